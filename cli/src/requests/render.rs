//! A request's text, as `ctl requests` and `analyze --requests` print it: its figures, its
//! stretches, and the steps that cost it most with what they carried.

use std::fmt::Write as _;

use super::{Lived, RequestBreakdown, StepCost, Stretch};
use crate::text::short;

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

fn role(r: Lived) -> &'static str {
    match r {
        Lived::Waiting => "waiting",
        Lived::Prefill => "prefill",
        Lived::Decode => "decode",
        Lived::Preempted => "preempted",
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

/// A request's lifecycle from its engine's log, each line after `indent`: its times, its
/// stretches, its preemptions, and its steps under `head`.
pub fn lifecycle(out: &mut String, b: &RequestBreakdown, indent: &str, head: &str) {
    let opt = |v: Option<f64>| v.map_or("-".into(), dur);
    let state = match &b.finish {
        Some(f) => format!("finished ({f})"),
        None => "running".into(),
    };
    let n = |v: Option<u32>| v.map_or("?".into(), |v| v.to_string());
    let _ = writeln!(
        out,
        "{indent}TTFT {}   e2e {}   prompt {} tokens ({} cached), output {} tokens, {state}",
        opt(b.ttft_ms),
        opt(b.e2e_ms),
        n(b.prompt_tokens),
        n(b.cached_tokens),
        n(b.output_tokens),
    );
    if b.partial {
        let _ = writeln!(
            out,
            "{indent}partial: the log lost its start (dropped from a full ring while it ran, or \
             running before the log was on); what it missed is shown as ?"
        );
    }
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
