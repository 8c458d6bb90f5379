//! `ctl requests`'s text: a header saying what was read, then each request (the request's
//! own text is `crate::requests::render`'s).

use std::fmt::Write as _;

use super::EngineLog;
use crate::ctl::top::Failure;
use crate::flags::{RankBy, RequestsArgs};
use crate::requests::render::lifecycle;
use crate::requests::RequestBreakdown;

fn by_name(by: RankBy) -> &'static str {
    match by {
        RankBy::Ttft => "time to first token",
        RankBy::E2e => "end-to-end time",
        RankBy::Itl => "longest gap between tokens",
        RankBy::Queue => "queue wait",
    }
}

pub fn render(
    ranked: &[RequestBreakdown],
    total: usize,
    logs: &[EngineLog],
    off: usize,
    failures: &[Failure],
    a: &RequestsArgs,
) -> String {
    let mut out = String::new();
    let steps: usize = logs.iter().map(|l| l.doc.steps.len()).sum();
    let _ = writeln!(
        out,
        "{} requests from {} engine{} ({steps} steps); {} by {}, slowest first",
        total,
        logs.len(),
        if logs.len() == 1 { "" } else { "s" },
        if a.request.is_some() {
            "matching --request".to_string()
        } else {
            format!("{} shown", ranked.len())
        },
        by_name(a.by),
    );
    if off > 0 {
        let _ = writeln!(
            out,
            "{off} engine(s) keep no request log: set \"stepscope\": {{\"requests\": true}} in \
             STEPSCOPE_CONFIG"
        );
    }
    let partial = ranked.iter().filter(|b| b.partial).count();
    if partial > 0 {
        let _ = writeln!(
            out,
            "{partial} of these requests are partial records: the log lost their start, and \
             their prompt, cached and output tokens are unknown (?)"
        );
    }
    for l in logs.iter().filter(|l| l.doc.evicted_running > 0) {
        let _ = writeln!(
            out,
            "{} (pid {}): {} requests dropped from the log while running (raise \
             stepscope.requests.requests)",
            l.server, l.doc.pid, l.doc.evicted_running
        );
    }
    let head = if a.request.is_some() {
        "every step it lived through:"
    } else {
        "cost it most:"
    };
    for (i, b) in ranked.iter().enumerate() {
        let _ = writeln!(out, "\n{:>3}. {}  ({})", i + 1, b.id, b.server);
        lifecycle(&mut out, b, "     ", head);
    }
    for f in failures {
        let _ = writeln!(out, "\n{}: {}", f.url, f.error);
    }
    out
}
