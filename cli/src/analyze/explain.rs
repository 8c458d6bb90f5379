//! `analyze`'s explanation of each step: where its GPU time went and what bounds it, per
//! step, per group of like steps (the groups `diff` compares) and for the trace. The figures
//! are the summary's ([`GpuTime`], computed by the format crate); this module only groups and
//! prints them.

use std::collections::BTreeMap;

use serde::Serialize;
use stepscope_format::trace::{GpuMean, GpuTime, Step, Verdict};

use crate::diff::shape::GroupKey;
use crate::text::short;

/// Steps of one kind and shape, their GPU figures summed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GroupRow {
    /// E.g. `decode 3-4 req 3-4 tok` (see `diff`'s groups).
    pub group: String,
    /// Steps in it.
    pub steps: usize,
    /// Of which with device work.
    pub steps_on_gpu: usize,
    /// Mean wall time, µs.
    pub mean_wall_us: f64,
    /// Its GPU figures per step (means).
    pub per_step: GpuMean,
    /// What bounds the group, judged on its summed figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

/// The groups of like steps, in `diff`'s order of groups (stage, requests, tokens).
pub fn groups(steps: &[Step]) -> Vec<GroupRow> {
    let mut by: BTreeMap<GroupKey, (usize, usize, f64, GpuTime)> = BTreeMap::new();
    for s in steps {
        let e = by.entry(GroupKey::of(&s.name)).or_default();
        e.0 += 1;
        e.2 += s.dur_us;
        if let Some(g) = &s.gpu {
            e.1 += 1;
            e.3.add(g);
        }
    }
    by.into_iter()
        .map(|(key, (n, on_gpu, wall, gpu))| GroupRow {
            group: key.label(),
            steps: n,
            steps_on_gpu: on_gpu,
            mean_wall_us: wall / n.max(1) as f64,
            per_step: gpu.per(n),
            verdict: gpu.verdict,
        })
        .collect()
}

fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

/// `host-bound (host wait 62% of 4.100 ms)`.
pub fn verdict_text(v: &Option<Verdict>) -> String {
    match v {
        Some(v) => format!(
            "{} ({} {:.0}% of {} ms)",
            v.bound.as_str(),
            v.bound.figure(),
            100.0 * v.share(),
            ms(v.of_us)
        ),
        None => "no GPU work".into(),
    }
}

/// The trace's own lines.
pub fn render_trace(g: &GpuTime) -> String {
    if g.timeline_us() <= 0.0 && g.launches == Default::default() {
        return String::new();
    }
    let comm = g.busy.communication_us + g.communication_overlapped_us;
    let l = &g.launches;
    let mut o = format!(
        "GPU busy {} ms: computation {}, exposed communication {}, copies {}; idle {} ms: \
         host wait {}, dependency wait {}, other {}\n",
        ms(g.busy_us),
        ms(g.busy.computation_us),
        ms(g.busy.communication_us),
        ms(g.busy.copies_us()),
        ms(g.idle.total_us()),
        ms(g.idle.host_wait_us),
        ms(g.idle.dependency_wait_us),
        ms(g.idle.other_us),
    );
    if comm > 0.0 {
        o.push_str(&format!(
            "communication {} ms, {:.1}% of it overlapped by computation\n",
            ms(comm),
            100.0 * g.communication_overlapped_us / comm
        ));
    }
    o.push_str(&format!(
        "launches: {} kernel, {} graph replays running {} kernels, {} copies; launch delay \
         median {} p90 {} µs; {} ran shorter than their launch call; sync calls {} ms\n",
        l.kernel_launches,
        l.graph_launches,
        l.graph_kernels,
        l.copy_launches,
        l.delay_median_us.map_or("-".into(), |d| format!("{d:.1}")),
        l.delay_p90_us.map_or("-".into(), |d| format!("{d:.1}")),
        l.short,
        ms(g.sync_us),
    ));
    o.push_str(&format!("verdict: {}\n", verdict_text(&g.verdict)));
    o
}

/// Each step's explanation, a row each (ms).
pub fn render_steps(steps: &[Step]) -> String {
    if steps.iter().all(|s| s.gpu.is_none()) {
        return String::new();
    }
    let mut o = String::from(
        "\n  why each step took what it took on its GPUs (ms; launches: kernels + graph replays)\n  \
         step                              busy   compute  exp.comm    copies  host wait  dep.wait  launches  verdict\n",
    );
    for s in steps {
        let Some(g) = &s.gpu else { continue };
        o.push_str(&format!(
            "  {:<30} {:>8} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9}  {}\n",
            short(&s.name, 30),
            ms(g.busy_us),
            ms(g.busy.computation_us),
            ms(g.busy.communication_us),
            ms(g.busy.copies_us()),
            ms(g.idle.host_wait_us),
            ms(g.idle.dependency_wait_us),
            format!(
                "{}+{}",
                g.launches.kernel_launches, g.launches.graph_launches
            ),
            verdict_text(&g.verdict)
        ));
    }
    o
}

/// The groups, a row each (ms per step).
pub fn render_groups(rows: &[GroupRow]) -> String {
    if rows.iter().all(|r| r.steps_on_gpu == 0) {
        return String::new();
    }
    let mut o = String::from(
        "\n  per group of like steps (means per step, ms)\n  \
         group                          steps      wall      busy   compute  exp.comm    copies  host wait  dep.wait  launches  verdict\n",
    );
    for r in rows {
        let g = &r.per_step;
        o.push_str(&format!(
            "  {:<30} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9.0}  {}\n",
            short(&r.group, 30),
            r.steps,
            ms(r.mean_wall_us),
            ms(g.busy_us),
            ms(g.computation_us),
            ms(g.communication_exposed_us),
            ms(g.copies_us),
            ms(g.host_wait_us),
            ms(g.dependency_wait_us),
            g.kernel_launches + g.graph_launches,
            verdict_text(&r.verdict)
        ));
    }
    o
}
