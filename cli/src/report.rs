//! `stepscope report`: a self-contained HTML page (inline SVG charts, no network) of one trace
//! or of every rank of a run: time per step per rank, top kernels, the
//! computation/communication/memory split, utilization, each step's device timeline and
//! verdict (`explain.rs`), and the captured requests' waterfall.

mod explain;

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::analyze::ranks;
use crate::analyze::requests::{self, TraceRequest};
use crate::text::{esc, short};
use crate::trace::TraceError;
use crate::trace_report::{Step, TraceReport};

/// The page around the charts: style, an explanation, the table sorter. `{{traces}}` and
/// `{{body}}` are filled in.
const TEMPLATE: &str = include_str!("report.html");

const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

fn rank_label(r: &TraceReport, i: usize) -> String {
    r.rank
        .map(|x| format!("rank {x}"))
        .unwrap_or_else(|| format!("trace {i}"))
}

/// Horizontal bars: (label, value, tooltip). `full`: the value of a full-width bar (100 for
/// percentages); by default the largest value.
fn hbars(title: &str, unit: &str, items: &[(String, f64, String)], full: Option<f64>) -> String {
    let row = 22.0;
    let label_w = 420.0;
    let bar_w = 420.0;
    let h = 30.0 + row * items.len() as f64;
    let max = full
        .unwrap_or_else(|| items.iter().map(|i| i.1).fold(0.0, f64::max))
        .max(f64::MIN_POSITIVE);
    let mut s = format!(
        "<figure><figcaption>{}</figcaption><svg class=\"chart\" viewBox=\"0 0 {} {h}\" width=\"{}\" height=\"{h}\" role=\"img\">",
        esc(title),
        label_w + bar_w + 90.0,
        label_w + bar_w + 90.0
    );
    for (i, (label, v, tip)) in items.iter().enumerate() {
        let y = 20.0 + row * i as f64;
        let w = bar_w * v / max;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"lbl\">{}</text><rect x=\"{}\" y=\"{}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"><title>{}</title></rect><text x=\"{}\" y=\"{}\" class=\"val\">{v:.1} {unit}</text>",
            label_w - 6.0,
            y + 14.0,
            esc(&short(label, 60)),
            label_w,
            y + 2.0,
            row - 6.0,
            PALETTE[i % PALETTE.len()],
            esc(tip),
            label_w + w + 4.0,
            y + 14.0
        );
    }
    s.push_str("</svg></figure>");
    s
}

/// Vertical bars grouped by step, one colour per rank.
fn steps_chart(reports: &[TraceReport]) -> String {
    let n_steps = reports.iter().map(|r| r.steps.len()).max().unwrap_or(0);
    if n_steps == 0 {
        return "<p class=\"note\">No iterations found (no <code>execute_…</code> or <code>ProfilerStep#</code> annotations).</p>".into();
    }
    let max = reports
        .iter()
        .flat_map(|r| r.steps.iter().map(|s| s.dur_us))
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let group_w = (720.0 / n_steps as f64).clamp(12.0, 120.0);
    let bar_w = (group_w - 4.0) / reports.len() as f64;
    let (h, top) = (240.0, 10.0);
    let w = 60.0 + group_w * n_steps as f64 + 20.0;
    let mut s = format!(
        "<figure><figcaption>Time per step per rank (ms)</figcaption><svg class=\"chart\" viewBox=\"0 0 {w} {}\" width=\"{w}\" height=\"{}\" role=\"img\">",
        h + 50.0,
        h + 50.0
    );
    let _ = write!(
        s,
        "<text x=\"4\" y=\"{}\" class=\"val\">{:.2}</text><line x1=\"58\" y1=\"{top}\" x2=\"58\" y2=\"{}\" stroke=\"#999\"/>",
        top + 10.0,
        max / 1000.0,
        top + h
    );
    for (ri, r) in reports.iter().enumerate() {
        for (si, st) in r.steps.iter().enumerate() {
            let bh = h * st.dur_us / max;
            let x = 60.0 + group_w * si as f64 + bar_w * ri as f64;
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{}\"><title>{}: {} — {:.3} ms wall, {:.3} ms GPU, {} kernels</title></rect>",
                top + h - bh,
                (bar_w - 1.0).max(1.0),
                PALETTE[ri % PALETTE.len()],
                esc(&rank_label(r, ri)),
                esc(&st.name),
                st.dur_us / 1000.0,
                st.kernel_us / 1000.0,
                st.kernel_count
            );
        }
    }
    for si in 0..n_steps {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" class=\"val\" text-anchor=\"middle\">{}</text>",
            60.0 + group_w * si as f64 + group_w / 2.0,
            top + h + 14.0,
            si + 1
        );
    }
    for (ri, r) in reports.iter().enumerate() {
        let _ = write!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" class=\"val\">{}</text>",
            60.0 + 90.0 * ri as f64,
            top + h + 26.0,
            PALETTE[ri % PALETTE.len()],
            74.0 + 90.0 * ri as f64,
            top + h + 35.0,
            esc(&rank_label(r, ri))
        );
    }
    s.push_str("</svg></figure>");
    s
}

/// Stacked bars of computation / communication / memory, one per rank.
fn split_chart(reports: &[TraceReport]) -> String {
    let row = 24.0;
    let h = 40.0 + row * reports.len() as f64;
    let colors = ["#4e79a7", "#e15759", "#59a14f"];
    let mut s = format!(
        "<figure><figcaption>GPU time: computation / communication / memory</figcaption><svg class=\"chart\" viewBox=\"0 0 700 {h}\" width=\"700\" height=\"{h}\" role=\"img\">"
    );
    for (i, r) in reports.iter().enumerate() {
        let parts = [
            r.split.computation_us,
            r.split.communication_us,
            r.split.memory_us,
        ];
        let total: f64 = parts.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let y = 10.0 + row * i as f64;
        let _ = write!(
            s,
            "<text x=\"90\" y=\"{}\" text-anchor=\"end\" class=\"lbl\">{}</text>",
            y + 15.0,
            esc(&rank_label(r, i))
        );
        let mut x = 96.0;
        for (j, p) in parts.iter().enumerate() {
            let w = 560.0 * p / total;
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{y}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"><title>{}: {:.1}% ({:.3} ms)</title></rect>",
                row - 6.0,
                colors[j],
                ["computation", "communication", "memory"][j],
                100.0 * p / total,
                p / 1000.0
            );
            x += w;
        }
    }
    let ly = h - 14.0;
    for (j, name) in ["computation", "communication", "memory"]
        .iter()
        .enumerate()
    {
        let _ = write!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\" class=\"val\">{name}</text>",
            96.0 + 130.0 * j as f64,
            ly,
            colors[j],
            110.0 + 130.0 * j as f64,
            ly + 9.0
        );
    }
    s.push_str("</svg></figure>");
    s
}

/// Requests drawn in the waterfall at most (the first seen).
const WATERFALL_ROWS: usize = 200;

/// The requests of the first trace whose iterations name them (every rank of a step serves
/// the same requests): a table, and a waterfall with one row per request and a bar per
/// captured iteration it was in (prefill, decode), its span drawn through the iterations that
/// left it out. Clicking a row (or opening the page at `#req-N`) shows that request's
/// iterations. Empty when no trace names requests.
fn requests_section(reports: &[TraceReport]) -> String {
    let Some((ri, r)) = reports
        .iter()
        .enumerate()
        .find(|(_, r)| r.steps.iter().any(|s| !s.requests.is_empty()))
    else {
        return String::new();
    };
    let mut all = requests::requests(&r.steps, None);
    let logs = crate::analyze::request_logs(&crate::analyze::trace_dir(&r.file));
    requests::join_logs(&mut all, &logs, Some(0));
    // First seen first: the waterfall's order.
    all.sort_by_key(|q| q.costliest.first().map_or(usize::MAX, |s| s.index));
    let rows = &all[..all.len().min(WATERFALL_ROWS)];
    let mut o = format!(
        "<h2>Requests</h2><p class=\"note\">{} request(s) in the captured iterations of {} ({}){}. A bar per iteration a request was in: <span class=\"key prefill\">prefill</span> <span class=\"key decode\">decode</span> <span class=\"key scheduled\">phase not recorded</span>; a thin line where it was left out. Shares of CPU and GPU time are by tokens when the engine gave them. Queue wait and time to first token are not in a trace: they come from the engine's request log, where a capture with <code>\"stepscope\": {{\"requests\": true}}</code> wrote it beside the trace (else -). Click a request to see its iterations.</p>",
        all.len(),
        esc(&rank_label(r, ri)),
        esc(&r.file),
        if all.len() > rows.len() {
            format!("; the first {} shown", rows.len())
        } else {
            String::new()
        }
    );
    o.push_str(&waterfall(&r.steps, rows));
    o.push_str("<table class=\"sortable\"><thead><tr><th>#</th><th>iterations</th><th>prefill chunks</th><th>prefill tokens</th><th>decode steps</th><th>wall (ms)</th><th>CPU share (ms)</th><th>GPU share (ms)</th><th>queue (ms)</th><th>TTFT (ms)</th><th>request</th></tr></thead><tbody>");
    for (k, q) in rows.iter().enumerate() {
        let _ = write!(
            o,
            "<tr data-req=\"{k}\"><td>{k}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            q.steps,
            q.prefill.map_or(0, |p| p.steps),
            q.prefill.map_or(0, |p| p.tokens),
            q.decode.map_or(0, |d| d.steps),
            q.wall_ms,
            q.cpu_ms,
            q.gpu_ms,
            opt_ms(q.log.as_ref().and_then(|b| b.queue.map(|s| s.ms))),
            opt_ms(q.log.as_ref().and_then(|b| b.ttft_ms)),
            esc(&q.id)
        );
    }
    o.push_str("</tbody></table>");
    for (k, q) in rows.iter().enumerate() {
        let _ = write!(
            o,
            "<div class=\"req-steps\" id=\"req-{k}\" hidden><h3>{}</h3>",
            esc(&q.id)
        );
        if let Some(b) = &q.log {
            let _ = write!(
                o,
                "<p class=\"note\">In its engine's request log: queue {} ms, TTFT {} ms, end to end {} ms, prefill {} ms, {} preemption(s) ({}).</p>",
                opt_ms(b.queue.map(|s| s.ms)),
                opt_ms(b.ttft_ms),
                opt_ms(b.e2e_ms),
                opt_ms(b.prefill.map(|s| s.ms)),
                b.preempted_at.len(),
                esc(&b.server)
            );
        }
        o.push_str("<table><thead><tr><th>step</th><th>start (ms)</th><th>wall (ms)</th><th>role</th><th>its tokens</th><th>share (%)</th><th>requests</th><th>tokens</th><th>largest prefill</th></tr></thead><tbody>");
        for s in &q.costliest {
            let start = r.steps.get(s.index).map_or(0.0, |st| st.start_us / 1e3);
            let largest = match (&s.largest_prefill_request, s.own_prefill) {
                (Some(_), true) => format!("{} tokens (its own)", s.largest_prefill_tokens),
                (Some(id), false) => format!("{} tokens of {}", s.largest_prefill_tokens, esc(id)),
                (None, _) => "-".into(),
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{start:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{largest}</td></tr>",
                s.step.map_or_else(|| format!("#{}", s.index + 1), |i| i.to_string()),
                s.ms,
                s.role.as_str(),
                s.own_tokens.map_or_else(|| "-".into(), |t| t.to_string()),
                100.0 * s.share,
                s.requests,
                s.tokens.map_or_else(|| "-".into(), |t| t.to_string()),
            );
        }
        o.push_str("</tbody></table></div>");
    }
    o
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// The waterfall: time across (the captured iterations' span), one row per request.
fn waterfall(steps: &[Step], rows: &[TraceRequest]) -> String {
    let (label_w, plot_w, row_h, top) = (260.0, 740.0, 14.0, 16.0);
    let t0 = steps
        .iter()
        .map(|s| s.start_us)
        .fold(f64::INFINITY, f64::min);
    let t1 = steps
        .iter()
        .map(|s| s.start_us + s.dur_us)
        .fold(f64::NEG_INFINITY, f64::max);
    let span = (t1 - t0).max(f64::MIN_POSITIVE);
    let x = |t: f64| label_w + plot_w * (t - t0) / span;
    let h = top + row_h * rows.len() as f64 + 20.0;
    let w = label_w + plot_w + 10.0;
    let mut s = format!(
        "<figure><figcaption>Request waterfall ({:.3} ms of captured iterations)</figcaption><svg class=\"chart waterfall\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\">",
        span / 1e3
    );
    for (k, q) in rows.iter().enumerate() {
        let y = top + row_h * k as f64;
        let _ = write!(
            s,
            "<g class=\"req\" data-req=\"{k}\"><text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"lbl\">{}</text>",
            label_w - 6.0,
            y + 10.0,
            esc(&short(&q.id, 36))
        );
        let at = |i: usize| steps.get(i);
        if let (Some(a), Some(b)) = (
            q.costliest.first().and_then(|f| at(f.index)),
            q.costliest.last().and_then(|l| at(l.index)),
        ) {
            let _ = write!(
                s,
                "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" class=\"span\"/>",
                x(a.start_us),
                y + 6.0,
                x(b.start_us + b.dur_us),
                y + 6.0
            );
        }
        for it in &q.costliest {
            let Some(st) = at(it.index) else { continue };
            let _ = write!(
                s,
                "<rect x=\"{:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{}\" class=\"{}\"><title>{}: step {} — {} {:.3} ms, {:.1}% of it</title></rect>",
                x(st.start_us),
                y + 1.0,
                (x(st.start_us + st.dur_us) - x(st.start_us)).max(0.5),
                row_h - 3.0,
                it.role.as_str(),
                esc(&q.id),
                it.step.map_or_else(|| "?".into(), |i| i.to_string()),
                it.role.as_str(),
                it.ms,
                100.0 * it.share
            );
        }
        s.push_str("</g>");
    }
    let _ = write!(
        s,
        "<text x=\"{label_w}\" y=\"{:.1}\" class=\"val\">0</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" class=\"val\">{:.3} ms</text></svg></figure>",
        h - 4.0,
        label_w + plot_w,
        h - 4.0,
        span / 1e3
    );
    s
}

/// The page.
pub fn render(reports: &[TraceReport], errors: &[TraceError]) -> String {
    let mut body = String::new();
    let rows = ranks(reports);
    body.push_str("<h2>Ranks</h2><table class=\"sortable\"><thead><tr><th>rank</th><th>steps</th><th>median step (ms)</th><th>GPU busy (ms)</th><th>utilization (%)</th><th>kernels</th><th>file</th></tr></thead><tbody>");
    for (row, r) in rows.iter().zip(reports) {
        let _ = write!(
            body,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.1}</td><td>{}</td><td>{}</td></tr>",
            if row.straggler { " class=\"straggler\"" } else { "" },
            row.rank.map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
            row.steps,
            row.median_step_us
                .map(|m| format!("{:.3}", m / 1000.0))
                .unwrap_or_else(|| "-".into()),
            row.gpu_busy_us / 1000.0,
            100.0 * row.utilization,
            r.kernels.count,
            esc(&r.file)
        );
    }
    body.push_str("</tbody></table>");

    body.push_str("<h2>Iterations</h2>");
    body.push_str(&steps_chart(reports));
    body.push_str(&explain::section(reports, rank_label));

    // Top kernels over all ranks.
    let mut totals: HashMap<&str, (f64, u64)> = HashMap::new();
    for r in reports {
        for k in &r.kernels.by_name {
            let e = totals.entry(k.name.as_str()).or_default();
            e.0 += k.total_us;
            e.1 += k.count;
        }
    }
    let mut top: Vec<(&str, (f64, u64))> = totals.into_iter().collect();
    top.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.0.cmp(b.0)));
    top.truncate(15);
    let items: Vec<(String, f64, String)> = top
        .iter()
        .map(|(n, (t, c))| (n.to_string(), t / 1000.0, format!("{n}: {c} launches")))
        .collect();
    body.push_str("<h2>Kernels</h2>");
    body.push_str(&hbars(
        "Top kernels by GPU time, all ranks (ms)",
        "ms",
        &items,
        None,
    ));
    body.push_str("<h2>GPU time split</h2>");
    body.push_str(&split_chart(reports));
    let util: Vec<(String, f64, String)> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                rank_label(r, i),
                100.0 * r.utilization,
                format!(
                    "{}: busy {:.3} ms of {:.3} ms",
                    r.file,
                    r.gpu_busy_us / 1000.0,
                    r.span_us / 1000.0
                ),
            )
        })
        .collect();
    body.push_str("<h2>Utilization</h2>");
    body.push_str(&hbars(
        "GPU utilization per rank (%)",
        "%",
        &util,
        Some(100.0),
    ));
    body.push_str(&requests_section(reports));
    if !errors.is_empty() {
        body.push_str("<h2>Not analyzed</h2><ul class=\"errors\">");
        for e in errors {
            let _ = write!(body, "<li>{}</li>", esc(&e.to_string()));
        }
        body.push_str("</ul>");
    }

    TEMPLATE
        .replacen("{{traces}}", &reports.len().to_string(), 1)
        .replacen("{{body}}", &body, 1)
}

/// `stepscope report`.
pub fn command(r: &crate::flags::ReportArgs) -> Result<std::process::ExitCode, crate::Error> {
    let mut loaded = crate::load::load(&r.inputs, 50)?;
    crate::floor::apply(loaded.reports.iter_mut().map(|r| &mut r.summary), &r.floor)?;
    if loaded.reports.is_empty() {
        return Err(crate::Error::NothingRead);
    }
    let html = render(&loaded.reports, &loaded.errors);
    std::fs::write(&r.output, html).map_err(|e| crate::Error::Write {
        path: r.output.clone(),
        message: e.to_string(),
    })?;
    crate::outln!(
        "wrote {} ({} trace(s))",
        r.output.display(),
        loaded.reports.len()
    )?;
    Ok(crate::error::partial(!loaded.errors.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::requests::test_step;

    #[test]
    fn the_waterfall_draws_a_row_per_request_and_a_bar_per_iteration_it_was_in() {
        let steps = vec![
            test_step(1, 9.0, &[("<long>", 128, true)]),
            test_step(2, 9.0, &[("<long>", 2, true), ("short", 1, false)]),
            test_step(3, 9.0, &[("short", 1, false)]),
            test_step(4, 9.0, &[("<long>", 1, false), ("short", 1, false)]),
        ];
        let rows = requests::requests(&steps, None);
        let svg = waterfall(&steps, &rows);
        assert_eq!(svg.matches("<g class=\"req\"").count(), 2);
        assert_eq!(svg.matches("class=\"prefill\"").count(), 2);
        assert_eq!(svg.matches("class=\"decode\"").count(), 4);
        // Ids are escaped; a request's span runs across the iteration that left it out.
        assert!(svg.contains("&lt;long&gt;") && !svg.contains("<long>"));
        assert_eq!(svg.matches("class=\"span\"").count(), 2);
    }
}
