//! The step timeline through `WorkerProfiler`: every step recorded, idle or in a session,
//! with the phase the profiler itself reports for it, the counts it was given, and times that
//! follow `step()` and the guard's drop.

use stepscope::backend::NoBackend;
use stepscope::{IterationInfo, ProfilerConfig, StartOptions, WorkerProfiler};

fn timed(steps: usize, extra: &str) -> WorkerProfiler {
    let json = format!(r#"{{"stepscope": {{"timeline": {{"steps": {steps}}}{extra}}}}}"#);
    let cfg = ProfilerConfig::from_json_str(&json).unwrap();
    WorkerProfiler::with_backend(&cfg, "w", Box::new(NoBackend))
}

#[test]
fn every_step_carries_its_counts_and_the_phase_the_profiler_reports() {
    let p = timed(64, "");
    let mut expected = Vec::new();
    for i in 1..=12u32 {
        if i == 4 {
            p.start_with(StartOptions {
                delay_iterations: Some(2),
                max_iterations: Some(3),
                ..StartOptions::default()
            })
            .unwrap();
        }
        let info = IterationInfo::new(i % 3, 100 * i, i, i);
        let guard = p.step(&info);
        // The phase of this step, as the profiler reports it while the step runs.
        expected.push((u64::from(i), info, p.phase().as_str()));
        drop(guard);
    }
    let got: Vec<(u64, IterationInfo, &str)> = p
        .timeline(0)
        .unwrap()
        .iter()
        .map(|s| {
            let info = IterationInfo::new(
                s.num_ctx_reqs,
                s.num_ctx_tokens,
                s.num_gen_reqs,
                s.num_gen_tokens,
            );
            (s.step, info, s.phase)
        })
        .collect();
    assert_eq!(got, expected);
    // The session went through its delay and window: the timeline saw both.
    let phases: Vec<&str> = got.iter().map(|g| g.2).collect();
    assert!(
        phases.contains(&"delaying") && phases.contains(&"running"),
        "{phases:?}"
    );
    assert_eq!(p.status().timeline.map(|t| t.recorded), Some(12));
}

#[test]
fn a_step_without_its_end_lasts_until_the_next_step() {
    let p = timed(16, "");
    for _ in 0..5 {
        // An engine that never ends its steps: each ends at the next one's begin.
        std::mem::forget(p.step(&IterationInfo::default()));
    }
    let t = p.timeline(0).unwrap();
    // The fifth is still open: not read.
    assert_eq!(t.len(), 4);
    for w in t.windows(2) {
        let end = w[0].start_unix_ns + w[0].duration_ns;
        assert!(end.abs_diff(w[1].start_unix_ns) <= 1, "{w:?}");
    }
    p.step_end();
    assert_eq!(p.timeline(0).unwrap().len(), 5);
}

#[test]
fn the_timeline_is_off_by_default_and_status_says_so() {
    let p = WorkerProfiler::with_backend(&ProfilerConfig::default(), "w", Box::new(NoBackend));
    drop(p.step(&IterationInfo::default()));
    assert!(!p.has_timeline());
    assert_eq!(p.timeline(0), None);
    assert_eq!(p.status().timeline, None);
    let on = timed(16, "");
    let info = on.status().timeline.unwrap();
    assert_eq!((info.capacity, info.recorded), (16, 0));
}

#[test]
fn the_config_takes_true_false_or_a_size_and_names_a_bad_one() {
    for (json, steps) in [
        (r#"{"stepscope": {"timeline": true}}"#, Some(4096)),
        (r#"{"stepscope": {"timeline": false}}"#, None),
        (r#"{"stepscope": {"timeline": {}}}"#, Some(4096)),
        (r#"{"stepscope": {"timeline": {"steps": 100}}}"#, Some(100)),
    ] {
        let cfg = ProfilerConfig::from_json_str(json).unwrap();
        assert_eq!(cfg.stepscope.timeline, steps, "{json}");
    }
    for bad in [
        r#"{"stepscope": {"timeline": 5}}"#,
        r#"{"stepscope": {"timeline": {"steps": 8}}}"#,
        r#"{"stepscope": {"timeline": {"steps": -1}}}"#,
        r#"{"stepscope": {"timeline": {"step": 100}}}"#,
    ] {
        let e = ProfilerConfig::from_json_str(bad).unwrap_err();
        assert!(
            e.field()
                .is_some_and(|f| f.starts_with("stepscope.timeline")),
            "{bad}: {e}"
        );
    }
}
