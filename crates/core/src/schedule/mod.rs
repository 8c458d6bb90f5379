//! The pure capture schedule: vLLM 0.32's `WorkerProfiler` state machine, with no I/O, clocks
//! or threads.
//!
//! Inputs are calls (`start`, `stop`, a step, `shutdown`, and the outcome of a backend start);
//! outputs are decisions the caller carries out on the backend. vLLM's semantics, which the
//! tests pin down case by case:
//!
//! - `start(delay, max)`: overrides apply to this session only and revert to the config's
//!   values at the next start; a start while active is ignored; with delay 0 the backend starts
//!   at once, otherwise in the step whose count since the start equals the delay.
//! - A step counts only while active. While running, each step counts toward max, except the
//!   wait/warmup steps of a torch schedule. When the counted steps exceed max (strictly `> N`)
//!   the profiler goes through the full stop, so a later start works.
//! - `stop()` while inactive is ignored; otherwise it clears the session and stops the backend
//!   if it runs. A stop during the delay never touches the backend.
//! - A backend start that fails leaves the session active and not running until `stop()`.
//!
//! One state exists that vLLM does not have: [`Phase::Starting`], a start whose outcome is not
//! known yet because it waits for the engine thread (see `WorkerProfiler`).
//!
//! stepscope's capture control ([`Policy`], from the config's `"stepscope"` keys) adds two
//! more, and changes nothing when absent:
//! - `start_at_step` replaces the delay: the backend starts in the step with that index.
//! - `min_batch_*`: the delay counts from the first iteration that reaches that size; `stages`:
//!   only iterations of those stages count toward delay and max. With either, a delay of 0
//!   means "in the first iteration that qualifies". While running, an iteration of another
//!   stage pauses the backend ([`Phase::Paused`]) until one of a chosen stage resumes it.
//! - `repeat`: after a window ends by its max, the session waits ([`Phase::Between`]) and the
//!   next window starts `repeat_every` steps after the previous one started, or at the first
//!   qualifying step after that: of a chosen stage and, with `min_batch_*`, of that size (every
//!   window of the series waits for a batch of the size asked for, not only the first).
//! - `slow_step_ms` / `slow_step_factor`: after the start (and its delay, if any), the session
//!   watches ([`Phase::Watching`]) the durations the caller measures ([`StepInfo::previous_ns`])
//!   and the window begins in the first qualifying step after a slow one ([`slow`]). With
//!   `repeat`, each later window waits for a new slow step.
//!
//! The capture budget ([`Budget`]) is judged here too, from what the caller measures (the
//! process's growth, the window's age): a window over it ends through the full stop.

mod budget;
mod counters;
mod options;
mod policy;
mod slow;
mod step;

pub use budget::{Budget, CutBy, CutShort};
pub use counters::Limits;
pub use options::StartOptions;
pub use policy::Policy;
pub(crate) use policy::ALL_STAGES;
pub use slow::{Detector, SlowStep, SlowStepSeen, MIN_SAMPLES, WINDOW};
pub use step::StepInfo;

use counters::Counters;
pub(crate) use policy::stage_bit;
use policy::Series;

/// The named states of a capture session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No session. `start()` arms one.
    Idle,
    /// A session waits for its delay to pass; the backend is untouched.
    Delaying,
    /// The backend start was decided but has not happened yet (it waits for the engine
    /// thread). Becomes `Running` or `StartFailed` with [`Schedule::start_result`].
    Starting,
    /// The backend captures.
    Running,
    /// The backend failed to start. As in vLLM the session stays active, and no further start
    /// is tried until `stop()` ends it.
    StartFailed,
    /// The backend started and is paused over an iteration of a stage not chosen (`stages`).
    Paused,
    /// Between two windows of a repeated session (`repeat`): the backend is stopped.
    Between,
    /// A session with a slow-step trigger waits for a slow step; the backend is untouched.
    Watching,
}

impl Phase {
    /// The state's name: `idle`, `delaying`, `starting`, `running`, `start_failed`, `paused`,
    /// `between` or `watching`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Delaying => "delaying",
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::StartFailed => "start_failed",
            Phase::Paused => "paused",
            Phase::Between => "between",
            Phase::Watching => "watching",
        }
    }
}

/// What `start()` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartDecision {
    /// A session is already active: the request is ignored.
    AlreadyActive,
    /// The session waits `delay` steps before starting the backend.
    Armed {
        /// The session's delay.
        delay: u64,
    },
    /// Start the backend now and report with [`Schedule::start_result`].
    StartBackend,
    /// The backend starts in the step with this index (`start_at_step`).
    ArmedAt {
        /// The session's start step.
        step: u64,
    },
    /// The requested start step has already passed: nothing started.
    Passed {
        /// The requested start step.
        step: u64,
        /// The index of the last step taken.
        now: u64,
    },
}

/// What `stop()` (or `shutdown()`) decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopDecision {
    /// No session was active: ignored.
    NotActive,
    /// The session ended before its backend started; the backend was never touched.
    Disarmed,
    /// The session ended while its backend start was still pending: drop that start.
    CancelStart,
    /// The session ended while running: stop the backend.
    StopBackend,
}

/// What the first half of a step decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepBegin {
    /// No session: the step does nothing more.
    Inactive,
    /// The step counted; call [`Schedule::end_step`].
    Counted,
    /// The delay has just passed (or a repeated session's next window is due): start the
    /// backend, report with `start_result`, then call [`Schedule::end_step`].
    StartBackend,
    /// An iteration of a stage not chosen: pause the backend over it.
    PauseBackend,
    /// An iteration of a chosen stage after a pause: resume the backend.
    ResumeBackend,
}

/// What the second half of a step decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepEnd {
    /// The backend is running: advance its own schedule (torch's wait/warmup/active).
    pub advance_backend: bool,
    /// This step counted toward max (not a wait/warmup step).
    pub counted: bool,
    /// Max was exceeded: the session went through the full stop; stop the backend.
    pub stop_backend: bool,
}

/// vLLM's `WorkerProfiler` counters and flags, as a pure state machine, with stepscope's
/// capture control: vLLM's counters ([`Counters`](counters)) and the policy's session state
/// ([`Series`](policy)) apart, each transition written once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    counters: Counters,
    policy: Policy,
    series: Series,
    phase: Phase,
}

impl Schedule {
    /// A schedule with the config's delay and max, and `uncounted_after_start` running steps
    /// after each backend start that do not count toward max (torch's wait + warmup − 1; see
    /// [`crate::config::ProfilerConfig::uncounted_steps_after_start`]).
    pub fn new(defaults: Limits, uncounted_after_start: u64) -> Self {
        Self::with_policy(defaults, uncounted_after_start, Policy::default())
    }

    /// The same with stepscope's capture control.
    pub fn with_policy(defaults: Limits, uncounted_after_start: u64, policy: Policy) -> Self {
        Schedule {
            counters: Counters::new(defaults, uncounted_after_start),
            policy,
            series: Series {
                detector: policy.slow.map(Detector::new),
                ..Series::default()
            },
            phase: Phase::Idle,
        }
    }

    /// The current state.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// A session is active (vLLM's `_active`).
    pub fn is_active(&self) -> bool {
        self.phase != Phase::Idle
    }

    /// The backend captures (vLLM's `_running`); false while paused over another stage.
    pub fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    /// The limits of the current (or last) session.
    pub fn limits(&self) -> Limits {
        self.counters.limits
    }

    /// Steps counted since the session's start (vLLM's `_active_iteration_count`).
    pub fn steps_since_start(&self) -> u64 {
        self.counters.since_start
    }

    /// Steps counted toward max in the current window (vLLM's `_profiling_for_iters`).
    pub fn profiled_steps(&self) -> u64 {
        self.counters.profiled
    }

    /// The session's absolute start step, if it has one.
    pub fn target_step(&self) -> Option<u64> {
        self.series.target_step
    }

    /// Steps captured in the current window, or in the last one once it has ended (by its
    /// max or by a stop). Unlike [`Schedule::profiled_steps`], a stop does not reset it.
    pub fn captured_steps(&self) -> u64 {
        self.series.captured
    }

    /// Windows this session has completed: by their max, or by a stop while capturing.
    pub fn windows_done(&self) -> u64 {
        self.series.windows_done
    }

    /// The step the current window's backend started in (or was asked to), once one has.
    pub fn window_start(&self) -> Option<u64> {
        matches!(
            self.phase,
            Phase::Starting | Phase::Running | Phase::Paused | Phase::StartFailed
        )
        .then_some(self.series.window_start)
    }

    /// The session waits for a slow step: the caller times each step and passes the previous
    /// one's duration to [`Schedule::begin_step`].
    pub fn times_steps(&self) -> bool {
        self.phase == Phase::Watching && self.series.fired.is_none()
    }

    /// The slow-step trigger of the policy, if any.
    pub fn slow_step(&self) -> Option<SlowStep> {
        self.series.detector.as_ref().map(Detector::trigger)
    }

    /// The slow step the current (or last) window follows.
    pub fn window_trigger(&self) -> Option<SlowStepSeen> {
        self.series.fired
    }

    /// The slowest step timed in this (or the last) session.
    pub fn slowest_step(&self) -> Option<SlowStepSeen> {
        self.series.detector.as_ref().and_then(Detector::slowest)
    }

    /// The running median of the steps timed, once there are enough of them.
    pub fn median_step_ns(&self) -> Option<u64> {
        self.series.detector.as_ref().and_then(Detector::median_ns)
    }

    /// Windows per session under the policy.
    pub fn windows(&self) -> u64 {
        self.policy.repeat.max(1)
    }

    /// The step the next window of a repeated session is due in (while [`Phase::Between`]).
    pub fn next_window_at(&self) -> Option<u64> {
        (self.phase == Phase::Between).then(|| self.series.window_due(&self.policy))
    }

    /// Begins a session; `now` is the index of the last step taken (0 before the first).
    /// `None` fields keep the config's values, for this session only.
    /// An explicit delay overrides the config's `start_at_step`; an explicit start step
    /// overrides the config's delay.
    pub fn start(&mut self, request: StartOptions, now: u64) -> StartDecision {
        if self.is_active() {
            return StartDecision::AlreadyActive;
        }
        let target = match (request.start_at_step, request.delay_iterations) {
            (Some(step), _) => Some(step),
            (None, Some(_)) => None,
            (None, None) => self.policy.start_at_step,
        };
        if let Some(step) = target.filter(|s| *s <= now) {
            return StartDecision::Passed { step, now };
        }
        self.counters
            .begin(request.delay_iterations, request.max_iterations);
        self.series.begin(&self.policy, target);
        let delay = self.counters.limits.delay;
        if self.series.triggered && delay == 0 {
            self.phase = Phase::Watching;
            return StartDecision::Armed { delay: 0 };
        }
        if let Some(step) = target {
            self.phase = Phase::Delaying;
            return StartDecision::ArmedAt { step };
        }
        if delay == 0 && !self.policy.gated() {
            self.enter_starting(now + 1);
            StartDecision::StartBackend
        } else {
            self.phase = Phase::Delaying;
            StartDecision::Armed { delay }
        }
    }

    /// A window's backend start is decided, in step `index`: the one place a window begins.
    fn enter_starting(&mut self, index: u64) {
        self.phase = Phase::Starting;
        self.series.window_begins(index);
    }

    /// Reports the outcome of the backend start that `start` or `begin_step` asked for.
    pub fn start_result(&mut self, started: bool) {
        if self.phase != Phase::Starting {
            return;
        }
        if started {
            self.phase = Phase::Running;
            self.counters.backend_started();
        } else {
            self.phase = Phase::StartFailed;
        }
    }

    /// Ends the session: the full stop (vLLM's public `stop()`).
    pub fn stop(&mut self) -> StopDecision {
        let decision = match self.phase {
            Phase::Idle => return StopDecision::NotActive,
            Phase::Delaying | Phase::StartFailed | Phase::Between | Phase::Watching => {
                StopDecision::Disarmed
            }
            Phase::Starting => StopDecision::CancelStart,
            Phase::Running | Phase::Paused => {
                // A window cut short by the stop still counts as done.
                self.series.windows_done += 1;
                StopDecision::StopBackend
            }
        };
        self.end_session();
        decision
    }

    /// Back to idle, vLLM's counters reset (status keeps `captured` and `windows_done`).
    fn end_session(&mut self) {
        self.phase = Phase::Idle;
        self.counters.reset();
        self.series.target_step = None;
    }

    /// vLLM's `shutdown()`: stops only a session whose backend runs (paused or not), or one
    /// whose start is pending, which could otherwise never be carried out.
    pub fn shutdown(&mut self) -> StopDecision {
        match self.phase {
            Phase::Running | Phase::Paused | Phase::Starting => self.stop(),
            _ => StopDecision::NotActive,
        }
    }

    /// First half of a step: counts it and decides whether the backend starts, pauses or
    /// resumes in it.
    pub fn begin_step(&mut self, step: StepInfo) -> StepBegin {
        if self.phase == Phase::Idle {
            return StepBegin::Inactive;
        }
        self.counters.since_start += 1;
        let counts = self.policy.stage_counts(step.stage);
        match self.phase {
            Phase::Delaying => {
                let s = &mut self.series;
                let due = match s.target_step {
                    Some(target) => step.index >= target && counts,
                    None => {
                        s.qualify(&self.policy, &step);
                        if s.qualified && counts {
                            s.delay_counted += 1;
                        }
                        s.qualified
                            && counts
                            && s.delay_counted >= self.counters.limits.delay.max(1)
                    }
                };
                if due && s.triggered {
                    // The delay is over: the steps from this one on are timed.
                    self.phase = Phase::Watching;
                    StepBegin::Counted
                } else if due {
                    self.enter_starting(step.index);
                    StepBegin::StartBackend
                } else {
                    StepBegin::Counted
                }
            }
            Phase::Watching => {
                let s = &mut self.series;
                if s.fired.is_none() {
                    let previous = step.index.saturating_sub(1);
                    if let (Some(ns), Some(d)) = (step.previous_ns, s.detector.as_mut()) {
                        s.fired = d.observe(previous, ns);
                    }
                }
                s.qualify(&self.policy, &step);
                if s.fired.is_some() && s.qualified && counts {
                    self.enter_starting(step.index);
                    StepBegin::StartBackend
                } else {
                    StepBegin::Counted
                }
            }
            Phase::Between
                if step.index >= self.series.window_due(&self.policy)
                    && counts
                    && self.policy.batch_qualifies(&step) =>
            {
                self.enter_starting(step.index);
                StepBegin::StartBackend
            }
            Phase::Running if !counts => {
                self.phase = Phase::Paused;
                StepBegin::PauseBackend
            }
            Phase::Paused if counts => {
                self.phase = Phase::Running;
                StepBegin::ResumeBackend
            }
            // Idle returned above. A pending start is carried out before a step begins; were
            // it not, the step still counts and the backend is simply not running yet.
            _ => StepBegin::Counted,
        }
    }

    /// Second half of a step: counts it toward max while running, and applies the `> max`
    /// cutoff: through the full stop, or into the gap before a repeated session's next window.
    pub fn end_step(&mut self) -> StepEnd {
        if self.phase != Phase::Running {
            return StepEnd::default();
        }
        let (counted, exceeded) = self.counters.count_running();
        let mut end = StepEnd {
            advance_backend: true,
            counted,
            stop_backend: false,
        };
        if exceeded {
            // The step past max ends the window; it is not one of the window's captures.
            self.series.windows_done += 1;
            end.stop_backend = true;
            if self.series.windows_done < self.policy.repeat {
                if self.series.triggered {
                    self.phase = Phase::Watching;
                    self.series.rearm_trigger(&self.policy);
                } else {
                    self.phase = Phase::Between;
                }
                self.counters.profiled = 0;
            } else {
                self.end_session();
            }
        } else if counted {
            self.series.captured = self.counters.profiled;
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iteration::Stage;

    fn sched(delay: u64, max: u64) -> Schedule {
        Schedule::new(Limits { delay, max }, 0)
    }

    #[test]
    fn delay_zero_starts_in_start() {
        let mut s = sched(0, 0);
        assert_eq!(
            s.start(StartOptions::default(), 0),
            StartDecision::StartBackend
        );
        s.start_result(true);
        assert!(s.is_running());
    }

    #[test]
    fn stop_in_every_phase_resets_counters() {
        for (phase_steps, expect) in [(0, StopDecision::Disarmed), (2, StopDecision::StopBackend)] {
            let mut s = sched(2, 0);
            s.start(StartOptions::default(), 0);
            for _ in 0..phase_steps {
                if s.begin_step(StepInfo::default()) == StepBegin::StartBackend {
                    s.start_result(true);
                }
                s.end_step();
            }
            assert_eq!(s.stop(), expect);
            assert_eq!((s.steps_since_start(), s.profiled_steps()), (0, 0));
            assert_eq!(s.phase(), Phase::Idle);
        }
    }

    #[test]
    fn start_result_outside_starting_is_ignored() {
        let mut s = sched(3, 0);
        s.start(StartOptions::default(), 0);
        s.start_result(true);
        assert_eq!(s.phase(), Phase::Delaying);
    }

    /// Drives a schedule over steps of the given durations (ms) and stages, as the profiler
    /// does (the previous step's duration only when it was timed); returns the captured steps.
    fn captured_with(s: &mut Schedule, steps: &[(u64, Stage)]) -> Vec<u64> {
        let mut captured = Vec::new();
        let mut previous: Option<u64> = None;
        for (i, (ms, stage)) in steps.iter().enumerate() {
            let index = i as u64 + 1;
            let timed = s.times_steps();
            let info = StepInfo {
                index,
                stage: *stage,
                requests: 1,
                tokens: 1,
                previous_ns: None,
            }
            .after(if timed { previous } else { None });
            if s.begin_step(info) == StepBegin::StartBackend {
                s.start_result(true);
            }
            s.end_step();
            if s.is_running() {
                captured.push(index);
            }
            previous = s.times_steps().then_some(ms * 1_000_000);
        }
        captured
    }

    fn triggered(max: u64, slow: SlowStep, repeat: u64, stages: u8) -> Schedule {
        Schedule::with_policy(
            Limits { delay: 0, max },
            0,
            Policy {
                slow: Some(slow),
                repeat,
                stages,
                ..Policy::default()
            },
        )
    }

    const ABS_10MS: SlowStep = SlowStep {
        min_ns: 10_000_000,
        factor: 0.0,
    };

    #[test]
    fn slow_step_window_begins_in_the_step_after_the_first_slow_one() {
        let mut s = triggered(3, ABS_10MS, 1, 0);
        assert_eq!(
            s.start(StartOptions::default(), 0),
            StartDecision::Armed { delay: 0 }
        );
        assert_eq!(s.phase(), Phase::Watching);
        // Step 5 takes 25 ms; 9 too, after the window.
        let mut steps = vec![(1, Stage::Decode); 12];
        steps[4].0 = 25;
        steps[8].0 = 25;
        assert_eq!(captured_with(&mut s, &steps), [6, 7, 8]);
        let fired = s.window_trigger().expect("fired");
        assert_eq!((fired.step, fired.duration_ns), (5, 25_000_000));
        // One window: the session ended at its max, the later slow step starts nothing.
        assert_eq!(s.phase(), Phase::Idle);
    }

    #[test]
    fn repeated_slow_step_windows_each_wait_for_a_new_slow_step() {
        let mut s = triggered(2, ABS_10MS, 2, 0);
        s.start(StartOptions::default(), 0);
        let mut steps = vec![(1, Stage::Decode); 20];
        steps[2].0 = 30; // step 3: window 4, 5 (6 ends it)
        steps[4].0 = 30; // step 5 is captured: not timed, does not count
        steps[11].0 = 30; // step 12: window 13, 14
        assert_eq!(captured_with(&mut s, &steps), [4, 5, 13, 14]);
        assert_eq!(s.windows_done(), 2);
        assert_eq!(s.phase(), Phase::Idle);
    }

    #[test]
    fn slow_step_window_waits_for_a_chosen_stage() {
        let decode = stage_bit(Stage::Decode);
        let mut s = triggered(2, ABS_10MS, 1, decode);
        s.start(StartOptions::default(), 0);
        let mut steps = vec![(1, Stage::Decode); 10];
        steps[2] = (40, Stage::Decode);
        steps[3] = (1, Stage::Prefill);
        assert_eq!(captured_with(&mut s, &steps), [5, 6]);
    }

    #[test]
    fn relative_trigger_ignores_a_uniformly_slow_run_and_fires_on_an_outlier() {
        let factor = SlowStep {
            min_ns: 0,
            factor: 3.0,
        };
        let mut s = triggered(2, factor, 1, 0);
        s.start(StartOptions::default(), 0);
        let uniform = vec![(50, Stage::Decode); 400];
        assert_eq!(captured_with(&mut s, &uniform), Vec::<u64>::new());
        assert_eq!(s.phase(), Phase::Watching);
        assert_eq!(s.median_step_ns(), Some(50_000_000));

        let mut s = triggered(2, factor, 1, 0);
        s.start(StartOptions::default(), 0);
        let mut steps = vec![(50, Stage::Decode); 100];
        steps[59].0 = 200;
        assert_eq!(captured_with(&mut s, &steps), [61, 62]);
        assert_eq!(s.slowest_step().map(|x| x.step), Some(60));
    }

    #[test]
    fn slow_step_delay_comes_before_watching_and_stop_disarms() {
        let mut s = Schedule::with_policy(
            Limits { delay: 3, max: 1 },
            0,
            Policy {
                slow: Some(ABS_10MS),
                ..Policy::default()
            },
        );
        s.start(StartOptions::default(), 0);
        assert_eq!(s.phase(), Phase::Delaying);
        // Step 2 is slow but within the delay: not timed.
        let mut steps = vec![(1, Stage::Decode); 8];
        steps[1].0 = 50;
        steps[4].0 = 50;
        assert_eq!(captured_with(&mut s, &steps), [6]);
        s.start(StartOptions::default(), 8);
        assert_eq!(s.stop(), StopDecision::Disarmed);
    }
}
