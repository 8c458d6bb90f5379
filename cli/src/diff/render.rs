//! The text of a comparison: the groups (changed first), each changed group's names, device
//! time, ranks.

use std::fmt::Write as _;

use super::compare::{DiffReport, GpuSide, GroupDiff, Judged, SideInfo, Verdict};
use super::names::{NameRow, PerStep, Status};
use super::why::GpuChange;
use crate::text::short;

/// A duration in µs, in the unit that reads best.
pub fn dur(us: f64) -> String {
    let a = us.abs();
    if a >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if a >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} µs")
    }
}

/// A signed duration.
pub fn signed(us: f64) -> String {
    if us >= 0.0 {
        format!("+{}", dur(us))
    } else {
        format!("-{}", dur(-us))
    }
}

/// A relative change, percent.
pub fn pct(change: Option<f64>) -> String {
    change.map_or_else(|| "-".into(), |c| format!("{:+.1}%", 100.0 * c))
}

fn side_line(label: &str, s: &SideInfo) -> String {
    let mut o = format!(
        "{label:<7}{}: {} capture(s), {} steps",
        s.input, s.captures, s.steps
    );
    if !s.ranks.is_empty() {
        let _ = write!(o, ", ranks {:?}", s.ranks);
    }
    if s.from_manifests > 0 {
        let _ = write!(o, ", {} from manifests", s.from_manifests);
    }
    o
}

/// The verdict with its evidence.
pub fn verdict(j: &Judged) -> String {
    match (j.verdict, j.p_value, j.shift_ci_us) {
        (v, Some(p), Some([lo, hi])) if v.changed() || v == Verdict::NoChange => format!(
            "{} (shift {} [{}, {}], noise ±{}, p={p:.1e})",
            v.as_str(),
            signed(j.shift_us.unwrap_or(0.0)),
            signed(lo),
            signed(hi),
            dur(j.noise_us.unwrap_or(0.0)),
        ),
        (v, _, _) => v.as_str().to_string(),
    }
}

fn stats_cells(s: Option<super::compare::StepStats>) -> String {
    match s {
        Some(s) => format!(
            "{:>6} {:>10} {:>10}",
            s.steps,
            dur(s.median_us),
            dur(s.p90_us)
        ),
        None => format!("{:>6} {:>10} {:>10}", 0, "-", "-"),
    }
}

fn per_step(p: Option<PerStep>) -> (String, String) {
    match p {
        Some(p) => (format!("{:.1}", p.count), dur(p.us)),
        None => ("-".into(), "-".into()),
    }
}

fn name_rows(o: &mut String, rows: &[NameRow]) {
    o.push_str("    Δ/step        before/step  after/step   calls/step     kind        name\n");
    for r in rows {
        let (bc, bt) = per_step(r.before);
        let (ac, at) = per_step(r.after);
        let status = match r.status {
            Status::Same => String::new(),
            Status::Matched => format!("matched {} → ", r.before_names.join(", ")),
            s => format!("{} ", s.as_str()),
        };
        let _ = writeln!(
            o,
            "    {:>12}  {:>11}  {:>11}  {:>6} → {:<6} {:<10}  {}{}",
            signed(r.delta_us),
            bt,
            at,
            bc,
            ac,
            r.category.as_str(),
            short(&status, 60),
            short(&r.name, 100)
        );
    }
}

/// `why: device timeline +2.10 ms/step: host wait +2.05 ms; launches per step 412 → 1630`.
pub fn why_line(c: &GpuChange) -> String {
    let mut o = format!(
        "why: device timeline {} per step",
        signed(c.timeline_delta_us)
    );
    if !c.moved.is_empty() {
        let parts: Vec<String> = c
            .moved
            .iter()
            .map(|m| format!("{} {}", m.part.as_str(), signed(m.delta_us)))
            .collect();
        let _ = write!(o, ": {}", parts.join(", "));
    }
    let [lb, la] = c.launches;
    if (la - lb).abs() >= 0.5 {
        let _ = write!(o, "; launches per step {lb:.0} → {la:.0}");
        if let Some(g) = c.graphs {
            let [gb, ga] = c.graph_launches;
            let _ = write!(o, " (graph replays {gb:.0} → {ga:.0}: {g})");
        }
    }
    o
}

/// `floor: 41.0% → 35.2% of wall (further from its floor; memory bandwidth-bound)`.
pub fn floor_line([b, a]: &[crate::analyze::explain::GroupFloor; 2]) -> String {
    let way = if a.of_wall > b.of_wall {
        "closer to"
    } else if a.of_wall < b.of_wall {
        "further from"
    } else {
        "as close to"
    };
    format!(
        "floor: {:.1}% → {:.1}% of wall ({way} its floor of {} per step; {}-bound after)",
        100.0 * b.of_wall,
        100.0 * a.of_wall,
        dur(a.floor_us),
        a.bound.as_str()
    )
}

fn gpu_rows(o: &mut String, [b, a]: &[GpuSide; 2]) {
    o.push_str("\n== device time per step (all captures)\n");
    o.push_str("                          before        after       change\n");
    let row = |o: &mut String, what: &str, x: f64, y: f64| {
        let change = (x > 0.0).then(|| y / x - 1.0);
        let _ = writeln!(
            o,
            "  {what:<20} {:>12} {:>12} {:>12}",
            dur(x),
            dur(y),
            pct(change)
        );
    };
    row(o, "busy", b.busy_us_per_step, a.busy_us_per_step);
    row(
        o,
        "computation",
        b.computation_us_per_step,
        a.computation_us_per_step,
    );
    row(
        o,
        "communication",
        b.communication_us_per_step,
        a.communication_us_per_step,
    );
    row(o, "memory", b.memory_us_per_step, a.memory_us_per_step);
    row(o, "largest idle gap", b.largest_gap_us, a.largest_gap_us);
    let _ = writeln!(
        o,
        "  {:<20} {:>11.1}% {:>11.1}%",
        "utilization",
        100.0 * b.utilization,
        100.0 * a.utilization
    );
}

/// The whole text.
pub fn render(r: &DiffReport) -> String {
    let mut o = String::new();
    let s = &r.settings;
    let _ = writeln!(o, "{}", side_line("before", &r.before));
    let _ = writeln!(o, "{}", side_line("after", &r.after));
    let _ = writeln!(
        o,
        "judged per group: Mann-Whitney rank test on the medians of 10 blocks of consecutive \
         steps a side, Holm-corrected at alpha {}; a change is a shift of at least {}% of the \
         median before and beyond the noise band (how far runs drift if each wanders as its \
         blocks do); groups need {} steps a side",
        s.alpha,
        100.0 * s.min_change,
        s.min_steps
    );
    let changed = r
        .groups
        .iter()
        .filter(|g| g.judged.verdict.changed())
        .count();
    let judged = r
        .groups
        .iter()
        .filter(|g| g.judged.verdict.changed() || g.judged.verdict == Verdict::NoChange)
        .count();
    let _ = writeln!(
        o,
        "\n== groups: {changed} of {judged} judged changed beyond noise ({} groups)",
        r.groups.len()
    );
    o.push_str(
        "  group                           steps     median        p90 | steps     median        p90   change  verdict\n",
    );
    for g in &r.groups {
        let _ = writeln!(
            o,
            "  {:<28} {} | {} {:>8}  {}",
            short(&g.group, 28),
            stats_cells(g.judged.before),
            stats_cells(g.judged.after),
            pct(g.judged.change),
            verdict(&g.judged)
        );
    }
    let names_compared = r.groups.iter().any(|g| g.names_compared);
    if !names_compared && !r.groups.is_empty() {
        o.push_str(
            "\n  (kernels and operators not compared: some captures were read from manifests, \
             which hold step times only; drop --steps-only, or keep the traces beside them)\n",
        );
    }
    // What changed in the changed groups, else in the largest group.
    let shown: Vec<&GroupDiff> = {
        let changed: Vec<&GroupDiff> = r
            .groups
            .iter()
            .filter(|g| g.judged.verdict.changed())
            .collect();
        if changed.is_empty() {
            r.groups
                .iter()
                .filter(|g| g.judged.before.is_some() && g.judged.after.is_some())
                .max_by_key(|g| g.judged.after.map_or(0, |a| a.steps))
                .into_iter()
                .collect()
        } else {
            changed
        }
    };
    for g in shown.iter().filter(|g| {
        (g.names_compared && !g.names.is_empty()) || g.gpu.is_some() || g.floor.is_some()
    }) {
        let _ = writeln!(
            o,
            "\n== {}: per step, largest change first ({}; kernels: device time, operators and annotations: self time)",
            g.group,
            g.judged.verdict.as_str()
        );
        if let Some(c) = &g.gpu {
            let _ = writeln!(o, "  {}", why_line(c));
        }
        if let Some(f) = &g.floor {
            let _ = writeln!(o, "  {}", floor_line(f));
        }
        if g.names_compared && !g.names.is_empty() {
            name_rows(&mut o, &g.names);
        }
    }
    if let Some(gpu) = &r.gpu {
        gpu_rows(&mut o, gpu);
    }
    if !r.ranks.is_empty() {
        o.push_str("\n== ranks (all steps)\n  rank   steps     median        p90 | steps     median        p90   change  verdict\n");
        for k in &r.ranks {
            let _ = writeln!(
                o,
                "  {:>4} {} | {} {:>8}  {}",
                k.rank,
                stats_cells(k.judged.before),
                stats_cells(k.judged.after),
                pct(k.judged.change),
                verdict(&k.judged)
            );
        }
    }
    o
}
