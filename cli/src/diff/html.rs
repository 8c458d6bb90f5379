//! The HTML page of a comparison, self-contained (no network) in the style of `report`: the
//! groups side by side as rows, a chart of each group's median before and after, and each
//! group's names a click away.

use std::fmt::Write as _;

use super::compare::{DiffReport, GpuSide, Verdict};
use super::render::{dur, pct, signed, verdict};
use crate::text::esc;
use crate::trace::TraceError;

const STYLE: &str = "body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
td.l, th.l { text-align: left; }
th { background: #f4f4f4; }
tr.slower td { background: #fde2e2; } tr.faster td { background: #e2f4e2; }
figure { margin: 1em 0; } figcaption { font-weight: 600; margin-bottom: .3em; }
.chart text { font: 11px system-ui, sans-serif; fill: #333; }
.note { color: #666; } .errors li { color: #a00; }
section { display: none; } section:target { display: block; }";

/// Paired horizontal bars: each group's median before (grey) and after (blue or red).
fn chart(r: &DiffReport) -> String {
    let groups: Vec<_> = r
        .groups
        .iter()
        .filter(|g| g.judged.before.is_some() || g.judged.after.is_some())
        .collect();
    let max = groups
        .iter()
        .flat_map(|g| [g.judged.before, g.judged.after])
        .flatten()
        .map(|s| s.median_us)
        .fold(f64::MIN_POSITIVE, f64::max);
    let (label_w, bar_w, row) = (260.0, 460.0, 30.0);
    let h = 10.0 + row * groups.len() as f64;
    let mut s = format!(
        "<figure><figcaption>Median step time per group: before (grey), after (blue; red when \
         judged slower)</figcaption><svg class=\"chart\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" \
         height=\"{h}\" role=\"img\">",
        w = label_w + bar_w + 100.0
    );
    for (i, g) in groups.iter().enumerate() {
        let y = 5.0 + row * i as f64;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            label_w - 6.0,
            y + 16.0,
            esc(&g.group)
        );
        let after_colour = if g.judged.verdict == Verdict::Slower {
            "#e15759"
        } else {
            "#4e79a7"
        };
        for (k, (stats, colour)) in [(g.judged.before, "#bab0ac"), (g.judged.after, after_colour)]
            .into_iter()
            .enumerate()
        {
            let Some(st) = stats else { continue };
            let w = bar_w * st.median_us / max;
            let yy = y + 2.0 + 12.0 * k as f64;
            let _ = write!(
                s,
                "<rect x=\"{label_w}\" y=\"{yy}\" width=\"{w:.1}\" height=\"11\" fill=\"{colour}\"><title>{}: {} median over {} steps</title></rect><text x=\"{}\" y=\"{}\">{}</text>",
                if k == 0 { "before" } else { "after" },
                dur(st.median_us),
                st.steps,
                label_w + w + 4.0,
                yy + 10.0,
                dur(st.median_us)
            );
        }
    }
    s.push_str("</svg></figure>");
    s
}

fn gpu_table(gpu: &[GpuSide; 2]) -> String {
    let [b, a] = gpu;
    let mut s = String::from(
        "<h2>Device time per step</h2><table><thead><tr><th class=\"l\"></th><th>before</th><th>after</th><th>change</th></tr></thead><tbody>",
    );
    for (what, x, y) in [
        ("busy", b.busy_us_per_step, a.busy_us_per_step),
        (
            "computation",
            b.computation_us_per_step,
            a.computation_us_per_step,
        ),
        (
            "communication",
            b.communication_us_per_step,
            a.communication_us_per_step,
        ),
        ("memory", b.memory_us_per_step, a.memory_us_per_step),
        ("largest idle gap", b.largest_gap_us, a.largest_gap_us),
    ] {
        let _ = write!(
            s,
            "<tr><td class=\"l\">{what}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            dur(x),
            dur(y),
            pct((x > 0.0).then(|| y / x - 1.0))
        );
    }
    let _ = write!(
        s,
        "<tr><td class=\"l\">utilization</td><td>{:.1}%</td><td>{:.1}%</td><td></td></tr></tbody></table>",
        100.0 * b.utilization,
        100.0 * a.utilization
    );
    s
}

/// The page.
pub fn render(r: &DiffReport, errors: &[TraceError]) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<p>before: <code>{}</code> ({} capture(s), {} steps) &nbsp; after: <code>{}</code> ({} capture(s), {} steps)</p>\
         <p class=\"note\">Steps are grouped by stage and by requests and tokens in power-of-two buckets. A group is judged \
         changed when the Mann-Whitney rank test is significant (Holm-corrected, alpha {}) and the Hodges-Lehmann shift is at \
         least {}% of the median before. Click a group to see what its steps ran.</p>",
        esc(&r.before.input),
        r.before.captures,
        r.before.steps,
        esc(&r.after.input),
        r.after.captures,
        r.after.steps,
        r.settings.alpha,
        100.0 * r.settings.min_change
    );
    body.push_str(&chart(r));
    body.push_str(
        "<h2>Groups</h2><table id=\"groups\"><thead><tr><th class=\"l\">group</th>\
         <th>steps before</th><th>median before</th><th>p90 before</th>\
         <th>steps after</th><th>median after</th><th>p90 after</th><th>change</th>\
         <th class=\"l\">verdict</th></tr></thead><tbody>",
    );
    for (i, g) in r.groups.iter().enumerate() {
        let class = match g.judged.verdict {
            Verdict::Slower => " class=\"slower\"",
            Verdict::Faster => " class=\"faster\"",
            _ => "",
        };
        let cells = |s: Option<super::compare::StepStats>| match s {
            Some(s) => format!(
                "<td>{}</td><td>{}</td><td>{}</td>",
                s.steps,
                dur(s.median_us),
                dur(s.p90_us)
            ),
            None => "<td>0</td><td>-</td><td>-</td>".into(),
        };
        let _ = write!(
            body,
            "<tr{class}><td class=\"l\"><a href=\"#g{i}\">{}</a></td>{}{}<td>{}</td><td class=\"l\">{}</td></tr>",
            esc(&g.group),
            cells(g.judged.before),
            cells(g.judged.after),
            pct(g.judged.change),
            esc(&verdict(&g.judged))
        );
    }
    body.push_str("</tbody></table>");
    for (i, g) in r.groups.iter().enumerate() {
        let _ = write!(
            body,
            "<section id=\"g{i}\"><h2>{}</h2><p>{}</p>",
            esc(&g.group),
            esc(&verdict(&g.judged))
        );
        if let Some(c) = &g.gpu {
            let _ = write!(body, "<p>{}</p>", esc(&super::render::why_line(c)));
        }
        if !g.names_compared {
            body.push_str("<p class=\"note\">Names not compared: some captures were read from manifests.</p></section>");
            continue;
        }
        body.push_str(
            "<table><thead><tr><th>Δ per step</th><th>before per step</th><th>after per step</th>\
             <th>calls before</th><th>calls after</th><th class=\"l\">kind</th><th class=\"l\">status</th>\
             <th class=\"l\">name</th></tr></thead><tbody>",
        );
        for n in &g.names {
            let cell = |p: Option<super::names::PerStep>| {
                p.map_or(("-".to_string(), "-".to_string()), |p| {
                    (dur(p.us), format!("{:.1}", p.count))
                })
            };
            let (bt, bc) = cell(n.before);
            let (at, ac) = cell(n.after);
            let title = if n.before_names.is_empty() && n.after_names.is_empty() {
                String::new()
            } else {
                format!(
                    " title=\"before: {} / after: {}\"",
                    esc(&n.before_names.join(", ")),
                    esc(&n.after_names.join(", "))
                )
            };
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{bt}</td><td>{at}</td><td>{bc}</td><td>{ac}</td><td class=\"l\">{}</td><td class=\"l\"{title}>{}</td><td class=\"l\">{}</td></tr>",
                signed(n.delta_us),
                n.category.as_str(),
                n.status.as_str(),
                esc(&n.name)
            );
        }
        body.push_str(
            "</tbody></table><p><a href=\"#groups\">back to the groups</a></p></section>",
        );
    }
    if let Some(gpu) = &r.gpu {
        body.push_str(&gpu_table(gpu));
    }
    if !r.ranks.is_empty() {
        body.push_str("<h2>Ranks</h2><table><thead><tr><th>rank</th><th>median before</th><th>median after</th><th>change</th><th class=\"l\">verdict</th></tr></thead><tbody>");
        for k in &r.ranks {
            let m =
                |s: Option<super::compare::StepStats>| s.map_or("-".into(), |s| dur(s.median_us));
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                k.rank,
                m(k.judged.before),
                m(k.judged.after),
                pct(k.judged.change),
                esc(&verdict(&k.judged))
            );
        }
        body.push_str("</tbody></table>");
    }
    if !errors.is_empty() {
        body.push_str("<h2>Not read</h2><ul class=\"errors\">");
        for e in errors {
            let _ = write!(body, "<li>{}</li>", esc(&e.to_string()));
        }
        body.push_str("</ul>");
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>stepscope diff</title>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{STYLE}</style></head>\
         <body><h1>stepscope diff</h1>{body}<script>document.body.dataset.ready = \"1\";</script></body></html>\n"
    )
}
