//! The report's "why each step took what it took": per trace, one stacked bar per step of its
//! device timeline (busy by class, idle by cause; the summary's [`GpuTime`]), with its verdict.

use std::fmt::Write as _;

use stepscope_format::trace::GpuTime;

use crate::analyze::explain::verdict_text;
use crate::text::{esc, short};
use crate::trace_report::TraceReport;

/// Steps drawn per trace; the rest are counted in a note.
const MAX_STEPS: usize = 120;

/// The parts of a bar, in order, with their colours (the `.why-*` classes of the page).
const PARTS: [(&str, &str); 6] = [
    ("computation", "why-compute"),
    ("exposed communication", "why-comm"),
    ("copies", "why-copy"),
    ("host wait", "why-host"),
    ("dependency wait", "why-dep"),
    ("other idle", "why-other"),
];

fn parts(g: &GpuTime) -> [f64; 6] {
    [
        g.busy.computation_us,
        g.busy.communication_us,
        g.busy.copies_us(),
        g.idle.host_wait_us,
        g.idle.dependency_wait_us,
        g.idle.other_us,
    ]
}

/// The section, empty when no trace has a step with device work.
pub fn section(reports: &[TraceReport], label: impl Fn(&TraceReport, usize) -> String) -> String {
    if !reports
        .iter()
        .any(|r| r.steps.iter().any(|s| s.gpu.is_some()))
    {
        return String::new();
    }
    let mut o = String::from(
        "<h2>Why each step took what it took</h2><p class=\"note\">Each step's device \
         timeline: the work it launched (busy, each instant counted as the first running of \
         computation, communication, copies) and the idle gaps its work ended, by cause: \
         <b>host wait</b> (launched after the GPU went idle), <b>dependency wait</b> (queued \
         before, not started), other (no launch in the trace). The verdict names the largest \
         part; a black tick marks the step's floor (the fastest it could run on the device, \
         when its work and the model's shape are known). Definitions: docs/analyze.md.</p><p>",
    );
    for (name, class) in PARTS {
        let _ = write!(o, "<span class=\"key {class}\">{name}</span> ");
    }
    o.push_str("</p>");
    for (i, r) in reports.iter().enumerate() {
        o.push_str(&chart(r, &label(r, i)));
    }
    o
}

fn chart(r: &TraceReport, title: &str) -> String {
    let steps: Vec<_> = r
        .steps
        .iter()
        .filter_map(|s| s.gpu.as_ref().map(|g| (s, g)))
        .collect();
    if steps.is_empty() {
        return String::new();
    }
    let shown = &steps[..steps.len().min(MAX_STEPS)];
    let max = shown
        .iter()
        .map(|(s, g)| g.timeline_us().max(s.floor.map_or(0.0, |f| f.floor_us)))
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let (row, label_w, bar_w) = (18.0, 230.0, 520.0);
    let h = 10.0 + row * shown.len() as f64;
    let w = label_w + bar_w + 420.0;
    let mut s = format!(
        "<figure class=\"why\"><figcaption>{} — device timeline per step (full width {:.3} ms)\
         </figcaption><svg class=\"chart\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" \
         role=\"img\">",
        esc(title),
        max / 1000.0
    );
    for (i, (step, g)) in shown.iter().enumerate() {
        let y = 4.0 + row * i as f64;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"lbl\">{}</text>",
            label_w - 6.0,
            y + 11.0,
            esc(&short(&step.name, 40))
        );
        let mut x = label_w;
        for ((name, class), us) in PARTS.iter().zip(parts(g)) {
            if us <= 0.0 {
                continue;
            }
            let bw = bar_w * us / max;
            let _ = write!(
                s,
                "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{}\">\
                 <title>{}: {name} {:.3} ms ({:.0}%)</title></rect>",
                row - 4.0,
                esc(&step.name),
                us / 1000.0,
                100.0 * us / g.timeline_us().max(f64::MIN_POSITIVE)
            );
            x += bw;
        }
        if let Some(f) = &step.floor {
            // The floor: the fastest the step could run on this device.
            let fx = label_w + bar_w * f.floor_us / max;
            let _ = write!(
                s,
                "<line class=\"floor\" x1=\"{fx:.1}\" x2=\"{fx:.1}\" y1=\"{}\" y2=\"{}\">\
                 <title>{}: floor {:.3} ms ({}-bound), {:.1}% of its wall time</title></line>",
                y - 1.0,
                y + row - 3.0,
                esc(&step.name),
                f.floor_us / 1000.0,
                f.bound.as_str(),
                100.0 * f.of_wall
            );
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" class=\"val\">{}</text>",
            label_w + bar_w + 6.0,
            y + 11.0,
            esc(&verdict_text(&g.verdict))
        );
    }
    s.push_str("</svg></figure>");
    if steps.len() > shown.len() {
        let _ = write!(
            s,
            "<p class=\"note\">{} more steps not drawn (<code>stepscope analyze --json</code> \
             has every one).</p>",
            steps.len() - shown.len()
        );
    }
    s
}
