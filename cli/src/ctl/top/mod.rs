//! `stepscope ctl top` and `stepscope ctl timeline`: every engine worker's step timeline
//! (`"stepscope": {"timeline": ...}`), read from each vLLM server's `GET /stepscope/timeline`,
//! or from the last steps each SGLang scheduler adds to `/server_info`.
//!
//! - `gather`: polling the servers and merging what they send;
//! - `summary`: per worker over the last window or since a step;
//! - `render`: the table; this module: the command (the table, `--json`, the live view).

use std::process::ExitCode;
use std::time::Duration;

use crate::ctl::answers::WorkerTimeline;
use crate::ctl::discovery::servers;
use crate::ctl::http::agent;
use crate::error::{partial, Error};
use crate::flags::{Common, TopArgs};

mod gather;
mod render;
mod summary;

pub use gather::Failure;
use gather::Gathered;
pub use render::render_top;
pub use summary::{summarize, Row, Span};

/// `stepscope ctl top`.
pub fn top(a: &TopArgs) -> Result<ExitCode, Error> {
    let agent = agent(a.common.timeout_for(false), a.common.api_key.as_deref());
    let servers = servers(&a.common, &agent)?;
    let span = match a.since_step {
        Some(step) => Span::SinceStep(step),
        None => Span::Last((a.window * 1e9) as u64),
    };
    // Bounded however long it runs: more than a window's steps at any realistic rate.
    let mut g = Gathered::new(1 << 16);
    loop {
        g.poll(
            &agent,
            a.common.engine,
            &servers,
            a.common.concurrency_for(servers.len()),
            a.common.retries,
        );
        let rows = summarize(&g.list(), span);
        if a.once {
            if a.common.json {
                let doc = serde_json::json!({
                    "window_s": a.since_step.is_none().then_some(a.window),
                    "since_step": a.since_step,
                    "workers": rows,
                    "errors": g.failures,
                });
                crate::out::json(&doc, true)?;
            } else {
                crate::out!("{}", render_top(&rows, &g.failures, span))?;
            }
            let none = rows.iter().all(|r| !r.timeline);
            return Ok(partial(!g.failures.is_empty() || none));
        }
        // Home and clear, then the table: one frame per poll.
        let shown = crate::out!("\x1b[H\x1b[2J{}", render_top(&rows, &g.failures, span));
        if shown.is_err() || crate::out::closed() {
            // The reader went away (a pipe closed), or the output failed: nothing failed here.
            return Ok(partial(false));
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

/// Every worker's timeline as the servers `c` names have it now (up to `keep` steps each),
/// and the servers that gave none.
pub(super) fn gather_once(
    c: &Common,
    keep: usize,
) -> Result<(Vec<WorkerTimeline>, Vec<Failure>), Error> {
    let agent = agent(c.timeout_for(false), c.api_key.as_deref());
    let servers = servers(c, &agent)?;
    let mut g = Gathered::new(keep);
    g.poll(
        &agent,
        c.engine,
        &servers,
        c.concurrency_for(servers.len()),
        c.retries,
    );
    Ok((g.list(), g.failures))
}

/// What the tests of `ctl top`'s modules share.
#[cfg(test)]
pub(crate) mod testing {
    use stepscope_format::timeline::TimelineStep;

    use crate::ctl::answers::WorkerTimeline;

    /// A worker whose steps, 10 ms apart, end just before `now`.
    pub(crate) fn worker(name: &str, rank: i64, durations_ms: &[u64], now: u64) -> WorkerTimeline {
        let n = durations_ms.len() as u64;
        let steps = durations_ms
            .iter()
            .enumerate()
            .map(|(i, d)| TimelineStep {
                step: i as u64 + 1,
                start_unix_ns: now - (n - i as u64) * 10_000_000,
                duration_ns: d * 1_000_000,
                num_ctx_reqs: 1,
                num_ctx_tokens: 100,
                num_gen_reqs: 3,
                num_gen_tokens: 3,
                phase: "idle".to_string(),
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
}
