//! The request log's tests' documents, built one way for every module's tests.

use super::document::{EngineStep, RequestRecord};

/// A millisecond, in the documents' nanoseconds.
pub(super) const MS: u64 = 1_000_000;

/// Engine step `n`, starting at `start_ms` and lasting `ms`, with (prefill tokens, of which
/// request) and `decode` requests of one token each.
pub(super) fn step(
    n: u64,
    start_ms: u64,
    ms: u64,
    prefill: Option<(u32, &str)>,
    decode: u32,
) -> EngineStep {
    EngineStep {
        step: n,
        start_unix_ns: start_ms * MS,
        duration_ns: ms * MS,
        prefill_reqs: u32::from(prefill.is_some()),
        prefill_tokens: prefill.map_or(0, |p| p.0),
        decode_reqs: decode,
        decode_tokens: decode,
        preempted: 0,
        waiting: 0,
        largest_prefill_tokens: prefill.map_or(0, |p| p.0),
        largest_prefill_request: prefill.map(|p| p.1.to_string()),
    }
}

/// A request of `prompt` tokens (none cached) and `output` produced, to which nothing has
/// happened yet: no step, no time, no end.
pub(super) fn record(id: &str, prompt: u32, output: u32) -> RequestRecord {
    RequestRecord {
        id: id.into(),
        partial: false,
        prompt_tokens: Some(prompt),
        cached_tokens: Some(0),
        output_tokens: Some(output),
        arrival_unix_ns: None,
        queued_unix_ns: None,
        queued_after_step: 0,
        first_scheduled_step: None,
        first_scheduled_unix_ns: None,
        prefill_steps: 0,
        prefill_tokens: 0,
        first_token_step: None,
        first_token_unix_ns: None,
        decode_steps: 0,
        last_prefill_step: None,
        last_token_unix_ns: None,
        last_step: None,
        preempted_at: vec![],
        resumed_at: vec![],
        finished_step: None,
        finished_unix_ns: None,
        finish: None,
    }
}
