//! What `stop()` costs the engine thread with the torch backend, for traces of about 10k, 100k
//! and 1M events, beside what it would cost if the trace were written synchronously (stop and
//! wait for the write: torch's and vLLM's way), in the same run. Then the writer's throughput,
//! beside torch's own stop + export of the same workload (scripts/bench_torch_export.py, run
//! with the venv's python).
//!
//! `STEPSCOPE_BENCH_OPS=10000,100000` picks the sizes (default 10k, 100k, 1M ops; one op is one
//! trace event).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::Value;
use stepscope::{IterationInfo, ProfilerConfig, WorkerProfiler};
use tch::{Device, Kind, Tensor};

/// `cargo bench` passes `--bench`; `cargo test --all-targets` runs each bench once without
/// it, as a smoke test, which gets the smallest size only.
fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn sizes() -> Vec<usize> {
    if !bench_mode() {
        return vec![10_000];
    }
    std::env::var("STEPSCOPE_BENCH_OPS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000])
}

fn bench_dir() -> PathBuf {
    std::env::temp_dir().join(format!("stepscope-bench-stop-{}", std::process::id()))
}

fn profiler(dir: &Path) -> WorkerProfiler {
    let cfg = ProfilerConfig::from_value(&serde_json::json!({
        "profiler": "torch",
        "torch_profiler_dir": dir,
        "torch_profiler_with_stack": false,
        "torch_profiler_dump_cuda_time_total": false,
    }))
    .expect("config");
    WorkerProfiler::new(&cfg, "bench").expect("profiler")
}

/// One captured iteration of `ops` tensor additions; the session is left running.
fn capture(p: &WorkerProfiler, x: &Tensor, ops: usize) {
    p.start().expect("start");
    let _it = p.step(&IterationInfo::new(0, 0, 1, 1));
    for _ in 0..ops {
        let _ = x + x;
    }
}

fn clean(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::create_dir_all(dir);
}

fn stop_latency(c: &mut Criterion) {
    let dir = bench_dir();
    clean(&dir);
    let x = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
    let p = profiler(&dir);
    for ops in sizes() {
        let mut g = c.benchmark_group(format!("torch_stop/{ops}_ops"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(1))
            .measurement_time(Duration::from_secs(1));
        // The same session either way; only what the clock covers differs.
        let session = |iters: u64, with_write: bool| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                capture(&p, &x, ops);
                let t = Instant::now();
                p.stop().expect("stop");
                let returned = t.elapsed();
                assert!(p.flush(Duration::from_secs(600)).expect("flush"));
                total += if with_write { t.elapsed() } else { returned };
                clean(&dir);
            }
            total
        };
        g.bench_function("stop", |b| b.iter_custom(|iters| session(iters, false)));
        g.bench_function("stop_and_write", |b| {
            b.iter_custom(|iters| session(iters, true))
        });
        g.finish();
    }
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One session per size: the writer's figures from its manifest, and torch's export of the
/// same workload.
fn throughput(_c: &mut Criterion) {
    let dir = bench_dir();
    let x = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
    println!("\nwriter throughput (one session per size; MB = 10^6 bytes of uncompressed JSON)");
    for ops in sizes() {
        clean(&dir);
        let p = profiler(&dir);
        capture(&p, &x, ops);
        p.stop().expect("stop");
        assert!(p.flush(Duration::from_secs(600)).expect("flush"));
        drop(p);
        let manifest = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(".stepscope.json"))
            .expect("manifest");
        let m: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        let events = count_events(&dir.join(m["trace_file"].as_str().unwrap()));
        let json_mb = m["json_bytes"].as_f64().unwrap() / 1e6;
        let write_s = m["write_seconds"].as_f64().unwrap();
        let finalize_s = m["finalize_seconds"].as_f64().unwrap();
        println!(
            "  {ops:>8} ops: {events} events, {json_mb:.1} MB JSON -> {:.1} MB gz; finalize \
             {finalize_s:.3} s, write {write_s:.3} s = {:.0} MB/s of JSON",
            m["trace_bytes"].as_f64().unwrap() / 1e6,
            json_mb / write_s
        );
        match torch_export(ops).filter(|_| bench_mode()) {
            Some(t) => {
                let export_s = t["export_s"].as_f64().unwrap_or(f64::NAN);
                println!(
                    "  {ops:>8} ops, torch: stop {:.3} s, export_chrome_trace(.gz) {export_s:.3} s \
                     = {:.0} MB/s of the same JSON; stepscope's writer is {:.1}x faster",
                    t["stop_s"].as_f64().unwrap_or(f64::NAN),
                    json_mb / export_s,
                    export_s / write_s
                );
            }
            None => println!("  (torch's export not measured: not a --bench run, or no python with torch on PATH)"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn count_events(path: &Path) -> usize {
    let mut text = String::new();
    let file = std::fs::File::open(path).unwrap();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["traceEvents"].as_array().map_or(0, Vec::len)
}

fn torch_export(ops: usize) -> Option<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench_torch_export.py");
    let out = Command::new("python")
        .arg(script)
        .arg(ops.to_string())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last()?).ok()
}

criterion_group!(benches, stop_latency, throughput);
criterion_main!(benches);
