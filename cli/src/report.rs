//! `stepscope report`: a self-contained HTML page (inline SVG charts, no network) of one trace
//! or of every rank of a run: time per step per rank, top kernels, the
//! computation/communication/memory split, utilization.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::analyze::ranks;
use crate::text::{esc, short};
use crate::trace::TraceError;
use crate::trace_report::TraceReport;

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
    let loaded = crate::load::load(&r.inputs, 50)?;
    if loaded.reports.is_empty() {
        return Err(crate::Error::NothingRead);
    }
    let html = render(&loaded.reports, &loaded.errors);
    std::fs::write(&r.output, html).map_err(|e| crate::Error::Write {
        path: r.output.clone(),
        message: e.to_string(),
    })?;
    println!(
        "wrote {} ({} trace(s))",
        r.output.display(),
        loaded.reports.len()
    );
    Ok(crate::error::partial(!loaded.errors.is_empty()))
}
