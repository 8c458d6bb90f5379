//! `stepscope ctl`: start, stop and list profiling on every worker behind a router.
//!
//! Requests go to all workers at once (bounded by `concurrency`), each with its own timeout,
//! so one hung or dead worker costs one timeout, not the whole fleet's patience; every result
//! is reported, with what to check when it failed.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Map, Value};

/// The request dialect: which engine's control API the workers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// vLLM's `/start_profile` (body: profile_prefix, delay_iterations, max_iterations).
    Vllm,
    /// SGLang's `/start_profile` (body: output_dir, num_steps, activities, ...).
    Sglang,
}

/// What to do on every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// POST /start_profile.
    Start,
    /// POST /stop_profile.
    Stop,
    /// List the workers and their health.
    Workers,
    /// Each server's engine workers' stepscope state (GET /stepscope/status).
    Status,
}

impl Action {
    fn path(self) -> &'static str {
        match self {
            Action::Start => "/start_profile",
            Action::Stop => "/stop_profile",
            Action::Workers => "/health",
            Action::Status => "/stepscope/status",
        }
    }
}

/// A worker to talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// Base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// The router's view of its health; `None` when unknown (given with --worker).
    pub healthy: Option<bool>,
}

/// The result for one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// The worker's base URL.
    pub url: String,
    /// Whether the request succeeded (2xx).
    pub ok: bool,
    /// The HTTP status, when an answer came.
    pub status: Option<u16>,
    /// `ctl status`: the engine workers' states the server reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_workers: Option<Vec<Value>>,
    /// Time spent on this worker, retries included.
    pub elapsed_ms: u64,
    /// What went wrong and what to check; `None` on success.
    pub error: Option<String>,
}

/// A failure before any worker was contacted (exit 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryError(pub String);

impl std::fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DiscoveryError {}

/// An HTTP agent whose every call ends within `timeout`, and which hands back 4xx/5xx as
/// responses (their bodies explain them).
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into()
}

/// Normalizes a base URL: adds `http://` when no scheme is given, drops a trailing slash.
pub fn normalize_url(url: &str) -> Result<String, DiscoveryError> {
    let url = url.trim().trim_end_matches('/');
    if url.is_empty() {
        return Err(DiscoveryError("an empty URL was given".into()));
    }
    if url.starts_with("https://") {
        return Err(DiscoveryError(format!(
            "{url}: https is not supported by this build of stepscope ctl; engine control \
             endpoints are plain HTTP (use http://)"
        )));
    }
    if url.starts_with("http://") {
        Ok(url.to_string())
    } else if url.contains("://") {
        Err(DiscoveryError(format!(
            "{url}: only http:// URLs are supported"
        )))
    } else {
        Ok(format!("http://{url}"))
    }
}

/// Parses a router's worker list: vllm-router's and SGLang's gateway form
/// `{"workers": [{"url": …, "is_healthy": …}]}` (entries may also be plain strings), or the
/// SGLang router's `/list_workers` form `{"urls": […]}`.
pub fn parse_worker_list(body: &Value) -> Option<Vec<Worker>> {
    let entry = |v: &Value| -> Option<Worker> {
        match v {
            Value::String(s) => Some(Worker {
                url: s.clone(),
                healthy: None,
            }),
            Value::Object(o) => Some(Worker {
                url: o.get("url")?.as_str()?.to_string(),
                healthy: o.get("is_healthy").and_then(Value::as_bool),
            }),
            _ => None,
        }
    };
    let list = body
        .get("workers")
        .or_else(|| body.get("urls"))
        .and_then(Value::as_array)?;
    list.iter().map(entry).collect()
}

/// Asks the router for its workers: `GET /workers`, then `GET /list_workers` if that is not
/// found.
pub fn discover(agent: &ureq::Agent, router: &str) -> Result<Vec<Worker>, DiscoveryError> {
    let mut tried = Vec::new();
    for path in ["/workers", "/list_workers"] {
        let url = format!("{router}{path}");
        let (status, body) = match get(agent, &url) {
            Ok(r) => r,
            Err(e) => {
                return Err(DiscoveryError(format!(
                    "cannot list workers at {url}: {}",
                    explain_transport(&e, router)
                )))
            }
        };
        if status == 404 {
            tried.push(path);
            continue;
        }
        if !(200..300).contains(&status) {
            return Err(DiscoveryError(format!(
                "the router answered {status} to GET {url}: {}",
                excerpt(&body)
            )));
        }
        let json: Value = serde_json::from_str(&body).map_err(|e| {
            DiscoveryError(format!(
                "GET {url} did not return JSON ({e}): is {router} a vllm-router or SGLang router?"
            ))
        })?;
        let workers = parse_worker_list(&json).ok_or_else(|| {
            DiscoveryError(format!(
                "GET {url} returned JSON without a \"workers\" or \"urls\" list: {}",
                excerpt(&body)
            ))
        })?;
        if workers.is_empty() {
            return Err(DiscoveryError(format!(
                "the router at {router} lists no workers: check that the workers registered \
                 with it (e.g. the router's --worker-urls) and that they started"
            )));
        }
        return workers
            .into_iter()
            .map(|w| {
                Ok(Worker {
                    url: normalize_url(&w.url)?,
                    healthy: w.healthy,
                })
            })
            .collect();
    }
    Err(DiscoveryError(format!(
        "{router} has no worker list (tried {}): is it a vllm-router or SGLang router? Give \
         the workers directly with --worker URL",
        tried.join(" and ")
    )))
}

fn get(agent: &ureq::Agent, url: &str) -> Result<(u16, String), ureq::Error> {
    let mut resp = agent.get(url).call()?;
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    Ok((status, body))
}

fn post(
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

/// At most 200 characters of a body, on one line.
fn excerpt(body: &str) -> String {
    let one_line: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.is_empty() {
        return "(empty body)".into();
    }
    match one_line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

/// What a transport failure means and what to check.
fn explain_transport(e: &ureq::Error, url: &str) -> String {
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

/// What an HTTP error status means for this action and engine.
fn explain_status(engine: Engine, action: Action, status: u16, body: &str) -> String {
    let path = action.path();
    match (status, engine, action) {
        (404, Engine::Vllm, Action::Start | Action::Stop) => format!(
            "{path} not found: the server was started without a profiler config; restart it \
             with --profiler-config '{{\"profiler\": \"torch\", \"torch_profiler_dir\": \
             \"/path/to/traces\"}}' (or \"profiler\": \"cuda\")"
        ),
        (404, Engine::Vllm, Action::Status) => format!(
            "{path} not found: stepscope's status endpoint is an opt-in vLLM endpoint plugin; \
             install stepscope in the server's environment and start vllm serve with \
             VLLM_PLUGINS naming stepscope (see docs/vllm.md)"
        ),
        (404, Engine::Sglang, _) => format!(
            "{path} not found: is this an SGLang server (sglang.launch_server)? For vLLM use \
             --engine vllm"
        ),
        (404, _, _) => format!("{path} not found"),
        (s, _, _) if s >= 500 => {
            format!("server error {s}: {} (see the worker's log)", excerpt(body))
        }
        (s, _, _) => format!("HTTP {s}: {}", excerpt(body)),
    }
}

/// Failures worth another try: the connection never got an answer, or a gateway said so.
fn retryable(result: &Result<(u16, String), ureq::Error>) -> bool {
    match result {
        Ok((status, _)) => matches!(status, 502..=504),
        Err(ureq::Error::Timeout(_)) => false, // a hung worker would hang again
        Err(_) => true,
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
    let url = format!("{worker}{}", action.path());
    let mut attempt = 0;
    let result = loop {
        let result = match action {
            Action::Workers | Action::Status => get(agent, &url),
            Action::Start | Action::Stop => post(agent, &url, body),
        };
        if attempt >= retries || !retryable(&result) {
            break result;
        }
        attempt += 1;
        std::thread::sleep(Duration::from_millis(100 << attempt.min(5)));
    };
    let elapsed_ms = start.elapsed().as_millis() as u64;
    let mut engine_workers = None;
    let (ok, status, error) = match result {
        Ok((s, body)) if (200..300).contains(&s) && action == Action::Status => {
            match serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("workers")?.as_array().cloned())
            {
                Some(list) => {
                    engine_workers = Some(list);
                    (true, Some(s), None)
                }
                None => (
                    false,
                    Some(s),
                    Some(format!(
                        "the answer is not {{\"workers\": [...]}}: {}",
                        excerpt(&body)
                    )),
                ),
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
    let error = match (error, attempt) {
        (Some(e), n) if n > 0 => Some(format!("{e} (after {} tries)", n + 1)),
        (e, _) => e,
    };
    Outcome {
        url: worker.to_string(),
        ok,
        status,
        engine_workers,
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
    crate::par_map(workers, concurrency, |worker| {
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
            elapsed_ms: 0,
            error: Some("internal error: no result recorded".into()),
        })
    })
    .collect()
}

/// The `/start_profile` body fields a user gave, per dialect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartFields {
    /// vLLM: trace name prefix.
    pub profile_prefix: Option<String>,
    /// vLLM: iterations before capture starts.
    pub delay_iterations: Option<u64>,
    /// vLLM: iterations to capture.
    pub max_iterations: Option<u64>,
    /// SGLang: where traces go.
    pub output_dir: Option<String>,
    /// SGLang: steps to capture.
    pub num_steps: Option<u64>,
    /// SGLang: activities, e.g. CPU, GPU.
    pub activities: Option<Vec<String>>,
    /// SGLang: separate traces for prefill and decode.
    pub profile_by_stage: bool,
    /// SGLang: record stacks.
    pub with_stack: Option<bool>,
    /// SGLang: record shapes.
    pub record_shapes: Option<bool>,
}

/// The JSON body for `/start_profile`: only the fields given. A field of the other dialect is
/// a usage error naming the flag to use instead.
pub fn start_body(engine: Engine, f: &StartFields) -> Result<Value, String> {
    let mut body = Map::new();
    let vllm_only = [
        ("--profile-prefix", f.profile_prefix.is_some()),
        ("--delay-iterations", f.delay_iterations.is_some()),
        ("--max-iterations", f.max_iterations.is_some()),
    ];
    let sglang_only = [
        ("--output-dir", f.output_dir.is_some()),
        ("--num-steps", f.num_steps.is_some()),
        ("--activities", f.activities.is_some()),
        ("--profile-by-stage", f.profile_by_stage),
        ("--with-stack", f.with_stack.is_some()),
        ("--record-shapes", f.record_shapes.is_some()),
    ];
    match engine {
        Engine::Vllm => {
            if let Some((flag, _)) = sglang_only.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{flag} is an SGLang field; add --engine sglang, or with vLLM use \
                     --delay-iterations/--max-iterations/--profile-prefix"
                ));
            }
            if let Some(p) = &f.profile_prefix {
                body.insert("profile_prefix".into(), json!(p));
            }
            if let Some(d) = f.delay_iterations {
                body.insert("delay_iterations".into(), json!(d));
            }
            if let Some(m) = f.max_iterations {
                body.insert("max_iterations".into(), json!(m));
            }
        }
        Engine::Sglang => {
            if let Some((flag, _)) = vllm_only.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{flag} is a vLLM field; with --engine sglang use --num-steps/--output-dir"
                ));
            }
            if let Some(d) = &f.output_dir {
                body.insert("output_dir".into(), json!(d));
            }
            if let Some(n) = f.num_steps {
                body.insert("num_steps".into(), json!(n));
            }
            if let Some(a) = &f.activities {
                body.insert("activities".into(), json!(a));
            }
            if f.profile_by_stage {
                body.insert("profile_by_stage".into(), json!(true));
            }
            if let Some(v) = f.with_stack {
                body.insert("with_stack".into(), json!(v));
            }
            if let Some(v) = f.record_shapes {
                body.insert("record_shapes".into(), json!(v));
            }
        }
    }
    Ok(Value::Object(body))
}

/// The human-readable table, with a summary line.
pub fn render_table(action: Action, outcomes: &[Outcome], total: Duration) -> String {
    let width = outcomes
        .iter()
        .map(|o| o.url.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut out = format!(
        "{:<width$}  {:<7}  {:>4}  {:>8}  MESSAGE\n",
        "WORKER", "RESULT", "HTTP", "TIME"
    );
    for o in outcomes {
        let result = match (o.ok, action) {
            (true, Action::Workers) => "healthy",
            (true, Action::Status) => "ok",
            (true, _) => "ok",
            (false, _) if o.error.as_deref().is_some_and(|e| e.starts_with("skipped")) => "skipped",
            (false, _) => "FAILED",
        };
        let status = o
            .status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<width$}  {:<7}  {:>4}  {:>5} ms  {}\n",
            o.url,
            result,
            status,
            o.elapsed_ms,
            o.error.as_deref().unwrap_or("")
        ));
        for w in o.engine_workers.iter().flatten() {
            out.push_str(&format!("    {}\n", engine_worker_line(w)));
        }
    }
    let ok = outcomes.iter().filter(|o| o.ok).count();
    let verb = match action {
        Action::Start => "started",
        Action::Stop => "stopped",
        Action::Workers => "healthy",
        Action::Status => "answered",
    };
    out.push_str(&format!(
        "{ok} of {} workers {verb}, {} failed, in {:.2} s\n",
        outcomes.len(),
        outcomes.len() - ok,
        total.as_secs_f64()
    ));
    out
}

/// One engine worker's state, as `ctl status` prints it under its server.
fn engine_worker_line(w: &Value) -> String {
    let text = |k: &str| w.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let num = |k: &str| w.get(k).and_then(Value::as_u64);
    let rank = num("rank").map_or_else(|| "rank ?".into(), |r| format!("rank {r}"));
    let mut line = format!("{rank:<8} {:<12} {:<6}", text("phase"), text("backend"));
    if let Some(step) = num("step_index") {
        line.push_str(&format!("  step {step}"));
    }
    if let Some(first) = num("window_first_step") {
        line.push_str(&format!("  window from step {first}"));
    }
    if let Some(at) = num("start_at_step") {
        line.push_str(&format!("  starts at step {at}"));
    }
    if let (Some(n), Some(max)) = (num("iterations_captured"), num("max_iterations")) {
        if w.get("active").and_then(Value::as_bool) == Some(true) {
            let of = if max > 0 {
                format!("/{max}")
            } else {
                String::new()
            };
            line.push_str(&format!("  captured {n}{of}"));
        }
    }
    if let (Some(done), Some(all)) = (num("windows_done"), num("windows")) {
        if all > 1 {
            line.push_str(&format!("  windows {done}/{all}"));
        }
    }
    if let Some(at) = num("next_window_at") {
        line.push_str(&format!("  next at step {at}"));
    }
    line.push_str(&slow_step_part(w));
    if let Some(n) = num("pending_writes").filter(|n| *n > 0) {
        line.push_str(&format!("  {n} trace(s) being written"));
    }
    if w.get("selected").and_then(Value::as_bool) == Some(false) {
        line.push_str("  (not in stepscope.ranks)");
    }
    if let Some(e) = w.get("last_error").and_then(Value::as_str) {
        line.push_str(&format!("  last error: {e}"));
    }
    if let Some(note) = w.get("note").and_then(Value::as_str) {
        line.push_str(&format!("  ({note})"));
    }
    line
}

/// The slow-step trigger's part of a worker line: the thresholds while watching, the median
/// and slowest step timed, the step that fired.
fn slow_step_part(w: &Value) -> String {
    let f = |k: &str| w.get(k).and_then(Value::as_f64);
    let step_ms = |k: &str| {
        let s = w.get(k)?;
        Some((s.get("step")?.as_u64()?, s.get("ms")?.as_f64()?))
    };
    let mut out = String::new();
    let thresholds: Vec<String> = [
        f("slow_step_ms").map(|ms| format!("> {ms} ms")),
        f("slow_step_factor").map(|k| format!("> {k}x median")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if thresholds.is_empty() {
        return out;
    }
    out.push_str(&format!("  trigger {}", thresholds.join(" and ")));
    if let Some(m) = f("median_step_ms") {
        out.push_str(&format!("  median {m:.1} ms"));
    }
    if let Some((step, ms)) = step_ms("slowest_step") {
        out.push_str(&format!("  slowest step {step} ({ms:.1} ms)"));
    }
    if let Some((step, ms)) = step_ms("trigger_step") {
        out.push_str(&format!("  fired at step {step} ({ms:.1} ms)"));
    }
    out
}

/// The `--json` document.
pub fn render_json(outcomes: &[Outcome]) -> String {
    json!({ "workers": outcomes }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
