//! What `ctl` talks to and what it gets back: the workers, the action asked of each, and each
//! one's outcome.

use serde::Serialize;
use serde_json::Value;

use crate::flags::Engine;

/// What to do on every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// POST /start_profile.
    Start,
    /// POST /stop_profile.
    Stop,
    /// List the workers and their health.
    Workers,
    /// Each server's engine workers' stepscope state: vLLM's `GET /stepscope/status` (the
    /// plugin's endpoint), SGLang's `GET /server_info` (each answering scheduler's
    /// `internal_states[i].stepscope`, which the plugin adds).
    Status,
    /// Each server's engines' request logs: vLLM's `GET /stepscope/requests`, SGLang's
    /// `/server_info` (`ctl requests`).
    Requests,
    /// Each server's workers' step timelines: vLLM's `GET /stepscope/timeline`, SGLang's
    /// `/server_info` (`ctl top`, `ctl timeline`).
    Timeline,
}

impl Action {
    pub(super) fn path(self, engine: Engine) -> &'static str {
        match (self, engine) {
            (Action::Start, _) => "/start_profile",
            (Action::Stop, _) => "/stop_profile",
            (Action::Workers, _) => "/health",
            (Action::Status, Engine::Vllm) => "/stepscope/status",
            (Action::Requests, Engine::Vllm) => "/stepscope/requests",
            (Action::Timeline, Engine::Vllm) => "/stepscope/timeline",
            (Action::Status | Action::Requests | Action::Timeline, Engine::Sglang) => {
                "/server_info"
            }
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
    /// `ctl status`: the server's OpenTelemetry exports of request spans (their counters).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub otel: Vec<Value>,
    /// Time spent on this worker, retries included.
    pub elapsed_ms: u64,
    /// What went wrong and what to check; `None` on success.
    pub error: Option<String>,
}
