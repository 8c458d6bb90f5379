//! The request log's document: its steps, its requests' records, and the one rule of a
//! request's role in a step.

use serde::{Deserialize, Serialize};

/// One engine step: what it scheduled, and how long it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStep {
    /// The step's index (the first step is 1).
    pub step: u64,
    /// When the engine began scheduling it.
    pub start_unix_ns: u64,
    /// From the start of its scheduling to the end of its output's processing, ns.
    pub duration_ns: u64,
    /// Requests scheduled in prefill: before their first token (the log's role rule, decided
    /// once in the library's `requests` module).
    pub prefill_reqs: u32,
    /// Tokens scheduled for requests in prefill.
    pub prefill_tokens: u32,
    /// Requests scheduled in decode.
    pub decode_reqs: u32,
    /// Tokens scheduled for requests in decode (more than one a request with speculative
    /// decoding).
    pub decode_tokens: u32,
    /// Requests the step preempted.
    pub preempted: u32,
    /// Requests waiting in the engine's queue when the step began.
    pub waiting: u32,
    /// The largest prefill chunk it carried, tokens (0: none).
    pub largest_prefill_tokens: u32,
    /// The request of that chunk, while the log still holds it.
    pub largest_prefill_request: Option<String>,
}

impl EngineStep {
    /// Requests in the step, prefill and decode.
    pub fn requests(&self) -> u32 {
        self.prefill_reqs + self.decode_reqs
    }

    /// Tokens in the step, prefill and decode.
    pub fn tokens(&self) -> u32 {
        self.prefill_tokens + self.decode_tokens
    }

    /// When it ended, ns since the Unix epoch.
    pub fn end_unix_ns(&self) -> u64 {
        self.start_unix_ns + self.duration_ns
    }
}

/// One request's lifecycle. A time or step is `None` until it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The engine's id of the request (cut to [`ID_BYTES`] bytes when longer).
    pub id: String,
    /// The log lost the start of it: first seen scheduled rather than arriving (it ran before
    /// the log was on, or the ring dropped it while it ran). Its prompt, cached and output
    /// tokens are then absent, and its step counts and first times are those since it was
    /// seen again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// Its prompt, tokens; absent for a partial record.
    pub prompt_tokens: Option<u32>,
    /// Tokens of its prompt the engine had at its first scheduling (prefix cache); absent
    /// before it, and for a partial record.
    pub cached_tokens: Option<u32>,
    /// Tokens it produced; absent for a partial record.
    pub output_tokens: Option<u32>,
    /// When it arrived at the engine's front door (vLLM: the API server), if the engine said:
    /// on this document's clock, `queued_unix_ns` less the lead the wall clock gave when it
    /// was queued.
    pub arrival_unix_ns: Option<u64>,
    /// When it reached the scheduler's queue; `None` when the log first saw it scheduled
    /// (it arrived before the log was on, or was dropped from a full log).
    pub queued_unix_ns: Option<u64>,
    /// Steps begun before it was queued: it waited from within step `queued_after_step`
    /// (or before step 1).
    pub queued_after_step: u64,
    /// The step that first scheduled it.
    pub first_scheduled_step: Option<u64>,
    /// When that step began.
    pub first_scheduled_unix_ns: Option<u64>,
    /// Steps that scheduled it in prefill (its chunks, before its first token).
    pub prefill_steps: u32,
    /// Tokens scheduled for it in prefill.
    pub prefill_tokens: u32,
    /// The step that produced its first token.
    pub first_token_step: Option<u64>,
    /// When that step ended.
    pub first_token_unix_ns: Option<u64>,
    /// Steps that scheduled it in decode (after its first token, a return after a preemption
    /// included).
    pub decode_steps: u32,
    /// The last step that scheduled it in prefill: each step that scheduled it up to this one
    /// was prefill, each later one decode ([`RequestRecord::role_in`]).
    #[serde(default)]
    pub last_prefill_step: Option<u64>,
    /// When the step that produced its last token so far ended.
    pub last_token_unix_ns: Option<u64>,
    /// The last step that scheduled it.
    pub last_step: Option<u64>,
    /// The steps that preempted it, in order.
    pub preempted_at: Vec<u64>,
    /// The steps that scheduled it again after each preemption.
    pub resumed_at: Vec<u64>,
    /// The last step begun when it finished.
    pub finished_step: Option<u64>,
    /// When it finished.
    pub finished_unix_ns: Option<u64>,
    /// Why it finished: `stop`, `length`, `abort`, `error`, or `other`.
    pub finish: Option<String>,
}

/// Whether a step that schedules a request is its prefill, by the tokens it had produced
/// before the step: until its first token it is (vLLM's rule: `is_context_phase`,
/// `compute_iteration_details`, and its `request_prefill_time`, which ends at the first
/// token); after it, its decode, a return after a preemption included. The one place the rule
/// is written: the request log, the engines' iterations (the trace header's `prefill`) and the
/// readers take it from here or from what it recorded.
pub fn in_prefill(outputs_before: u32) -> bool {
    outputs_before == 0
}

/// A request's role in a step that scheduled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduledAs {
    /// Prefill: a chunk of its prompt, before its first token.
    Prefill,
    /// Decode.
    Decode,
}

impl RequestRecord {
    /// Its role in step `step`, one that scheduled it, as the log decided it.
    pub fn role_in(&self, step: u64) -> ScheduledAs {
        match self.last_prefill_step {
            Some(p) if step <= p => ScheduledAs::Prefill,
            _ => ScheduledAs::Decode,
        }
    }

    /// The last step it did something in: the one it was queued within, the last that
    /// scheduled it, or the one it finished in.
    pub fn last_activity(&self) -> u64 {
        (self.queued_after_step + 1)
            .max(self.last_step.unwrap_or(0))
            .max(self.finished_step.unwrap_or(0))
    }
}

impl RequestsDocument {
    /// The document a read above step `since` gets from the same log: the steps above it, and
    /// the requests still running or active after it (for a server that sends its last steps
    /// whatever the reader asks, as SGLang's `/server_info` does).
    pub fn after_step(mut self, since: u64) -> Self {
        self.steps.retain(|s| s.step > since);
        self.requests
            .retain(|r| r.finish.is_none() || r.last_activity() > since);
        self
    }
}

/// How many requests and steps a log keeps, or has recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests.
    pub requests: u64,
    /// Engine steps.
    pub steps: u64,
}

/// One engine's request log as the plugins serve it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestsDocument {
    /// The engine process.
    pub pid: u32,
    /// The engine's steps begun so far: the next read's `since`.
    pub step_index: u64,
    /// The engine's clock when the document was made.
    pub now_unix_ns: u64,
    /// `tsc` (the CPU's time-stamp counter) or `monotonic`.
    pub clock: String,
    /// What the log keeps.
    pub capacity: Counts,
    /// What it has recorded in all: the requests that reached the scheduler while it was on
    /// (each once, however often the ring dropped it), and the steps begun.
    pub recorded: Counts,
    /// Requests dropped from the log while still running, to make room for new ones.
    pub evicted_running: u64,
    /// The ended steps above `since`, oldest first.
    pub steps: Vec<EngineStep>,
    /// The requests it holds that were running, or did something, after step `since`, in
    /// the order they arrived.
    pub requests: Vec<RequestRecord>,
}

/// The longest request id a log keeps whole, bytes.
pub const ID_BYTES: usize = 64;
