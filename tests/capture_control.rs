//! stepscope's capture control beyond vLLM (`"stepscope": {ranks, start_at_step, stages,
//! min_batch_*, repeat, repeat_every}`), through the public API with a recording backend,
//! plus invariants checked on random engine runs.

mod support;

use proptest::prelude::*;
use stepscope::{
    Error, IterationInfo, ProfilerConfig, StartOptions, StartOutcome, StopOutcome, WorkerProfiler,
};
use support::{profiler, Call, Recording};

const PREFILL: IterationInfo = IterationInfo::new(2, 300, 0, 0);
const DECODE: IterationInfo = IterationInfo::new(0, 0, 8, 8);
const MIXED: IterationInfo = IterationInfo::new(1, 100, 8, 8);

/// Steps through `iterations`; returns the indices of the captured steps.
fn run(p: &WorkerProfiler, iterations: &[IterationInfo]) -> Vec<u64> {
    iterations
        .iter()
        .filter_map(|info| {
            let it = p.step(info);
            it.is_captured().then(|| p.step_index())
        })
        .collect()
}

fn config_error(json: &str) -> String {
    match ProfilerConfig::from_json_str(json) {
        Err(e @ Error::Config { .. }) => format!("{}: {e}", e.field().unwrap_or_default()),
        other => panic!("expected a config error for {json}, got {other:?}"),
    }
}

#[test]
fn each_key_is_validated_with_an_error_naming_it() {
    let cases = [
        (r#"{"stepscope": {"ranks": []}}"#, "stepscope.ranks"),
        (r#"{"stepscope": {"ranks": [0, 0]}}"#, "stepscope.ranks"),
        (r#"{"stepscope": {"ranks": [-1]}}"#, "stepscope.ranks"),
        (
            r#"{"stepscope": {"start_at_step": 0}}"#,
            "stepscope.start_at_step",
        ),
        (
            r#"{"stepscope": {"stages": ["decoding"]}}"#,
            "stepscope.stages",
        ),
        (r#"{"stepscope": {"stages": []}}"#, "stepscope.stages"),
        (
            r#"{"stepscope": {"stages": ["decode", "decode"]}}"#,
            "stepscope.stages",
        ),
        (
            r#"{"stepscope": {"min_batch_requests": -2}}"#,
            "stepscope.min_batch_requests",
        ),
        (
            r#"{"stepscope": {"min_batch_tokens": "8"}}"#,
            "stepscope.min_batch_tokens",
        ),
        (r#"{"stepscope": {"repeat": 0}}"#, "stepscope.repeat"),
        (
            r#"{"max_iterations": 2, "stepscope": {"repeat": 3}}"#,
            "stepscope.repeat_every",
        ),
        (
            r#"{"stepscope": {"repeat": 3, "repeat_every": 10}}"#,
            "stepscope.repeat",
        ),
        (
            r#"{"max_iterations": 5, "stepscope": {"repeat": 3, "repeat_every": 5}}"#,
            "stepscope.repeat_every",
        ),
        (
            r#"{"delay_iterations": 3, "stepscope": {"start_at_step": 100}}"#,
            "stepscope.start_at_step",
        ),
        (
            r#"{"stepscope": {"start_at_step": 100, "min_batch_requests": 8}}"#,
            "stepscope.start_at_step",
        ),
        (
            r#"{"max_iterations": 2, "stepscope": {"slow_step_ms": 0}}"#,
            "stepscope.slow_step_ms",
        ),
        (
            r#"{"max_iterations": 2, "stepscope": {"slow_step_ms": "5"}}"#,
            "stepscope.slow_step_ms",
        ),
        (
            r#"{"stepscope": {"slow_step_ms": 5}}"#,
            "stepscope.slow_step_ms",
        ),
        (
            r#"{"max_iterations": 2, "stepscope": {"slow_step_factor": 1}}"#,
            "stepscope.slow_step_factor",
        ),
        (
            r#"{"stepscope": {"slow_step_factor": 3}}"#,
            "stepscope.slow_step_factor",
        ),
        (
            r#"{"max_iterations": 2, "stepscope": {"slow_step_ms": 5, "start_at_step": 9}}"#,
            "stepscope.slow_step_ms",
        ),
        (
            r#"{"max_iterations": 2, "stepscope": {"slow_step_ms": 5, "repeat": 2, "repeat_every": 9}}"#,
            "stepscope.repeat_every",
        ),
        (
            r#"{"stepscope": {"request_ids": 1}}"#,
            "stepscope.request_ids",
        ),
    ];
    for (json, field) in cases {
        let e = config_error(json);
        assert!(e.starts_with(&format!("{field}: ")), "{json}: {e}");
    }
    // Absent keys change nothing: the config is vLLM's.
    let cfg = ProfilerConfig::from_json_str("{}").unwrap();
    assert!(cfg.stepscope.capture.is_vllm_exact());
}

#[test]
fn start_at_step_aligns_ranks_whatever_the_arrival_of_the_start() {
    let json = r#"{"max_iterations": 3, "stepscope": {"start_at_step": 10}}"#;
    let (early, _) = profiler(json);
    let (late, _) = profiler(json);
    run(&early, &[DECODE; 2]);
    run(&late, &[DECODE; 7]);
    assert_eq!(early.start().unwrap(), StartOutcome::ArmedAt { step: 10 });
    assert_eq!(late.start().unwrap(), StartOutcome::ArmedAt { step: 10 });
    let a = run(&early, &[DECODE; 18]);
    let b = run(&late, &[DECODE; 13]);
    assert_eq!(a, [10, 11, 12]);
    assert_eq!(a, b, "both ranks captured the same step indices");
}

#[test]
fn a_start_step_already_passed_is_an_error_naming_it() {
    let (p, rec) = profiler(r#"{"max_iterations": 2}"#);
    run(&p, &[DECODE; 5]);
    let opts = StartOptions::default().at_step(Some(5)).unwrap();
    match p.start_with(opts) {
        Err(Error::InvalidArgument { name, message }) => {
            assert_eq!(name, "start_at_step");
            assert!(message.contains("at step 5"), "{message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(!p.is_active());
    assert!(StartOptions::default().at_step(Some(0)).is_err());
    // A start step given at start() overrides the config's delay.
    let opts = StartOptions::default().at_step(Some(8)).unwrap();
    assert_eq!(
        p.start_with(opts).unwrap(),
        StartOutcome::ArmedAt { step: 8 }
    );
    assert_eq!(run(&p, &[DECODE; 6]), [8, 9]);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 8 }, Call::Stop]);
}

#[test]
fn stages_count_only_chosen_iterations_and_pause_over_the_others() {
    let (p, rec) = profiler(
        r#"{"delay_iterations": 2, "max_iterations": 2, "stepscope": {"stages": ["decode"]}}"#,
    );
    p.start().unwrap();
    let steps = [
        PREFILL, DECODE, PREFILL, DECODE, MIXED, DECODE, PREFILL, DECODE, DECODE,
    ];
    //            1        2       3        4       5      6       7        8       9
    // Delay: decode steps 2 and 4 count, the backend starts in 4. Captured: 4, 6 (5 paused);
    // the stop comes with the third counted decode step (8), vLLM's `> max`.
    assert_eq!(run(&p, &steps), [4, 6]);
    assert!(!p.is_active());
    assert_eq!(
        rec.lifecycle(),
        [
            Call::Start { first_step: 4 },
            Call::Pause,
            Call::Resume,
            Call::Pause,
            Call::Resume,
            Call::Stop
        ]
    );
}

#[test]
fn with_a_stage_filter_a_delay_of_zero_waits_for_the_first_chosen_iteration() {
    let (p, rec) =
        profiler(r#"{"max_iterations": 1, "stepscope": {"stages": ["prefill", "mixed"]}}"#);
    assert_eq!(p.start().unwrap(), StartOutcome::Armed { delay: 0 });
    assert_eq!(run(&p, &[DECODE, DECODE, MIXED, DECODE, PREFILL]), [3]);
    assert_eq!(rec.lifecycle()[0], Call::Start { first_step: 3 });
}

#[test]
fn the_delay_counts_from_the_first_iteration_of_the_minimum_batch() {
    let small = IterationInfo::new(0, 0, 4, 4);
    let big = IterationInfo::new(0, 0, 32, 32);
    let (p, _) = profiler(
        r#"{"delay_iterations": 2, "max_iterations": 2, "stepscope": {"min_batch_requests": 16, "min_batch_tokens": 32}}"#,
    );
    p.start().unwrap();
    // Step 3 is the first big batch (count 1); the backend starts at count 2 (step 4), and
    // later small batches count as usual.
    assert_eq!(
        run(&p, &[small, small, big, small, small, small, big]),
        [4, 5]
    );
}

#[test]
fn repeat_takes_windows_repeat_every_steps_apart_each_its_own_capture() {
    let (p, rec) = profiler(
        r#"{"delay_iterations": 2, "max_iterations": 2, "stepscope": {"repeat": 3, "repeat_every": 5}}"#,
    );
    p.start().unwrap();
    let captured = run(&p, &[DECODE; 16]);
    assert_eq!(captured, [2, 3, 7, 8, 12, 13]);
    assert!(!p.is_active(), "the session ends after its last window");
    assert_eq!(
        rec.lifecycle(),
        [
            Call::Start { first_step: 2 },
            Call::Stop,
            Call::Start { first_step: 7 },
            Call::Stop,
            Call::Start { first_step: 12 },
            Call::Stop
        ]
    );
}

#[test]
fn every_window_of_a_repeat_series_begins_at_a_batch_of_the_minimum_size() {
    let small = IterationInfo::new(0, 0, 3, 3);
    let big = IterationInfo::new(0, 0, 4, 4);
    let (p, rec) = profiler(
        r#"{"max_iterations": 2, "stepscope": {"stages": ["decode"], "min_batch_requests": 4, "repeat": 2, "repeat_every": 4}}"#,
    );
    p.start().unwrap();
    // Window 1 begins at step 2 (the first batch of 4). Window 2 is due at step 6, a batch of
    // 3: it waits for step 8, the next batch of 4, not only for the due step.
    let captured = run(
        &p,
        &[
            small, big, small, small, small, small, small, big, small, small,
        ],
    );
    assert_eq!(captured, [2, 3, 8, 9]);
    assert_eq!(
        rec.lifecycle(),
        [
            Call::Start { first_step: 2 },
            Call::Stop,
            Call::Start { first_step: 8 },
            Call::Stop
        ]
    );
}

#[test]
fn a_stop_between_windows_ends_the_series_without_touching_the_backend() {
    let (p, rec) =
        profiler(r#"{"max_iterations": 1, "stepscope": {"repeat": 4, "repeat_every": 10}}"#);
    p.start().unwrap();
    run(&p, &[DECODE; 4]);
    let status = p.status();
    assert_eq!(
        (status.phase, status.windows_done, status.next_window_at),
        ("between", 1, Some(11))
    );
    assert!(p.is_active());
    assert_eq!(p.stop().unwrap(), StopOutcome::Disarmed);
    assert_eq!(run(&p, &[DECODE; 20]), Vec::<u64>::new());
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 1 }, Call::Stop]);
}

#[test]
fn ranks_not_listed_treat_start_and_stop_as_no_ops() {
    let json = r#"{"stepscope": {"ranks": [0, 2]}}"#;
    let (selected, rec0) = profiler(json);
    selected.set_rank(2);
    let (other, rec1) = profiler(json);
    other.set_rank(1);
    assert_eq!(selected.start().unwrap(), StartOutcome::Started);
    assert_eq!(other.start().unwrap(), StartOutcome::NotSelected);
    assert_eq!(run(&other, &[DECODE; 3]), Vec::<u64>::new());
    assert_eq!(other.stop().unwrap(), StopOutcome::NotSelected);
    assert!(rec1.calls().is_empty());
    assert_eq!(rec0.lifecycle(), [Call::Start { first_step: 1 }]);
    assert!(!other.status().selected && selected.status().selected);
}

#[test]
fn ranks_without_a_known_rank_is_an_error_at_start() {
    // RANK is not set in the test environment (the check is skipped where it is).
    if std::env::var_os("RANK").is_some() {
        return;
    }
    let (p, _) = profiler(r#"{"stepscope": {"ranks": [0]}}"#);
    let e = p.start().unwrap_err();
    assert_eq!(e.field(), Some("stepscope.ranks"), "{e}");
    assert!(!p.is_active());
}

#[test]
fn status_reports_the_window_and_its_progress() {
    let (p, _) = profiler(r#"{"delay_iterations": 3, "max_iterations": 4}"#);
    run(&p, &[DECODE; 2]);
    p.start().unwrap();
    let s = p.status();
    assert_eq!(
        (
            s.phase,
            s.active,
            s.step_index,
            s.delay_iterations,
            s.max_iterations,
            s.window_first_step
        ),
        ("delaying", true, 2, 3, 4, None)
    );
    run(&p, &[DECODE; 4]);
    let s = p.status();
    assert_eq!(
        (s.phase, s.window_first_step, s.iterations_captured),
        ("running", Some(5), 2)
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["phase"], "running");
    assert_eq!(json["backend"], "recording");
    assert_eq!(json["windows"], 1);
}

#[test]
fn status_after_a_stop_keeps_what_the_window_captured() {
    // A manual stop mid-window: the window counts as done, its captures stay in the status.
    let (p, _rec) = profiler(r#"{"delay_iterations": 2, "max_iterations": 10}"#);
    p.start().unwrap();
    run(&p, &[DECODE; 4]);
    assert_eq!(p.status().iterations_captured, 3);
    p.stop().unwrap();
    let s = p.status();
    assert_eq!(
        (s.phase, s.active, s.iterations_captured, s.windows_done),
        ("idle", false, 3, 1)
    );
    // Stopped by its max: max captures, one window done; a new session starts from zero.
    let (p, _rec) = profiler(r#"{"max_iterations": 2}"#);
    p.start().unwrap();
    run(&p, &[DECODE; 5]);
    let s = p.status();
    assert_eq!(
        (s.phase, s.iterations_captured, s.windows_done),
        ("idle", 2, 1)
    );
    p.start().unwrap();
    let s = p.status();
    assert_eq!((s.iterations_captured, s.windows_done), (0, 0));
    // A stop while still delaying captured nothing and completes no window.
    let (p, _rec) = profiler(r#"{"delay_iterations": 5}"#);
    p.start().unwrap();
    run(&p, &[DECODE; 2]);
    p.stop().unwrap();
    let s = p.status();
    assert_eq!((s.iterations_captured, s.windows_done), (0, 0));
}

/// The random capture-control config of a property test: a start step excludes a delay and a
/// batch minimum (the config refuses both), windows are at least max + 1 apart.
struct Control {
    delay: u64,
    stages: Vec<&'static str>,
    min_reqs: u64,
    every: u64,
    json: String,
}

impl Control {
    fn new(
        delay: u64,
        max: u64,
        stage_bits: u8,
        min_reqs: u64,
        start_at: Option<u64>,
        repeat: u64,
        gap: u64,
    ) -> Self {
        let names = ["prefill", "decode", "mixed", "idle"];
        let stages: Vec<&'static str> = (0..4)
            .filter(|b| stage_bits & (1 << b) != 0)
            .map(|b| names[b])
            .collect();
        let every = max + 1 + gap;
        let (delay, min_reqs) = if start_at.is_some() {
            (0, 0)
        } else {
            (delay, min_reqs)
        };
        let start_key = start_at.map_or(String::new(), |s| format!(r#""start_at_step": {s},"#));
        let json = format!(
            r#"{{"profiler": "cuda", "delay_iterations": {delay}, "max_iterations": {max},
                "stepscope": {{{start_key} "stages": {stages:?}, "min_batch_requests": {min_reqs},
                "repeat": {repeat}, "repeat_every": {every}}}}}"#
        );
        Control {
            delay,
            stages,
            min_reqs,
            every,
            json,
        }
    }

    fn profiler(&self) -> (WorkerProfiler, Recording) {
        let cfg = ProfilerConfig::from_json_str(&self.json).unwrap();
        let rec = Recording::default();
        let p = WorkerProfiler::with_backend(&cfg, "prop", Box::new(rec.clone()));
        (p, rec)
    }
}

fn stage_of(i: u8) -> IterationInfo {
    [PREFILL, DECODE, MIXED, IterationInfo::default()][usize::from(i % 4)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the iterations, stage filter, batch minimum and repeats: only chosen stages are
    /// captured, no window captures more than max, there are at most `repeat` windows per
    /// start, none before the start step, and window k begins no earlier than
    /// repeat_every·k steps after the first.
    #[test]
    fn capture_control_invariants(
        delay in 0u64..4,
        max in 1u64..4,
        stages in 1u8..16,
        min_reqs in 0u64..10,
        repeat in 1u64..4,
        gap in 0u64..4,
        start_at in proptest::option::of(1u64..12),
        kinds in proptest::collection::vec(0u8..4, 0..60),
    ) {
        let c = Control::new(delay, max, stages, min_reqs, start_at, repeat, gap);
        let (p, rec) = c.profiler();
        let (chosen, every) = (c.stages, c.every);
        p.start().unwrap();
        let mut captured = Vec::new();
        for k in &kinds {
            let info = stage_of(*k);
            let it = p.step(&info);
            if it.is_captured() {
                captured.push((p.step_index(), info));
            }
        }
        for (step, info) in &captured {
            prop_assert!(chosen.contains(&info.stage().as_str()), "step {} of stage {:?}", step, info.stage());
            if let Some(s) = start_at {
                prop_assert!(*step >= s);
            }
        }
        let starts: Vec<u64> = rec.lifecycle().iter().filter_map(|c| match c {
            Call::Start { first_step } => Some(*first_step),
            _ => None,
        }).collect();
        prop_assert!(starts.len() as u64 <= repeat);
        for (k, first) in starts.iter().enumerate() {
            prop_assert!(*first >= starts[0] + k as u64 * every, "window {} of {:?} before its due step", k, starts);
        }
        // Captured iterations per window.
        for (i, first) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(u64::MAX);
            let n = captured.iter().filter(|(s, _)| s >= first && *s < end).count() as u64;
            prop_assert!(n <= max, "window at {} captured {} > max {}", first, n, max);
        }
        // Starts and stops alternate, pauses only inside a window.
        let mut open = false;
        let mut paused = false;
        for c in rec.lifecycle() {
            match c {
                Call::Start { .. } => { prop_assert!(!open); open = true; paused = false; }
                Call::Stop => { prop_assert!(open); open = false; }
                Call::Pause => { prop_assert!(open && !paused); paused = true; }
                Call::Resume => { prop_assert!(open && paused); paused = false; }
                _ => {}
            }
        }
    }
}

/// The capture-control semantics as the config reference states them, written independently
/// of `schedule.rs`, for the CUDA-like backend (no torch schedule): what the backend is asked
/// to do, and which steps are captured.
#[derive(Debug, Default)]
struct Model {
    // config
    delay: u64,
    max: u64,
    stages: Vec<&'static str>,
    min_reqs: u64,
    start_at: Option<u64>,
    repeat: u64,
    every: u64,
    // session
    active: bool,
    collecting: bool,
    paused: bool,
    failed: bool,
    between: bool,
    started: bool,
    s_delay: u64,
    s_max: u64,
    target: Option<u64>,
    qualified: bool,
    counted_for_delay: u64,
    profiled: u64,
    first_window: u64,
    windows_done: u64,
    fail_next_start: bool,
    // world
    steps: u64,
    lifecycle: Vec<Call>,
    captured: Vec<u64>,
}

impl Model {
    fn gated(&self) -> bool {
        self.stages.len() < 4 || self.min_reqs > 0
    }

    fn backend_start(&mut self, first_step: u64) {
        self.lifecycle.push(Call::Start { first_step });
        self.started = true;
        if std::mem::take(&mut self.fail_next_start) {
            self.failed = true;
        } else {
            self.collecting = true;
        }
    }

    fn reset(&mut self) {
        self.active = false;
        self.collecting = false;
        self.paused = false;
        self.failed = false;
        self.between = false;
        self.started = false;
    }

    fn start(&mut self, delay: Option<u64>, max: Option<u64>, at: Option<u64>) {
        if self.active {
            return;
        }
        let target = at.or(if delay.is_none() { self.start_at } else { None });
        if target.is_some_and(|t| t <= self.steps) {
            return; // refused: the step has passed
        }
        self.active = true;
        self.s_delay = delay.unwrap_or(self.delay);
        self.s_max = max.unwrap_or(self.max);
        self.target = target;
        self.qualified = self.min_reqs == 0;
        self.counted_for_delay = 0;
        self.profiled = 0;
        self.windows_done = 0;
        if target.is_none() && self.s_delay == 0 && !self.gated() {
            self.first_window = self.steps + 1;
            self.backend_start(self.steps + 1);
        }
    }

    fn stop(&mut self) {
        if !self.active {
            return;
        }
        if self.collecting || self.paused {
            self.lifecycle.push(Call::Stop);
        }
        self.reset();
    }

    fn shutdown(&mut self) {
        if self.collecting || self.paused {
            self.stop();
        }
    }

    fn step(&mut self, info: &IterationInfo) {
        self.steps += 1;
        if !self.active {
            return;
        }
        let chosen = self.stages.contains(&info.stage().as_str());
        let requests = u64::from(info.num_ctx_reqs + info.num_gen_reqs);
        if self.between {
            let due = self.first_window + self.windows_done * self.every;
            if self.steps >= due && chosen && requests >= self.min_reqs {
                self.between = false;
                self.backend_start(self.steps);
            }
        } else if !self.started {
            let go = match self.target {
                Some(t) => self.steps >= t && chosen,
                None => {
                    self.qualified |= requests >= self.min_reqs;
                    if self.qualified && chosen {
                        self.counted_for_delay += 1;
                    }
                    self.qualified && chosen && self.counted_for_delay >= self.s_delay.max(1)
                }
            };
            if go {
                self.first_window = self.steps;
                self.backend_start(self.steps);
            }
        } else if self.collecting && !chosen {
            self.lifecycle.push(Call::Pause);
            self.collecting = false;
            self.paused = true;
        } else if self.paused && chosen {
            self.lifecycle.push(Call::Resume);
            self.collecting = true;
            self.paused = false;
        }
        if self.collecting {
            self.profiled += 1;
            if self.s_max > 0 && self.profiled > self.s_max {
                self.windows_done += 1;
                self.lifecycle.push(Call::Stop);
                self.collecting = false;
                if self.windows_done < self.repeat.max(1) {
                    self.between = true;
                    self.profiled = 0;
                } else {
                    self.reset();
                }
                return;
            }
            self.captured.push(self.steps);
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Start(Option<u64>, Option<u64>, Option<u64>),
    Stop,
    Step(u8, bool),
    Shutdown,
    FailNextStart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (
            proptest::option::of(0u64..4),
            proptest::option::of(0u64..4),
            proptest::option::weighted(0.2, 1u64..40)
        )
            .prop_map(|(d, m, a)| Op::Start(d, m, a)),
        1 => Just(Op::Stop),
        10 => (0u8..4, any::<bool>()).prop_map(|(k, big)| Op::Step(k, big)),
        1 => Just(Op::Shutdown),
        1 => Just(Op::FailNextStart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The implementation against the model above, op by op: the backend calls and the
    /// captured steps agree, and so do is_active and is_running.
    #[test]
    fn capture_control_matches_its_reference_model(
        delay in 0u64..4,
        max in 1u64..4,
        stages in 1u8..16,
        min_reqs in proptest::option::weighted(0.3, 1u64..20),
        start_at in proptest::option::weighted(0.2, 1u64..30),
        repeat in 1u64..4,
        gap in 0u64..4,
        ops in proptest::collection::vec(op(), 0..80),
    ) {
        let c = Control::new(delay, max, stages, min_reqs.unwrap_or(0), start_at, repeat, gap);
        let (imp, rec) = c.profiler();
        let mut model = Model {
            delay: c.delay, max, stages: c.stages, min_reqs: c.min_reqs, start_at, repeat,
            every: c.every,
            ..Model::default()
        };
        let mut captured = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Start(d, m, a) => {
                    let opts = StartOptions { delay_iterations: *d, max_iterations: *m, start_at_step: *a };
                    let _ = imp.start_with(opts);
                    model.start(*d, *m, *a);
                }
                Op::Stop => {
                    let _ = imp.stop();
                    model.stop();
                }
                Op::Step(kind, big) => {
                    let mut info = stage_of(*kind);
                    if *big {
                        info.num_gen_reqs += 20;
                    }
                    if imp.step(&info).is_captured() {
                        captured.push(imp.step_index());
                    }
                    model.step(&info);
                }
                Op::Shutdown => {
                    let _ = imp.shutdown();
                    model.shutdown();
                }
                Op::FailNextStart => {
                    rec.fail_only_next_start();
                    model.fail_next_start = true;
                }
            }
            if !model.fail_next_start {
                rec.clear_start_plan();
            }
            prop_assert_eq!(rec.lifecycle(), model.lifecycle.clone(), "backend calls after op {} {:?}", i, op);
            prop_assert_eq!(&captured, &model.captured, "captured steps after op {} {:?}", i, op);
            prop_assert_eq!(imp.is_active(), model.active, "is_active after op {} {:?}", i, op);
            prop_assert_eq!(imp.is_running(), model.collecting, "is_running after op {} {:?}", i, op);
        }
    }
}

/// A toy engine: one step per entry, each lasting about that many milliseconds inside its
/// guard. Returns the captured steps.
fn engine(p: &WorkerProfiler, step_ms: &[u64]) -> Vec<u64> {
    step_ms
        .iter()
        .filter_map(|ms| {
            let it = p.step(&DECODE);
            std::thread::sleep(std::time::Duration::from_millis(*ms));
            it.is_captured().then(|| p.step_index())
        })
        .collect()
}

#[test]
fn a_slow_step_starts_the_window_in_the_next_iteration() {
    // Steps of 0 ms against a 100 ms threshold; step 4 takes 300 ms, step 9 too.
    let (p, rec) = profiler(r#"{"max_iterations": 3, "stepscope": {"slow_step_ms": 100}}"#);
    assert!(matches!(p.start(), Ok(StartOutcome::Armed { delay: 0 })));
    assert_eq!(p.status().phase, "watching");
    let mut steps = [0u64; 12];
    steps[3] = 300;
    steps[8] = 300;
    assert_eq!(engine(&p, &steps), [5, 6, 7]);
    assert_eq!(rec.captured_steps(), [5, 6, 7]);
    let trigger = rec.triggers.lock()[0].expect("the start names its slow step");
    assert_eq!(trigger.step, 4);
    assert!(trigger.duration_ns >= 300_000_000);
    let status = p.status();
    assert_eq!(status.trigger_step.map(|t| t.step), Some(4));
    assert_eq!(status.slowest_step.map(|t| t.step), Some(4));
    assert_eq!(status.slow_step_ms, Some(100.0));
    // One window: a later slow step starts nothing.
    assert!(!p.is_active());
}

#[test]
fn a_factor_trigger_ignores_a_uniformly_slow_run_then_fires_on_an_outlier() {
    let (p, rec) = profiler(r#"{"max_iterations": 2, "stepscope": {"slow_step_factor": 10}}"#);
    p.start().unwrap();
    // 30 steps of 5 ms: the median is 5 ms, no step is 10x slower.
    assert!(engine(&p, &[5; 30]).is_empty());
    assert_eq!(p.status().phase, "watching");
    let median = p.status().median_step_ms.expect("a median after 30 steps");
    assert!(median >= 5.0, "median {median} ms");
    // Step 32 takes 400 ms: the window is 33 and 34.
    let mut steps = [5u64; 8];
    steps[1] = 400;
    assert_eq!(engine(&p, &steps), [33, 34]);
    assert_eq!(rec.triggers.lock()[0].map(|t| t.step), Some(32));
}

/// Request ids that count how often they are read.
struct CountedIds(Vec<String>, std::cell::Cell<usize>);

impl stepscope::RequestIds for CountedIds {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn for_each_id(&self, f: &mut dyn FnMut(&str)) {
        self.1.set(self.1.get() + 1);
        self.0.as_slice().for_each_id(f);
    }
}

#[test]
fn request_ids_are_read_only_for_captured_iterations_and_only_when_asked_for() {
    let ids = |step: u64| CountedIds(vec![format!("r{step}"), "shared".into()], 0.into());
    let (p, rec) = profiler(
        r#"{"delay_iterations": 2, "max_iterations": 2, "stepscope": {"request_ids": true}}"#,
    );
    assert!(!p.wants_request_ids(), "nothing armed");
    p.start().unwrap();
    assert!(p.wants_request_ids());
    let mut reads = Vec::new();
    for step in 1..=5 {
        let r = ids(step);
        drop(p.step_with_requests(&DECODE, &r));
        reads.push(r.1.get());
    }
    // Steps 2 and 3 are captured (delay 2, max 2): only their ids are read.
    assert_eq!(reads, [0, 1, 1, 0, 0]);
    assert_eq!(
        *rec.requests.lock(),
        [
            (2, vec!["r2".to_string(), "shared".into()]),
            (3, vec!["r3".to_string(), "shared".into()])
        ]
    );
    assert!(!p.wants_request_ids(), "the session ended");

    // Off (the default): ids passed anyway are never read.
    let (p, rec) = profiler(r#"{"max_iterations": 2}"#);
    p.start().unwrap();
    assert!(!p.wants_request_ids());
    let r = ids(1);
    drop(p.step_with_requests(&DECODE, &r));
    assert_eq!(r.1.get(), 0);
    assert!(rec.requests.lock().is_empty());
    assert_eq!(rec.captured_steps(), [1]);
}
