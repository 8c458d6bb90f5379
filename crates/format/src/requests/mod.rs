//! The request log's document (`stepscope.requests`): each request's lifecycle in an engine
//! (queued, scheduled, its prefill chunks, first token, decode, preemptions, end) and the
//! engine steps it lived through, as the library serves it (the vLLM plugin's
//! `GET /stepscope/requests`, SGLang's `/server_info`, and a capture window's log beside its
//! traces) and its readers read it: `stepscope ctl requests`, `stepscope analyze --requests`
//! and `stepscope report`. Times are ns since the
//! Unix epoch on the engine process's clock; steps are that engine's step indices (the first
//! step is 1).

mod breakdown;
mod document;
#[cfg(test)]
mod fixtures;
mod otlp;
mod spans;

pub use breakdown::{breakdowns, rank, Lived, RankBy, RequestBreakdown, StepCost, Stretch};
pub use document::{
    in_prefill, Counts, EngineStep, RequestRecord, RequestsDocument, ScheduledAs, ID_BYTES,
};
pub use otlp::{otlp_json, otlp_protobuf};
pub use spans::{
    request_spans, step_span_id, step_spans, AttrValue, Span, SpanEvent, SpanOptions, SpanParent,
    COSTLIEST, ENGINE_SPAN,
};
