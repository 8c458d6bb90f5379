//! Talking to workers: one agent with a timeout per call, retries for transient failures, what
//! each failure means, and the fan-out over the fleet.

use std::time::{Duration, Instant};

use serde_json::Value;
use ureq::http::header::{HeaderValue, AUTHORIZATION};
use ureq::http::Request;
use ureq::middleware::MiddlewareNext;
use ureq::SendBody;

use super::answers::{excerpt, status_answer};
use super::fleet::{Action, Outcome};
use crate::flags::Engine;

/// An HTTP agent whose every call ends within `timeout`, which hands back 4xx/5xx as
/// responses (their bodies explain them), and which sends `api_key`, if any, with every
/// request (`Authorization: Bearer …`, as vLLM's and SGLang's `--api-key` expect).
pub fn agent(timeout: Duration, api_key: Option<&str>) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .max_redirects(0);
    let bearer = api_key
        .filter(|k| !k.is_empty())
        .and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok());
    match bearer {
        Some(value) => config
            .middleware(move |mut req: Request<SendBody>, next: MiddlewareNext| {
                req.headers_mut().insert(AUTHORIZATION, value.clone());
                next.handle(req)
            })
            .build()
            .into(),
        None => config.build().into(),
    }
}

pub(super) fn get(agent: &ureq::Agent, url: &str) -> Result<(u16, String), ureq::Error> {
    let mut resp = agent.get(url).call()?;
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    Ok((status, body))
}

pub(super) fn post(
    agent: &ureq::Agent,
    url: &str,
    body: Option<&Value>,
) -> Result<(u16, String), ureq::Error> {
    let req = agent.post(url);
    let mut resp = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .send(b.to_string())?,
        None => req.send_empty()?,
    };
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    Ok((status, text))
}

/// What a transport failure means and what to check.
pub(super) fn explain_transport(e: &ureq::Error, url: &str) -> String {
    match e {
        ureq::Error::Timeout(_) => "no answer within the timeout: the worker may be hung or \
                                     busy (a stop that writes a large trace can take long: \
                                     raise --timeout)"
            .to_string(),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "connection refused: nothing listens at {url}; is the worker up, and is the port \
             right?"
        ),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            "connect timed out: check the address and that no firewall drops the traffic"
                .to_string()
        }
        ureq::Error::Io(io) => format!("I/O error talking to {url}: {io}"),
        ureq::Error::HostNotFound => format!("host not found: check the host name in {url}"),
        ureq::Error::ConnectionFailed => format!("cannot connect to {url}"),
        other => format!("request failed: {other}"),
    }
}

/// What an HTTP error status means for this action and engine: the one explanation of every
/// `ctl` command's answers.
pub(super) fn explain_status(engine: Engine, action: Action, status: u16, body: &str) -> String {
    let path = action.path(engine);
    match (status, engine, action) {
        (404, Engine::Vllm, Action::Start | Action::Stop) => format!(
            "{path} not found: the server was started without a profiler config; restart it \
             with --profiler-config '{{\"profiler\": \"torch\", \"torch_profiler_dir\": \
             \"/path/to/traces\"}}' (or \"profiler\": \"cuda\")"
        ),
        (404, Engine::Vllm, Action::Status | Action::Requests | Action::Timeline) => format!(
            "{path} not found: stepscope's routes are an opt-in vLLM endpoint plugin; install \
             stepscope in the server's environment and start vllm serve with VLLM_PLUGINS \
             naming stepscope (see docs/vllm.md)"
        ),
        (404, Engine::Sglang, _) => format!(
            "{path} not found: is this an SGLang server (sglang.launch_server)? For vLLM use \
             --engine vllm"
        ),
        (404, _, _) => format!("{path} not found"),
        (401, _, _) => format!(
            "{path}: 401 Unauthorized: the server was started with --api-key; pass the same \
             key with --api-key or STEPSCOPE_API_KEY"
        ),
        (s, _, _) if s >= 500 => {
            format!(
                "server error {s}: {} (HTTP {s}; see the worker's log)",
                excerpt(body)
            )
        }
        (s, _, _) => format!("HTTP {s}: {}", excerpt(body)),
    }
}

/// Failures worth another try: the connection never got an answer, or a gateway said so.
pub(super) fn retryable(result: &Result<(u16, String), ureq::Error>) -> bool {
    match result {
        Ok((status, _)) => matches!(status, 502..=504),
        Err(ureq::Error::Timeout(_)) => false, // a hung worker would hang again
        Err(_) => true,
    }
}

/// Whether an answer will not change by asking again later: a client error (no such route on
/// that server, its key refused) other than a timeout (408) or a rate limit (429). `ctl stop
/// --wait` stops polling such a server; no answer, or a server error (a server restarting), is
/// asked again until its wait runs out. (`retryable` is the narrower rule for an immediate
/// retry of one call.)
pub(super) fn refused_for_good(status: Option<u16>) -> bool {
    matches!(status, Some(s) if (400..500).contains(&s) && s != 408 && s != 429)
}

/// Calls `send` until it succeeds, fails for good, or `retries` more tries are spent (100 ms,
/// doubling, between tries): the last answer and how many retries it took. Every request
/// `ctl` makes goes through here.
pub(super) fn retrying(
    retries: u32,
    send: impl Fn() -> Result<(u16, String), ureq::Error>,
) -> (Result<(u16, String), ureq::Error>, u32) {
    let mut attempt = 0;
    loop {
        let result = send();
        if attempt >= retries || !retryable(&result) {
            return (result, attempt);
        }
        attempt += 1;
        std::thread::sleep(Duration::from_millis(100 << attempt.min(5)));
    }
}

/// What a failure after retries says: the error, and how many tries it took.
pub(super) fn after_tries(error: String, retries_spent: u32) -> String {
    if retries_spent > 0 {
        format!("{error} (after {} tries)", retries_spent + 1)
    } else {
        error
    }
}

/// Sends `action` to one worker, with up to `retries` more tries for transient failures.
pub fn call_worker(
    agent: &ureq::Agent,
    engine: Engine,
    action: Action,
    worker: &str,
    body: Option<&Value>,
    retries: u32,
) -> Outcome {
    let start = Instant::now();
    let url = format!("{worker}{}", action.path(engine));
    let (result, attempt) = retrying(retries, || match action {
        Action::Workers | Action::Status | Action::Requests | Action::Timeline => get(agent, &url),
        Action::Start | Action::Stop => post(agent, &url, body),
    });
    let elapsed_ms = start.elapsed().as_millis() as u64;
    let mut engine_workers = None;
    let mut otel = Vec::new();
    let (ok, status, error) = match result {
        Ok((s, body)) if (200..300).contains(&s) && action == Action::Status => {
            match status_answer(engine, &body) {
                Ok((list, exports)) => {
                    engine_workers = Some(list);
                    otel = exports;
                    (true, Some(s), None)
                }
                Err(e) => (false, Some(s), Some(e)),
            }
        }
        Ok((s, _)) if (200..300).contains(&s) => (true, Some(s), None),
        Ok((s, body)) => (
            false,
            Some(s),
            Some(explain_status(engine, action, s, &body)),
        ),
        Err(e) => (false, None, Some(explain_transport(&e, worker))),
    };
    let error = error.map(|e| after_tries(e, attempt));
    Outcome {
        url: worker.to_string(),
        ok,
        status,
        engine_workers,
        otel,
        elapsed_ms,
        error,
    }
}

/// Calls every worker, at most `concurrency` at a time; results in the workers' order.
pub fn fan_out(
    agent: &ureq::Agent,
    engine: Engine,
    action: Action,
    workers: &[String],
    body: Option<&Value>,
    concurrency: usize,
    retries: u32,
) -> Vec<Outcome> {
    crate::par::par_map(workers, concurrency, |worker| {
        call_worker(agent, engine, action, worker, body, retries)
    })
    .into_iter()
    .zip(workers)
    .map(|(o, url)| {
        o.unwrap_or_else(|| Outcome {
            url: url.clone(),
            ok: false,
            status: None,
            engine_workers: None,
            otel: Vec::new(),
            elapsed_ms: 0,
            error: Some("internal error: no result recorded".into()),
        })
    })
    .collect()
}
