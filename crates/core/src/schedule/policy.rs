//! stepscope's capture control beyond vLLM's delay and max ([`Policy`], from the config's
//! `"stepscope"` keys), and what a session keeps to apply it ([`Series`]: the windows of one
//! session, the delay's qualifying steps, the slow-step trigger's state).

use super::slow::{Detector, SlowStepSeen};
use super::step::StepInfo;
use crate::iteration::Stage;

/// stepscope's capture control, beyond vLLM's delay and max. `Policy::default()` is vLLM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// The slow-step trigger, if any.
    pub slow: Option<super::slow::SlowStep>,
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
    pub(super) fn stage_counts(&self, stage: Stage) -> bool {
        self.stages == 0 || self.stages & stage_bit(stage) != 0
    }

    pub(super) fn batch_qualifies(&self, step: &StepInfo) -> bool {
        step.requests >= self.min_batch_requests && step.tokens >= self.min_batch_tokens
    }

    /// Whether a session begins already qualified: no minimum batch size to wait for.
    pub(super) fn no_min_batch(&self) -> bool {
        self.min_batch_requests == 0 && self.min_batch_tokens == 0
    }

    /// Whether starting waits for a qualifying iteration even with a delay of 0.
    pub(super) fn gated(&self) -> bool {
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

/// What one session keeps to apply the [`Policy`]: its windows, the qualifying steps of its
/// delay, its slow-step trigger. Reset by each start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Series {
    /// Qualifying steps counted toward the delay (equals vLLM's count under vLLM's policy).
    pub(super) delay_counted: u64,
    /// The session's absolute start step, replacing the delay.
    pub(super) target_step: Option<u64>,
    /// An iteration of the minimum batch size has been seen (for the next window).
    pub(super) qualified: bool,
    /// The step the session's first window started in.
    pub(super) first_window_step: u64,
    /// The step the current (or last) window started in.
    pub(super) window_start: u64,
    /// Windows completed: by their max, or by a stop while capturing.
    pub(super) windows_done: u64,
    /// Steps captured in the current (or, after a stop, the last) window: kept for status
    /// after the stop resets vLLM's counters.
    pub(super) captured: u64,
    /// The slow-step detector, with a trigger in the policy.
    pub(super) detector: Option<Detector>,
    /// The session's windows follow slow steps (the policy has a trigger and no start step
    /// overrode it). Not the same as being in the phase `Watching`: a triggered session
    /// also delays, starts and runs.
    pub(super) triggered: bool,
    /// The slow step that the current (or last) window follows.
    pub(super) fired: Option<SlowStepSeen>,
}

impl Series {
    /// A new session's: `target` its start step, if any.
    pub(super) fn begin(&mut self, policy: &Policy, target: Option<u64>) {
        self.delay_counted = 0;
        self.windows_done = 0;
        self.captured = 0;
        self.qualified = policy.no_min_batch();
        self.target_step = target;
        self.fired = None;
        self.triggered = self.detector.is_some() && target.is_none();
        if let Some(d) = self.detector.as_mut() {
            d.reset();
        }
    }

    /// Notes whether `step` is of the minimum batch size (once seen, it stays so).
    pub(super) fn qualify(&mut self, policy: &Policy, step: &StepInfo) {
        if !self.qualified && policy.batch_qualifies(step) {
            self.qualified = true;
        }
    }

    /// A window begins in step `index`.
    pub(super) fn window_begins(&mut self, index: u64) {
        if self.windows_done == 0 {
            self.first_window_step = index;
        }
        self.window_start = index;
        self.captured = 0;
    }

    /// A triggered session's next window waits for a new slow step, and for a qualifying
    /// batch after it.
    pub(super) fn rearm_trigger(&mut self, policy: &Policy) {
        self.fired = None;
        self.qualified = policy.no_min_batch();
    }

    /// The step the next window is due in: `repeat_every` steps per completed window after
    /// the first one's start.
    pub(super) fn window_due(&self, policy: &Policy) -> u64 {
        self.first_window_step + self.windows_done * policy.repeat_every
    }
}
