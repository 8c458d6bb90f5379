//! The request log (`stepscope.requests`) per engine step, beside the step timeline alone
//! measured in the same run: one step of a batch of B requests in decode (`begin_step`, B
//! `scheduled`, `end_step`, B `produced`), for B = 1, 64 and 256, with ids as vLLM makes them
//! (`cmpl-` and 32 hex digits and its suffixes, 48 bytes). The per-request cost is the slope:
//! (cost at 256 − cost at 1) / 255. The log's memory at its default sizes is printed once.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use stepscope::backend::NoBackend;
use stepscope::config::{ProfilerConfig, REQUEST_LOG_SIZE};
use stepscope::requests::RequestLog;
use stepscope::{IterationInfo, WorkerProfiler};

fn ids(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "cmpl-{:032x}-0-{:08x}",
                i as u128 * 0x9e37_79b9_7f4a_7c15,
                i
            )
        })
        .collect()
}

fn bench_requests(c: &mut Criterion) {
    let mut g = c.benchmark_group("requests");

    // The timeline alone: one step's begin and end in its ring.
    let cfg = ProfilerConfig::from_json_str(r#"{"stepscope": {"timeline": true}}"#).unwrap();
    let timed = WorkerProfiler::with_backend(&cfg, "bench", Box::new(NoBackend));
    let info = IterationInfo::new(0, 0, 64, 64);
    drop(timed.step(&info));
    g.bench_function("timeline_step", |b| {
        b.iter(|| drop(timed.step(black_box(&info))))
    });

    let log0 = RequestLog::new(REQUEST_LOG_SIZE);
    eprintln!(
        "request log at its default sizes ({} requests, {} steps): {:.2} MB",
        log0.capacity().requests,
        log0.capacity().steps,
        log0.memory_bytes() as f64 / 1e6
    );
    for batch in [1usize, 64, 256] {
        let names = ids(batch);
        let mut log = RequestLog::new(REQUEST_LOG_SIZE);
        for id in &names {
            log.arrived(id, 100, None);
        }
        // Each in decode: a token produced, 100 computed.
        let s = log.begin_step(0);
        for id in &names {
            log.scheduled(s, id, 100, 0);
        }
        log.end_step(s);
        for id in &names {
            log.produced(s, id, 1);
        }
        // Each step decodes one more token: the engine has computed all but the last.
        let mut computed = 100u32;
        g.bench_with_input(BenchmarkId::new("log_step", batch), &names, |b, names| {
            b.iter(|| {
                let s = log.begin_step(0);
                for id in names {
                    log.scheduled(s, black_box(id), 1, computed);
                }
                computed = computed.wrapping_add(1);
                log.end_step(s);
                for id in names {
                    log.produced(s, black_box(id), 1);
                }
            })
        });
        // The steps and the batch's decode went into the log.
        let d = log.document(0);
        assert!(d
            .steps
            .last()
            .is_some_and(|s| s.decode_reqs as usize == batch));
    }
    g.finish();
}

criterion_group!(benches, bench_requests);
criterion_main!(benches);
