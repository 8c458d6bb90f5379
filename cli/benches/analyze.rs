//! Trace analysis throughput on a real 35 MB Kineto trace (tests/data/hta), in MB/s of
//! uncompressed JSON on one core, beside a baseline measured in the same run: serde_json
//! skipping the whole document (`IgnoredAny`), the floor for any serde-based reader.

use std::hint::black_box;
use std::io::Read;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use stepscope_cli::{analyze, trace};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/hta/trace_diff__control__control.json.gz"
);

fn bench(c: &mut Criterion) {
    let path = Path::new(TRACE);
    let gz = std::fs::read(path).expect("the bench trace");
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut json)
        .unwrap();
    let mut g = c.benchmark_group("analyze_35MB_trace");
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.sample_size(10);
    g.bench_function("baseline_serde_skip_all", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&json)).unwrap())
    });
    g.bench_function("parse_and_analyze", |b| {
        b.iter(|| analyze::analyze_bytes(path, black_box(&json), 15).unwrap())
    });
    g.bench_function("gunzip", |b| {
        b.iter(|| trace::read(black_box(path)).unwrap())
    });
    g.bench_function("read_gunzip_parse_analyze", |b| {
        b.iter(|| analyze::analyze_file(black_box(path), 15).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
