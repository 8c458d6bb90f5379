//! `ctl stop --wait`: stops every server's profiling, then waits until every engine worker's
//! traces of that stop are written, and says where each is.
//!
//! Before the stop it reads each engine worker's status (its last traces, numbered by `seq`);
//! after it, it polls the status until no engine worker records (`running`), waits for the
//! engine thread to carry out a stop (`stopping`) or writes (`pending_writes`), and lists the
//! traces numbered after the ones seen before.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::{agent, discovery, fan_out, http, render_table, Action, Outcome};
use crate::error::{partial, Error};
use crate::flags::StopArgs;

/// One trace a stop ended, as its worker reported it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoppedTrace {
    /// The server.
    pub url: String,
    /// The engine worker (its trace name).
    pub worker_name: String,
    /// `complete`, `failed`, `unfinished`, or `writing` when the wait ran out.
    pub status: String,
    /// The trace file.
    pub trace_file: String,
    /// Why it is not complete.
    pub error: Option<String>,
}

/// A status answer's engine workers, keyed by (server, position).
type Workers = HashMap<(String, usize), Value>;

fn engine_workers(outcomes: &[Outcome]) -> Workers {
    let mut out = HashMap::new();
    for o in outcomes {
        for (i, w) in o.engine_workers.iter().flatten().enumerate() {
            out.insert((o.url.clone(), i), w.clone());
        }
    }
    out
}

/// The highest trace `seq` a worker's status lists (0: none).
fn last_seq(w: &Value) -> u64 {
    w["traces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["seq"].as_u64())
        .max()
        .unwrap_or(0)
}

/// Whether an engine worker neither records nor writes.
fn settled(w: &Value) -> bool {
    !w["running"].as_bool().unwrap_or(false)
        && !w["stopping"].as_bool().unwrap_or(false)
        && w["pending_writes"].as_u64().unwrap_or(0) == 0
}

/// The traces each worker lists after `before`'s.
pub fn traces_since(before: &Workers, after: &[Outcome]) -> Vec<StoppedTrace> {
    let mut out = Vec::new();
    for o in after {
        for (i, w) in o.engine_workers.iter().flatten().enumerate() {
            let since = before.get(&(o.url.clone(), i)).map_or(0, last_seq);
            for t in w["traces"].as_array().into_iter().flatten() {
                if t["seq"].as_u64().unwrap_or(0) <= since {
                    continue;
                }
                out.push(StoppedTrace {
                    url: o.url.clone(),
                    worker_name: w["worker_name"].as_str().unwrap_or("?").to_string(),
                    status: t["status"].as_str().unwrap_or("?").to_string(),
                    trace_file: t["trace_file"].as_str().unwrap_or("").to_string(),
                    error: t["error"].as_str().map(str::to_string),
                });
            }
        }
    }
    out
}

/// `stepscope ctl stop [--wait]`.
pub fn command(a: &StopArgs) -> Result<ExitCode, Error> {
    let c = &a.common;
    if !a.wait {
        return super::run(Action::Stop, c, None);
    }
    let started = Instant::now();
    let agent = agent(c.timeout_for(true), c.api_key.as_deref());
    let urls: Vec<String> = discovery::servers_with_unhealthy(c, &agent)?
        .into_iter()
        .filter(|w| c.include_unhealthy || w.healthy != Some(false))
        .map(|w| w.url)
        .collect();
    let concurrency = c.concurrency.map_or(urls.len(), |n| n as usize);
    let status = |urls: &[String]| {
        fan_out(
            &agent,
            c.engine,
            Action::Status,
            urls,
            None,
            concurrency,
            c.retries,
        )
    };
    let before = engine_workers(&status(&urls));
    let mut stopped = fan_out(
        &agent,
        c.engine,
        Action::Stop,
        &urls,
        None,
        concurrency,
        c.retries,
    );
    if !c.json {
        crate::out!(
            "{}",
            render_table(Action::Stop, &stopped, started.elapsed())
        )?;
    }
    let deadline = Instant::now() + Duration::from_secs_f64(a.wait_timeout);
    let mut announced = false;
    let after = loop {
        let after = status(&urls);
        let all = engine_workers(&after);
        // Settled: every server answered, or refused for good (waiting would only delay the
        // verdict on it by the whole timeout), and none of the workers that answered writes.
        let done = after
            .iter()
            .all(|o| o.ok || http::refused_for_good(o.status))
            && all.values().all(settled);
        if done || Instant::now() >= deadline {
            break after;
        }
        if !announced && !c.json {
            crate::errln!("stepscope: waiting for the workers' traces to be written…");
            announced = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let traces = traces_since(&before, &after);
    // A server whose status could not be read cannot be said to have written its traces.
    let unreadable: Vec<Outcome> = after
        .iter()
        .filter(|o| !o.ok)
        .map(|o| Outcome {
            url: o.url.clone(),
            ok: false,
            status: o.status,
            engine_workers: None,
            otel: Vec::new(),
            elapsed_ms: o.elapsed_ms,
            error: Some(format!(
                "its traces' status could not be read: {}",
                o.error.as_deref().unwrap_or("no answer")
            )),
        })
        .collect();
    let unsettled: Vec<String> = engine_workers(&after)
        .into_iter()
        .filter(|(_, w)| !settled(w))
        .map(|((url, _), w)| format!("{url} {}", w["worker_name"].as_str().unwrap_or("?")))
        .collect();
    let failed = !stopped.iter().all(|o| o.ok)
        || !unreadable.is_empty()
        || !unsettled.is_empty()
        || traces.iter().any(|t| t.status != "complete");
    if c.json {
        stopped.extend(unreadable);
        crate::outln!(
            "{}",
            serde_json::json!({"workers": stopped, "traces": traces, "still_writing": unsettled})
        )?;
    } else {
        for o in &unreadable {
            crate::outln!("{}  {}", o.url, o.error.as_deref().unwrap_or(""))?;
        }
        if traces.is_empty() {
            crate::outln!("no trace was written by this stop (nothing was being captured)")?;
        }
        for t in &traces {
            let why = t
                .error
                .as_deref()
                .map_or(String::new(), |e| format!("  ({e})"));
            crate::outln!(
                "{:<10} {} {}  {}{why}",
                t.status,
                t.url,
                t.worker_name,
                t.trace_file
            )?;
        }
        for w in &unsettled {
            crate::outln!("still writing after {:.0} s: {w}", a.wait_timeout)?;
        }
    }
    Ok(partial(failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outcome(url: &str, workers: Value) -> Outcome {
        Outcome {
            url: url.into(),
            ok: true,
            status: Some(200),
            engine_workers: workers.as_array().cloned(),
            otel: Vec::new(),
            elapsed_ms: 1,
            error: None,
        }
    }

    #[test]
    fn the_traces_of_a_stop_are_those_numbered_after_the_ones_seen_before() {
        let before = engine_workers(&[outcome(
            "http://a",
            json!([{"worker_name": "rank0", "traces": [{"seq": 1, "status": "complete"}]}]),
        )]);
        let after = [outcome(
            "http://a",
            json!([{"worker_name": "rank0", "running": false, "pending_writes": 0, "traces": [
                {"seq": 1, "status": "complete", "trace_file": "/t/old.pt.trace.json.gz"},
                {"seq": 2, "status": "failed", "trace_file": "/t/new.pt.trace.json.gz",
                 "error": "No space left on device"},
            ]}]),
        )];
        let t = traces_since(&before, &after);
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].status.as_str(), t[0].trace_file.as_str()),
            ("failed", "/t/new.pt.trace.json.gz")
        );
        assert_eq!(t[0].error.as_deref(), Some("No space left on device"));
        let w = &after[0].engine_workers.as_ref().unwrap()[0];
        assert!(settled(w));
        assert!(!settled(&json!({"running": true})));
        assert!(!settled(&json!({"stopping": true})));
        assert!(!settled(&json!({"pending_writes": 1})));
    }
}
