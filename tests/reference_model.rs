//! Property test: random sequences of start/stop/step/shutdown, with random delay, max,
//! warmup/wait and backend failures, through both the implementation and a reference model
//! transliterated from vLLM 0.32's `WorkerProfiler`/`TorchProfilerWrapper`
//! (vllm/profiler/wrapper.py). After every call the two must agree on `is_active`,
//! `is_running` and every backend call so far.

mod support;

use proptest::prelude::*;
use stepscope::{IterationInfo, ProfilerConfig, StartOptions, WorkerProfiler};
use support::{Call, Recording};

/// vLLM's WorkerProfiler, line for line, over a fake backend whose starts fail on plan.
struct Reference {
    default_delay: u64,
    default_max: u64,
    delay: u64,
    max: u64,
    active: bool,
    running: bool,
    active_iteration_count: u64,
    profiling_for_iters: u64,
    // TorchProfilerWrapper: schedule only with wait or warmup > 0.
    uses_schedule: bool,
    initial_warmup_steps_remaining: u64,
    warmup_steps_remaining: u64,
    // The fake backend.
    fail_next_start: bool,
    steps: u64,
    calls: Vec<Call>,
}

impl Reference {
    fn new(delay: u64, max: u64, torch: bool, wait: u64, warmup: u64) -> Self {
        let uses_schedule = torch && (warmup > 0 || wait > 0);
        Reference {
            default_delay: delay,
            default_max: max,
            delay,
            max,
            active: false,
            running: false,
            active_iteration_count: 0,
            profiling_for_iters: 0,
            uses_schedule,
            initial_warmup_steps_remaining: (wait + warmup).saturating_sub(1),
            warmup_steps_remaining: 0,
            fail_next_start: false,
            steps: 0,
            calls: Vec::new(),
        }
    }

    fn _start(&mut self, first_step: u64) -> bool {
        self.calls.push(Call::Start { first_step });
        self.warmup_steps_remaining = self.initial_warmup_steps_remaining;
        !std::mem::take(&mut self.fail_next_start)
    }

    fn call_start(&mut self, first_step: u64) {
        if self._start(first_step) {
            self.running = true;
        }
    }

    fn call_stop(&mut self) {
        self.calls.push(Call::Stop);
        self.running = false;
    }

    fn start(&mut self, delay: Option<u64>, max: Option<u64>) {
        if self.active {
            return;
        }
        self.delay = delay.unwrap_or(self.default_delay);
        self.max = max.unwrap_or(self.default_max);
        self.active = true;
        if self.delay == 0 {
            self.call_start(self.steps + 1);
        }
    }

    fn profiler_step(&mut self) -> bool {
        self.calls.push(Call::Advance);
        if self.uses_schedule && self.warmup_steps_remaining > 0 {
            self.warmup_steps_remaining -= 1;
            return false;
        }
        true
    }

    /// Worker.annotate_profile: profiler.step(), then annotate while running.
    fn step(&mut self) {
        self.steps += 1;
        self.wrapper_step();
        if self.running {
            self.calls.push(Call::Begin {
                step: self.steps,
                info: IterationInfo::default(),
            });
            self.calls.push(Call::End);
        }
    }

    fn wrapper_step(&mut self) {
        if !self.active {
            return;
        }
        self.active_iteration_count += 1;
        if !self.running && self.delay > 0 && self.active_iteration_count == self.delay {
            self.call_start(self.steps);
        }
        if self.running && self.profiler_step() {
            self.profiling_for_iters += 1;
        }
        if self.max > 0 && self.running && self.profiling_for_iters > self.max {
            self.stop();
        }
    }

    fn stop(&mut self) {
        if !self.active {
            return;
        }
        self.active = false;
        self.active_iteration_count = 0;
        self.profiling_for_iters = 0;
        if self.running {
            self.call_stop();
        }
    }

    fn shutdown(&mut self) {
        if self.running {
            self.stop();
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Start(Option<u64>, Option<u64>),
    Stop,
    Step,
    Shutdown,
    FailNextStart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (proptest::option::of(0u64..5), proptest::option::of(0u64..5))
            .prop_map(|(d, m)| Op::Start(d, m)),
        1 => Just(Op::Stop),
        8 => Just(Op::Step),
        1 => Just(Op::Shutdown),
        1 => Just(Op::FailNextStart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn implementation_matches_vllm_reference(
        delay in 0u64..5,
        max in 0u64..5,
        torch in any::<bool>(),
        wait in 0u64..3,
        warmup in 0u64..3,
        ops in proptest::collection::vec(op(), 0..80),
    ) {
        let json = if torch {
            format!(r#"{{"profiler": "torch", "torch_profiler_dir": "/tmp/stepscope-prop",
                "delay_iterations": {delay}, "max_iterations": {max},
                "wait_iterations": {wait}, "warmup_iterations": {warmup}}}"#)
        } else {
            format!(r#"{{"profiler": "cuda", "delay_iterations": {delay}, "max_iterations": {max},
                "warmup_iterations": {warmup}}}"#)
        };
        let cfg = ProfilerConfig::from_json_str(&json).unwrap();
        let rec = Recording::default();
        let imp = WorkerProfiler::with_backend(&cfg, "prop", Box::new(rec.clone()));
        let mut reference = Reference::new(delay, max, torch, wait, warmup);

        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Start(d, m) => {
                    let _ = imp.start_with(StartOptions { delay_iterations: *d, max_iterations: *m, start_at_step: None });
                    reference.start(*d, *m);
                }
                Op::Stop => {
                    let _ = imp.stop();
                    reference.stop();
                }
                Op::Step => {
                    drop(imp.step(&IterationInfo::default()));
                    reference.step();
                }
                Op::Shutdown => {
                    let _ = imp.shutdown();
                    reference.shutdown();
                }
                Op::FailNextStart => {
                    // Replace any unused plan: one failure armed at a time, as in the model.
                    rec.fail_only_next_start();
                    reference.fail_next_start = true;
                }
            }
            // A start that consumed the plan in the model consumed it in the implementation.
            if !reference.fail_next_start {
                rec.clear_start_plan();
            }
            prop_assert_eq!(imp.is_active(), reference.active, "is_active after op {} {:?}", i, op);
            prop_assert_eq!(imp.is_running(), reference.running, "is_running after op {} {:?}", i, op);
            prop_assert_eq!(rec.calls(), reference.calls.clone(), "backend calls after op {} {:?}", i, op);
        }
    }
}
