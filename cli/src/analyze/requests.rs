//! The requests of a capture (`stepscope analyze --requests`, `report`): for each request its
//! captured iterations carried (stepscope's `request_ids`), where its time in them went
//! (prefill chunks, decode steps), its share of their CPU and GPU time, and the iterations that
//! cost it most with what they carried. A trace holds the captured iterations only: what a
//! request did outside them (its arrival, its queue wait, the steps it waited through) is in
//! its engine's request log, which [`join_logs`] adds from the logs a capture wrote beside its
//! traces (read by the caller). No I/O.

use std::collections::HashMap;

use serde::Serialize;
use stepscope_format::requests::{RequestsDocument, ID_BYTES};
use stepscope_format::trace::Step;

use crate::flags::RankBy;
use crate::requests::render::lifecycle;
use crate::requests::{breakdowns, RequestBreakdown};

/// How a request's share of an iteration's time is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ShareBy {
    /// Its scheduled tokens over the iteration's (the engine gave each request's tokens).
    Tokens,
    /// One part per request (the engine gave the ids only).
    Requests,
}

/// What a request did in one captured iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IterationRole {
    /// A chunk of its prompt.
    Prefill,
    /// Decode.
    Decode,
    /// Scheduled; the engine did not say in which phase.
    Scheduled,
}

impl IterationRole {
    /// `prefill`, `decode` or `scheduled`, as `--json` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            IterationRole::Prefill => "prefill",
            IterationRole::Decode => "decode",
            IterationRole::Scheduled => "scheduled",
        }
    }
}

/// One captured iteration a request was in, with what the iteration carried.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InStep {
    /// The engine's step index, when stepscope annotated it.
    pub step: Option<u64>,
    /// Its position among the trace's iterations (0 is the first).
    pub index: usize,
    pub role: IterationRole,
    /// Tokens scheduled for this request (when the engine gave them).
    pub own_tokens: Option<u32>,
    /// The iteration's wall time, CPU operator time and GPU kernel time, ms.
    pub ms: f64,
    pub cpu_ms: f64,
    pub gpu_ms: f64,
    /// This request's part of the iteration (0..1), and so of its CPU and GPU time.
    pub share: f64,
    /// Requests and tokens in the iteration (tokens when the engine gave them).
    pub requests: usize,
    pub tokens: Option<u32>,
    /// Prefill requests and their tokens in the iteration.
    pub prefill_reqs: usize,
    pub prefill_tokens: u32,
    /// The largest prefill chunk the iteration carried, tokens, and its request.
    pub largest_prefill_tokens: u32,
    pub largest_prefill_request: Option<String>,
    /// That largest chunk is this request's own.
    pub own_prefill: bool,
}

/// A stretch of a request's captured iterations in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Phase {
    /// Iterations.
    pub steps: usize,
    /// Tokens scheduled for it in them.
    pub tokens: u64,
    /// Their summed wall time, mean and longest, ms.
    pub ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

/// One request of a capture.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceRequest {
    pub id: String,
    /// Captured iterations it was in.
    pub steps: usize,
    /// Its first and last of them (engine step indices, when annotated).
    pub first_step: Option<u64>,
    pub last_step: Option<u64>,
    /// Iterations between its first and last that did not schedule it (preempted, or left
    /// out for lack of token budget).
    pub absent_steps: usize,
    /// It was in the capture's first iteration, or its last: it may have begun before the
    /// capture, or gone on after it.
    pub at_start: bool,
    pub at_end: bool,
    /// Its prefill chunks and decode steps in the capture (when the engine gave phases).
    pub prefill: Option<Phase>,
    pub decode: Option<Phase>,
    /// Summed wall time of the iterations it was in, ms.
    pub wall_ms: f64,
    /// Its share of their CPU operator time and GPU kernel time, ms.
    pub cpu_ms: f64,
    pub gpu_ms: f64,
    pub share_by: ShareBy,
    /// The iterations that cost it most, longest first (all of its iterations, in order, for
    /// one request asked for by id).
    pub costliest: Vec<InStep>,
    /// Its lifecycle in its engine's request log, when the capture's log was written beside
    /// the trace (`"stepscope": {"requests": true}`): arrival, queue wait, TTFT, and the
    /// engine steps that cost it most, those it waited through included. Engine steps count
    /// the engine's schedules, not the trace's iterations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<RequestBreakdown>,
}

/// Iterations listed per request in the table.
pub const COSTLIEST: usize = 3;

/// What a step's requests carried, computed once per step.
struct StepLoad<'a> {
    step: &'a Step,
    /// The engine gave each request's tokens and phase (`step.tokens`, `step.prefill`).
    shares: bool,
    tokens: Option<u32>,
    prefill_reqs: usize,
    prefill_tokens: u32,
    largest: Option<(u32, &'a str)>,
}

impl<'a> StepLoad<'a> {
    fn of(step: &'a Step) -> Self {
        let shares =
            step.tokens.len() == step.requests.len() && step.prefill.len() == step.requests.len();
        let (mut prefill_reqs, mut prefill_tokens, mut largest) = (0, 0u32, None);
        if shares {
            let prefills = step.requests.iter().zip(&step.tokens).zip(&step.prefill);
            for ((id, &t), _) in prefills.filter(|(_, p)| **p) {
                prefill_reqs += 1;
                prefill_tokens = prefill_tokens.saturating_add(t);
                if largest.is_none_or(|(lt, _)| t > lt) {
                    largest = Some((t, id.as_str()));
                }
            }
        }
        StepLoad {
            step,
            shares,
            tokens: shares.then(|| step.tokens.iter().fold(0u32, |a, t| a.saturating_add(*t))),
            prefill_reqs,
            prefill_tokens,
            largest,
        }
    }

    /// What the step was to its request at position `pos`.
    fn for_request(&self, index: usize, pos: usize) -> InStep {
        let id = self.step.requests[pos].as_str();
        let own_tokens = self.shares.then(|| self.step.tokens[pos]);
        let share = match (own_tokens, self.tokens) {
            (Some(t), Some(all)) if all > 0 => f64::from(t) / f64::from(all),
            _ => 1.0 / self.step.requests.len() as f64,
        };
        let (largest_prefill_tokens, largest_prefill_request) = self
            .largest
            .map_or((0, None), |(t, r)| (t, Some(r.to_string())));
        InStep {
            step: self.step.step,
            index,
            role: match self.shares.then(|| self.step.prefill[pos]) {
                Some(true) => IterationRole::Prefill,
                Some(false) => IterationRole::Decode,
                None => IterationRole::Scheduled,
            },
            own_tokens,
            ms: self.step.dur_us / 1e3,
            cpu_ms: self.step.cpu_op_us / 1e3,
            gpu_ms: self.step.kernel_us / 1e3,
            share,
            requests: self.step.requests.len(),
            tokens: self.tokens,
            prefill_reqs: self.prefill_reqs,
            prefill_tokens: self.prefill_tokens,
            own_prefill: largest_prefill_request.as_deref() == Some(id),
            largest_prefill_tokens,
            largest_prefill_request,
        }
    }
}

fn phase(steps: &[InStep], role: IterationRole) -> Option<Phase> {
    let of: Vec<&InStep> = steps.iter().filter(|s| s.role == role).collect();
    if of.is_empty() {
        return None;
    }
    let ms: f64 = of.iter().map(|s| s.ms).sum();
    Some(Phase {
        steps: of.len(),
        tokens: of
            .iter()
            .map(|s| u64::from(s.own_tokens.unwrap_or(0)))
            .sum(),
        ms,
        mean_ms: ms / of.len() as f64,
        max_ms: of.iter().map(|s| s.ms).fold(0.0, f64::max),
    })
}

/// The requests of a trace's iterations, by the wall time of the iterations they were in,
/// longest first (first seen first among equals), each with up to `keep` of its costliest
/// iterations (`None`: all of them, in order).
pub fn requests(steps: &[Step], keep: Option<usize>) -> Vec<TraceRequest> {
    let loads: Vec<StepLoad<'_>> = steps.iter().map(StepLoad::of).collect();
    // Each request's iterations, in the order requests were first seen.
    let mut seen: Vec<&str> = Vec::new();
    let mut lived: HashMap<&str, Vec<InStep>> = HashMap::new();
    for (i, load) in loads.iter().enumerate() {
        for (pos, id) in load.step.requests.iter().enumerate() {
            let entry = lived.entry(id.as_str()).or_insert_with(|| {
                seen.push(id.as_str());
                Vec::new()
            });
            // An id listed twice in one iteration counts once.
            if entry.last().is_none_or(|s| s.index != i) {
                entry.push(load.for_request(i, pos));
            }
        }
    }
    let last_index = steps.len().saturating_sub(1);
    let mut out: Vec<TraceRequest> = seen
        .iter()
        .map(|id| {
            let mut its = lived.remove(id).unwrap_or_default();
            let share_by = if its.iter().all(|s| s.own_tokens.is_some()) {
                ShareBy::Tokens
            } else {
                ShareBy::Requests
            };
            let first = its.first().map_or(0, |s| s.index);
            let last = its.last().map_or(0, |s| s.index);
            let request = TraceRequest {
                id: id.to_string(),
                steps: its.len(),
                first_step: its.first().and_then(|s| s.step),
                last_step: its.last().and_then(|s| s.step),
                absent_steps: (last - first + 1).saturating_sub(its.len()),
                at_start: first == 0,
                at_end: last == last_index,
                prefill: phase(&its, IterationRole::Prefill),
                decode: phase(&its, IterationRole::Decode),
                wall_ms: its.iter().map(|s| s.ms).sum(),
                cpu_ms: its.iter().map(|s| s.share * s.cpu_ms).sum(),
                gpu_ms: its.iter().map(|s| s.share * s.gpu_ms).sum(),
                share_by,
                costliest: Vec::new(),
                log: None,
            };
            if let Some(k) = keep {
                its.sort_by(|a, b| b.ms.total_cmp(&a.ms).then(a.index.cmp(&b.index)));
                its.truncate(k);
            }
            TraceRequest {
                costliest: its,
                ..request
            }
        })
        .collect();
    out.sort_by(|a, b| b.wall_ms.total_cmp(&a.wall_ms));
    out
}

/// Whether the log's id `logged` is the trace's `id`: the same, or its first [`ID_BYTES`]
/// bytes (a log keeps longer ids cut).
fn same_id(logged: &str, id: &str) -> bool {
    logged == id || (logged.len() == ID_BYTES && id.len() > ID_BYTES && id.starts_with(logged))
}

/// Gives each request its lifecycle from the first of the request logs (each with its file's
/// name) that holds it, with its `keep` costliest engine steps up to its first token
/// (`None`: every step it lived through, in order).
pub fn join_logs(
    requests: &mut [TraceRequest],
    logs: &[(String, RequestsDocument)],
    keep: Option<usize>,
) {
    for (file, doc) in logs {
        if requests.iter().all(|r| r.log.is_some()) {
            return;
        }
        let found = breakdowns(file, doc, RankBy::Ttft, keep);
        let by_id: HashMap<&str, &RequestBreakdown> =
            found.iter().map(|b| (b.id.as_str(), b)).collect();
        for r in requests.iter_mut().filter(|r| r.log.is_none()) {
            // A log keeps an id cut to its first ID_BYTES bytes.
            let cut = (0..=ID_BYTES.min(r.id.len()))
                .rev()
                .find(|&n| r.id.is_char_boundary(n))
                .map_or(r.id.as_str(), |n| &r.id[..n]);
            r.log = by_id
                .get(r.id.as_str())
                .or_else(|| by_id.get(cut).filter(|b| same_id(&b.id, &r.id)))
                .map(|b| (*b).clone());
        }
    }
}

fn ms(v: f64) -> String {
    format!("{v:.3} ms")
}

fn step_label(s: &InStep) -> String {
    s.step
        .map_or_else(|| format!("#{}", s.index + 1), |i| i.to_string())
}

/// What an iteration carried, in words: batch, tokens, its largest prefill chunk.
fn carried(s: &InStep) -> String {
    let mut o = format!("{} request(s)", s.requests);
    if let Some(t) = s.tokens {
        o.push_str(&format!(", {t} tokens"));
    }
    if let Some(r) = &s.largest_prefill_request {
        if s.own_prefill {
            o.push_str(&format!(
                ", its own prefill chunk the largest ({} tokens)",
                s.largest_prefill_tokens
            ));
        } else {
            o.push_str(&format!(
                ", largest prefill {} tokens of {}",
                s.largest_prefill_tokens,
                crate::text::short(r, 40)
            ));
        }
    }
    o
}

fn role_of(s: &InStep) -> String {
    match s.own_tokens {
        Some(t) => format!("{} {t} tok", s.role.as_str()),
        None => s.role.as_str().into(),
    }
}

/// The table of a trace's requests: the first `top` (0: all), each with its costliest
/// iterations.
pub fn render(all: &[TraceRequest], top: usize) -> String {
    let mut o = String::new();
    if all.is_empty() {
        o.push_str(
            "\n  requests: none recorded (capture with \"stepscope\": {\"request_ids\": true})\n",
        );
        return o;
    }
    let shown = if top == 0 {
        all.len()
    } else {
        top.min(all.len())
    };
    let by_tokens = all.iter().all(|r| r.share_by == ShareBy::Tokens);
    o.push_str(&format!(
        "\n  requests: {} in the capture, {shown} shown, by the wall time of the iterations they were in; CPU and GPU shares by {}\n",
        all.len(),
        if by_tokens { "tokens" } else { "request (tokens not recorded)" }
    ));
    let partial = all
        .iter()
        .filter(|r| r.log.as_ref().is_some_and(|l| l.partial))
        .count();
    let unjoined = all.iter().filter(|r| r.log.is_none()).count();
    if partial > 0 || (unjoined > 0 && unjoined < all.len()) {
        o.push_str(&format!(
            "  their engines' logs: {partial} record(s) partial (the log lost their start: \
             prompt, cached and output tokens unknown), {unjoined} request(s) not in any log \
             beside the trace\n"
        ));
    }
    o.push_str("  request                               steps   prefill (chunks, tokens, ms)   decode (steps, mean, max)      wall         CPU share    GPU share\n");
    for r in all.iter().take(shown) {
        let prefill = r.prefill.map_or_else(
            || "-".into(),
            |p| format!("{} × {} tok {}", p.steps, p.tokens, ms(p.ms)),
        );
        let decode = r.decode.map_or_else(
            || "-".into(),
            |d| format!("{}, {:.3}, {:.3} ms", d.steps, d.mean_ms, d.max_ms),
        );
        let edge = match (r.at_start, r.at_end) {
            (true, true) => " [whole capture]",
            (true, false) => " [from the start]",
            (false, true) => " [to the end]",
            _ => "",
        };
        o.push_str(&format!(
            "  {:<36}  {:>5}   {:<29}  {:<29}  {:>11}  {:>11}  {:>11}{edge}\n",
            crate::text::short(&r.id, 36),
            r.steps,
            prefill,
            decode,
            ms(r.wall_ms),
            ms(r.cpu_ms),
            ms(r.gpu_ms),
        ));
        if r.absent_steps > 0 {
            o.push_str(&format!(
                "      not scheduled in {} iteration(s) between its first and last\n",
                r.absent_steps
            ));
        }
        for s in r.costliest.iter().take(COSTLIEST) {
            o.push_str(&format!(
                "      step {:<8} {:>11}  {:<18} {}\n",
                step_label(s),
                ms(s.ms),
                role_of(s),
                carried(s)
            ));
        }
        if let Some(b) = &r.log {
            o.push_str(&format!(
                "      in its engine's request log ({}):\n",
                b.server
            ));
            lifecycle(
                &mut o,
                b,
                "        ",
                "engine steps that cost it most, to its first token:",
            );
        }
    }
    if all.iter().take(shown).all(|r| r.log.is_none()) {
        o.push_str("  (a trace holds only the captured iterations: a request's arrival, queue wait and time to first token are in its engine's request log, \"stepscope\": {\"requests\": true}, which a capture then writes beside its traces)\n");
    }
    o
}

/// One request's iterations, in order.
pub fn render_one(r: &TraceRequest) -> String {
    let mut o = format!(
        "\n  request {}: {} captured iteration(s), {} wall, CPU share {}, GPU share {}\n",
        r.id,
        r.steps,
        ms(r.wall_ms),
        ms(r.cpu_ms),
        ms(r.gpu_ms)
    );
    o.push_str(
        "  step        wall         role               share   what the iteration carried\n",
    );
    for s in &r.costliest {
        o.push_str(&format!(
            "  {:<10}  {:>11}  {:<18} {:>5.1}%  {}\n",
            step_label(s),
            ms(s.ms),
            role_of(s),
            100.0 * s.share,
            carried(s)
        ));
    }
    if let Some(b) = &r.log {
        o.push_str(&format!(
            "\n  in its engine's request log ({}):\n",
            b.server
        ));
        lifecycle(&mut o, b, "  ", "every engine step it lived through:");
    }
    o
}

/// A captured iteration for tests: step `i` starting at `i` × 10 ms, lasting `ms`, half of it
/// CPU operator time and a tenth kernel time, serving `reqs` (id, tokens, in prefill).
#[cfg(test)]
pub(crate) fn test_step(i: u64, ms: f64, reqs: &[(&str, u32, bool)]) -> Step {
    Step {
        name: format!("execute_{i}"),
        step: Some(i),
        requests: reqs.iter().map(|r| r.0.to_string()).collect(),
        tokens: reqs.iter().map(|r| r.1).collect(),
        prefill: reqs.iter().map(|r| r.2).collect(),
        start_us: i as f64 * 1e4,
        dur_us: ms * 1e3,
        cpu_op_us: ms * 500.0,
        kernel_us: ms * 100.0,
        kernel_count: 1,
        gpu: None,
        work: None,
        floor: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_step as step;

    #[test]
    fn a_short_request_is_charged_to_the_long_prefill_it_shared_steps_with() {
        let steps = vec![
            step(1, 30.0, &[("long", 128, true), ("short", 1, false)]),
            step(2, 31.0, &[("long", 128, true), ("short", 1, false)]),
            step(3, 2.0, &[("short", 1, false)]),
            step(4, 2.0, &[("long", 1, false)]),
        ];
        let all = requests(&steps, Some(COSTLIEST));
        let long = all.iter().find(|r| r.id == "long").unwrap();
        let short = all.iter().find(|r| r.id == "short").unwrap();
        assert_eq!(all[0].id, "long", "61+2 ms of iterations before 61+2");
        let p = long.prefill.unwrap();
        assert_eq!((p.steps, p.tokens), (2, 256));
        assert_eq!(long.absent_steps, 1, "step 3 left it out");
        assert!(long.at_start && long.at_end);
        // Shares by tokens: 128/129 of steps 1 and 2's CPU time.
        let expected = 128.0 / 129.0 * (15.0 + 15.5) + 1.0;
        assert!((long.cpu_ms - expected).abs() < 1e-9, "{}", long.cpu_ms);
        assert_eq!(short.share_by, ShareBy::Tokens);
        let worst = &short.costliest[0];
        assert_eq!(worst.step, Some(2));
        assert_eq!(worst.largest_prefill_request.as_deref(), Some("long"));
        assert_eq!(
            (worst.largest_prefill_tokens, worst.own_prefill),
            (128, false)
        );
        assert_eq!(short.decode.unwrap().steps, 3);
        assert!(!short.at_end);
        let text = render(&all, 10);
        assert!(
            text.contains("largest prefill 128 tokens of long"),
            "{text}"
        );
    }

    /// A log's request record, as the engine serves it.
    fn record(id: &str, queued: u64, first: u64, token: u64) -> serde_json::Value {
        serde_json::json!({
            "id": id, "prompt_tokens": 8, "cached_tokens": 0, "output_tokens": 1,
            "arrival_unix_ns": queued, "queued_unix_ns": queued, "queued_after_step": 1,
            "first_scheduled_step": first, "first_scheduled_unix_ns": first * 1_000_000_000,
            "prefill_steps": 1, "prefill_tokens": 8, "first_token_step": first,
            "first_token_unix_ns": token, "decode_steps": 0, "last_token_unix_ns": token,
            "last_step": first, "preempted_at": [], "resumed_at": [], "finished_step": first,
            "finished_unix_ns": token, "finish": "length"
        })
    }

    #[test]
    fn a_request_log_beside_the_trace_gives_each_request_its_queue_and_ttft() {
        let long_id = "x".repeat(ID_BYTES + 6);
        let steps = vec![step(
            5,
            30.0,
            &[(long_id.as_str(), 8, true), ("short", 8, true)],
        )];
        let mut all = requests(&steps, Some(COSTLIEST));
        let steps: Vec<serde_json::Value> = [1u64, 2]
            .iter()
            .map(|i| {
                serde_json::json!({
                    "step": i, "start_unix_ns": i * 1_000_000_000, "duration_ns": 500_000_000,
                    "prefill_reqs": 1, "prefill_tokens": 8, "decode_reqs": 0,
                    "decode_tokens": 0, "preempted": 0, "waiting": 1,
                    "largest_prefill_tokens": 8, "largest_prefill_request": "short"
                })
            })
            .collect();
        // The log keeps a long id cut to ID_BYTES bytes.
        let records = [
            record(&long_id[..ID_BYTES], 900_000_000, 2, 2_500_000_000),
            record("short", 900_000_000, 1, 1_500_000_000),
        ];
        let doc: RequestsDocument = serde_json::from_value(serde_json::json!({
            "pid": 1, "step_index": 2, "now_unix_ns": 0, "clock": "tsc",
            "capacity": {"requests": 16, "steps": 16}, "recorded": {"requests": 2, "steps": 2},
            "evicted_running": 0, "steps": steps, "requests": records,
        }))
        .unwrap();
        join_logs(
            &mut all,
            &[("engine0.1.requests.json".into(), doc)],
            Some(COSTLIEST),
        );
        let by = |id: &str| all.iter().find(|r| r.id == id).unwrap();
        let short = by("short").log.as_ref().unwrap();
        assert_eq!(short.queue.unwrap().ms, 100.0);
        assert_eq!(short.ttft_ms, Some(600.0));
        let long = by(&long_id).log.as_ref().unwrap();
        assert_eq!((long.queue.unwrap().steps, long.ttft_ms), (1, Some(1600.0)));
        // It waited through step 1, whose prefill was the short request's.
        assert_eq!(
            long.costliest[0].largest_prefill_request.as_deref(),
            Some("short")
        );
        let text = render(&all, 0);
        assert!(
            text.contains("in its engine's request log (engine0.1.requests.json)"),
            "{text}"
        );
        assert!(!text.contains("a trace holds only"), "{text}");
    }

    #[test]
    fn without_tokens_a_step_is_shared_equally_and_phases_are_unknown() {
        let mut s = step(7, 10.0, &[("a", 0, false), ("b", 0, false)]);
        s.tokens.clear();
        s.prefill.clear();
        let all = requests(&[s], None);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].share_by, ShareBy::Requests);
        assert!((all[0].cpu_ms - 2.5).abs() < 1e-9);
        assert!(all[0].prefill.is_none() && all[0].decode.is_none());
        assert_eq!(all[0].costliest[0].role, IterationRole::Scheduled);
        assert!(render(&all, 0).contains("tokens not recorded"));
    }
}
