//! Trace reading throughput on a real 35 MB Kineto trace (tests/data/hta), in MB/s of
//! uncompressed JSON on one core, beside baselines measured in the same run: serde_json
//! skipping the whole document held in memory (`IgnoredAny`, the floor for any serde-based
//! reader) and gunzip alone. The memory side (peak RSS on a 3 GB trace, a 64-rank directory)
//! is `scripts/bench_read.py`.

use std::hint::black_box;
use std::io::Read;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use stepscope_cli::{trace, trace_report};
use stepscope_format::trace::{EventSink, EventStream, Meta, Summarizer};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/hta/trace_diff__control__control.json.gz"
);

/// Parses every event's fields and drops them.
struct Parse;
impl EventSink for Parse {
    type Event<'de> = stepscope_format::trace::Event<'de>;
    fn event(&mut self, e: Self::Event<'_>, _: &Meta) {
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
    g.bench_function("baseline_serde_skip_all_in_memory", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&json)).unwrap())
    });
    g.bench_function("baseline_gunzip_stream", |b| {
        b.iter(|| {
            let mut r = trace::open(path).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            while r.read(&mut buf).unwrap() > 0 {}
        })
    });
    g.bench_function("stream_events", |b| {
        b.iter(|| {
            EventStream::new()
                .read_all(black_box(&json[..]), &mut Parse)
                .unwrap()
        })
    });
    g.bench_function("stream_summarize", |b| {
        b.iter(|| {
            let mut s = Summarizer::new();
            let meta = EventStream::new()
                .read_all(black_box(&json[..]), &mut s)
                .unwrap();
            s.finish(meta, 15)
        })
    });
    g.bench_function("gunzip_stream_summarize", |b| {
        b.iter(|| trace_report::analyze_file(black_box(path), 15).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
