//! What one engine iteration scheduled: request and token counts, and its stage.

use stepscope_format::trace::{PhaseWork, StepWork};

/// The counts of one engine iteration. A context request is one still in prefill (it has not
/// produced a token yet); a generation request is one in decode.
///
/// `IterationInfo::default()` means the counts are unknown (the C ABI's `NULL`).
///
/// With `detail`, the annotation name can carry vLLM's roofline sums
/// (`detailed_trace_annotation`).
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
    /// vLLM's per-phase sums, for detailed annotation names.
    pub detail: Option<IterationDetail>,
}

/// vLLM's per-phase roofline sums of one iteration (see `Worker.annotate_profile`), over the
/// requests of one phase, with `q` a request's scheduled tokens and `seq` its computed plus
/// scheduled tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct PhaseSums {
    /// Σ seq: the KV length the phase attends over.
    pub seq_len_sum: u64,
    /// Σ q²: a proxy for the QKᵀ compute of prefill.
    pub qq_compute: u64,
    /// Σ q·seq: a proxy for the QKᵀ compute of decode and chunked prefill.
    pub qk_compute: u64,
}

/// The detailed sums of both phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct IterationDetail {
    /// Sums over context (prefill) requests.
    pub ctx: PhaseSums,
    /// Sums over generation (decode) requests.
    pub gen: PhaseSums,
}

impl IterationDetail {
    /// The sums of the requests' shares, each in its phase, as vLLM's `annotate_profile`
    /// sums them: `seq` is a request's computed tokens plus those scheduled. `None` when a
    /// share lacks its computed tokens; zeros when there is none (an iteration that scheduled
    /// nothing: vLLM names it `execute_0_context_0(sq0sk0sqsq0sqsk0)_…`). The one place
    /// stepscope derives them: the engine plugins pass each request's counts, never the sums.
    pub fn of_shares(shares: &[RequestShare]) -> Option<IterationDetail> {
        let mut d = IterationDetail::default();
        for s in shares {
            let q = u64::from(s.tokens);
            let seq = u64::from(s.computed?) + q;
            let p = if s.prefill { &mut d.ctx } else { &mut d.gen };
            p.seq_len_sum += seq;
            p.qq_compute += q * q;
            p.qk_compute += q * seq;
        }
        Some(d)
    }
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
            detail: None,
        }
    }

    /// The same counts with vLLM's detailed sums.
    pub const fn with_detail(mut self, detail: IterationDetail) -> Self {
        self.detail = Some(detail);
        self
    }

    /// Writes the iteration's annotation name into `out` (cleared first), byte for byte as
    /// vLLM's `Worker.annotate_profile` names it:
    /// `execute_context_{n}({tok})_generation_{n}({tok})`, or with `detailed` (and sums
    /// present) `execute_{total}_context_{n}(sq{tok}sk{seq}sqsq{qq}sqsk{qk})_generation_{n}(…)`.
    /// Without sums, `detailed` falls back to the simple name. No allocation once `out` has
    /// grown to fit.
    pub fn write_name(&self, detailed: bool, out: &mut String) {
        out.clear();
        match (detailed, &self.detail) {
            (true, Some(d)) => {
                out.push_str("execute_");
                push_u64(
                    out,
                    u64::from(self.num_ctx_tokens) + u64::from(self.num_gen_tokens),
                );
                out.push_str("_context_");
                push_phase(out, self.num_ctx_reqs, self.num_ctx_tokens, &d.ctx);
                out.push_str("_generation_");
                push_phase(out, self.num_gen_reqs, self.num_gen_tokens, &d.gen);
            }
            _ => {
                out.push_str("execute_context_");
                push_u64(out, self.num_ctx_reqs.into());
                out.push('(');
                push_u64(out, self.num_ctx_tokens.into());
                out.push_str(")_generation_");
                push_u64(out, self.num_gen_reqs.into());
                out.push('(');
                push_u64(out, self.num_gen_tokens.into());
                out.push(')');
            }
        }
    }

    /// The annotation name as a new string (see [`IterationInfo::write_name`]).
    pub fn name(&self, detailed: bool) -> String {
        let mut s = String::with_capacity(64);
        self.write_name(detailed, &mut s);
        s
    }

    /// The iteration's work per phase, as a trace's header records it, when the detailed sums
    /// are known.
    pub fn work(&self) -> Option<StepWork> {
        let d = self.detail?;
        let phase = |reqs: u32, tokens: u32, s: &PhaseSums| PhaseWork {
            requests: reqs.into(),
            sq: tokens.into(),
            sk: s.seq_len_sum,
            sqsq: s.qq_compute,
            sqsk: s.qk_compute,
        };
        Some(StepWork {
            context: phase(self.num_ctx_reqs, self.num_ctx_tokens, &d.ctx),
            generation: phase(self.num_gen_reqs, self.num_gen_tokens, &d.gen),
        })
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

fn push_phase(out: &mut String, reqs: u32, tokens: u32, sums: &PhaseSums) {
    push_u64(out, reqs.into());
    out.push_str("(sq");
    push_u64(out, tokens.into());
    out.push_str("sk");
    push_u64(out, sums.seq_len_sum);
    out.push_str("sqsq");
    push_u64(out, sums.qq_compute);
    out.push_str("sqsk");
    push_u64(out, sums.qk_compute);
    out.push(')');
}

/// Appends the decimal digits of `n` without going through `fmt` (it is on the per-iteration
/// path while capturing).
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        out.push(char::from(d));
    }
}

/// The ids of the requests one iteration served (`stepscope.request_ids`), as an engine
/// holds them: read only when the iteration is captured, so an engine can pass them without
/// copying.
pub trait RequestIds {
    /// How many ids there are.
    fn count(&self) -> usize;

    /// Calls `f` with each id, in order.
    fn for_each_id(&self, f: &mut dyn FnMut(&str));

    /// Calls `f` with each request's part of the iteration, in id order, and returns true,
    /// when the engine gave them (one per id); returns false without calling `f` otherwise
    /// (the default).
    fn for_each_share(&self, _f: &mut dyn FnMut(RequestShare)) -> bool {
        false
    }
}

/// One request's part of an iteration: the tokens scheduled for it, and whether it is in its
/// context (prefill) phase, as the engine counts it in [`IterationInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RequestShare {
    /// Tokens scheduled for the request this iteration.
    pub tokens: u32,
    /// Tokens of the request already computed (in the KV cache) before this iteration, when
    /// the engine gave them: what its work per phase is summed from
    /// ([`IterationDetail::of_shares`]).
    pub computed: Option<u32>,
    /// The request is in prefill (a chunk of its prompt), not decode.
    pub prefill: bool,
}

/// Request ids with each one's [`RequestShare`]: what an engine passes when it knows how many
/// tokens each request got. Shares are reported only when there is one per id.
#[derive(Debug, Clone, Copy)]
pub struct ScheduledRequests<'a, S> {
    /// The requests' ids.
    pub ids: &'a [S],
    /// Each request's part, in the order of `ids`.
    pub shares: &'a [RequestShare],
}

impl<S: AsRef<str>> RequestIds for ScheduledRequests<'_, S> {
    fn count(&self) -> usize {
        self.ids.len()
    }

    fn for_each_id(&self, f: &mut dyn FnMut(&str)) {
        self.ids.for_each_id(f);
    }

    fn for_each_share(&self, f: &mut dyn FnMut(RequestShare)) -> bool {
        if self.shares.len() != self.ids.len() {
            return false;
        }
        self.shares.iter().for_each(|s| f(*s));
        true
    }
}

impl<S: AsRef<str>> RequestIds for [S] {
    fn count(&self) -> usize {
        self.len()
    }

    fn for_each_id(&self, f: &mut dyn FnMut(&str)) {
        for id in self {
            f(id.as_ref());
        }
    }
}

impl<S: AsRef<str>> RequestIds for Vec<S> {
    fn count(&self) -> usize {
        self.len()
    }

    fn for_each_id(&self, f: &mut dyn FnMut(&str)) {
        self.as_slice().for_each_id(f);
    }
}

/// The kind of work an iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Only context (prefill) requests.
    Prefill,
    /// Only generation (decode) requests.
    Decode,
    /// Both.
    Mixed,
    /// None (or counts unknown).
    #[default]
    Idle,
}

impl Stage {
    /// Every stage, in a fixed order.
    pub const ALL: [Stage; 4] = [Stage::Prefill, Stage::Decode, Stage::Mixed, Stage::Idle];

    /// The stage named `name` (`prefill`, `decode`, `mixed`, `idle`).
    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.as_str() == name)
    }

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

    #[test]
    fn simple_names_match_vllm() {
        assert_eq!(
            IterationInfo::new(2, 384, 30, 30).name(false),
            "execute_context_2(384)_generation_30(30)"
        );
        assert_eq!(
            IterationInfo::default().name(true),
            "execute_context_0(0)_generation_0(0)"
        );
        assert_eq!(
            IterationInfo::new(u32::MAX, 0, 0, 10).name(false),
            "execute_context_4294967295(0)_generation_0(10)"
        );
    }

    #[test]
    fn detailed_names_match_vllm() {
        // One new request with 4 prompt tokens (seq 4), two decodes at seq 10 and 7.
        let info = IterationInfo::new(1, 4, 2, 2).with_detail(IterationDetail {
            ctx: PhaseSums {
                seq_len_sum: 4,
                qq_compute: 16,
                qk_compute: 16,
            },
            gen: PhaseSums {
                seq_len_sum: 17,
                qq_compute: 2,
                qk_compute: 17,
            },
        });
        assert_eq!(
            info.name(true),
            "execute_6_context_1(sq4sk4sqsq16sqsk16)_generation_2(sq2sk17sqsq2sqsk17)"
        );
        assert_eq!(info.name(false), "execute_context_1(4)_generation_2(2)");
    }

    #[test]
    fn the_sums_come_from_each_requests_share_and_its_computed_tokens() {
        // The same iteration from its requests: a new one of 4 tokens, decodes at 9 and 6
        // computed tokens.
        let share = |tokens, computed, prefill| RequestShare {
            tokens,
            computed: Some(computed),
            prefill,
        };
        let shares = [share(4, 0, true), share(1, 9, false), share(1, 6, false)];
        let info = IterationInfo::new(1, 4, 2, 2)
            .with_detail(IterationDetail::of_shares(&shares).unwrap());
        assert_eq!(
            info.name(true),
            "execute_6_context_1(sq4sk4sqsq16sqsk16)_generation_2(sq2sk17sqsq2sqsk17)"
        );
        let w = info.work().unwrap();
        assert_eq!(
            (w.context.requests, w.context.sq, w.generation.sk),
            (1, 4, 17)
        );
        // A share without its computed tokens: no sums.
        let partial = [
            share(4, 0, true),
            RequestShare {
                tokens: 1,
                ..RequestShare::default()
            },
        ];
        assert_eq!(IterationDetail::of_shares(&partial), None);
        // An iteration that scheduled nothing has zero sums, and vLLM's detailed name for it.
        let empty =
            IterationInfo::new(0, 0, 0, 0).with_detail(IterationDetail::of_shares(&[]).unwrap());
        assert_eq!(
            empty.name(true),
            "execute_0_context_0(sq0sk0sqsq0sqsk0)_generation_0(sq0sk0sqsq0sqsk0)"
        );
        assert_eq!(IterationInfo::new(1, 4, 0, 0).work(), None);
    }
}
