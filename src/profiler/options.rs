//! What a start or a stop did.

/// What [`WorkerProfiler::start_with`](super::WorkerProfiler::start_with) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOutcome {
    /// The backend started.
    Started,
    /// The backend starts in the step whose count since now equals `delay`.
    Armed {
        /// The session's delay.
        delay: u64,
    },
    /// The engine thread starts the backend at its next `step()`.
    Deferred,
    /// The backend starts in the step with this index (`start_at_step`).
    ArmedAt {
        /// The session's start step.
        step: u64,
    },
    /// A session was already active; the request was ignored (as vLLM does).
    AlreadyActive,
    /// This worker's rank is not in `stepscope.ranks`: nothing starts here.
    NotSelected,
}

/// What [`WorkerProfiler::stop`](super::WorkerProfiler::stop) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// The backend stopped.
    Stopped,
    /// The session ended before its backend started; the backend was not touched.
    Disarmed,
    /// The session ended; the engine thread stops the backend at its next `step()`.
    Deferred,
    /// No session was active; the request was ignored (as vLLM does).
    NotActive,
    /// This worker's rank is not in `stepscope.ranks`: nothing to stop here.
    NotSelected,
}
