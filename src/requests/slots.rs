//! The log's slots, as its rings hold them: a request's ([`Req`]: its id inline and its
//! lifecycle's counters and times), a step's ([`Step`]), and a preemption's or resumption's
//! ([`Event`]).

use stepscope_format::requests::ID_BYTES;

/// One request's slot.
#[derive(Clone, Copy)]
pub(super) struct Req {
    /// Its arrival order, from 1; 0: the slot is empty.
    pub(super) seq: u64,
    pub(super) hash: u64,
    /// The id's full length (only the first [`ID_BYTES`] are kept).
    pub(super) id_len: u32,
    pub(super) id: [u8; ID_BYTES],
    pub(super) prompt_tokens: u32,
    pub(super) cached_tokens: u32,
    pub(super) output_tokens: u32,
    pub(super) prefill_steps: u32,
    pub(super) prefill_tokens: u32,
    pub(super) decode_steps: u32,
    /// Preempted, and not scheduled again yet.
    pub(super) out: bool,
    /// First seen scheduled (or producing) rather than arriving: what came before is missing.
    pub(super) partial: bool,
    /// The last step that scheduled it in prefill, 0: none.
    pub(super) last_prefill_step: u64,
    pub(super) finish: u8,
    /// How long before it was queued it arrived at the engine's front door, ns (the engine's
    /// wall clock against ours, read together: no drift between the two clocks enters it);
    /// `None`: not said.
    pub(super) arrival_lead_ns: Option<u64>,
    /// Clock ticks, 0: not seen.
    pub(super) queued: u64,
    pub(super) queued_after_step: u64,
    /// Step indices, 0: not yet.
    pub(super) first_scheduled_step: u64,
    pub(super) first_token_step: u64,
    pub(super) last_step: u64,
    pub(super) finished_step: u64,
    /// Clock ticks, 0: not yet.
    pub(super) first_scheduled: u64,
    pub(super) first_token: u64,
    pub(super) last_token: u64,
    pub(super) finished: u64,
}

impl Req {
    pub(super) const EMPTY: Req = Req {
        seq: 0,
        hash: 0,
        id_len: 0,
        id: [0; ID_BYTES],
        prompt_tokens: 0,
        cached_tokens: 0,
        output_tokens: 0,
        prefill_steps: 0,
        prefill_tokens: 0,
        decode_steps: 0,
        out: false,
        partial: false,
        last_prefill_step: 0,
        finish: 0,
        arrival_lead_ns: None,
        queued: 0,
        queued_after_step: 0,
        first_scheduled_step: 0,
        first_token_step: 0,
        last_step: 0,
        finished_step: 0,
        first_scheduled: 0,
        first_token: 0,
        last_token: 0,
        finished: 0,
    };

    pub(super) fn id_matches(&self, hash: u64, id: &[u8]) -> bool {
        self.seq != 0
            && self.hash == hash
            && self.id_len as usize == id.len()
            && self.id[..id.len().min(ID_BYTES)] == id[..id.len().min(ID_BYTES)]
    }

    pub(super) fn id_str(&self) -> String {
        let n = (self.id_len as usize).min(ID_BYTES);
        String::from_utf8_lossy(&self.id[..n]).into_owned()
    }

    /// The last step it did something in.
    pub(super) fn last_activity(&self) -> u64 {
        (self.queued_after_step + 1)
            .max(self.last_step)
            .max(self.finished_step)
    }
}

/// One step's slot.
#[derive(Clone, Copy, Default)]
pub(super) struct Step {
    /// Its index, 0: empty.
    pub(super) step: u64,
    pub(super) begin: u64,
    /// 0: not ended.
    pub(super) end: u64,
    pub(super) prefill_reqs: u32,
    pub(super) prefill_tokens: u32,
    pub(super) decode_reqs: u32,
    pub(super) decode_tokens: u32,
    pub(super) preempted: u32,
    pub(super) waiting: u32,
    pub(super) largest_prefill_tokens: u32,
    /// The seq of that chunk's request, 0: none.
    pub(super) largest_prefill_seq: u64,
}

/// A preemption or a resumption.
#[derive(Clone, Copy, Default)]
pub(super) struct Event {
    pub(super) seq: u64,
    pub(super) step: u64,
    pub(super) resumed: bool,
}
