//! The `ctl top` table.

use super::gather::Failure;
use super::summary::{Row, Span};
use crate::stats::STRAGGLER_FACTOR;

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
