//! vLLM's `WorkerProfiler` counters: the session's limits (the config's, or one session's
//! overrides), the steps since the start (`_active_iteration_count`), the steps counted toward
//! max (`_profiling_for_iters`) after torch's uncounted wait/warmup steps, and the `> N` cutoff.

/// Delay and max for one session, in engine iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Steps after the start before the backend starts (0: in `start()` itself).
    pub delay: u64,
    /// Counted steps to capture; the stop comes in the step that exceeds it. 0: no limit.
    pub max: u64,
}

/// vLLM's counters for one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Counters {
    /// The config's delay and max.
    pub(super) defaults: Limits,
    /// The current (or last) session's.
    pub(super) limits: Limits,
    /// Running steps after each backend start that do not count toward max.
    pub(super) uncounted_after_start: u64,
    /// vLLM's `_active_iteration_count`.
    pub(super) since_start: u64,
    /// vLLM's `_profiling_for_iters`.
    pub(super) profiled: u64,
    /// Uncounted steps left after the last backend start.
    pub(super) uncounted_left: u64,
}

impl Counters {
    pub(super) fn new(defaults: Limits, uncounted_after_start: u64) -> Self {
        Counters {
            defaults,
            limits: defaults,
            uncounted_after_start,
            since_start: 0,
            profiled: 0,
            uncounted_left: 0,
        }
    }

    /// A session begins with these overrides (`None` keeps the config's value).
    pub(super) fn begin(&mut self, delay: Option<u64>, max: Option<u64>) {
        self.limits = Limits {
            delay: delay.unwrap_or(self.defaults.delay),
            max: max.unwrap_or(self.defaults.max),
        };
        self.since_start = 0;
        self.profiled = 0;
    }

    /// The backend started: its uncounted steps begin.
    pub(super) fn backend_started(&mut self) {
        self.uncounted_left = self.uncounted_after_start;
    }

    /// A running step: whether it counted toward max, and whether max is now exceeded.
    pub(super) fn count_running(&mut self) -> (bool, bool) {
        let counted = if self.uncounted_left > 0 {
            self.uncounted_left -= 1;
            false
        } else {
            self.profiled += 1;
            true
        };
        (
            counted,
            self.limits.max > 0 && self.profiled > self.limits.max,
        )
    }

    /// vLLM's counters reset at the end of a session (the limits stay for status).
    pub(super) fn reset(&mut self) {
        self.since_start = 0;
        self.profiled = 0;
    }
}
