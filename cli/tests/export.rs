//! `stepscope export`: request logs as OTLP spans, written as OTLP JSON lines or posted to a
//! collector (a test server on loopback), each request once, the same ids on a second run;
//! a bad log or a refusing collector is an error naming it.

mod common;

use std::collections::HashSet;
use std::path::Path;

use common::server::{Reply, Server};
use common::stepscope;
use serde_json::{json, Value};
use stepscope_test_doubles::Scratch;

const S: u64 = 1_000_000_000;

/// An engine's request log: request `a` (2 prefill chunks behind nothing, 2 decode steps) and
/// request `b`, which waited behind `a`'s prefill, finished when `finished`.
fn request_log(finished: bool) -> Value {
    let step = |n: u64, prefill: Option<(u32, &str)>, decode: u32| {
        json!({"step": n, "start_unix_ns": n * S, "duration_ns": S / 2,
               "prefill_reqs": u32::from(prefill.is_some()),
               "prefill_tokens": prefill.map_or(0, |p| p.0), "decode_reqs": decode,
               "decode_tokens": decode, "preempted": 0, "waiting": 1,
               "largest_prefill_tokens": prefill.map_or(0, |p| p.0),
               "largest_prefill_request": prefill.map(|p| p.1)})
    };
    let done = |s: u64| if finished { Some(s) } else { None };
    json!({
        "pid": 7, "step_index": 6, "now_unix_ns": 9 * S, "clock": "tsc",
        "capacity": {"requests": 16, "steps": 16}, "recorded": {"requests": 2, "steps": 6},
        "evicted_running": 0,
        "steps": [step(1, Some((128, "a")), 0), step(2, Some((72, "a")), 0),
                  step(3, Some((8, "b")), 1), step(4, None, 2), step(5, None, 1)],
        "requests": [
            {"id": "a", "prompt_tokens": 200, "cached_tokens": 0, "output_tokens": 3,
             "arrival_unix_ns": S, "queued_unix_ns": S, "queued_after_step": 0,
             "first_scheduled_step": 1, "first_scheduled_unix_ns": S,
             "prefill_steps": 2, "prefill_tokens": 200, "first_token_step": 2,
             "first_token_unix_ns": 2 * S + S / 2, "decode_steps": 2,
             "last_token_unix_ns": 4 * S + S / 2, "last_step": 4, "preempted_at": [],
             "resumed_at": [], "finished_step": 4, "finished_unix_ns": 4 * S + S / 2,
             "finish": "length"},
            {"id": "b", "prompt_tokens": 8, "cached_tokens": 0, "output_tokens": 2,
             "arrival_unix_ns": S + S / 4, "queued_unix_ns": S + S / 4, "queued_after_step": 1,
             "first_scheduled_step": 3, "first_scheduled_unix_ns": 3 * S,
             "prefill_steps": 1, "prefill_tokens": 8, "first_token_step": 3,
             "first_token_unix_ns": 3 * S + S / 2, "decode_steps": 2,
             "last_token_unix_ns": 5 * S + S / 2, "last_step": 5, "preempted_at": [],
             "resumed_at": [], "finished_step": done(5),
             "finished_unix_ns": done(5 * S + S / 2),
             "finish": if finished { Some("stop") } else { None }},
        ],
    })
}

fn write(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), v.to_string()).unwrap();
}

/// Every span of OTLP JSON lines, with its `resourceSpans` walked.
fn spans_of(lines: &str) -> Vec<Value> {
    lines
        .lines()
        .flat_map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["resourceSpans"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|rs| rs["scopeSpans"].as_array().unwrap().clone())
                .flat_map(|ss| ss["spans"].as_array().unwrap().clone())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn export(args: &[&str]) -> std::process::Output {
    stepscope(&[&["export"], args].concat())
}

#[test]
fn a_directorys_logs_become_otlp_json_lines_each_request_once_with_the_same_ids_again() {
    let dir = Scratch::empty("export-json");
    // Two windows' logs of the same engine: the later one saw `b` finish.
    write(&dir, "engine0.100.requests.json", &request_log(false));
    write(&dir, "engine0.200.requests.json", &request_log(true));
    let out = dir.join("spans.jsonl");
    let o = export(&[
        "--otlp-json",
        out.to_str().unwrap(),
        "--steps",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with("exported 2 requests"), "{stdout}");
    // Progress on stderr.
    assert!(String::from_utf8_lossy(&o.stderr).contains("2/3 requests"));
    let text = std::fs::read_to_string(&out).unwrap();
    let spans = spans_of(&text);
    let named = |n: &str| spans.iter().filter(|s| s["name"] == n).collect::<Vec<_>>();
    // Each request once (a from the newer log, not again from the older), under a request
    // span of its own.
    let engines = named("stepscope.engine");
    let ids: Vec<&str> = engines
        .iter()
        .map(|e| {
            attr(e, "gen_ai.request.id").unwrap()["stringValue"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 2);
    assert_eq!(named("stepscope.request").len(), 2);
    // b's queue span: 1.25 s to 3 s, through steps 1-2, held by a's prefill.
    let b_engine = engines
        .iter()
        .find(|e| attr(e, "gen_ai.request.id").unwrap()["stringValue"] == "b")
        .unwrap();
    let queue = named("stepscope.queue")
        .into_iter()
        .find(|q| q["parentSpanId"] == b_engine["spanId"])
        .unwrap();
    assert_eq!(
        (&queue["startTimeUnixNano"], &queue["endTimeUnixNano"]),
        (&json!((S + S / 4).to_string()), &json!((3 * S).to_string()))
    );
    assert_eq!(
        attr(queue, "stepscope.queue.largest_prefill.request").unwrap()["stringValue"],
        "a"
    );
    assert_eq!(
        attr(queue, "stepscope.queue.steps").unwrap()["intValue"],
        "2"
    );
    // Every step once, and the requests' links name them.
    let steps = named("stepscope.step");
    assert_eq!(steps.len(), 5);
    let step_ids: HashSet<&str> = steps
        .iter()
        .map(|s| s["spanId"].as_str().unwrap())
        .collect();
    let linked: Vec<&str> = spans
        .iter()
        .flat_map(|s| s["links"].as_array().unwrap().iter())
        .map(|l| l["spanId"].as_str().unwrap())
        .collect();
    assert!(!linked.is_empty() && linked.iter().all(|l| step_ids.contains(l)));
    // No temporary left; a second run gives the same spans, ids included.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let again = dir.join("again.jsonl");
    let o = export(&[
        "--otlp-json",
        again.to_str().unwrap(),
        "--steps",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert_eq!(std::fs::read_to_string(&again).unwrap(), text);
}

#[test]
fn spans_are_posted_as_otlp_json_and_a_refusal_or_a_bad_log_is_an_error_naming_it() {
    let dir = Scratch::empty("export-post");
    let log = dir.join("engine0.1.requests.json");
    std::fs::write(&log, request_log(true).to_string()).unwrap();
    let collector = Server::new(|_, _| Reply::Json(200, json!({})));
    let url = format!("{}/v1/traces", collector.url);
    let o = export(&["--otlp", &url, "--batch", "1", log.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let posted = collector.requests();
    // One message a request (--batch 1), JSON, to the traces path.
    assert_eq!(posted.len(), 2);
    for p in &posted {
        assert_eq!((p.method.as_str(), p.path.as_str()), ("POST", "/v1/traces"));
        assert_eq!(p.content_type.as_deref(), Some("application/json"));
    }
    let lines: Vec<String> = posted.iter().map(|p| p.body.clone()).collect();
    assert_eq!(
        spans_of(&lines.join("\n"))
            .iter()
            .filter(|s| s["name"] == "stepscope.engine")
            .count(),
        2
    );

    // A collector that refuses: exit 2, its status and words said.
    let refusing = Server::new(|_, _| Reply::Text(500, "no room"));
    let o = export(&[
        "--otlp",
        &format!("{}/v1/traces", refusing.url),
        log.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("refused the spans (HTTP 500): no room"),
        "{err}"
    );

    // A file that is not a request log: named.
    let bad = dir.join("engine0.2.requests.json");
    std::fs::write(&bad, "{\"not\": 1}").unwrap();
    let o = export(&["--otlp", &url, bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("engine0.2.requests.json: not a request log"),
        "{err}"
    );
    // Neither sink, or both: a usage error.
    let o = export(&[log.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}
