//! Which steps are compared with which: a step's kind and shape, from its annotation name,
//! bucketed so that steps of about the same work fall in one group.
//!
//! stepscope and vLLM name an iteration `execute_context_{n}({tokens})_generation_{n}({tokens})`
//! (or, detailed, `execute_{total}_context_{n}(sq{tokens}sk…)_generation_{n}(sq{tokens}sk…)`):
//! its stage (prefill: context requests only; decode: generation only; mixed: both), its
//! requests and its tokens. Requests and tokens are bucketed by powers of two (1, 2, 3-4, 5-8,
//! 9-16, …). torch's `ProfilerStep#N` and other names carry no shape: they form one group,
//! `step`.

use serde::Serialize;

/// A step's stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Context (prefill) requests only.
    Prefill,
    /// Generation (decode) requests only.
    Decode,
    /// Both.
    Mixed,
    /// Neither (an iteration that scheduled nothing).
    Idle,
    /// No shape in its name (`ProfilerStep#N`).
    Step,
}

impl Stage {
    /// `prefill`, `decode`, …
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
            Stage::Mixed => "mixed",
            Stage::Idle => "idle",
            Stage::Step => "step",
        }
    }
}

/// A bucket of counts: `lo..=hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Bucket {
    /// Smallest count in it.
    pub lo: u64,
    /// Largest.
    pub hi: u64,
}

impl Bucket {
    /// The bucket of `n`: 0, 1, 2, 3-4, 5-8, 9-16, …
    pub fn of(n: u64) -> Self {
        if n <= 2 {
            return Bucket { lo: n, hi: n };
        }
        let hi = n.checked_next_power_of_two().unwrap_or(u64::MAX);
        Bucket { lo: hi / 2 + 1, hi }
    }
}

impl std::fmt::Display for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// The group a step belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GroupKey {
    /// Its stage.
    pub stage: Stage,
    /// Requests in the step (context and generation).
    pub requests: Bucket,
    /// Tokens scheduled in the step.
    pub tokens: Bucket,
}

impl GroupKey {
    /// The group of a step named `name`.
    pub fn of(name: &str) -> Self {
        match counts(name) {
            Some((ctx_reqs, ctx_tokens, gen_reqs, gen_tokens)) => GroupKey {
                stage: match (ctx_reqs > 0, gen_reqs > 0) {
                    (true, false) => Stage::Prefill,
                    (false, true) => Stage::Decode,
                    (true, true) => Stage::Mixed,
                    (false, false) => Stage::Idle,
                },
                requests: Bucket::of(ctx_reqs + gen_reqs),
                tokens: Bucket::of(ctx_tokens + gen_tokens),
            },
            None => GroupKey {
                stage: Stage::Step,
                requests: Bucket::of(0),
                tokens: Bucket::of(0),
            },
        }
    }

    /// E.g. `decode 3-4 req 3-4 tok`, or `step`.
    pub fn label(&self) -> String {
        match self.stage {
            Stage::Step => "step".into(),
            s => format!("{} {} req {} tok", s.as_str(), self.requests, self.tokens),
        }
    }
}

/// The decimal number at the start of `s`, and what follows it.
fn number(s: &str) -> Option<(u64, &str)> {
    let end = s.bytes().take_while(u8::is_ascii_digit).count();
    Some((s[..end].parse().ok()?, &s[end..]))
}

/// One phase's `{n}({tokens}` or `{n}(sq{tokens}`: requests and tokens.
fn phase(s: &str) -> Option<(u64, u64)> {
    let (reqs, rest) = number(s)?;
    let rest = rest.strip_prefix('(')?;
    let rest = rest.strip_prefix("sq").unwrap_or(rest);
    Some((reqs, number(rest)?.0))
}

/// Context requests and tokens, generation requests and tokens, from an iteration's name.
fn counts(name: &str) -> Option<(u64, u64, u64, u64)> {
    let rest = name.strip_prefix("execute_")?;
    let ctx = rest.find("context_")? + "context_".len();
    let gen = rest.find("_generation_")? + "_generation_".len();
    let (ctx_reqs, ctx_tokens) = phase(&rest[ctx..])?;
    let (gen_reqs, gen_tokens) = phase(&rest[gen..])?;
    Some((ctx_reqs, ctx_tokens, gen_reqs, gen_tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_grouped_by_stage_and_bucketed_counts() {
        let g = GroupKey::of("execute_context_0(0)_generation_4(4)");
        assert_eq!(g.label(), "decode 3-4 req 3-4 tok");
        let g = GroupKey::of("execute_context_1(200)_generation_3(3)");
        assert_eq!(g.label(), "mixed 3-4 req 129-256 tok");
        let detailed =
            "execute_130_context_1(sq128sk128sqsq16384sqsk16384)_generation_2(sq2sk40sqsq2sqsk40)";
        assert_eq!(GroupKey::of(detailed).label(), "mixed 3-4 req 129-256 tok");
        assert_eq!(GroupKey::of("ProfilerStep#12").label(), "step");
        assert_eq!(GroupKey::of("execute_model").label(), "step");
        assert_eq!(
            GroupKey::of("execute_context_0(0)_generation_0(0)").stage,
            Stage::Idle
        );
        assert_eq!(
            (Bucket::of(1), Bucket::of(2), Bucket::of(5), Bucket::of(8)),
            (
                Bucket { lo: 1, hi: 1 },
                Bucket { lo: 2, hi: 2 },
                Bucket { lo: 5, hi: 8 },
                Bucket { lo: 5, hi: 8 }
            )
        );
    }
}
