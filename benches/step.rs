//! `step()` in each state, beside an empty-closure baseline measured in the same run, so the
//! figures read as a cost over doing nothing.
//!
//! - idle: no session (the engine's normal state): one relaxed load + the step counter.
//! - idle_timeline_on: idle with the step timeline on: each step's begin and end written into
//!   its ring (two clock reads and a handful of relaxed stores, no lock).
//! - armed: a session in its delay (counting toward the backend start).
//! - watching: a session armed with a slow-step trigger that never fires: two clock reads per
//!   step (its begin, and its end when the guard drops) and, for the relative form, the
//!   running median's update; measured against armed_in_delay.
//! - running: a session capturing with a backend that does nothing (the profiler's own cost,
//!   without a tool's; like the CUDA profiler API's backend, it opens no range per iteration,
//!   so with no NVTX tool the iteration's end takes no lock): schedule, backend calls, and
//!   the capture budget's
//!   check (on by default: a clock read every 32nd step, and there a `pread` of
//!   /proc/self/statm once a millisecond has passed since the last),
//!   beside the same with the budget off.
//! - nvtx "always" with no NVTX tool attached, beside a raw NVTX push/pop baseline: stepscope
//!   sees the null domain NVTX returns without a tool and annotates nothing, so the step stays
//!   idle-cheap, while the raw push/pop still pays NVTX's dispatch.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use stepscope::backend::NoBackend;
use stepscope::{IterationInfo, ProfilerConfig, StartOptions, WorkerProfiler};

#[path = "../tests/support/mod.rs"]
mod support;
use support::ReadsNames;

fn profiler() -> WorkerProfiler {
    let cfg = ProfilerConfig::default();
    let p = WorkerProfiler::with_backend(&cfg, "bench", Box::new(NoBackend));
    // Register this thread as the engine thread, as a real engine's first step does.
    drop(p.step(&IterationInfo::default()));
    p
}

fn bench_step(c: &mut Criterion) {
    let info = IterationInfo::new(1, 512, 63, 63);
    let mut g = c.benchmark_group("step");

    g.bench_function("baseline_empty_closure", |b| {
        b.iter(|| {
            black_box(&info);
        })
    });

    let idle = profiler();
    g.bench_function("idle", |b| b.iter(|| drop(idle.step(black_box(&info)))));

    // The step timeline on (`stepscope.timeline`), no session: the step's begin and end go
    // into the ring (two reads of the clock), without the lock.
    let cfg = ProfilerConfig::from_json_str(r#"{"stepscope": {"timeline": true}}"#).unwrap();
    let timed = WorkerProfiler::with_backend(&cfg, "bench", Box::new(NoBackend));
    drop(timed.step(&info));
    g.bench_function("idle_timeline_on", |b| {
        b.iter(|| drop(timed.step(black_box(&info))))
    });
    // The steps went into the ring (under `cargo test`, criterion runs each bench once).
    assert!(timed.timeline(0).is_some_and(|t| !t.is_empty()));

    let armed = profiler();
    armed
        .start_with(StartOptions {
            delay_iterations: Some(u64::MAX),
            max_iterations: None,
            ..StartOptions::default()
        })
        .expect("start");
    g.bench_function("armed_in_delay", |b| {
        b.iter(|| drop(armed.step(black_box(&info))))
    });

    for (name, trigger) in [
        ("armed_watching_slow_step_ms", r#""slow_step_ms": 1e12"#),
        (
            "armed_watching_slow_step_factor",
            r#""slow_step_factor": 1e12"#,
        ),
    ] {
        let json = format!(r#"{{"max_iterations": 1, "stepscope": {{{trigger}}}}}"#);
        let cfg = ProfilerConfig::from_json_str(&json).expect("config");
        let watching = WorkerProfiler::with_backend(&cfg, "bench", Box::new(NoBackend));
        drop(watching.step(&info));
        watching.start().expect("start");
        assert_eq!(watching.status().phase, "watching");
        g.bench_function(name, |b| b.iter(|| drop(watching.step(black_box(&info)))));
        assert_eq!(
            watching.status().phase,
            "watching",
            "{name}: the trigger never fires"
        );
    }

    let running = profiler();
    running
        .start_with(StartOptions {
            delay_iterations: Some(0),
            max_iterations: Some(0),
            ..StartOptions::default()
        })
        .expect("start");
    assert!(running.is_running());
    g.bench_function("running_no_tool", |b| {
        b.iter(|| drop(running.step(black_box(&info))))
    });
    assert!(
        running.is_running(),
        "the default budget cut the window short"
    );

    let cfg = ProfilerConfig::from_json_str(
        r#"{"stepscope": {"max_capture_mb": 0, "max_capture_s": 0}}"#,
    )
    .expect("config");
    let unbudgeted = WorkerProfiler::with_backend(&cfg, "bench", Box::new(NoBackend));
    drop(unbudgeted.step(&info));
    unbudgeted.start().expect("start");
    g.bench_function("running_no_tool_budget_off", |b| {
        b.iter(|| drop(unbudgeted.step(black_box(&info))))
    });

    let named =
        WorkerProfiler::with_backend(&ProfilerConfig::default(), "bench", Box::new(ReadsNames));
    drop(named.step(&info));
    named.start().expect("start");
    g.bench_function("running_with_names", |b| {
        b.iter(|| drop(named.step(black_box(&info))))
    });

    g.bench_function("baseline_raw_nvtx_push_pop_no_tool", |b| {
        b.iter(|| {
            let _ =
                nvtx_sys::range_push_ascii(black_box(c"execute_context_1(512)_generation_63(63)"));
            let _ = nvtx_sys::range_pop();
        })
    });
    let cfg = ProfilerConfig::from_json_str(r#"{"stepscope": {"nvtx": "always"}}"#).unwrap();
    let always = WorkerProfiler::with_backend(&cfg, "bench", Box::new(NoBackend));
    drop(always.step(&info));
    g.bench_function("nvtx_always_no_tool", |b| {
        b.iter(|| drop(always.step(black_box(&info))))
    });
    g.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
