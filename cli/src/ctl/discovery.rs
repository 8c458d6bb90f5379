//! Finding the workers: base URLs normalized, a router's worker list in its dialects.

use serde_json::Value;

use super::answers::excerpt;
use super::fleet::Worker;
use super::http::{explain_transport, get};
use crate::error::Error;
use crate::flags::Common;

/// A failure before any worker was contacted (exit 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryError(pub String);

impl std::fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DiscoveryError {}

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

/// The servers `c` names (a router's workers, or the `--worker`s), those the router reports
/// unhealthy left out unless `--include-unhealthy`.
pub(crate) fn servers(c: &Common, agent: &ureq::Agent) -> Result<Vec<Worker>, Error> {
    Ok(servers_with_unhealthy(c, agent)?
        .into_iter()
        .filter(|w| c.include_unhealthy || w.healthy != Some(false))
        .collect())
}

/// Every server `c` names, with the router's view of its health.
pub(crate) fn servers_with_unhealthy(
    c: &Common,
    agent: &ureq::Agent,
) -> Result<Vec<Worker>, Error> {
    let workers = match &c.targets.router_url {
        Some(router) => normalize_url(router).and_then(|r| discover(agent, &r)),
        None => c
            .targets
            .workers
            .iter()
            .map(|w| normalize_url(w).map(|url| Worker { url, healthy: None }))
            .collect(),
    };
    workers.map_err(|e| Error::Usage(e.0))
}
