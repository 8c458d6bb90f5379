//! `stepscope ctl`: start, stop and list profiling on every worker behind a router.
//!
//! Requests go to all workers at once (bounded by `concurrency`), each with its own timeout,
//! so one hung or dead worker costs one timeout, not the whole fleet's patience; every result
//! is reported, with what to check when it failed.
//!
//! - `fleet`: the workers, what is asked of them and what each answered;
//! - `discovery`: base URLs, the router's worker list, the servers a command names;
//! - `http`: the calls, their retries and what their failures mean, the fan-out;
//! - `answers`: what each engine answers (status, timelines), read by one rule;
//! - `body`: the `/start_profile` body in each engine's dialect;
//! - `render`: the table and the `--json` document;
//! - `stop_wait`: `ctl stop --wait`, until every engine worker's traces are written;
//! - `top`: `ctl top` and `ctl timeline`, from each server's step timeline; `page`: the
//!   timeline's HTML page;
//! - `requests`: `ctl requests`, from each engine's request log.

use std::process::ExitCode;
use std::time::Instant;

use serde_json::Value;

use crate::error::{partial, Error};
use crate::flags::{Common, CtlCommand};

mod answers;
mod body;
mod discovery;
mod fleet;
pub(crate) mod http;
mod page;
mod render;
pub(crate) mod requests;
mod stop_wait;
mod top;

pub use crate::flags::{Engine, StartFields};
pub use answers::{timeline_workers, WorkerTimeline};
pub use body::start_body;
pub use discovery::{discover, normalize_url, parse_worker_list, DiscoveryError};
pub use fleet::{Action, Outcome, Worker};
pub use http::{agent, call_worker, fan_out};
pub use render::{render_json, render_table};
pub use top::{render_top, summarize, Row, Span};

/// Sends `action` to every worker `c` names and prints what each answered: 0 when all
/// succeeded, 1 when some did not.
pub fn run(action: Action, c: &Common, body: Option<Value>) -> Result<ExitCode, Error> {
    let started = Instant::now();
    let agent = agent(c.timeout_for(action == Action::Stop), c.api_key.as_deref());
    let workers = discovery::servers_with_unhealthy(c, &agent)?;

    let (to_call, skipped): (Vec<_>, Vec<_>) = workers
        .iter()
        .partition(|w| c.include_unhealthy || w.healthy != Some(false));
    let urls: Vec<String> = to_call.iter().map(|w| w.url.clone()).collect();
    let concurrency = c.concurrency_for(urls.len());
    let mut outcomes = fan_out(
        &agent,
        c.engine,
        action,
        &urls,
        body.as_ref(),
        concurrency,
        c.retries,
    );
    outcomes.extend(skipped.iter().map(|w| {
        Outcome {
            url: w.url.clone(),
            ok: false,
            status: None,
            engine_workers: None,
            otel: Vec::new(),
            elapsed_ms: 0,
            error: Some(
                "skipped: the router reports this worker unhealthy (--include-unhealthy tries it \
             anyway)"
                    .into(),
            ),
        }
    }));
    // Report in discovery order.
    outcomes.sort_by_key(|o| workers.iter().position(|w| w.url == o.url));

    if c.json {
        crate::outln!("{}", render_json(&outcomes))?;
    } else {
        crate::out!("{}", render_table(action, &outcomes, started.elapsed()))?;
    }
    Ok(partial(!outcomes.iter().all(|o| o.ok)))
}

/// `stepscope ctl …`.
pub fn command(c: &CtlCommand) -> Result<ExitCode, Error> {
    match c {
        CtlCommand::Start(a) => {
            let body = start_body(a.common.engine, &a.fields).map_err(Error::Usage)?;
            run(Action::Start, &a.common, Some(body))
        }
        CtlCommand::Stop(a) => stop_wait::command(a),
        CtlCommand::Workers(c) => run(Action::Workers, c, None),
        CtlCommand::Status(c) => run(Action::Status, c, None),
        CtlCommand::Top(a) => top::top(a),
        CtlCommand::Timeline(a) => page::command(a),
        CtlCommand::Requests(a) => requests::command(a),
    }
}

#[cfg(test)]
mod tests {
    use super::answers::status_answer;
    use super::http::explain_status;
    use super::render::engine_worker_line;
    use super::*;
    use serde_json::json;

    #[test]
    fn a_worker_line_shows_the_slow_step_trigger() {
        let w = json!({
            "rank": 0, "phase": "watching", "backend": "torch", "step_index": 120,
            "slow_step_ms": 50.0, "slow_step_factor": 5.0, "median_step_ms": 9.25,
            "slowest_step": {"step": 77, "ms": 31.5}, "trigger_step": null,
        });
        let line = engine_worker_line(&w);
        assert!(
            line.contains("watching")
                && line.contains(
                    "trigger > 50 ms and > 5x median  median 9.2 ms  slowest step 77 (31.5 ms)"
                ),
            "{line}"
        );
        assert!(!line.contains("fired"), "{line}");
        let quiet = json!({"rank": 0, "phase": "idle", "backend": "torch"});
        assert!(!engine_worker_line(&quiet).contains("trigger"));
    }

    #[test]
    fn a_worker_line_shows_the_capture_budget_and_its_last_cut() {
        let w = json!({
            "rank": 0, "phase": "idle", "backend": "torch", "max_capture_mb": 2048,
            "max_capture_s": 300.0,
            "last_cut": {"by": "max_capture_mb", "step": 812, "grew_mb": 25.7,
                         "expansion": 80, "projected_mb": 2056.0, "limit_mb": 2048,
                         "seconds": 4.2, "limit_s": 300.0},
        });
        let line = engine_worker_line(&w);
        assert!(
            line.contains(
                "budget 2048 MB, 300 s  last cut at step 812 by max_capture_mb (grew 26 MB)"
            ),
            "{line}"
        );
        let off = json!({"rank": 0, "phase": "idle", "max_capture_mb": 0, "max_capture_s": 0.0});
        assert!(!engine_worker_line(&off).contains("budget"));
    }

    #[test]
    fn a_status_answer_carries_the_otel_export_and_its_line_says_what_was_dropped() {
        let body = json!({
            "workers": [{"rank": 0, "phase": "idle", "backend": "torch"}],
            "otel": {"endpoint": "http://c:4317", "queue": 4, "queued": 4, "in_flight": 1,
                     "exported_requests": 10, "exported_spans": 52, "dropped": 7,
                     "failed": 0, "not_found": 0, "steps_lost": 0, "last_error": null},
        });
        let (workers, otel) = status_answer(crate::flags::Engine::Vllm, &body.to_string()).unwrap();
        assert_eq!((workers.len(), otel.len()), (1, 1));
        let line = super::render::otel_line(&otel[0]);
        assert_eq!(
            line,
            "otel → http://c:4317: 10 requests exported (52 spans), 4/4 queued, 1 being \
             exported, 7 DROPPED (queue full)"
        );
        // Off: no export in the answer.
        let off = json!({"workers": [], "otel": null});
        assert!(status_answer(crate::flags::Engine::Vllm, &off.to_string())
            .unwrap()
            .1
            .is_empty());
    }

    #[test]
    fn router_dialects_parse() {
        let vllm = json!({"workers": [
            {"url": "http://a:8000", "is_healthy": true},
            {"url": "http://b:8000", "is_healthy": false, "load": 3}
        ], "total": 2});
        assert_eq!(
            parse_worker_list(&vllm).unwrap(),
            [
                Worker {
                    url: "http://a:8000".into(),
                    healthy: Some(true)
                },
                Worker {
                    url: "http://b:8000".into(),
                    healthy: Some(false)
                }
            ]
        );
        let sglang = json!({"urls": ["http://c:30000", "http://d:30000"]});
        let w = parse_worker_list(&sglang).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w[1].url, "http://d:30000");
        assert_eq!(w[1].healthy, None);
        assert_eq!(parse_worker_list(&json!({"items": []})), None);
        assert_eq!(parse_worker_list(&json!({"workers": [{"id": 1}]})), None);
    }

    #[test]
    fn bodies_hold_only_the_fields_given() {
        let f = StartFields {
            delay_iterations: Some(10),
            max_iterations: Some(3),
            ..Default::default()
        };
        assert_eq!(
            start_body(Engine::Vllm, &f).unwrap(),
            json!({"delay_iterations": 10, "max_iterations": 3})
        );
        assert_eq!(
            start_body(Engine::Vllm, &StartFields::default()).unwrap(),
            json!({})
        );
        let err = start_body(Engine::Sglang, &f).unwrap_err();
        assert!(err.contains("--delay-iterations is a vLLM field"), "{err}");
        let s = StartFields {
            num_steps: Some(5),
            activities: Some(vec!["CPU".into(), "GPU".into()]),
            profile_by_stage: true,
            ..Default::default()
        };
        assert_eq!(
            start_body(Engine::Sglang, &s).unwrap(),
            json!({"num_steps": 5, "activities": ["CPU", "GPU"], "profile_by_stage": true})
        );
        assert!(start_body(Engine::Vllm, &s)
            .unwrap_err()
            .contains("--num-steps"));
    }

    #[test]
    fn urls_are_normalized() {
        assert_eq!(
            normalize_url("10.0.0.1:8000/").unwrap(),
            "http://10.0.0.1:8000"
        );
        assert_eq!(normalize_url("http://h:1").unwrap(), "http://h:1");
        assert!(normalize_url("https://h").unwrap_err().0.contains("https"));
        assert!(normalize_url("grpc://h").is_err());
        assert!(normalize_url("").is_err());
    }

    #[test]
    fn a_404_on_vllm_names_the_flag_to_add() {
        let m = explain_status(Engine::Vllm, Action::Start, 404, "");
        assert!(m.contains("--profiler-config"), "{m}");
        let m = explain_status(Engine::Vllm, Action::Stop, 503, "overloaded\n  now");
        assert!(m.contains("server error 503: overloaded now"), "{m}");
    }

    #[test]
    fn sglang_status_is_read_from_server_infos_internal_states() {
        let info = json!({"version": "0.5.23", "internal_states": [
            {"max_total_num_tokens": 1, "stepscope": {"plugin": "sglang", "workers": [{"phase": "idle"}]}},
            {"stepscope": {"plugin": "sglang", "workers": [{"phase": "running"}, {"phase": "idle"}]}},
        ]});
        let workers = status_answer(Engine::Sglang, &info.to_string()).unwrap().0;
        let phases: Vec<&str> = workers
            .iter()
            .map(|w| w["phase"].as_str().unwrap())
            .collect();
        assert_eq!(phases, ["idle", "running", "idle"]);
        let without = json!({"internal_states": [{"max_total_num_tokens": 1}]});
        let err = status_answer(Engine::Sglang, &without.to_string()).unwrap_err();
        assert!(err.contains("no stepscope status"), "{err}");
        assert!(status_answer(Engine::Sglang, "{}")
            .unwrap_err()
            .contains("internal_states"));
        assert_eq!(Action::Status.path(Engine::Sglang), "/server_info");
    }
}
