//! The profiler's state, as `status()` reports it.

use super::driver::Inner;
use crate::error::Error;
use crate::flush::TraceWrite;
use crate::manifest::Status as WriteStatus;
use crate::schedule::{CutShort, SlowStepSeen};
use crate::timeline::TimelineInfo;

/// A step's index and duration, as status reports the slow-step trigger's steps.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StepTime {
    /// The step's index.
    pub step: u64,
    /// Its duration, ms.
    pub ms: f64,
}

impl From<SlowStepSeen> for StepTime {
    fn from(s: SlowStepSeen) -> Self {
        StepTime {
            step: s.step,
            ms: ns_to_ms(s.duration_ns),
        }
    }
}

fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// How many of the last traces [`Status::traces`] lists.
pub const STATUS_TRACES: usize = 8;

/// Where the traces since a ticket stand ([`crate::WorkerProfiler::writes_since`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Writes {
    /// A stop from another thread waits for the engine thread's next step: its traces are not
    /// queued yet.
    pub stopping: bool,
    /// Writes in flight, these or others.
    pub pending_writes: usize,
    /// The traces since the ticket, oldest first.
    pub traces: Vec<TraceWrite>,
}

impl Writes {
    /// Every trace since the ticket has been written or has failed, and no stop waits to be
    /// carried out.
    pub fn settled(&self) -> bool {
        !self.stopping && self.traces.iter().all(|t| t.status != WriteStatus::Writing)
    }
}

/// A profiler's state ([`crate::WorkerProfiler::status`]); serializes to the JSON that
/// `stepscope_status_json` and Python's `status()` return.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Status {
    /// The name the next (or current) session's traces carry.
    pub worker_name: String,
    /// `cuda`, `torch`, `none`, or a user backend's name.
    pub backend: String,
    /// The worker's global rank, when known.
    pub rank: Option<u32>,
    /// Whether this worker profiles under `stepscope.ranks`.
    pub selected: bool,
    /// The session's state (see [`Phase::as_str`](crate::schedule::Phase::as_str)).
    pub phase: &'static str,
    /// A session is active.
    pub active: bool,
    /// The backend captures (also while a stop from another thread waits for the engine
    /// thread's next step).
    pub running: bool,
    /// A stop from another thread waits for the engine thread's next step.
    pub stopping: bool,
    /// The worker's step count.
    pub step_index: u64,
    /// Steps since the session's start.
    pub steps_since_start: u64,
    /// The session's delay.
    pub delay_iterations: u64,
    /// The session's max per window (0: until stop).
    pub max_iterations: u64,
    /// The session's absolute start step, if it has one.
    pub start_at_step: Option<u64>,
    /// The step the current window's capture started in.
    pub window_first_step: Option<u64>,
    /// Iterations captured in the current window, or in the last one after it ended (by its
    /// max or by a stop).
    pub iterations_captured: u64,
    /// Windows per session (`stepscope.repeat`).
    pub windows: u64,
    /// Windows completed in this (or the last) session, a window ended by a stop included.
    pub windows_done: u64,
    /// The step the next window is due in, between windows.
    pub next_window_at: Option<u64>,
    /// The slow-step trigger's absolute threshold, ms (`stepscope.slow_step_ms`).
    pub slow_step_ms: Option<f64>,
    /// The trigger's relative threshold (`stepscope.slow_step_factor`).
    pub slow_step_factor: Option<f64>,
    /// The running median of the steps the trigger timed, ms (with a factor).
    pub median_step_ms: Option<f64>,
    /// The slowest step the trigger timed in this (or the last) session.
    pub slowest_step: Option<StepTime>,
    /// The slow step the current (or last) window follows.
    pub trigger_step: Option<StepTime>,
    /// Captured iterations record their request ids (`stepscope.request_ids`).
    pub request_ids: bool,
    /// The capture budget: what one capture may cost the process at its peak, MB (its growth
    /// over the window times the writer's expansion; `stepscope.max_capture_mb`; 0: no limit).
    pub max_capture_mb: u64,
    /// How long a window may run, s (`stepscope.max_capture_s`; 0: no limit).
    pub max_capture_s: f64,
    /// The last window the budget ended, if any.
    pub last_cut: Option<CutShort>,
    /// Stopped sessions whose traces are still being written.
    pub pending_writes: usize,
    /// The last traces handed to the writer ([`STATUS_TRACES`] at most), oldest first: where
    /// each is and how its write stands.
    pub traces: Vec<TraceWrite>,
    /// The last backend error not returned to a caller, if any.
    pub last_error: Option<String>,
    /// The step timeline's size and fill (`stepscope.timeline`); `None` when it is off.
    pub timeline: Option<TimelineInfo>,
}

impl Status {
    /// The state of the profiler whose state behind the lock is `g`.
    pub(super) fn of(g: &Inner, step_index: u64, request_ids: bool) -> Status {
        let s = &g.schedule;
        let limits = s.limits();
        Status {
            worker_name: g.worker_name.clone(),
            backend: g.backend.name().to_string(),
            rank: g.rank,
            selected: g.selected().unwrap_or(false),
            phase: s.phase().as_str(),
            active: s.is_active(),
            running: g.backend_running(),
            stopping: g.pending_stop,
            step_index,
            steps_since_start: s.steps_since_start(),
            delay_iterations: limits.delay,
            max_iterations: limits.max,
            start_at_step: s.target_step(),
            window_first_step: s.window_start(),
            iterations_captured: s.captured_steps(),
            windows: s.windows(),
            windows_done: s.windows_done(),
            next_window_at: s.next_window_at(),
            slow_step_ms: s
                .slow_step()
                .filter(|t| t.min_ns > 0)
                .map(|t| ns_to_ms(t.min_ns)),
            slow_step_factor: s.slow_step().map(|t| t.factor).filter(|k| *k > 0.0),
            median_step_ms: s.median_step_ns().map(ns_to_ms),
            slowest_step: s.slowest_step().map(StepTime::from),
            trigger_step: s.window_trigger().map(StepTime::from),
            request_ids,
            max_capture_mb: g.budget.max_growth_bytes >> 20,
            max_capture_s: g.budget.max_age_ns as f64 / 1e9,
            last_cut: g.last_cut,
            pending_writes: g.pending_writes(),
            traces: g
                .backend
                .pending_writes()
                .map_or_else(Vec::new, |p| p.last_traces(STATUS_TRACES)),
            last_error: g.last_error.as_ref().map(Error::to_string),
            // The profiler fills it: the timeline is outside the lock.
            timeline: None,
        }
    }
}
