//! The log's slots as its document gives them ([`RequestRecord`], [`EngineStep`]).

use super::slots::{Event, Req, Step};
use super::Finish;
use crate::clock::Scale;
use stepscope_format::requests::{EngineStep, RequestRecord};

/// Step `s` as the document gives it; `largest`: the id of its largest prefill chunk's request.
pub(super) fn engine_step(scale: &Scale, s: &Step, largest: Option<String>) -> EngineStep {
    // Both ends converted alike, so that a step's end is the time its tokens are given.
    let start_unix_ns = scale.unix_ns(s.begin);
    EngineStep {
        step: s.step,
        start_unix_ns,
        duration_ns: scale.unix_ns(s.end).saturating_sub(start_unix_ns),
        prefill_reqs: s.prefill_reqs,
        prefill_tokens: s.prefill_tokens,
        decode_reqs: s.decode_reqs,
        decode_tokens: s.decode_tokens,
        preempted: s.preempted,
        waiting: s.waiting,
        largest_prefill_tokens: s.largest_prefill_tokens,
        largest_prefill_request: largest,
    }
}

/// Request `r` as the document gives it; `events` are sorted by request.
pub(super) fn record(scale: &Scale, r: &Req, events: &[&Event]) -> RequestRecord {
    let time = |ticks: u64| (ticks != 0).then(|| scale.unix_ns(ticks));
    let step = |s: u64| (s != 0).then_some(s);
    let from = events.partition_point(|e| e.seq < r.seq);
    let to = from + events[from..].partition_point(|e| e.seq == r.seq);
    let mine = events[from..to].iter();
    RequestRecord {
        id: r.id_str(),
        partial: r.partial,
        // What a partial record missed is unknown, not 0.
        prompt_tokens: (!r.partial).then_some(r.prompt_tokens),
        cached_tokens: (!r.partial && r.first_scheduled_step != 0).then_some(r.cached_tokens),
        output_tokens: (!r.partial).then_some(r.output_tokens),
        arrival_unix_ns: r
            .arrival_lead_ns
            .zip(time(r.queued))
            .map(|(lead, queued)| queued.saturating_sub(lead)),
        queued_unix_ns: time(r.queued),
        queued_after_step: r.queued_after_step,
        first_scheduled_step: step(r.first_scheduled_step),
        first_scheduled_unix_ns: time(r.first_scheduled),
        prefill_steps: r.prefill_steps,
        prefill_tokens: r.prefill_tokens,
        first_token_step: step(r.first_token_step),
        first_token_unix_ns: time(r.first_token),
        decode_steps: r.decode_steps,
        last_prefill_step: step(r.last_prefill_step),
        last_token_unix_ns: time(r.last_token),
        last_step: step(r.last_step),
        preempted_at: mine
            .clone()
            .filter(|e| !e.resumed)
            .map(|e| e.step)
            .collect(),
        resumed_at: mine.filter(|e| e.resumed).map(|e| e.step).collect(),
        finished_step: step(r.finished_step),
        finished_unix_ns: time(r.finished),
        finish: Finish::name(r.finish).map(str::to_string),
    }
}
