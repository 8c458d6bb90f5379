//! vLLM 0.32 `WorkerProfiler` semantics, case by case, through the public API with a recording
//! backend. Each expected sequence was worked out from vllm/profiler/wrapper.py.

mod support;

use stepscope::schedule::Phase;
use stepscope::{Error, IterationInfo, StartOptions, StartOutcome, StopOutcome};
use support::{profiler, steps, Call};

fn opts(delay: Option<u64>, max: Option<u64>) -> StartOptions {
    StartOptions {
        delay_iterations: delay,
        max_iterations: max,
        ..StartOptions::default()
    }
}

#[test]
fn immediate_start_and_stop() {
    let (p, rec) = profiler("{}");
    assert_eq!(p.start().unwrap(), StartOutcome::Started);
    assert!(p.is_active() && p.is_running() && p.should_annotate());
    assert_eq!(steps(&p, 3), [true, true, true]);
    assert_eq!(p.stop().unwrap(), StopOutcome::Stopped);
    assert!(!p.is_active() && !p.is_running());
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 1 }, Call::Stop]);
    assert_eq!(rec.captured_steps(), [1, 2, 3]);
}

#[test]
fn delayed_start_begins_in_the_step_that_reaches_the_delay() {
    let (p, rec) = profiler(r#"{"delay_iterations": 3}"#);
    assert_eq!(p.start().unwrap(), StartOutcome::Armed { delay: 3 });
    assert!(p.is_active() && !p.is_running());
    assert_eq!(steps(&p, 5), [false, false, true, true, true]);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 3 }]);
}

#[test]
fn max_iterations_stop_after_more_than_max_with_full_reset() {
    let (p, rec) = profiler(r#"{"max_iterations": 2}"#);
    p.start().unwrap();
    // Counted steps 1 and 2 are captured; the third exceeds max (> 2) and stops in step().
    assert_eq!(steps(&p, 4), [true, true, false, false]);
    assert!(
        !p.is_active(),
        "the stop by itself goes through the full stop"
    );
    assert_eq!(p.phase(), Phase::Idle);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 1 }, Call::Stop]);
}

#[test]
fn delay_and_max_capture_exactly_the_window() {
    let (p, rec) = profiler(r#"{"delay_iterations": 2, "max_iterations": 3}"#);
    p.start().unwrap();
    steps(&p, 8);
    assert_eq!(rec.captured_steps(), [2, 3, 4]);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 2 }, Call::Stop]);
    // The stop comes in step 5, after iteration 4's annotation closed.
    let calls = rec.calls();
    let stop = calls.iter().position(|c| *c == Call::Stop).unwrap();
    assert_eq!(calls[stop - 1], Call::Advance);
    assert_eq!(calls[stop - 2], Call::End);
}

#[test]
fn duplicate_start_and_stop_are_ignored() {
    let (p, rec) = profiler(r#"{"max_iterations": 5}"#);
    assert_eq!(p.start().unwrap(), StartOutcome::Started);
    // A second start, even with other overrides, changes nothing.
    assert_eq!(
        p.start_with(opts(Some(7), Some(1))).unwrap(),
        StartOutcome::AlreadyActive
    );
    assert_eq!(steps(&p, 3), [true, true, true], "max 1 was not applied");
    assert_eq!(p.stop().unwrap(), StopOutcome::Stopped);
    assert_eq!(p.stop().unwrap(), StopOutcome::NotActive);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 1 }, Call::Stop]);
}

#[test]
fn step_while_inactive_touches_nothing_but_counts_the_index() {
    let (p, rec) = profiler(r#"{"delay_iterations": 1}"#);
    assert_eq!(steps(&p, 4), [false; 4]);
    assert!(rec.calls().is_empty());
    assert_eq!(p.step_index(), 4);
    assert!(!p.is_active());
}

#[test]
fn start_failure_leaves_the_session_active_and_not_running() {
    let (p, rec) = profiler("{}");
    rec.fail_next_start();
    let err = p.start().unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert!(err.to_string().contains("start failed on request"));
    assert!(p.is_active() && !p.is_running());
    assert_eq!(p.phase(), Phase::StartFailed);
    // No retry on later steps, and nothing is annotated.
    assert_eq!(steps(&p, 3), [false; 3]);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 1 }]);
    // stop() ends the session without touching the backend, and a new start works.
    assert_eq!(p.stop().unwrap(), StopOutcome::Disarmed);
    assert_eq!(p.start().unwrap(), StartOutcome::Started);
    assert_eq!(
        rec.lifecycle(),
        [Call::Start { first_step: 1 }, Call::Start { first_step: 4 }]
    );
}

#[test]
fn delayed_start_failure_is_reported_from_step_and_not_retried() {
    let (p, rec) = profiler(r#"{"delay_iterations": 2}"#);
    rec.fail_next_start();
    p.start().unwrap();
    assert_eq!(steps(&p, 4), [false; 4]);
    assert!(p.is_active() && !p.is_running());
    assert!(matches!(p.take_last_error(), Some(Error::Backend { .. })));
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 2 }]);
}

#[test]
fn shutdown_stops_only_a_running_session() {
    let (p, rec) = profiler("{}");
    p.shutdown().unwrap();
    assert!(rec.calls().is_empty(), "idle: nothing to stop");
    p.start().unwrap();
    steps(&p, 1);
    p.shutdown().unwrap();
    assert!(!p.is_active() && !p.is_running());
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 1 }, Call::Stop]);

    // vLLM's shutdown() leaves a session in its delay alone.
    let (p, rec) = profiler(r#"{"delay_iterations": 5}"#);
    p.start().unwrap();
    p.shutdown().unwrap();
    assert!(p.is_active());
    assert!(rec.calls().is_empty());
}

#[test]
fn stop_during_delay_never_touches_the_backend() {
    let (p, rec) = profiler(r#"{"delay_iterations": 5}"#);
    p.start().unwrap();
    steps(&p, 2);
    assert_eq!(p.stop().unwrap(), StopOutcome::Disarmed);
    assert_eq!(steps(&p, 6), [false; 6]);
    assert!(rec.calls().is_empty());
}

#[test]
fn restart_after_max_works() {
    let (p, rec) = profiler(r#"{"max_iterations": 1}"#);
    p.start().unwrap();
    assert_eq!(steps(&p, 2), [true, false]);
    assert_eq!(p.start().unwrap(), StartOutcome::Started);
    assert_eq!(steps(&p, 2), [true, false]);
    assert_eq!(
        rec.lifecycle(),
        [
            Call::Start { first_step: 1 },
            Call::Stop,
            Call::Start { first_step: 3 },
            Call::Stop
        ]
    );
}

#[test]
fn session_overrides_apply_once_and_revert_at_the_next_start() {
    let (p, rec) = profiler(r#"{"delay_iterations": 0, "max_iterations": 0}"#);
    assert_eq!(
        p.start_with(opts(Some(2), Some(1))).unwrap(),
        StartOutcome::Armed { delay: 2 }
    );
    assert_eq!(steps(&p, 4), [false, true, false, false]);
    assert!(!p.is_active());
    // Back to the config: start now, no limit.
    assert_eq!(p.start().unwrap(), StartOutcome::Started);
    assert_eq!(steps(&p, 5), [true; 5]);
    assert!(p.is_running());
    // One override alone keeps the other from the config.
    p.stop().unwrap();
    assert_eq!(
        p.start_with(opts(None, Some(2))).unwrap(),
        StartOutcome::Started
    );
    assert_eq!(steps(&p, 3), [true, true, false]);
    assert_eq!(rec.lifecycle().len(), 6);
}

#[test]
fn negative_overrides_are_errors_naming_the_field() {
    let err = StartOptions::from_signed(Some(-1), None).unwrap_err();
    assert_eq!(err.field(), Some("delay_iterations"));
    assert!(
        err.to_string().contains("greater than or equal to 0"),
        "{err}"
    );
    let err = StartOptions::from_signed(Some(1), Some(-3)).unwrap_err();
    assert_eq!(err.field(), Some("max_iterations"));
    assert_eq!(
        StartOptions::from_signed(Some(4), None).unwrap(),
        opts(Some(4), None)
    );
}

#[test]
fn warmup_steps_are_captured_but_not_counted_toward_max() {
    // Torch schedule wait=1, warmup=1: the start consumes one non-active step, one more
    // running step is uncounted (vLLM: wait + warmup - 1).
    let (p, rec) = profiler(
        r#"{"profiler": "torch", "torch_profiler_dir": "/tmp/stepscope-test",
            "wait_iterations": 1, "warmup_iterations": 1, "max_iterations": 2}"#,
    );
    p.start().unwrap();
    assert_eq!(steps(&p, 5), [true, true, true, false, false]);
    let advances = rec.calls().iter().filter(|c| **c == Call::Advance).count();
    assert_eq!(
        advances, 4,
        "the backend's schedule advances in every running step"
    );
}

#[test]
fn warmup_does_not_apply_to_the_cuda_profiler() {
    let (p, _rec) =
        profiler(r#"{"profiler": "cuda", "warmup_iterations": 3, "max_iterations": 2}"#);
    p.start().unwrap();
    assert_eq!(steps(&p, 3), [true, true, false]);
}

#[test]
fn the_iteration_guard_closes_the_annotation_when_it_drops() {
    let (p, rec) = profiler("{}");
    p.start().unwrap();
    let info = IterationInfo::new(2, 100, 5, 5);
    {
        let it = p.step(&info);
        assert!(it.is_captured());
        assert_eq!(rec.calls().last(), Some(&Call::Begin { step: 1, info }));
    }
    assert_eq!(rec.calls().last(), Some(&Call::End));
    // A range left open is closed by the next step, before anything else happens.
    std::mem::forget(p.step(&info));
    let _next = p.step(&info);
    let calls = rec.calls();
    let n = calls.len();
    assert_eq!(
        calls[n - 4..],
        [
            Call::Begin { step: 2, info },
            Call::End,
            Call::Advance,
            Call::Begin { step: 3, info }
        ]
    );
}

#[test]
fn stop_failure_is_reported_and_the_session_still_ends() {
    let (p, rec) = profiler("{}");
    *rec.fail_stops.lock() = true;
    p.start().unwrap();
    assert!(p.stop().is_err());
    assert!(!p.is_active() && !p.is_running());
    assert_eq!(p.start().unwrap(), StartOutcome::Started);
}

#[test]
fn set_worker_name_is_ignored_while_a_session_is_active() {
    let (p, _rec) = profiler("{}");
    assert!(p.set_worker_name("before").unwrap());
    p.start().unwrap();
    assert!(
        !p.set_worker_name("during").unwrap(),
        "vLLM's set_output_name"
    );
    assert_eq!(p.worker_name(), "before");
    p.stop().unwrap();
    assert!(p.set_worker_name("after").unwrap());
    assert_eq!(p.worker_name(), "after");
}

/// A worker name becomes the start of trace files' names: one that `set_trace_name` would
/// refuse is refused here too, naming `worker_name`, not taken and lost at write time.
#[test]
fn set_worker_name_refuses_what_is_no_file_name() {
    let (p, _rec) = profiler("{}");
    for bad in ["../x", "a/b", ".hidden", "", "tab\there"] {
        let e = p.set_worker_name(bad).expect_err(bad);
        assert_eq!(e.field(), Some("worker_name"), "{bad}: {e}");
    }
    assert_eq!(p.worker_name(), "test-worker");
}

#[test]
fn armed_exactly_while_a_step_can_use_its_counts() {
    let (p, _rec) = profiler(r#"{"delay_iterations": 2, "max_iterations": 1}"#);
    assert!(!p.is_armed());
    steps(&p, 1);
    assert!(!p.is_armed(), "idle: step() reads nothing");
    p.start().unwrap();
    assert!(p.is_armed(), "delaying: the next step may start capturing");
    assert_eq!(steps(&p, 4), [false, true, false, false]);
    assert!(!p.is_armed(), "the session ended by itself");
}

#[test]
fn reconfigure_applies_between_sessions_only() {
    let (p, _rec) = profiler("{}");
    let cfg = stepscope::ProfilerConfig::from_json_str(r#"{"max_iterations": 1}"#).unwrap();
    p.start().unwrap();
    assert!(!p.reconfigure(&cfg).unwrap(), "ignored while active");
    p.stop().unwrap();
    assert!(p.reconfigure(&cfg).unwrap());
}

#[test]
fn try_step_idle_counts_only_steps_with_nothing_to_do() {
    let (p, rec) = profiler(r#"{"delay_iterations": 2}"#);
    assert!(
        !p.try_step_idle(),
        "the first step registers the engine thread"
    );
    steps(&p, 1);
    assert!(p.try_step_idle());
    assert_eq!(p.step_index(), 2);
    p.start().unwrap();
    assert!(!p.try_step_idle(), "armed: step() has work");
    assert_eq!(p.step_index(), 2);
    assert_eq!(steps(&p, 2), [false, true]);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 4 }]);
}

#[test]
fn is_running_here_follows_is_running_through_every_transition() {
    let (p, _rec) = profiler(r#"{"delay_iterations": 1, "max_iterations": 2}"#);
    let same = |p: &stepscope::WorkerProfiler, when: &str| {
        assert_eq!(p.is_running_here(), p.is_running(), "{when}");
    };
    same(&p, "made");
    steps(&p, 1);
    same(&p, "idle");
    p.start().unwrap();
    same(&p, "delaying");
    let mut seen = Vec::new();
    for _ in 0..5 {
        let _iteration = p.step(&IterationInfo::default());
        same(&p, "after a step");
        seen.push(p.is_running_here());
    }
    assert_eq!(
        seen,
        [true, true, false, false, false],
        "the window, by itself"
    );
    p.start().unwrap();
    steps(&p, 2);
    assert!(p.is_running_here());
    p.step_end();
    same(&p, "after step_end");
    p.stop().unwrap();
    same(&p, "stopped");
    assert!(!p.is_running_here());
    p.start().unwrap();
    steps(&p, 2);
    p.shutdown().unwrap();
    same(&p, "shut down");
    assert!(!p.is_running_here());
}

#[test]
fn is_running_here_holds_through_a_stop_from_another_thread_until_the_engine_carries_it_out() {
    let (p, _rec) = profiler("{}");
    let p = std::sync::Arc::new(p);
    steps(&p, 1); // this thread is the engine thread
    p.start().unwrap();
    steps(&p, 1);
    let q = std::sync::Arc::clone(&p);
    assert_eq!(
        std::thread::spawn(move || q.stop().unwrap())
            .join()
            .unwrap(),
        StopOutcome::Deferred
    );
    assert!(p.is_running() && p.is_running_here(), "the stop is pending");
    steps(&p, 1);
    assert!(!p.is_running() && !p.is_running_here(), "carried out here");
}
