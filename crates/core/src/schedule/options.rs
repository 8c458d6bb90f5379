//! What a start takes beyond the config: the per-session overrides and the absolute start
//! step, with the one rule every surface follows (absent keeps the config's value, negative is
//! an error naming it).

use stepscope_format::error::{Error, Result};

/// One session's start request: vLLM's per-session overrides (`None` keeps the config's value)
/// plus stepscope's absolute start step. What the profiler's `start_with` takes
/// and the schedule decides on.
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
