//! `ctl timeline`'s page: one self-contained HTML file (no network) with the workers' steps
//! as data, drawn by its script into a heat map (workers × time, colour = step duration), a
//! table per worker of its step statistics, and each worker's slowest steps.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde_json::json;

use super::answers::WorkerTimeline;
use super::top::{gather_once, summarize, Span};
use crate::error::{partial, Error};
use crate::flags::TimelineArgs;

/// `stepscope ctl timeline --output FILE.html`.
pub fn command(a: &TimelineArgs) -> Result<ExitCode, Error> {
    let (workers, failures) = gather_once(&a.common, 1 << 20)?;
    let steps: usize = workers
        .iter()
        .filter_map(|w| w.steps.as_ref())
        .map(Vec::len)
        .sum();
    std::fs::write(&a.output, render(&workers, a.slowest)).map_err(|e| Error::Write {
        path: a.output.clone(),
        message: e.to_string(),
    })?;
    for f in &failures {
        crate::errln!("stepscope: {}: {}", f.url, f.error);
    }
    crate::errln!(
        "stepscope: wrote {} ({} workers, {steps} steps)",
        a.output.display(),
        workers.iter().filter(|w| w.steps.is_some()).count()
    );
    Ok(partial(!failures.is_empty()))
}

const TEMPLATE: &str = include_str!("timeline.html");

/// The page for `workers` (those whose timeline is off are listed, without steps).
pub fn render(workers: &[WorkerTimeline], slowest: usize) -> String {
    let timed: Vec<&WorkerTimeline> = workers.iter().filter(|w| w.steps.is_some()).collect();
    let steps = || timed.iter().flat_map(|w| w.steps.iter().flatten());
    let t0 = steps().map(|s| s.start_unix_ns).min().unwrap_or(0);
    let t1 = steps()
        .map(|s| s.start_unix_ns + s.duration_ns)
        .max()
        .unwrap_or(t0);
    // Statistics over everything each worker sent.
    let rows = summarize(workers, Span::SinceStep(0));
    let label = |w: &WorkerTimeline| match w.rank {
        Some(r) => format!("rank {r} · {}", w.worker_name),
        None => w.worker_name.clone(),
    };
    let data = json!({
        "t0_ns": t0,
        "t1_ns": t1,
        "workers": timed.iter().map(|w| {
            let straggler = rows
                .iter()
                .any(|r| r.url == w.url && r.worker_name == w.worker_name && r.straggler);
            json!({
                "label": label(w),
                "url": w.url,
                "rank": w.rank,
                "straggler": straggler,
                "steps": w.steps.iter().flatten()
                    .map(|s| [s.start_unix_ns, s.duration_ns])
                    .collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    });

    let mut tables = String::new();
    tables.push_str(
        "<h2>Workers</h2>\n<table class=\"workers\"><thead><tr><th>worker</th><th>rank</th>\
         <th>phase</th><th>steps</th><th>p50 ms</th><th>p99 ms</th><th>max ms</th>\
         <th>requests/step</th><th>tokens/step</th></tr></thead><tbody>\n",
    );
    let f = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |x| format!("{x:.p$}"));
    for r in &rows {
        let _ =
            writeln!(
            tables,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            if r.straggler { " class=\"straggler\"" } else { "" },
            escape(&format!("{} {}", r.url, r.worker_name)),
            r.rank.map_or("-".into(), |x| x.to_string()),
            escape(&r.phase),
            if r.timeline { r.steps.to_string() } else { "timeline off".into() },
            f(r.p50_ms, 3),
            f(r.p99_ms, 3),
            f(r.max_ms, 3),
            f(r.mean_requests, 1),
            f(r.mean_tokens, 0),
        );
    }
    tables.push_str("</tbody></table>\n");
    for w in &timed {
        let mut by_time: Vec<_> = w.steps.iter().flatten().collect();
        by_time.sort_by_key(|s| std::cmp::Reverse(s.duration_ns));
        let _ = writeln!(
            tables,
            "<h2>Slowest steps: {}</h2>\n<table class=\"slowest\"><thead><tr><th>step</th>\
             <th>at s</th><th>ms</th><th>prefill reqs</th><th>prefill tokens</th>\
             <th>decode reqs</th><th>decode tokens</th></tr></thead><tbody>",
            escape(&label(w))
        );
        for s in by_time.iter().take(slowest) {
            let _ = writeln!(
                tables,
                "<tr><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                s.step,
                (s.start_unix_ns - t0) as f64 / 1e9,
                s.duration_ns as f64 / 1e6,
                s.num_ctx_reqs,
                s.num_ctx_tokens,
                s.num_gen_reqs,
                s.num_gen_tokens
            );
        }
        tables.push_str("</tbody></table>\n");
    }
    let total: usize = timed
        .iter()
        .filter_map(|w| w.steps.as_ref())
        .map(Vec::len)
        .sum();
    let summary = format!(
        "{} worker(s) with a timeline, {total} steps over {:.1} s.",
        timed.len(),
        (t1 - t0) as f64 / 1e9
    );
    // In a <script> element only "</" can end it early.
    let data = data.to_string().replace("</", "<\\/");
    TEMPLATE
        .replacen("{{summary}}", &escape(&summary), 1)
        .replacen("{{tables}}", &tables, 1)
        .replacen("{{data}}", &data, 1)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
