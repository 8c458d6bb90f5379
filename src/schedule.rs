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
//!   next window starts `repeat_every` steps after the previous one started (or at the first
//!   qualifying step after that).

use crate::iteration::{IterationInfo, Stage};

/// Delay and max for one session, in engine iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Steps after the start before the backend starts (0: in `start()` itself).
    pub delay: u64,
    /// Counted steps to capture; the stop comes in the step that exceeds it. 0: no limit.
    pub max: u64,
}

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
}

impl Phase {
    /// The state's name: `idle`, `delaying`, `starting`, `running`, `start_failed`, `paused`
    /// or `between`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Delaying => "delaying",
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::StartFailed => "start_failed",
            Phase::Paused => "paused",
            Phase::Between => "between",
        }
    }
}

/// stepscope's capture control, beyond vLLM's delay and max. `Policy::default()` is vLLM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// Stages that count (bit `1 << stage index` in [`Stage::ALL`] order); 0: every stage.
    pub stages: u8,
    /// The delay counts from the first iteration with at least this many requests.
    pub min_batch_requests: u64,
    /// … and at least this many tokens.
    pub min_batch_tokens: u64,
    /// The config's absolute start step (replaces the delay), if any.
    pub start_at_step: Option<u64>,
    /// Windows per session (0 and 1: one).
    pub repeat: u64,
    /// Steps between the starts of two windows.
    pub repeat_every: u64,
}

impl Policy {
    fn stage_counts(&self, stage: Stage) -> bool {
        self.stages == 0 || self.stages & stage_bit(stage) != 0
    }

    fn batch_qualifies(&self, step: &StepInfo) -> bool {
        step.requests >= self.min_batch_requests && step.tokens >= self.min_batch_tokens
    }

    /// Whether starting waits for a qualifying iteration even with a delay of 0.
    fn gated(&self) -> bool {
        self.stages != 0 || self.min_batch_requests > 0 || self.min_batch_tokens > 0
    }
}

/// Every stage's bit: listing every stage is the same as no filter.
pub(crate) const ALL_STAGES: u8 = 0b1111;

/// The bit of `stage` in [`Policy::stages`].
pub(crate) fn stage_bit(stage: Stage) -> u8 {
    let i = Stage::ALL.iter().position(|s| *s == stage).unwrap_or(0);
    1 << i
}

/// What the schedule learns about one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepInfo {
    /// The step's index (the worker's `step()` count, from 1).
    pub index: u64,
    /// The iteration's stage.
    pub stage: Stage,
    /// Requests scheduled (context + generation).
    pub requests: u64,
    /// Tokens scheduled.
    pub tokens: u64,
}

impl StepInfo {
    /// The step `index` of an iteration with these counts.
    pub fn of(index: u64, info: &IterationInfo) -> Self {
        StepInfo {
            index,
            stage: info.stage(),
            requests: u64::from(info.num_ctx_reqs) + u64::from(info.num_gen_reqs),
            tokens: u64::from(info.num_ctx_tokens) + u64::from(info.num_gen_tokens),
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
/// capture control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    defaults: Limits,
    limits: Limits,
    uncounted_after_start: u64,
    policy: Policy,
    phase: Phase,
    since_start: u64,
    profiled: u64,
    uncounted_left: u64,
    /// Qualifying steps counted toward the delay (equals `since_start` under vLLM's policy).
    delay_counted: u64,
    /// The session's absolute start step, replacing the delay.
    target_step: Option<u64>,
    /// An iteration of the minimum batch size has been seen this session.
    qualified: bool,
    /// The step the session's first window started in.
    first_window_step: u64,
    /// The step the current (or last) window started in.
    window_start: u64,
    windows_done: u64,
    /// Steps captured in the current (or, after a stop, the last) window: kept for status
    /// after the stop resets vLLM's counters.
    captured: u64,
}

/// One session's start request: vLLM's per-session overrides (`None` keeps the config's value)
/// plus stepscope's absolute start step. What [`crate::WorkerProfiler::start_with`] takes and the
/// schedule decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StartOptions {
    /// Iterations to wait before the backend starts.
    pub delay_iterations: Option<u64>,
    /// Iterations to capture before stopping by itself (0: until stop).
    pub max_iterations: Option<u64>,
    /// Start in the step with this absolute index (the worker's `step()` count) instead of
    /// after a delay: the same value on every rank captures the same iterations everywhere.
    pub start_at_step: Option<u64>,
}

impl Schedule {
    /// A schedule with the config's delay and max, and `uncounted_after_start` running steps
    /// after each backend start that do not count toward max (torch's wait + warmup − 1; see
    /// [`crate::ProfilerConfig::uncounted_steps_after_start`]).
    pub fn new(defaults: Limits, uncounted_after_start: u64) -> Self {
        Self::with_policy(defaults, uncounted_after_start, Policy::default())
    }

    /// The same with stepscope's capture control.
    pub fn with_policy(defaults: Limits, uncounted_after_start: u64, policy: Policy) -> Self {
        Schedule {
            defaults,
            limits: defaults,
            uncounted_after_start,
            policy,
            phase: Phase::Idle,
            since_start: 0,
            profiled: 0,
            uncounted_left: 0,
            delay_counted: 0,
            target_step: None,
            qualified: false,
            first_window_step: 0,
            window_start: 0,
            windows_done: 0,
            captured: 0,
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
        self.limits
    }

    /// Steps counted since the session's start (vLLM's `_active_iteration_count`).
    pub fn steps_since_start(&self) -> u64 {
        self.since_start
    }

    /// Steps counted toward max in the current window (vLLM's `_profiling_for_iters`).
    pub fn profiled_steps(&self) -> u64 {
        self.profiled
    }

    /// The session's absolute start step, if it has one.
    pub fn target_step(&self) -> Option<u64> {
        self.target_step
    }

    /// Steps captured in the current window, or in the last one once it has ended (by its
    /// max or by a stop). Unlike [`Schedule::profiled_steps`], a stop does not reset it.
    pub fn captured_steps(&self) -> u64 {
        self.captured
    }

    /// Windows this session has completed: by their max, or by a stop while capturing.
    pub fn windows_done(&self) -> u64 {
        self.windows_done
    }

    /// The step the current window's backend started in (or was asked to), once one has.
    pub fn window_start(&self) -> Option<u64> {
        matches!(
            self.phase,
            Phase::Starting | Phase::Running | Phase::Paused | Phase::StartFailed
        )
        .then_some(self.window_start)
    }

    /// Windows per session under the policy.
    pub fn windows(&self) -> u64 {
        self.policy.repeat.max(1)
    }

    /// The step the next window of a repeated session is due in (while [`Phase::Between`]).
    pub fn next_window_at(&self) -> Option<u64> {
        (self.phase == Phase::Between).then(|| self.window_due())
    }

    /// The step the next window is due in: `repeat_every` steps per completed window after
    /// the first one's start.
    fn window_due(&self) -> u64 {
        self.first_window_step + self.windows_done * self.policy.repeat_every
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
        self.limits = Limits {
            delay: request.delay_iterations.unwrap_or(self.defaults.delay),
            max: request.max_iterations.unwrap_or(self.defaults.max),
        };
        self.since_start = 0;
        self.profiled = 0;
        self.delay_counted = 0;
        self.windows_done = 0;
        self.captured = 0;
        self.qualified = self.policy.min_batch_requests == 0 && self.policy.min_batch_tokens == 0;
        self.target_step = target;
        if let Some(step) = target {
            self.phase = Phase::Delaying;
            return StartDecision::ArmedAt { step };
        }
        if self.limits.delay == 0 && !self.policy.gated() {
            self.phase = Phase::Starting;
            self.first_window_step = now + 1;
            self.window_start = now + 1;
            StartDecision::StartBackend
        } else {
            self.phase = Phase::Delaying;
            StartDecision::Armed {
                delay: self.limits.delay,
            }
        }
    }

    /// Reports the outcome of the backend start that `start` or `begin_step` asked for.
    pub fn start_result(&mut self, started: bool) {
        if self.phase != Phase::Starting {
            return;
        }
        if started {
            self.phase = Phase::Running;
            self.uncounted_left = self.uncounted_after_start;
        } else {
            self.phase = Phase::StartFailed;
        }
    }

    /// Ends the session: the full stop (vLLM's public `stop()`).
    pub fn stop(&mut self) -> StopDecision {
        let decision = match self.phase {
            Phase::Idle => return StopDecision::NotActive,
            Phase::Delaying | Phase::StartFailed | Phase::Between => StopDecision::Disarmed,
            Phase::Starting => StopDecision::CancelStart,
            Phase::Running | Phase::Paused => {
                // A window cut short by the stop still counts as done.
                self.windows_done += 1;
                StopDecision::StopBackend
            }
        };
        self.end_session();
        decision
    }

    /// Back to idle, vLLM's counters reset (status keeps `captured` and `windows_done`).
    fn end_session(&mut self) {
        self.phase = Phase::Idle;
        self.since_start = 0;
        self.profiled = 0;
        self.target_step = None;
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
        self.since_start += 1;
        let counts = self.policy.stage_counts(step.stage);
        match self.phase {
            Phase::Delaying => {
                let due = match self.target_step {
                    Some(target) => step.index >= target && counts,
                    None => {
                        if !self.qualified && self.policy.batch_qualifies(&step) {
                            self.qualified = true;
                        }
                        if self.qualified && counts {
                            self.delay_counted += 1;
                        }
                        self.qualified && counts && self.delay_counted >= self.limits.delay.max(1)
                    }
                };
                if due {
                    self.phase = Phase::Starting;
                    self.first_window_step = step.index;
                    self.window_start = step.index;
                    self.captured = 0;
                    StepBegin::StartBackend
                } else {
                    StepBegin::Counted
                }
            }
            Phase::Between if step.index >= self.window_due() && counts => {
                self.phase = Phase::Starting;
                self.window_start = step.index;
                self.captured = 0;
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
        let mut end = StepEnd {
            advance_backend: true,
            ..StepEnd::default()
        };
        if self.uncounted_left > 0 {
            self.uncounted_left -= 1;
        } else {
            self.profiled += 1;
            end.counted = true;
        }
        if self.limits.max > 0 && self.profiled > self.limits.max {
            // The step past max ends the window; it is not one of the window's captures.
            self.windows_done += 1;
            end.stop_backend = true;
            if self.windows_done < self.policy.repeat {
                self.phase = Phase::Between;
                self.profiled = 0;
            } else {
                self.end_session();
            }
        } else if end.counted {
            self.captured = self.profiled;
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
