//! What one engine iteration scheduled: request and token counts, and its stage.

/// The counts of one engine iteration. A context request is one still in prefill (it has not
/// produced a token yet); a generation request is one in decode.
///
/// `IterationInfo::default()` means the counts are unknown (the C ABI's `NULL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct IterationInfo {
    /// Requests in prefill this iteration.
    pub num_ctx_reqs: u32,
    /// Tokens scheduled for requests in prefill.
    pub num_ctx_tokens: u32,
    /// Requests in decode this iteration.
    pub num_gen_reqs: u32,
    /// Tokens scheduled for requests in decode.
    pub num_gen_tokens: u32,
}

impl IterationInfo {
    /// Counts for one iteration.
    pub const fn new(
        num_ctx_reqs: u32,
        num_ctx_tokens: u32,
        num_gen_reqs: u32,
        num_gen_tokens: u32,
    ) -> Self {
        IterationInfo {
            num_ctx_reqs,
            num_ctx_tokens,
            num_gen_reqs,
            num_gen_tokens,
        }
    }

    /// The iteration's stage, from which kinds of request it holds.
    pub const fn stage(&self) -> Stage {
        match (self.num_ctx_reqs > 0, self.num_gen_reqs > 0) {
            (true, false) => Stage::Prefill,
            (false, true) => Stage::Decode,
            (true, true) => Stage::Mixed,
            (false, false) => Stage::Idle,
        }
    }
}

/// The kind of work an iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Only context (prefill) requests.
    Prefill,
    /// Only generation (decode) requests.
    Decode,
    /// Both.
    Mixed,
    /// None (or counts unknown).
    Idle,
}

impl Stage {
    /// Every stage, in a fixed order.
    pub const ALL: [Stage; 4] = [Stage::Prefill, Stage::Decode, Stage::Mixed, Stage::Idle];

    /// The stage's lowercase name: `prefill`, `decode`, `mixed`, `idle`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
            Stage::Mixed => "mixed",
            Stage::Idle => "idle",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_follows_which_requests_are_present() {
        assert_eq!(IterationInfo::new(1, 8, 0, 0).stage(), Stage::Prefill);
        assert_eq!(IterationInfo::new(0, 0, 3, 3).stage(), Stage::Decode);
        assert_eq!(IterationInfo::new(1, 8, 3, 3).stage(), Stage::Mixed);
        assert_eq!(IterationInfo::default().stage(), Stage::Idle);
    }
}
