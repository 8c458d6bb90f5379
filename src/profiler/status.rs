//! The profiler's state, as `status()` reports it.

use super::WorkerProfiler;
use crate::error::Error;

/// A profiler's state ([`WorkerProfiler::status`]); serializes to the JSON that
/// `stepscope_status_json` and Python's `status()` return.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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
    /// The backend captures.
    pub running: bool,
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
    /// Stopped sessions whose traces are still being written.
    pub pending_writes: usize,
    /// The last backend error not returned to a caller, if any.
    pub last_error: Option<String>,
}

impl WorkerProfiler {
    /// The profiler's state, for `stepscope ctl status` and logs.
    pub fn status(&self) -> Status {
        let g = self.inner.lock();
        let s = &g.schedule;
        let limits = s.limits();
        Status {
            worker_name: g.worker_name.clone(),
            backend: g.backend.name().to_string(),
            rank: g.rank,
            selected: g.selected().unwrap_or(false),
            phase: s.phase().as_str(),
            active: s.is_active(),
            running: s.is_running(),
            step_index: self.step_index(),
            steps_since_start: s.steps_since_start(),
            delay_iterations: limits.delay,
            max_iterations: limits.max,
            start_at_step: s.target_step(),
            window_first_step: s.window_start(),
            iterations_captured: s.captured_steps(),
            windows: s.windows(),
            windows_done: s.windows_done(),
            next_window_at: s.next_window_at(),
            pending_writes: g.pending_writes(),
            last_error: g.last_error.as_ref().map(Error::to_string),
        }
    }
}
