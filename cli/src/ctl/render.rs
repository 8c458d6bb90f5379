//! What `ctl` prints: the table with a summary line and each server's engine workers, or the
//! `--json` document.

use std::time::Duration;

use serde_json::{json, Value};

use super::fleet::{Action, Outcome};

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
        for e in &o.otel {
            out.push_str(&format!("    {}\n", otel_line(e)));
        }
    }
    let ok = outcomes.iter().filter(|o| o.ok).count();
    let verb = match action {
        Action::Start => "started",
        Action::Stop => "stopped",
        Action::Workers => "healthy",
        Action::Status | Action::Requests | Action::Timeline => "answered",
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
pub(super) fn engine_worker_line(w: &Value) -> String {
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
    line.push_str(&budget_part(w));
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

/// A server's OpenTelemetry export of request spans, as `ctl status` prints it: where to,
/// what went, what waits (of its cap), and what was dropped or failed.
pub(super) fn otel_line(e: &Value) -> String {
    let num = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut line = format!(
        "otel → {}: {} requests exported ({} spans), {}/{} queued",
        e.get("endpoint").and_then(Value::as_str).unwrap_or("?"),
        num("exported_requests"),
        num("exported_spans"),
        num("queued"),
        num("queue"),
    );
    for (key, what) in [
        ("in_flight", "being exported"),
        ("dropped", "DROPPED (queue full)"),
        ("failed", "failed"),
        ("not_found", "not in the request log"),
        ("steps_lost", "step spans lost"),
    ] {
        if num(key) > 0 {
            line.push_str(&format!(", {} {what}", num(key)));
        }
    }
    if let Some(err) = e.get("last_error").and_then(Value::as_str) {
        line.push_str(&format!("; last error: {err}"));
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

/// The capture budget's part of a worker line: the limits, and the last window it cut short.
fn budget_part(w: &Value) -> String {
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let limits: Vec<String> = [
        f(w, "max_capture_mb")
            .filter(|mb| *mb > 0.0)
            .map(|mb| format!("{mb} MB")),
        f(w, "max_capture_s")
            .filter(|s| *s > 0.0)
            .map(|s| format!("{s} s")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut out = String::new();
    if !limits.is_empty() {
        out.push_str(&format!("  budget {}", limits.join(", ")));
    }
    if let Some(cut) = w.get("last_cut").filter(|c| c.is_object()) {
        let by = cut.get("by").and_then(Value::as_str).unwrap_or("?");
        let step = cut.get("step").and_then(Value::as_u64).unwrap_or_default();
        let what = match (by, f(cut, "grew_mb")) {
            ("max_capture_mb", Some(mb)) => format!("grew {mb:.0} MB"),
            _ => format!("ran {:.1} s", f(cut, "seconds").unwrap_or_default()),
        };
        out.push_str(&format!("  last cut at step {step} by {by} ({what})"));
    }
    out
}

/// The `--json` document.
pub fn render_json(outcomes: &[Outcome]) -> String {
    json!({ "workers": outcomes }).to_string()
}
