//! What each engine answers, read by one rule: the workers' states in a status answer and the
//! workers' step timelines, from vLLM's routes (`{"workers": [...]}`) or from SGLang's
//! `/server_info`, whose `internal_states` (one per answering scheduler) each carry the plugin's
//! `"stepscope"` object.

use serde::Serialize;
use serde_json::Value;
use stepscope_format::requests::RequestsDocument;
use stepscope_format::timeline::{field_positions, TimelineStep};

use crate::flags::Engine;

/// At most 200 characters of a body, on one line.
pub(super) fn excerpt(body: &str) -> String {
    let one_line: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.is_empty() {
        return "(empty body)".into();
    }
    match one_line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

/// The answer as JSON, or why it is not.
fn json(body: &str) -> Result<Value, String> {
    serde_json::from_str(body)
        .map_err(|e| format!("the answer is not JSON ({e}): {}", excerpt(body)))
}

/// vLLM's `{"workers": [...]}`.
fn vllm_workers(value: &Value, body: &str) -> Result<Vec<Value>, String> {
    value
        .get("workers")
        .and_then(Value::as_array)
        .cloned()
        .ok_or_else(|| {
            format!(
                "the answer is not {{\"workers\": [...]}}: {}",
                excerpt(body)
            )
        })
}

/// SGLang's `/server_info`: each answering scheduler's `"stepscope"` object, in order; an error
/// when none carries one (the plugin is not installed in that server).
fn sglang_states(value: &Value, body: &str) -> Result<Vec<Value>, String> {
    let states = value
        .get("internal_states")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            format!(
                "/server_info has no internal_states list: {}",
                excerpt(body)
            )
        })?;
    let ours: Vec<Value> = states
        .iter()
        .filter_map(|s| s.get("stepscope"))
        .cloned()
        .collect();
    if ours.is_empty() {
        return Err(
            "/server_info carries no stepscope status: install stepscope in the \
                    server's environment (with SGLANG_PLUGINS set, it must name stepscope)"
                .to_string(),
        );
    }
    Ok(ours)
}

/// A status answer: the engine workers' states, and the OpenTelemetry exports' counters
/// (`"otel"`: vLLM's API server's, SGLang's schedulers'; none where the export is off).
pub(super) fn status_answer(
    engine: Engine,
    body: &str,
) -> Result<(Vec<Value>, Vec<Value>), String> {
    let value = json(body)?;
    let on = |v: Option<&Value>| v.filter(|v| v.is_object()).cloned();
    match engine {
        Engine::Vllm => Ok((
            vllm_workers(&value, body)?,
            on(value.get("otel")).into_iter().collect(),
        )),
        Engine::Sglang => {
            let states = sglang_states(&value, body)?;
            let workers = states
                .iter()
                .filter_map(|s| s.get("workers")?.as_array())
                .flatten()
                .cloned()
                .collect();
            let otel = states.iter().filter_map(|s| on(s.get("otel"))).collect();
            Ok((workers, otel))
        }
    }
}

/// Each answering scheduler's request log in SGLang's `/server_info` (its `stepscope.requests`:
/// a log's document, or null where the log is off), in order.
fn sglang_request_logs(body: &str) -> Result<Vec<Value>, String> {
    let value = json(body)?;
    Ok(sglang_states(&value, body)?
        .iter()
        .map(|s| s.get("requests").cloned().unwrap_or(Value::Null))
        .collect())
}

/// One engine worker's step timeline as its server reported it, with the steps gathered so
/// far.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerTimeline {
    /// The server's base URL.
    pub url: String,
    pub worker_name: String,
    pub rank: Option<i64>,
    /// The session's phase now (idle, delaying, running, watching, ...).
    pub phase: String,
    /// The worker's step count now.
    pub step_index: u64,
    /// The server's clock when it answered, ns since the Unix epoch.
    pub now_unix_ns: u64,
    /// `None` when this worker's timeline is off.
    pub steps: Option<Vec<TimelineStep<String>>>,
}

/// The workers' timelines in a timeline answer: vLLM's `/stepscope/timeline`, or SGLang's
/// `/server_info` (each scheduler's `stepscope.timeline`, in the form of vLLM's workers; a
/// scheduler whose timeline is off is listed as such).
pub fn timeline_workers(
    engine: Engine,
    url: &str,
    body: &str,
) -> Result<Vec<WorkerTimeline>, String> {
    let value = json(body)?;
    match engine {
        Engine::Vllm => vllm_workers(&value, body)?
            .iter()
            .map(|w| timeline_worker(url, w))
            .collect(),
        Engine::Sglang => sglang_states(&value, body)?
            .iter()
            .enumerate()
            .map(|(i, state)| match state.get("timeline") {
                Some(t) if !t.is_null() => timeline_worker(url, t),
                _ => Ok(WorkerTimeline {
                    url: url.to_string(),
                    worker_name: format!("scheduler{i}"),
                    rank: None,
                    phase: String::new(),
                    step_index: 0,
                    now_unix_ns: 0,
                    steps: None,
                }),
            })
            .collect(),
    }
}

fn timeline_worker(url: &str, w: &Value) -> Result<WorkerTimeline, String> {
    let text = |k: &str| w.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let num = |k: &str| w.get(k).and_then(Value::as_u64).unwrap_or(0);
    let steps = match w.get("steps") {
        None | Some(Value::Null) => None,
        Some(Value::Array(rows)) => {
            let fields: Vec<&str> = w
                .get("fields")
                .and_then(Value::as_array)
                .map(|f| f.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let at = field_positions(&fields)?;
            Some(
                rows.iter()
                    .map(|row| TimelineStep::from_row(row, &at))
                    .collect::<Result<_, _>>()?,
            )
        }
        Some(other) => return Err(format!("\"steps\" is not a list: {other}")),
    };
    Ok(WorkerTimeline {
        url: url.to_string(),
        worker_name: if text("worker_name").is_empty() {
            format!("rank{}", w.get("rank").and_then(Value::as_i64).unwrap_or(0))
        } else {
            text("worker_name")
        },
        rank: w.get("rank").and_then(Value::as_i64),
        phase: text("phase"),
        step_index: num("step_index"),
        now_unix_ns: num("now_unix_ns"),
        steps,
    })
}

/// Each engine's request log in a `ctl requests` answer, and how many engines keep none:
/// vLLM's `GET /stepscope/requests` (`{"engines": [...]}`), SGLang's `/server_info` (each
/// scheduler's log of its last steps).
pub(super) fn request_logs(
    engine: Engine,
    body: &str,
) -> Result<(Vec<RequestsDocument>, usize), String> {
    match engine {
        Engine::Vllm => vllm_request_logs(body),
        Engine::Sglang => documents(&sglang_request_logs(body)?),
    }
}

/// `{"engines": [document, ...]}`: the documents of the engines that keep a log, and how many
/// keep none (`"requests": null`).
fn vllm_request_logs(body: &str) -> Result<(Vec<RequestsDocument>, usize), String> {
    let value = json(body)?;
    let engines = value
        .get("engines")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            format!(
                "the answer is not {{\"engines\": [...]}}: {}",
                excerpt(body)
            )
        })?;
    documents(engines)
}

/// The logs among engines' answers (a log's document each, `null` or `"requests": null` where
/// an engine keeps none), and how many keep none.
fn documents(engines: &[Value]) -> Result<(Vec<RequestsDocument>, usize), String> {
    let mut docs = Vec::new();
    let mut off = 0;
    for e in engines {
        if e.get("requests").is_none_or(Value::is_null) {
            off += 1;
            continue;
        }
        docs.push(
            serde_json::from_value(e.clone())
                .map_err(|err| format!("an engine's request log is not in its form: {err}"))?,
        );
    }
    Ok((docs, off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_read_by_its_field_names() {
        let body = r#"{"workers": [{"worker_name": "rank0", "rank": 0, "phase": "idle",
            "step_index": 9, "now_unix_ns": 100,
            "fields": ["phase", "step", "start_unix_ns", "duration_ns", "num_ctx_reqs",
                       "num_ctx_tokens", "num_gen_reqs", "num_gen_tokens"],
            "steps": [["idle", 9, 50, 7, 1, 2, 3, 4]]},
            {"rank": 1, "steps": null, "fields": []}]}"#;
        let w = timeline_workers(Engine::Vllm, "http://h:1", body).unwrap();
        assert_eq!(
            w[0].steps.as_deref(),
            Some(
                &[TimelineStep {
                    step: 9,
                    start_unix_ns: 50,
                    duration_ns: 7,
                    num_ctx_reqs: 1,
                    num_ctx_tokens: 2,
                    num_gen_reqs: 3,
                    num_gen_tokens: 4,
                    phase: "idle".to_string()
                }][..]
            )
        );
        assert_eq!(
            (w[1].worker_name.as_str(), w[1].steps.is_none()),
            ("rank1", true)
        );
        let bad = timeline_workers(
            Engine::Vllm,
            "u",
            r#"{"workers": [{"fields": ["step"], "steps": [[1]]}]}"#,
        );
        assert!(bad.unwrap_err().contains("start_unix_ns"));
        assert!(timeline_workers(Engine::Vllm, "u", "<html>")
            .unwrap_err()
            .contains("not JSON"));
    }
}
