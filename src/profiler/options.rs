//! What a start takes beyond the config, and what a start or a stop did.

use crate::error::{Error, Result};
use crate::schedule::StartOptions;

/// Constructors from the signed values the C ABI and Python pass.
impl StartOptions {
    /// From signed values, as the C ABI and Python pass them: a negative value is an
    /// [`Error::InvalidArgument`] naming the field.
    pub fn from_signed(delay_iterations: Option<i64>, max_iterations: Option<i64>) -> Result<Self> {
        fn check(name: &str, v: Option<i64>) -> Result<Option<u64>> {
            match v {
                None => Ok(None),
                Some(v) => u64::try_from(v)
                    .map(Some)
                    .map_err(|_| Error::InvalidArgument {
                        name: name.into(),
                        message: format!("must be greater than or equal to 0 (got {v})"),
                    }),
            }
        }
        Ok(StartOptions {
            delay_iterations: check("delay_iterations", delay_iterations)?,
            max_iterations: check("max_iterations", max_iterations)?,
            start_at_step: None,
        })
    }

    /// The same options starting at an absolute step (signed, as the C ABI and Python pass
    /// it): a value below 1 is an [`Error::InvalidArgument`] naming `start_at_step`.
    pub fn at_step(mut self, start_at_step: Option<i64>) -> Result<Self> {
        self.start_at_step = match start_at_step {
            None => None,
            Some(v) => Some(u64::try_from(v).ok().filter(|s| *s >= 1).ok_or_else(|| {
                Error::InvalidArgument {
                    name: "start_at_step".into(),
                    message: format!("must be a step index >= 1 (got {v})"),
                }
            })?),
        };
        Ok(self)
    }
}

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
