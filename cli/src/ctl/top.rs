//! `stepscope ctl top` and `stepscope ctl timeline`: every engine worker's step timeline
//! (`"stepscope": {"timeline": ...}`), read from each vLLM server's `GET /stepscope/timeline`,
//! or from the last steps each SGLang scheduler adds to `/server_info`.
//!
//! - fetching: each server at once, incrementally (`?since=` the last step seen);
//! - [`summarize`]: per worker over the last window, steps per second, step p50/p99/max, the
//!   batch's requests and tokens, and stragglers (a p50 at least 1.2× the median of the
//!   workers' p50s, the rule `stepscope analyze` uses for ranks);
//! - the table, the `--json` document, and the live view.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::discovery::{discover, normalize_url};
use super::fleet::Worker;
use super::http::{agent, excerpt, explain_transport, get};
use crate::error::{partial, Error};
use crate::flags::{Common, Engine, TopArgs};

/// One step of a worker's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Step {
    pub step: u64,
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    pub num_ctx_reqs: u32,
    pub num_ctx_tokens: u32,
    pub num_gen_reqs: u32,
    pub num_gen_tokens: u32,
}

impl Step {
    fn requests(&self) -> u64 {
        u64::from(self.num_ctx_reqs) + u64::from(self.num_gen_reqs)
    }
    fn tokens(&self) -> u64 {
        u64::from(self.num_ctx_tokens) + u64::from(self.num_gen_tokens)
    }
}

/// One engine worker as its server reported it, with the steps gathered so far.
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
    pub steps: Option<Vec<Step>>,
}

impl WorkerTimeline {
    fn key(&self) -> (String, String) {
        (self.url.clone(), self.worker_name.clone())
    }
}

/// Parses one server's `/stepscope/timeline` answer.
pub fn parse_timeline(url: &str, body: &str) -> Result<Vec<WorkerTimeline>, String> {
    let value: Value = serde_json::from_str(body)
        .map_err(|e| format!("the answer is not JSON ({e}): {}", excerpt(body)))?;
    let workers = value
        .get("workers")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            format!(
                "the answer is not {{\"workers\": [...]}}: {}",
                excerpt(body)
            )
        })?;
    workers.iter().map(|w| parse_worker(url, w)).collect()
}

fn parse_worker(url: &str, w: &Value) -> Result<WorkerTimeline, String> {
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
            let at = |name: &str| {
                fields
                    .iter()
                    .position(|f| *f == name)
                    .ok_or_else(|| format!("the timeline's fields lack {name:?}"))
            };
            let idx = [
                at("step")?,
                at("start_unix_ns")?,
                at("duration_ns")?,
                at("num_ctx_reqs")?,
                at("num_ctx_tokens")?,
                at("num_gen_reqs")?,
                at("num_gen_tokens")?,
            ];
            let mut steps = Vec::with_capacity(rows.len());
            for row in rows {
                let v = |i: usize| row.get(idx[i]).and_then(Value::as_u64);
                let small = |i: usize| v(i).and_then(|n| u32::try_from(n).ok());
                let step = (|| {
                    Some(Step {
                        step: v(0)?,
                        start_unix_ns: v(1)?,
                        duration_ns: v(2)?,
                        num_ctx_reqs: small(3)?,
                        num_ctx_tokens: small(4)?,
                        num_gen_reqs: small(5)?,
                        num_gen_tokens: small(6)?,
                    })
                })()
                .ok_or_else(|| format!("a timeline step is not in its fields' form: {row}"))?;
                steps.push(step);
            }
            Some(steps)
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

/// One worker's line of `ctl top`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub url: String,
    pub worker_name: String,
    pub rank: Option<i64>,
    pub phase: String,
    pub step_index: u64,
    /// Whether the worker keeps a timeline (`"stepscope": {"timeline": ...}`).
    pub timeline: bool,
    /// Steps that began in the window.
    pub steps: usize,
    /// The window's first and last step.
    pub first_step: Option<u64>,
    pub last_step: Option<u64>,
    pub steps_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// The slowest step of the window.
    pub max_step: Option<u64>,
    /// Mean requests per step (prefill and decode).
    pub mean_requests: Option<f64>,
    /// Mean tokens per step.
    pub mean_tokens: Option<f64>,
    /// p50 at least 1.2× the median of the workers' p50s (two workers or more).
    pub straggler: bool,
}

/// The stragglers' rule: a p50 this many times the median of the workers' p50s.
pub const STRAGGLER_FACTOR: f64 = 1.2;

/// Which steps the statistics cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// Those that began in the last this many ns of each server's clock.
    Last(u64),
    /// Those after this step index (every worker's).
    SinceStep(u64),
}

/// Each worker over the steps `span` covers.
pub fn summarize(workers: &[WorkerTimeline], span: Span) -> Vec<Row> {
    let mut rows: Vec<Row> = workers
        .iter()
        .map(|w| {
            let end = w.now_unix_ns;
            let in_window: Vec<&Step> = w
                .steps
                .iter()
                .flatten()
                .filter(|s| match span {
                    Span::Last(ns) => {
                        s.start_unix_ns >= end.saturating_sub(ns) && s.start_unix_ns <= end
                    }
                    Span::SinceStep(after) => s.step > after,
                })
                .collect();
            // Steps per second over the window, or over the span the steps cover.
            let seconds = match span {
                Span::Last(ns) => ns as f64 / 1e9,
                Span::SinceStep(_) => match (in_window.first(), in_window.last()) {
                    (Some(a), Some(b)) => {
                        (b.start_unix_ns + b.duration_ns).saturating_sub(a.start_unix_ns) as f64
                            / 1e9
                    }
                    _ => 0.0,
                },
            };
            let mut ms: Vec<f64> = in_window
                .iter()
                .map(|s| s.duration_ns as f64 / 1e6)
                .collect();
            ms.sort_by(f64::total_cmp);
            let n = in_window.len();
            let mean = |f: fn(&Step) -> u64| {
                (n > 0).then(|| in_window.iter().map(|s| f(s) as f64).sum::<f64>() / n as f64)
            };
            let slowest = in_window.iter().max_by_key(|s| s.duration_ns);
            Row {
                url: w.url.clone(),
                worker_name: w.worker_name.clone(),
                rank: w.rank,
                phase: w.phase.clone(),
                step_index: w.step_index,
                timeline: w.steps.is_some(),
                steps: n,
                first_step: in_window.iter().map(|s| s.step).min(),
                last_step: in_window.iter().map(|s| s.step).max(),
                steps_per_s: if seconds > 0.0 {
                    n as f64 / seconds
                } else {
                    0.0
                },
                p50_ms: percentile(&ms, 50.0),
                p99_ms: percentile(&ms, 99.0),
                max_ms: ms.last().copied(),
                max_step: slowest.map(|s| s.step),
                mean_requests: mean(Step::requests),
                mean_tokens: mean(Step::tokens),
                straggler: false,
            }
        })
        .collect();
    let mut p50s: Vec<f64> = rows.iter().filter_map(|r| r.p50_ms).collect();
    p50s.sort_by(f64::total_cmp);
    if p50s.len() >= 2 {
        let mid = p50s.len() / 2;
        let median = if p50s.len() % 2 == 0 {
            (p50s[mid - 1] + p50s[mid]) / 2.0
        } else {
            p50s[mid]
        };
        for r in &mut rows {
            r.straggler = median > 0.0 && r.p50_ms.is_some_and(|p| p >= STRAGGLER_FACTOR * median);
        }
    }
    rows
}

/// The nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The servers `c` names (a router's workers, or the `--worker`s), those the router reports
/// unhealthy left out unless `--include-unhealthy`.
pub(super) fn servers(c: &Common, agent: &ureq::Agent) -> Result<Vec<Worker>, Error> {
    Ok(servers_with_unhealthy(c, agent)?
        .into_iter()
        .filter(|w| c.include_unhealthy || w.healthy != Some(false))
        .collect())
}

/// Every server `c` names, with the router's view of its health.
pub(super) fn servers_with_unhealthy(
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

/// A server that gave no timeline, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub url: String,
    pub error: String,
}

/// What the fleet's timelines are, gathered over one or more polls.
#[derive(Default)]
struct Gathered {
    workers: BTreeMap<(String, String), WorkerTimeline>,
    failures: Vec<Failure>,
    /// Steps kept per worker: what its ring holds is enough.
    keep: usize,
}

impl Gathered {
    fn since(&self, url: &str) -> u64 {
        // One `since` per server: the smallest last step of its workers (their step counts
        // advance together; a worker that lags only re-sends steps already seen).
        self.workers
            .values()
            .filter(|w| w.url == url)
            .map(|w| {
                w.steps
                    .as_ref()
                    .and_then(|s| s.last())
                    .map_or(0, |s| s.step)
            })
            .min()
            .unwrap_or(0)
    }

    fn merge(&mut self, fresh: WorkerTimeline) {
        let keep = self.keep.max(1);
        match self.workers.get_mut(&fresh.key()) {
            Some(old) => {
                let seen = old
                    .steps
                    .as_ref()
                    .and_then(|s| s.last())
                    .map_or(0, |s| s.step);
                if let (Some(steps), Some(new)) = (old.steps.as_mut(), fresh.steps.as_ref()) {
                    steps.extend(new.iter().filter(|s| s.step > seen));
                    let excess = steps.len().saturating_sub(keep);
                    steps.drain(..excess);
                } else {
                    old.steps = fresh.steps.clone();
                }
                old.phase = fresh.phase;
                old.step_index = fresh.step_index;
                old.now_unix_ns = fresh.now_unix_ns;
                old.rank = fresh.rank;
            }
            None => {
                self.workers.insert(fresh.key(), fresh);
            }
        }
    }

    /// Asks every server at once for the steps it has not sent yet.
    fn poll(&mut self, agent: &ureq::Agent, engine: Engine, servers: &[Worker]) {
        let urls: Vec<(String, u64)> = servers
            .iter()
            .map(|w| (w.url.clone(), self.since(&w.url)))
            .collect();
        let answers: Vec<(String, Result<Vec<WorkerTimeline>, String>)> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = urls
                    .iter()
                    .map(|(url, since)| {
                        scope.spawn(move || (url.clone(), fetch(agent, engine, url, *since)))
                    })
                    .collect();
                handles
                    .into_iter()
                    .zip(&urls)
                    .map(|(h, (url, _))| {
                        h.join()
                            .unwrap_or_else(|_| (url.clone(), Err("the request panicked".into())))
                    })
                    .collect()
            });
        self.failures.clear();
        for (url, answer) in answers {
            match answer {
                Ok(workers) => workers.into_iter().for_each(|w| self.merge(w)),
                Err(error) => self.failures.push(Failure { url, error }),
            }
        }
    }

    fn list(&self) -> Vec<WorkerTimeline> {
        let mut v: Vec<WorkerTimeline> = self.workers.values().cloned().collect();
        v.sort_by(|a, b| (a.rank, &a.url, &a.worker_name).cmp(&(b.rank, &b.url, &b.worker_name)));
        v
    }
}

fn fetch(
    agent: &ureq::Agent,
    engine: Engine,
    url: &str,
    since: u64,
) -> Result<Vec<WorkerTimeline>, String> {
    let full = match engine {
        Engine::Vllm => format!("{url}/stepscope/timeline?since={since}"),
        // Each scheduler's last steps ride on /server_info (no since: repeats are merged).
        Engine::Sglang => format!("{url}/server_info"),
    };
    match get(agent, &full) {
        Ok((200, body)) if engine == Engine::Sglang => parse_server_info(url, &body),
        Ok((200, body)) => parse_timeline(url, &body),
        Ok((404, _)) => Err(format!(
            "{url}/stepscope/timeline: 404: the server has no stepscope timeline route (start \
             vLLM with stepscope installed and VLLM_PLUGINS naming stepscope; see docs/vllm.md)"
        )),
        Ok((s, body)) => Err(format!("{full}: HTTP {s}: {}", excerpt(&body))),
        Err(e) => Err(explain_transport(&e, url)),
    }
}

/// SGLang's `/server_info`: each answering scheduler's `internal_states[i].stepscope.timeline`
/// (the plugin's, in the form of vLLM's timeline workers).
pub fn parse_server_info(url: &str, body: &str) -> Result<Vec<WorkerTimeline>, String> {
    let value: Value = serde_json::from_str(body)
        .map_err(|e| format!("the answer is not JSON ({e}): {}", excerpt(body)))?;
    let states = value
        .get("internal_states")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            format!(
                "/server_info has no internal_states list: {}",
                excerpt(body)
            )
        })?;
    let mut out = Vec::new();
    for state in states {
        let Some(mine) = state.get("stepscope") else {
            return Err(
                "/server_info carries no stepscope status: install stepscope in the server's \
                 environment (its SGLang plugin adds it)"
                    .into(),
            );
        };
        match mine.get("timeline") {
            Some(t) if !t.is_null() => out.push(parse_worker(url, t)?),
            // Off on this scheduler: listed as such.
            _ => out.push(WorkerTimeline {
                url: url.to_string(),
                worker_name: format!("scheduler{}", out.len()),
                rank: None,
                phase: String::new(),
                step_index: 0,
                now_unix_ns: 0,
                steps: None,
            }),
        }
    }
    Ok(out)
}

/// `stepscope ctl top`.
pub fn top(a: &TopArgs) -> Result<ExitCode, Error> {
    let agent = agent(a.common.timeout_for(false));
    let servers = servers(&a.common, &agent)?;
    let span = match a.since_step {
        Some(step) => Span::SinceStep(step),
        None => Span::Last((a.window * 1e9) as u64),
    };
    // Bounded however long it runs: more than a window's steps at any realistic rate.
    let mut g = Gathered {
        keep: 1 << 16,
        ..Gathered::default()
    };
    loop {
        g.poll(&agent, a.common.engine, &servers);
        let rows = summarize(&g.list(), span);
        if a.once {
            if a.common.json {
                let doc = serde_json::json!({
                    "window_s": a.since_step.is_none().then_some(a.window),
                    "since_step": a.since_step,
                    "workers": rows,
                    "errors": g.failures,
                });
                println!("{doc:#}");
            } else {
                print!("{}", render_top(&rows, &g.failures, span));
            }
            let none = rows.iter().all(|r| !r.timeline);
            return Ok(partial(!g.failures.is_empty() || none));
        }
        let mut out = std::io::stdout().lock();
        // Home and clear, then the table: one frame per poll.
        let frame = format!("\x1b[H\x1b[2J{}", render_top(&rows, &g.failures, span));
        if out
            .write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(ExitCode::SUCCESS);
        }
        drop(out);
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

/// The `ctl top` table.
pub fn render_top(rows: &[Row], failures: &[Failure], span: Span) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let over = match span {
        Span::Last(ns) => format!("the last {} s", ns as f64 / 1e9),
        Span::SinceStep(step) => format!("the steps after step {step}"),
    };
    let _ = writeln!(
        s,
        "stepscope ctl top: step times over {over}; * straggler (p50 >= {STRAGGLER_FACTOR}x \
         the workers' median)"
    );
    let _ = writeln!(
        s,
        "{:<2}{:<44} {:>5} {:<10} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "",
        "worker",
        "rank",
        "phase",
        "step",
        "steps/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "reqs",
        "tokens"
    );
    let f = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |x| format!("{x:.p$}"));
    for r in rows {
        let name = format!("{} {}", short_url(&r.url), r.worker_name);
        if !r.timeline {
            let _ = writeln!(
                s,
                "  {:<44} {:>5} {:<10} {:>9}  timeline off (\"stepscope\": {{\"timeline\": true}})",
                clip(&name, 44),
                r.rank.map_or("-".into(), |x| x.to_string()),
                r.phase,
                r.step_index
            );
            continue;
        }
        let _ = writeln!(
            s,
            "{:<2}{:<44} {:>5} {:<10} {:>9} {:>8.1} {:>9} {:>9} {:>9} {:>8} {:>9}",
            if r.straggler { "*" } else { "" },
            clip(&name, 44),
            r.rank.map_or("-".into(), |x| x.to_string()),
            r.phase,
            r.step_index,
            r.steps_per_s,
            f(r.p50_ms, 2),
            f(r.p99_ms, 2),
            f(r.max_ms, 2),
            f(r.mean_requests, 1),
            f(r.mean_tokens, 0),
        );
    }
    if rows.is_empty() && failures.is_empty() {
        s.push_str("  no engine workers reported\n");
    }
    for e in failures {
        let _ = writeln!(s, "  {}: {}", e.url, e.error);
    }
    s
}

fn short_url(url: &str) -> &str {
    url.strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url)
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let tail: String = s
            .chars()
            .rev()
            .take(n - 1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    }
}

/// Every worker's timeline as the servers `c` names have it now (up to `keep` steps each),
/// and the servers that gave none.
pub(super) fn gather_once(
    c: &Common,
    keep: usize,
) -> Result<(Vec<WorkerTimeline>, Vec<Failure>), Error> {
    let agent = agent(c.timeout_for(false));
    let servers = servers(c, &agent)?;
    let mut g = Gathered {
        keep,
        ..Gathered::default()
    };
    g.poll(&agent, c.engine, &servers);
    Ok((g.list(), g.failures))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(name: &str, rank: i64, durations_ms: &[u64], now: u64) -> WorkerTimeline {
        // Steps 10 ms apart, ending just before `now`.
        let n = durations_ms.len() as u64;
        let steps = durations_ms
            .iter()
            .enumerate()
            .map(|(i, d)| Step {
                step: i as u64 + 1,
                start_unix_ns: now - (n - i as u64) * 10_000_000,
                duration_ns: d * 1_000_000,
                num_ctx_reqs: 1,
                num_ctx_tokens: 100,
                num_gen_reqs: 3,
                num_gen_tokens: 3,
            })
            .collect();
        WorkerTimeline {
            url: "http://h:1".into(),
            worker_name: name.into(),
            rank: Some(rank),
            phase: "idle".into(),
            step_index: n,
            now_unix_ns: now,
            steps: Some(steps),
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn a_window_counts_its_steps_and_marks_the_straggler() {
        let now = 1_000_000_000_000;
        let workers = [
            worker("a", 0, &[5, 5, 5, 6, 40], now),
            worker("b", 1, &[5, 5, 6, 6, 5], now),
            worker("c", 2, &[9, 9, 9, 9, 9], now),
        ];
        let rows = summarize(&workers, Span::Last(1_000_000_000));
        let by = |n: &str| rows.iter().find(|r| r.worker_name == n).unwrap();
        assert_eq!(by("a").steps, 5);
        assert_eq!(by("a").p50_ms, Some(5.0));
        assert_eq!(by("a").max_ms, Some(40.0));
        assert_eq!(by("a").max_step, Some(5));
        assert_eq!(by("a").p99_ms, Some(40.0));
        assert_eq!(by("a").mean_requests, Some(4.0));
        assert_eq!(by("a").mean_tokens, Some(103.0));
        assert!((by("a").steps_per_s - 5.0).abs() < 1e-9);
        // Median of p50s (5, 5, 9) is 5: 9 >= 6 marks c, not a (its one slow step is no
        // straggler's).
        assert!(by("c").straggler && !by("a").straggler && !by("b").straggler);
        // Only the last 25 ms: the last two steps (starting 20 and 10 ms before now).
        let rows = summarize(&workers, Span::Last(25_000_000));
        assert_eq!(rows[0].steps, 2);
        // After step 3: steps 4 and 5, 10 ms apart, the last 40 ms long: 2 steps in 50 ms.
        let rows = summarize(&workers, Span::SinceStep(3));
        assert_eq!((rows[0].first_step, rows[0].last_step), (Some(4), Some(5)));
        assert!(
            (rows[0].steps_per_s - 40.0).abs() < 1e-9,
            "{}",
            rows[0].steps_per_s
        );
    }

    #[test]
    fn one_worker_is_nobodys_straggler_and_an_off_timeline_shows() {
        let now = 5_000_000_000;
        let mut off = worker("off", 1, &[], now);
        off.steps = None;
        let rows = summarize(
            &[worker("a", 0, &[50, 50], now), off],
            Span::Last(1_000_000_000),
        );
        assert!(!rows[0].straggler);
        assert!(!rows[1].timeline && rows[1].p50_ms.is_none());
        let table = render_top(&rows, &[], Span::Last(1_000_000_000));
        assert!(table.contains("timeline off"), "{table}");
    }

    #[test]
    fn the_answer_is_read_by_its_field_names() {
        let body = r#"{"workers": [{"worker_name": "rank0", "rank": 0, "phase": "idle",
            "step_index": 9, "now_unix_ns": 100,
            "fields": ["phase", "step", "start_unix_ns", "duration_ns", "num_ctx_reqs",
                       "num_ctx_tokens", "num_gen_reqs", "num_gen_tokens"],
            "steps": [["idle", 9, 50, 7, 1, 2, 3, 4]]},
            {"rank": 1, "steps": null, "fields": []}]}"#;
        let w = parse_timeline("http://h:1", body).unwrap();
        assert_eq!(
            w[0].steps.as_deref(),
            Some(
                &[Step {
                    step: 9,
                    start_unix_ns: 50,
                    duration_ns: 7,
                    num_ctx_reqs: 1,
                    num_ctx_tokens: 2,
                    num_gen_reqs: 3,
                    num_gen_tokens: 4
                }][..]
            )
        );
        assert_eq!(
            (w[1].worker_name.as_str(), w[1].steps.is_none()),
            ("rank1", true)
        );
        let bad = parse_timeline(
            "u",
            r#"{"workers": [{"fields": ["step"], "steps": [[1]]}]}"#,
        );
        assert!(bad.unwrap_err().contains("start_unix_ns"));
        assert!(parse_timeline("u", "<html>")
            .unwrap_err()
            .contains("not JSON"));
    }

    #[test]
    fn polls_merge_new_steps_once() {
        let now = 1_000_000_000;
        let mut g = Gathered {
            keep: 4,
            ..Gathered::default()
        };
        g.merge(worker("a", 0, &[1, 2, 3], now));
        assert_eq!(g.since("http://h:1"), 3);
        // The next answer repeats step 3 and brings 4..6: 3 once, and only the last 4 kept.
        let mut next = worker("a", 0, &[1, 2, 3, 4, 5, 6], now);
        next.steps.as_mut().unwrap().drain(..2);
        g.merge(next);
        let steps: Vec<u64> = g.list()[0]
            .steps
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.step)
            .collect();
        assert_eq!(steps, [3, 4, 5, 6]);
    }
}
