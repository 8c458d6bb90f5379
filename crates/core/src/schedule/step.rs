//! What the schedule learns about one step.

use crate::iteration::{IterationInfo, Stage};

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
    /// How long the previous step took, when the caller timed it (it does while
    /// the schedule's `times_steps`).
    pub previous_ns: Option<u64>,
}

impl StepInfo {
    /// The step `index` of an iteration with these counts.
    pub fn of(index: u64, info: &IterationInfo) -> Self {
        StepInfo {
            index,
            stage: info.stage(),
            requests: u64::from(info.num_ctx_reqs) + u64::from(info.num_gen_reqs),
            tokens: u64::from(info.num_ctx_tokens) + u64::from(info.num_gen_tokens),
            previous_ns: None,
        }
    }

    /// The same step, told how long the one before it took.
    pub fn after(mut self, previous_ns: Option<u64>) -> Self {
        self.previous_ns = previous_ns;
        self
    }
}
