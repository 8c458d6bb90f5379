//! `stepscope ctl requests`: which requests were slowest, and what cost them, from each
//! engine's request log (`"stepscope": {"requests": ...}`), read from each vLLM server's
//! `GET /stepscope/requests`, or from each SGLang scheduler's log of its last steps in
//! `/server_info`.
//!
//! - `crate::requests`: one request's stretches and costliest steps, the ranking and their text
//!   (no I/O; shared with `analyze --requests`);
//! - `render`: the text; this module: the command, the servers' answers, `--json`.

use std::process::ExitCode;

mod render;

use serde::Serialize;
use stepscope_format::requests::RequestsDocument;

use super::answers::request_logs;
use super::discovery::servers;
use super::fleet::Action;
use super::http::{after_tries, agent, explain_status, explain_transport, get, retrying};
use super::top::Failure;
use crate::error::{partial, Error};
use crate::flags::{Engine, RequestsArgs};
use crate::par::par_map;

pub(crate) use crate::requests::{breakdowns, rank, RequestBreakdown};

/// One engine's log as a server sent it.
pub struct EngineLog {
    pub server: String,
    pub doc: RequestsDocument,
}

/// `stepscope ctl requests`.
pub fn command(a: &RequestsArgs) -> Result<ExitCode, Error> {
    let agent = agent(a.common.timeout_for(false), a.common.api_key.as_deref());
    let servers = servers(&a.common, &agent)?;
    let since = a.since_step.unwrap_or(0);
    let answers = par_map(&servers, a.common.concurrency_for(servers.len()), |w| {
        fetch(&agent, a.common.engine, &w.url, since, a.common.retries)
    });
    let mut logs = Vec::new();
    let mut failures = Vec::new();
    let mut off = 0;
    for (w, answer) in servers.iter().zip(answers) {
        match answer.unwrap_or_else(|| Err("internal error: no result recorded".into())) {
            Ok((docs, without)) => {
                off += without;
                logs.extend(docs.into_iter().map(|doc| EngineLog {
                    server: w.url.clone(),
                    doc,
                }));
            }
            Err(error) => failures.push(Failure {
                url: w.url.clone(),
                error,
            }),
        }
    }
    let mut all: Vec<RequestBreakdown> = logs
        .iter()
        .flat_map(|l| {
            breakdowns(
                &l.server,
                &l.doc,
                a.by,
                if a.request.is_some() {
                    None
                } else {
                    Some(a.steps)
                },
            )
        })
        .collect();
    if let Some(id) = &a.request {
        all.retain(|b| b.id.starts_with(id.as_str()));
    }
    let total = all.len();
    let mut ranked = rank(all, a.by);
    if a.top > 0 && a.request.is_none() {
        ranked.truncate(a.top);
    }
    if a.common.json {
        let doc = Report {
            by: a.by,
            since_step: a.since_step,
            requests_seen: total,
            engines: logs.iter().map(EngineSummary::of).collect(),
            engines_without_log: off,
            requests: &ranked,
            errors: &failures,
        };
        crate::out::json(&doc, true)?;
    } else {
        crate::out!(
            "{}",
            render::render(&ranked, total, &logs, off, &failures, a)
        )?;
    }
    let none = logs.is_empty();
    if a.request.is_some() && ranked.is_empty() && !none {
        crate::errln!(
            "stepscope: no request whose id starts with {:?} in the logs read",
            a.request.as_deref().unwrap_or_default()
        );
        return Ok(partial(true));
    }
    Ok(partial(!failures.is_empty() || none))
}

/// `--json`'s document.
#[derive(Serialize)]
struct Report<'a> {
    by: crate::flags::RankBy,
    since_step: Option<u64>,
    requests_seen: usize,
    engines: Vec<EngineSummary>,
    engines_without_log: usize,
    requests: &'a [RequestBreakdown],
    errors: &'a [Failure],
}

/// What one engine's log covers.
#[derive(Serialize)]
pub struct EngineSummary {
    pub server: String,
    pub pid: u32,
    pub step_index: u64,
    pub first_step: Option<u64>,
    pub requests: usize,
    pub evicted_running: u64,
}

impl EngineSummary {
    fn of(l: &EngineLog) -> Self {
        EngineSummary {
            server: l.server.clone(),
            pid: l.doc.pid,
            step_index: l.doc.step_index,
            first_step: l.doc.steps.first().map(|s| s.step),
            requests: l.doc.requests.len(),
            evicted_running: l.doc.evicted_running,
        }
    }
}

/// One server's engines' logs, and how many of its engines keep none: vLLM's
/// `GET /stepscope/requests?since=N`, or SGLang's `/server_info` (each scheduler's log of its
/// last steps; `--since-step` then drops the steps up to N).
fn fetch(
    agent: &ureq::Agent,
    engine: Engine,
    url: &str,
    since: u64,
    retries: u32,
) -> Result<(Vec<RequestsDocument>, usize), String> {
    let full = match engine {
        Engine::Vllm => format!("{url}/stepscope/requests?since={since}"),
        Engine::Sglang => format!("{url}/server_info"),
    };
    let (answer, spent) = retrying(retries, || get(agent, &full));
    match answer {
        Ok((200, body)) => request_logs(engine, &body).map(|(docs, off)| {
            // SGLang's /server_info carries each scheduler's last steps whatever `since`.
            (docs.into_iter().map(|d| d.after_step(since)).collect(), off)
        }),
        Ok((s, body)) => Err(after_tries(
            format!(
                "{url}: {}",
                explain_status(engine, Action::Requests, s, &body)
            ),
            spent,
        )),
        Err(e) => Err(after_tries(explain_transport(&e, url), spent)),
    }
}
