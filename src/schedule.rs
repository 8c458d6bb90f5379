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
    /// The delay has just passed: start the backend, report with `start_result`, then call
    /// [`Schedule::end_step`].
    StartBackend,
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

/// vLLM's `WorkerProfiler` counters and flags, as a pure state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    defaults: Limits,
    limits: Limits,
    uncounted_after_start: u64,
    phase: Phase,
    since_start: u64,
    profiled: u64,
    uncounted_left: u64,
}

impl Schedule {
    /// A schedule with the config's delay and max, and `uncounted_after_start` running steps
    /// after each backend start that do not count toward max (torch's wait + warmup − 1; see
    /// [`crate::ProfilerConfig::uncounted_steps_after_start`]).
    pub fn new(defaults: Limits, uncounted_after_start: u64) -> Self {
        Schedule {
            defaults,
            limits: defaults,
            uncounted_after_start,
            phase: Phase::Idle,
            since_start: 0,
            profiled: 0,
            uncounted_left: 0,
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

    /// The backend captures (vLLM's `_running`).
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

    /// Steps counted toward max (vLLM's `_profiling_for_iters`).
    pub fn profiled_steps(&self) -> u64 {
        self.profiled
    }

    /// Begins a session. `None` keeps the config's value for this session.
    pub fn start(&mut self, delay: Option<u64>, max: Option<u64>) -> StartDecision {
        if self.is_active() {
            return StartDecision::AlreadyActive;
        }
        self.limits = Limits {
            delay: delay.unwrap_or(self.defaults.delay),
            max: max.unwrap_or(self.defaults.max),
        };
        if self.limits.delay == 0 {
            self.phase = Phase::Starting;
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
            Phase::Delaying | Phase::StartFailed => StopDecision::Disarmed,
            Phase::Starting => StopDecision::CancelStart,
            Phase::Running => StopDecision::StopBackend,
        };
        self.phase = Phase::Idle;
        self.since_start = 0;
        self.profiled = 0;
        decision
    }

    /// vLLM's `shutdown()`: stops only a running session (and one whose start is pending,
    /// which could otherwise never be carried out).
    pub fn shutdown(&mut self) -> StopDecision {
        match self.phase {
            Phase::Running | Phase::Starting => self.stop(),
            _ => StopDecision::NotActive,
        }
    }

    /// First half of a step: counts it and decides whether the delay has just passed.
    pub fn begin_step(&mut self) -> StepBegin {
        match self.phase {
            Phase::Idle => StepBegin::Inactive,
            Phase::Delaying => {
                self.since_start += 1;
                if self.since_start == self.limits.delay {
                    self.phase = Phase::Starting;
                    StepBegin::StartBackend
                } else {
                    StepBegin::Counted
                }
            }
            // A pending start is carried out before a step begins; were it not, the step
            // still counts and the backend is simply not running yet.
            Phase::Starting | Phase::Running | Phase::StartFailed => {
                self.since_start += 1;
                StepBegin::Counted
            }
        }
    }

    /// Second half of a step: counts it toward max while running, and applies the `> max`
    /// cutoff through the full stop.
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
            end.stop_backend = self.stop() == StopDecision::StopBackend;
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
        assert_eq!(s.start(None, None), StartDecision::StartBackend);
        s.start_result(true);
        assert!(s.is_running());
    }

    #[test]
    fn stop_in_every_phase_resets_counters() {
        for (phase_steps, expect) in [(0, StopDecision::Disarmed), (2, StopDecision::StopBackend)] {
            let mut s = sched(2, 0);
            s.start(None, None);
            for _ in 0..phase_steps {
                if s.begin_step() == StepBegin::StartBackend {
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
        s.start(None, None);
        s.start_result(true);
        assert_eq!(s.phase(), Phase::Delaying);
    }
}
