//! A request's engine steps as OpenTelemetry spans, from its engine's request log: what the
//! engine plugins export beside the engine's own request span and `stepscope export` sends
//! from a capture's logs. One builder; the encodings are `otlp.rs`'s.
//!
//! Under the engine's span of the request when there is one (vLLM's `llm_request`: the same
//! trace, its span the parent), else under a request span of stepscope's own:
//!
//! - `stepscope.engine`: the request's life in the engine core, from reaching its scheduler
//!   to its end, with an event for each preemption (`stepscope.preempted`) and return
//!   (`stepscope.resumed`), and attributes naming its costliest steps and what they carried;
//! - under it, `stepscope.queue` (reaching the scheduler to its first scheduling, with the
//!   steps it waited through and the largest prefill among them), one `stepscope.prefill`
//!   per prefill chunk (its step, batch and tokens), and `stepscope.decode` (its decode steps,
//!   their mean and longest);
//! - optionally one `stepscope.step` span per engine step (batch, tokens, phase, duration:
//!   [`step_spans`], each exported once), linked from the request spans of the steps that
//!   served them.
//!
//! Attribute names follow the OpenTelemetry GenAI conventions where one exists
//! (`gen_ai.request.id`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`) and are
//! `stepscope.*` where none does; each is documented in docs/vllm.md.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde::{Deserialize, Serialize};

use super::breakdown::{self, Lived, RankBy, RequestBreakdown, StepCost};
use super::document::{EngineStep, RequestRecord, RequestsDocument};

/// The engine's own span of a request, which stepscope's are the children of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpanParent {
    /// Its trace id, 32 hex digits.
    pub trace_id: String,
    /// Its span id, 16 hex digits.
    pub span_id: String,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttrValue {
    /// An integer.
    Int(i64),
    /// A number.
    Double(f64),
    /// Text.
    Str(String),
}

/// A span event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanEvent {
    /// Its name.
    pub name: String,
    /// When, ns since the Unix epoch.
    pub time_unix_ns: u64,
    /// Its attributes.
    pub attributes: Vec<(String, AttrValue)>,
}

/// One span, ready to encode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// The parent's span id, 16 hex digits (none for a root).
    pub parent_span_id: Option<String>,
    /// Its name.
    pub name: String,
    /// Start, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// End.
    pub end_unix_ns: u64,
    /// Its attributes, in order.
    pub attributes: Vec<(String, AttrValue)>,
    /// Its events.
    pub events: Vec<SpanEvent>,
    /// The span ids (of the same trace or another: trace id, span id) it links to.
    pub links: Vec<(String, String)>,
}

/// The name of a request's span in its engine (one per request built): what a caller counts
/// requests by.
pub const ENGINE_SPAN: &str = "stepscope.engine";

/// How many of a request's costliest steps its engine span names, unless told otherwise
/// (`stepscope.otel.costliest`, `stepscope export --costliest`).
pub const COSTLIEST: usize = 3;

/// What to build.
#[derive(Debug, Clone, Copy)]
pub struct SpanOptions {
    /// A number distinguishing this process's ids from another's (its pid and start time,
    /// say): span ids are hashes of it with the request or step.
    pub salt: u64,
    /// Costliest steps named per request.
    pub costliest: usize,
    /// One span per engine step too, linked from the requests' spans.
    pub steps: bool,
}

/// Links from a request's decode span to its steps, at most.
const MAX_LINKS: usize = 128;

fn id64(salt: u64, parts: &[&dyn HashPart]) -> u64 {
    let mut h = DefaultHasher::new();
    salt.hash(&mut h);
    for p in parts {
        p.feed(&mut h);
    }
    // Never the invalid all-zero id.
    h.finish().max(1)
}

trait HashPart {
    fn feed(&self, h: &mut DefaultHasher);
}
impl HashPart for &str {
    fn feed(&self, h: &mut DefaultHasher) {
        self.hash(h);
    }
}
impl HashPart for u64 {
    fn feed(&self, h: &mut DefaultHasher) {
        self.hash(h);
    }
}

fn hex64(v: u64) -> String {
    format!("{v:016x}")
}

/// The span id of engine step `step` (of the engine process `pid`).
pub fn step_span_id(salt: u64, pid: u32, step: u64) -> String {
    hex64(id64(salt, &[&"step", &u64::from(pid), &step]))
}

/// The trace the step spans of engine process `pid` are in.
fn steps_trace(salt: u64, pid: u32) -> String {
    format!(
        "{}{}",
        hex64(id64(salt, &[&"steps", &u64::from(pid)])),
        hex64(id64(salt, &[&"steps2", &u64::from(pid)]))
    )
}

/// The spans of `doc`'s finished requests among `wanted` (each with the engine's span of it,
/// when there is one). Requests not finished, or not in the document, are left out; a partial
/// record's spans say so (`stepscope.partial`). With [`SpanOptions::steps`] their spans link to
/// the step spans of the steps that served them ([`step_spans`], exported once each).
pub fn request_spans(
    doc: &RequestsDocument,
    wanted: &[(String, Option<SpanParent>)],
    opts: SpanOptions,
) -> Vec<Span> {
    let steps: HashMap<u64, &EngineStep> = doc.steps.iter().map(|s| (s.step, s)).collect();
    let by_id: HashMap<&str, &RequestRecord> =
        doc.requests.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut out = Vec::new();
    for (id, parent) in wanted {
        let Some(r) = by_id.get(id.as_str()) else {
            continue;
        };
        if r.finish.is_none() {
            continue;
        }
        let b = breakdown::breakdown("", r, doc, &steps, RankBy::E2e, None);
        let lived: Vec<&StepCost> = b.costliest.iter().collect();
        out.extend(one_request(
            doc.pid,
            r,
            &b,
            &lived,
            &steps,
            parent.as_ref(),
            opts,
        ));
    }
    out
}

/// One `stepscope.step` span for each of `steps` (of engine process `pid`), in a trace of
/// their own: the ids the request spans link to under the same `salt`.
pub fn step_spans(pid: u32, steps: &[EngineStep], salt: u64) -> Vec<Span> {
    steps.iter().map(|st| step_span(pid, st, salt)).collect()
}

fn step_span(pid: u32, st: &EngineStep, salt: u64) -> Span {
    let phase = match (st.prefill_reqs > 0, st.decode_reqs > 0) {
        (true, true) => "mixed",
        (true, false) => "prefill",
        (false, true) => "decode",
        (false, false) => "idle",
    };
    Span {
        trace_id: steps_trace(salt, pid),
        span_id: step_span_id(salt, pid, st.step),
        parent_span_id: None,
        name: "stepscope.step".into(),
        start_unix_ns: st.start_unix_ns,
        end_unix_ns: st.end_unix_ns(),
        attributes: vec![
            ("stepscope.step".into(), AttrValue::Int(st.step as i64)),
            ("stepscope.step.phase".into(), AttrValue::Str(phase.into())),
            (
                "stepscope.batch.requests".into(),
                AttrValue::Int(st.requests().into()),
            ),
            (
                "stepscope.batch.tokens".into(),
                AttrValue::Int(st.tokens().into()),
            ),
            (
                "stepscope.batch.prefill_tokens".into(),
                AttrValue::Int(st.prefill_tokens.into()),
            ),
            (
                "stepscope.batch.waiting".into(),
                AttrValue::Int(st.waiting.into()),
            ),
            ("stepscope.pid".into(), AttrValue::Int(pid.into())),
        ],
        events: Vec::new(),
        links: Vec::new(),
    }
}

#[allow(clippy::too_many_arguments)]
fn one_request(
    pid: u32,
    r: &RequestRecord,
    b: &RequestBreakdown,
    lived: &[&StepCost],
    steps: &HashMap<u64, &EngineStep>,
    parent: Option<&SpanParent>,
    opts: SpanOptions,
) -> Vec<Span> {
    let salt = opts.salt;
    let id = r.id.as_str();
    let sid = |kind: &str, n: u64| hex64(id64(salt, &[&id, &kind, &n]));
    let end = r
        .finished_unix_ns
        .or(r.last_token_unix_ns)
        .unwrap_or_default();
    let begin = r
        .queued_unix_ns
        .or(r.first_scheduled_unix_ns)
        .unwrap_or(end);
    let mut out = Vec::new();
    // The request span of stepscope's own when the engine has none.
    let (trace_id, root) = match parent {
        Some(p) => (p.trace_id.clone(), p.span_id.clone()),
        None => {
            let trace = format!("{}{}", sid("trace", 0), sid("trace", 1));
            let own = sid("request", 0);
            out.push(Span {
                trace_id: trace.clone(),
                span_id: own.clone(),
                parent_span_id: None,
                name: "stepscope.request".into(),
                start_unix_ns: r.arrival_unix_ns.unwrap_or(begin),
                end_unix_ns: end,
                attributes: vec![("gen_ai.request.id".into(), AttrValue::Str(id.into()))],
                events: Vec::new(),
                links: Vec::new(),
            });
            (trace, own)
        }
    };
    // The step spans are in a trace of their own: a link names both ids.
    let link = |s: u64| (steps_trace(salt, pid), step_span_id(salt, pid, s));
    let step_links = |role: Lived| -> Vec<(String, String)> {
        if !opts.steps {
            return Vec::new();
        }
        lived
            .iter()
            .filter(|c| c.role == role)
            .map(|c| c.step)
            .take(MAX_LINKS)
            .map(link)
            .collect()
    };

    // The engine span: attributes of the whole, and the events.
    let engine = sid("engine", 0);
    let mut attrs: Vec<(String, AttrValue)> = vec![
        ("gen_ai.request.id".into(), AttrValue::Str(id.into())),
        ("stepscope.pid".into(), AttrValue::Int(pid.into())),
    ];
    if let Some(n) = r.prompt_tokens {
        attrs.push(("gen_ai.usage.input_tokens".into(), AttrValue::Int(n.into())));
    }
    if let Some(n) = r.output_tokens {
        attrs.push((
            "gen_ai.usage.output_tokens".into(),
            AttrValue::Int(n.into()),
        ));
    }
    if let Some(n) = r.cached_tokens {
        attrs.push(("stepscope.cached_tokens".into(), AttrValue::Int(n.into())));
    }
    if let Some(f) = &r.finish {
        attrs.push(("stepscope.finish".into(), AttrValue::Str(f.clone())));
    }
    if r.partial {
        attrs.push(("stepscope.partial".into(), AttrValue::Int(1)));
    }
    attrs.push((
        "stepscope.prefill.steps".into(),
        AttrValue::Int(r.prefill_steps.into()),
    ));
    attrs.push((
        "stepscope.decode.steps".into(),
        AttrValue::Int(r.decode_steps.into()),
    ));
    attrs.push((
        "stepscope.preemptions".into(),
        AttrValue::Int(r.preempted_at.len() as i64),
    ));
    let mut costly: Vec<&&StepCost> = lived.iter().collect();
    costly.sort_by(|a, b| b.ms.total_cmp(&a.ms).then(a.step.cmp(&b.step)));
    for (k, c) in costly.iter().take(opts.costliest).enumerate() {
        let p = format!("stepscope.costliest.{}", k + 1);
        attrs.push((format!("{p}.step"), AttrValue::Int(c.step as i64)));
        attrs.push((
            format!("{p}.role"),
            AttrValue::Str(lived_name(c.role).into()),
        ));
        attrs.push((format!("{p}.ms"), AttrValue::Double(c.ms)));
        attrs.push((
            format!("{p}.batch.requests"),
            AttrValue::Int(c.requests.into()),
        ));
        attrs.push((format!("{p}.batch.tokens"), AttrValue::Int(c.tokens.into())));
        attrs.push((
            format!("{p}.largest_prefill.tokens"),
            AttrValue::Int(c.largest_prefill_tokens.into()),
        ));
        if let Some(who) = &c.largest_prefill_request {
            attrs.push((
                format!("{p}.largest_prefill.request"),
                AttrValue::Str(who.clone()),
            ));
        }
    }
    let step_start = |s: u64| steps.get(&s).map(|st| st.start_unix_ns);
    let mut events = Vec::new();
    for (k, &p) in r.preempted_at.iter().enumerate() {
        let at = |s: u64| step_start(s).unwrap_or(begin);
        events.push(SpanEvent {
            name: "stepscope.preempted".into(),
            time_unix_ns: at(p),
            attributes: vec![("stepscope.step".into(), AttrValue::Int(p as i64))],
        });
        if let Some(&back) = r.resumed_at.get(k) {
            events.push(SpanEvent {
                name: "stepscope.resumed".into(),
                time_unix_ns: at(back),
                attributes: vec![("stepscope.step".into(), AttrValue::Int(back as i64))],
            });
        }
    }
    out.push(Span {
        trace_id: trace_id.clone(),
        span_id: engine.clone(),
        parent_span_id: Some(root),
        name: ENGINE_SPAN.into(),
        start_unix_ns: begin,
        end_unix_ns: end.max(begin),
        attributes: attrs,
        events,
        links: Vec::new(),
    });
    let child = |name: &str, span_id: String, start: u64, stop: u64, attributes, links| Span {
        trace_id: trace_id.clone(),
        span_id,
        parent_span_id: Some(engine.clone()),
        name: name.into(),
        start_unix_ns: start,
        end_unix_ns: stop.max(start),
        attributes,
        events: Vec::new(),
        links,
    };

    // Queue: the steps it waited through after reaching the scheduler.
    if let (Some(q), Some(first)) = (r.queued_unix_ns, r.first_scheduled_unix_ns) {
        let waited: Vec<&&StepCost> = lived
            .iter()
            .filter(|c| {
                c.role == Lived::Waiting
                    && steps.get(&c.step).is_some_and(|st| st.end_unix_ns() > q)
            })
            .collect();
        let mut a = vec![(
            "stepscope.queue.steps".into(),
            AttrValue::Int(waited.len() as i64),
        )];
        if let Some(held) = waited
            .iter()
            .filter(|c| c.largest_prefill_tokens > 0)
            .max_by(|x, y| {
                x.largest_prefill_tokens
                    .cmp(&y.largest_prefill_tokens)
                    .then(y.step.cmp(&x.step))
            })
        {
            a.push((
                "stepscope.queue.largest_prefill.tokens".into(),
                AttrValue::Int(held.largest_prefill_tokens.into()),
            ));
            if let Some(who) = &held.largest_prefill_request {
                a.push((
                    "stepscope.queue.largest_prefill.request".into(),
                    AttrValue::Str(who.clone()),
                ));
            }
            a.push((
                "stepscope.queue.largest_prefill.step".into(),
                AttrValue::Int(held.step as i64),
            ));
        }
        out.push(child(
            "stepscope.queue",
            sid("queue", 0),
            q,
            first,
            a,
            Vec::new(),
        ));
    }
    // Each prefill chunk.
    for (k, c) in lived
        .iter()
        .filter(|c| c.role == Lived::Prefill)
        .enumerate()
    {
        let Some(st) = steps.get(&c.step) else {
            continue;
        };
        let a = vec![
            ("stepscope.step".into(), AttrValue::Int(c.step as i64)),
            ("stepscope.chunk".into(), AttrValue::Int(k as i64 + 1)),
            (
                "stepscope.batch.requests".into(),
                AttrValue::Int(c.requests.into()),
            ),
            (
                "stepscope.batch.tokens".into(),
                AttrValue::Int(c.tokens.into()),
            ),
            (
                "stepscope.batch.prefill_tokens".into(),
                AttrValue::Int(c.prefill_tokens.into()),
            ),
            (
                "stepscope.largest_prefill.tokens".into(),
                AttrValue::Int(c.largest_prefill_tokens.into()),
            ),
            (
                "stepscope.largest_prefill.own".into(),
                AttrValue::Int(i64::from(c.own_prefill)),
            ),
        ];
        let links = if opts.steps {
            vec![link(c.step)]
        } else {
            Vec::new()
        };
        out.push(child(
            "stepscope.prefill",
            sid("prefill", c.step),
            st.start_unix_ns,
            st.end_unix_ns(),
            a,
            links,
        ));
    }
    // The decode run.
    let decodes: Vec<&&StepCost> = lived.iter().filter(|c| c.role == Lived::Decode).collect();
    if let (Some(first), Some(last)) = (decodes.first(), decodes.last()) {
        if let (Some(a0), Some(a1)) = (steps.get(&first.step), steps.get(&last.step)) {
            let mut a = vec![(
                "stepscope.decode.steps".into(),
                AttrValue::Int(decodes.len() as i64),
            )];
            if let (Some(mean), Some(max)) = (b.decode_step_mean_ms, b.decode_step_max_ms) {
                a.push((
                    "stepscope.decode.step.mean_ms".into(),
                    AttrValue::Double(mean),
                ));
                a.push((
                    "stepscope.decode.step.max_ms".into(),
                    AttrValue::Double(max),
                ));
            }
            out.push(child(
                "stepscope.decode",
                sid("decode", 0),
                a0.start_unix_ns,
                a1.end_unix_ns(),
                a,
                step_links(Lived::Decode),
            ));
        }
    }
    out
}

fn lived_name(l: Lived) -> &'static str {
    match l {
        Lived::Waiting => "waiting",
        Lived::Prefill => "prefill",
        Lived::Decode => "decode",
        Lived::Preempted => "preempted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::document::Counts;

    use crate::requests::fixtures::{step, MS};

    fn record(id: &str) -> RequestRecord {
        RequestRecord {
            finish: Some("length".into()),
            ..crate::requests::fixtures::record(id, 8, 3)
        }
    }

    /// A long prompt prefilled in steps 1-3 (100 ms each) while a short request, queued at
    /// 50 ms, waits; the short one prefills in step 4 and decodes in 5-6, preempted in 5 and
    /// back in 6.
    fn doc() -> RequestsDocument {
        let short = RequestRecord {
            queued_unix_ns: Some(50 * MS),
            queued_after_step: 1,
            first_scheduled_step: Some(4),
            first_scheduled_unix_ns: Some(300 * MS),
            prefill_steps: 1,
            prefill_tokens: 8,
            first_token_step: Some(4),
            first_token_unix_ns: Some(310 * MS),
            last_prefill_step: Some(4),
            decode_steps: 1,
            last_token_unix_ns: Some(330 * MS),
            last_step: Some(6),
            preempted_at: vec![5],
            resumed_at: vec![6],
            finished_step: Some(6),
            finished_unix_ns: Some(330 * MS),
            ..record("short")
        };
        RequestsDocument {
            pid: 7,
            step_index: 6,
            now_unix_ns: 400 * MS,
            clock: "monotonic".into(),
            capacity: Counts {
                requests: 16,
                steps: 16,
            },
            recorded: Counts {
                requests: 2,
                steps: 6,
            },
            evicted_running: 0,
            steps: vec![
                step(1, 0, 100, Some((256, "long")), 0),
                step(2, 100, 100, Some((256, "long")), 0),
                step(3, 200, 100, Some((88, "long")), 0),
                step(4, 300, 10, Some((8, "short")), 1),
                step(5, 310, 10, None, 1),
                step(6, 320, 10, None, 2),
            ],
            requests: vec![
                short,
                RequestRecord {
                    finish: None,
                    ..record("running")
                },
            ],
        }
    }

    fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a AttrValue> {
        s.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    #[test]
    fn a_requests_spans_sit_under_the_engines_span_and_name_what_held_it() {
        let parent = SpanParent {
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            span_id: "b7ad6b7169203331".into(),
        };
        let opts = SpanOptions {
            salt: 1,
            costliest: 2,
            steps: true,
        };
        let wanted = vec![
            ("short".to_string(), Some(parent.clone())),
            // Not finished: no spans yet.
            ("running".to_string(), None),
            ("absent".to_string(), None),
        ];
        let spans = request_spans(&doc(), &wanted, opts);
        let named = |n: &str| spans.iter().filter(|s| s.name == n).collect::<Vec<_>>();
        let (engine,) = (named("stepscope.engine")[0],);
        assert_eq!(engine.trace_id, parent.trace_id);
        assert_eq!(
            engine.parent_span_id.as_deref(),
            Some(parent.span_id.as_str())
        );
        assert_eq!(
            (engine.start_unix_ns, engine.end_unix_ns),
            (50 * MS, 330 * MS)
        );
        // The queue: 50 ms to 300 ms, through steps 1-3 (step 1 ended after it was queued),
        // held by the long prefill's chunks, the largest (256 tokens) first seen in step 1.
        let queue = named("stepscope.queue")[0];
        assert_eq!(
            queue.parent_span_id.as_deref(),
            Some(engine.span_id.as_str())
        );
        assert_eq!(
            (queue.start_unix_ns, queue.end_unix_ns),
            (50 * MS, 300 * MS)
        );
        assert_eq!(
            attr(queue, "stepscope.queue.steps"),
            Some(&AttrValue::Int(3))
        );
        assert_eq!(
            attr(queue, "stepscope.queue.largest_prefill.request"),
            Some(&AttrValue::Str("long".into()))
        );
        assert_eq!(
            attr(queue, "stepscope.queue.largest_prefill.step"),
            Some(&AttrValue::Int(1))
        );
        let prefill = named("stepscope.prefill");
        assert_eq!(prefill.len(), 1);
        assert_eq!(
            (prefill[0].start_unix_ns, prefill[0].end_unix_ns),
            (300 * MS, 310 * MS)
        );
        // Decode: steps 5 (preempted: out) and 6 (back: decode).
        let decode = named("stepscope.decode")[0];
        assert_eq!(
            attr(decode, "stepscope.decode.steps"),
            Some(&AttrValue::Int(1))
        );
        assert_eq!(decode.links.len(), 1);
        let events: Vec<(&str, u64)> = engine
            .events
            .iter()
            .map(|e| (e.name.as_str(), e.time_unix_ns))
            .collect();
        assert_eq!(
            events,
            [
                ("stepscope.preempted", 310 * MS),
                ("stepscope.resumed", 320 * MS)
            ]
        );
        // The costliest steps are the long prefill's, named.
        assert_eq!(
            attr(engine, "stepscope.costliest.1.largest_prefill.request"),
            Some(&AttrValue::Str("long".into()))
        );
        assert!(attr(engine, "stepscope.costliest.3.step").is_none());
        // Each step a span of its own, those that scheduled the request linked from its
        // spans.
        let d = doc();
        let steps = step_spans(d.pid, &d.steps, opts.salt);
        assert_eq!(steps.len(), 6);
        assert!(named("stepscope.step").is_empty());
        assert!(steps.iter().any(|s| s.span_id == decode.links[0].1));
        assert!(steps.iter().any(|s| s.span_id == prefill[0].links[0].1));
        // Every span of the request inside the engine span.
        for s in spans.iter().filter(|s| s.trace_id == parent.trace_id) {
            assert!(s.start_unix_ns >= engine.start_unix_ns && s.end_unix_ns <= engine.end_unix_ns);
        }
    }

    #[test]
    fn without_the_engines_span_a_request_span_of_its_own_roots_them() {
        let spans = request_spans(
            &doc(),
            &[("short".to_string(), None)],
            SpanOptions {
                salt: 2,
                costliest: 3,
                steps: false,
            },
        );
        let root = spans
            .iter()
            .find(|s| s.name == "stepscope.request")
            .unwrap();
        assert_eq!(root.parent_span_id, None);
        let engine = spans.iter().find(|s| s.name == "stepscope.engine").unwrap();
        assert_eq!(
            engine.parent_span_id.as_deref(),
            Some(root.span_id.as_str())
        );
        assert!(spans
            .iter()
            .all(|s| s.trace_id == root.trace_id && s.links.is_empty()));
        // Ids are 32 and 16 hex digits, distinct.
        assert_eq!((root.trace_id.len(), root.span_id.len()), (32, 16));
        let mut ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), spans.len());
    }
}
