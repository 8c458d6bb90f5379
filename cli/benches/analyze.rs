//! Trace reading throughput on a real 35 MB Kineto trace (tests/data/hta), in MB/s of
//! uncompressed JSON on one core, every reader beside the others in the same run:
//!
//! - `skip_only`: the scanner finding each event's end and checking its structure (`Skip`),
//!   beside `serde_skip_all_in_memory` (serde_json skipping the whole document);
//! - `old_parser`: each event parsed by serde_json into the event type the reader used before
//!   the scanner (`crates/format/tests/support/old_event.rs`), as `stream_events` did;
//! - `scanner`: each event's fields read by the scanner (`Event`);
//! - `analysis`: the scanner and the summary (what `analyze` computes), from memory;
//! - `gunzip_analysis`: the same from the .gz file, gunzip on its own thread (`analyze_file`),
//!   beside `gunzip_only`.
//!
//! Criterion's figures are wall time on one thread; the gunzip rows use a second thread, so
//! their per-core figure is `scripts/bench_read.py`'s (CPU time of the whole process).

use std::hint::black_box;
use std::io::Read;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use stepscope_cli::{trace, trace_report};
use stepscope_format::trace::{Event, EventSink, EventStream, Meta, Serde, Skip, Summarizer};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/hta/trace_diff__control__control.json.gz"
);

#[path = "../../crates/format/tests/support/old_event.rs"]
mod old_event;
use old_event::OldEvent;

struct Old;
impl EventSink for Old {
    type Event<'de> = Serde<OldEvent<'de>>;
    fn event(&mut self, e: Self::Event<'_>, _: &Meta) {
        black_box(e);
    }
}

struct Scan;
impl EventSink for Scan {
    type Event<'de> = Event<'de>;
    fn event(&mut self, e: Event<'_>, _: &Meta) {
        black_box(e);
    }
}

struct Skipped;
impl EventSink for Skipped {
    type Event<'de> = Skip;
    fn event(&mut self, e: Skip, _: &Meta) {
        black_box(e);
    }
}

fn bench(c: &mut Criterion) {
    let path = Path::new(TRACE);
    let gz = std::fs::read(path).expect("the bench trace");
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut json)
        .unwrap();
    let mut g = c.benchmark_group("read_35MB_trace");
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.sample_size(10);
    g.bench_function("serde_skip_all_in_memory", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&json)).unwrap())
    });
    g.bench_function("skip_only", |b| {
        b.iter(|| {
            EventStream::new()
                .read_all(black_box(&json[..]), &mut Skipped)
                .unwrap()
        })
    });
    g.bench_function("old_parser", |b| {
        b.iter(|| {
            EventStream::new()
                .read_all(black_box(&json[..]), &mut Old)
                .unwrap()
        })
    });
    g.bench_function("scanner", |b| {
        b.iter(|| {
            EventStream::new()
                .read_all(black_box(&json[..]), &mut Scan)
                .unwrap()
        })
    });
    g.bench_function("analysis", |b| {
        b.iter(|| {
            let mut s = Summarizer::new();
            let meta = EventStream::new()
                .read_all(black_box(&json[..]), &mut s)
                .unwrap();
            s.finish(meta, 15)
        })
    });
    g.bench_function("gunzip_only", |b| {
        b.iter(|| {
            let mut r = trace::open(path).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            while r.read(&mut buf).unwrap() > 0 {}
        })
    });
    g.bench_function("gunzip_analysis", |b| {
        b.iter(|| trace_report::analyze_file(black_box(path), 15).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
