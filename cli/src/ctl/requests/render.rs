//! `ctl requests`'s text: a header saying what was read, then each request: its figures, its
//! stretches, and the steps that cost it most with what they carried.

use std::fmt::Write as _;

use super::breakdown::{Breakdown, Role, StepCost, Stretch};
use super::EngineLog;
use crate::ctl::top::Failure;
use crate::flags::{RankBy, RequestsArgs};
use crate::text::short;

fn by_name(by: RankBy) -> &'static str {
    match by {
        RankBy::Ttft => "time to first token",
        RankBy::E2e => "end-to-end time",
        RankBy::Itl => "longest gap between tokens",
        RankBy::Queue => "queue wait",
    }
}

/// A duration for people: ms below 10 s, else s.
pub fn dur(ms: f64) -> String {
    if ms >= 10_000.0 {
        format!("{:.1} s", ms / 1e3)
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

fn stretch(s: Option<Stretch>, unit: &str) -> String {
    match s {
        None => "-".into(),
        Some(s) => format!(
            "{} ({} {unit}{})",
            dur(s.ms),
            s.steps,
            if s.steps == 1 { "" } else { "s" }
        ),
    }
}

fn role(r: Role) -> &'static str {
    match r {
        Role::Waiting => "waiting",
        Role::Prefill => "prefill",
        Role::Decode => "decode",
        Role::Preempted => "preempted",
    }
}

/// A step and what it carried.
pub fn step_line(c: &StepCost) -> String {
    let mut line = format!(
        "step {:<6} {:>9}  {:<9}  batch {} ({} prefill, {} decode), {} tokens",
        c.step,
        dur(c.ms),
        role(c.role),
        c.requests,
        c.prefill_reqs,
        c.decode_reqs,
        c.tokens
    );
    if c.largest_prefill_tokens > 0 {
        let whose = if c.own_prefill {
            "its own".to_string()
        } else {
            c.largest_prefill_request
                .as_deref()
                .map_or("a request no longer in the log".into(), |id| short(id, 48))
        };
        let _ = write!(
            line,
            "; largest prefill {} tokens: {whose}",
            c.largest_prefill_tokens
        );
    }
    line
}

pub fn render(
    ranked: &[Breakdown],
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

/// A request's lifecycle from its engine's log, each line after `indent`: its times, its
/// stretches, its preemptions, and its steps under `head`.
pub fn lifecycle(out: &mut String, b: &Breakdown, indent: &str, head: &str) {
    let opt = |v: Option<f64>| v.map_or("-".into(), dur);
    let state = match &b.finish {
        Some(f) => format!("finished ({f})"),
        None => "running".into(),
    };
    let _ = writeln!(
        out,
        "{indent}TTFT {}   e2e {}   prompt {} tokens ({} cached), output {} tokens, {state}",
        opt(b.ttft_ms),
        opt(b.e2e_ms),
        b.prompt_tokens,
        b.cached_tokens,
        b.output_tokens,
    );
    let mut decode = stretch(b.decode, "step");
    if let (Some(mean), Some(max)) = (b.decode_step_mean_ms, b.decode_step_max_ms) {
        let _ = write!(decode, ", steps mean {} max {}", dur(mean), dur(max));
    }
    let _ = writeln!(
        out,
        "{indent}intake {}   queue {}   prefill {}   decode {}",
        stretch(b.intake, "step"),
        stretch(b.queue, "step"),
        stretch(b.prefill, "chunk"),
        decode,
    );
    if !b.preempted_at.is_empty() {
        let pairs: Vec<String> = b
            .preempted_at
            .iter()
            .enumerate()
            .map(|(k, p)| match b.resumed_at.get(k) {
                Some(r) => format!("at step {p}, back at {r}"),
                None => format!("at step {p}, not back yet"),
            })
            .collect();
        let _ = writeln!(
            out,
            "{indent}preempted {} time{}: {}",
            b.preempted_at.len(),
            if b.preempted_at.len() == 1 { "" } else { "s" },
            pairs.join("; ")
        );
    }
    if b.steps_missing > 0 {
        let _ = writeln!(
            out,
            "{indent}{} of its steps are no longer in the log",
            b.steps_missing
        );
    }
    if !b.costliest.is_empty() {
        let _ = writeln!(out, "{indent}{head}");
        for c in &b.costliest {
            let _ = writeln!(out, "{indent}  {}", step_line(c));
        }
    }
}
