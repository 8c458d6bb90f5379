//! `analyze`'s explanation of each step: where its GPU time went and what bounds it, per
//! step, per group of like steps (the groups `diff` compares) and for the trace. The figures
//! are the summary's ([`GpuTime`], computed by the format crate); this module only groups and
//! prints them.

use std::collections::BTreeMap;

use serde::Serialize;
use stepscope_format::trace::{GpuMean, GpuTime, Roof, Step, Summary, Verdict};

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
    /// The group against its floor, over its steps that have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<GroupFloor>,
}

/// A group's steps against their floors: sums over the steps with a floor.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct GroupFloor {
    /// Steps with a floor.
    pub steps: usize,
    /// Mean floor per step, µs.
    pub floor_us: f64,
    /// Σ floor / Σ wall.
    pub of_wall: f64,
    /// Σ floor / Σ GPU busy, over those with device work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of_busy: Option<f64>,
    /// The roof that gives most of their floors (Σ FLOP time against Σ byte time).
    pub bound: Roof,
}

impl GroupFloor {
    /// Of the steps with a floor; `None` when none has one.
    pub fn of<'a>(steps: impl IntoIterator<Item = &'a Step>) -> Option<GroupFloor> {
        let (mut n, mut floor, mut wall, mut busy_floor, mut busy) = (0, 0.0, 0.0, 0.0, 0.0);
        let (mut compute, mut memory) = (0.0, 0.0);
        for s in steps {
            let Some(f) = &s.floor else { continue };
            n += 1;
            floor += f.floor_us;
            wall += s.dur_us;
            compute += f.compute_us;
            memory += f.memory_us;
            if let Some(g) = s.gpu.as_ref().filter(|g| g.busy_us > 0.0) {
                busy_floor += f.floor_us;
                busy += g.busy_us;
            }
        }
        (n > 0).then(|| GroupFloor {
            steps: n,
            floor_us: floor / n as f64,
            of_wall: if wall > 0.0 { floor / wall } else { 0.0 },
            of_busy: (busy > 0.0).then(|| busy_floor / busy),
            bound: if compute >= memory {
                Roof::Compute
            } else {
                Roof::Memory
            },
        })
    }
}

/// The groups of like steps, in `diff`'s order of groups (stage, requests, tokens).
pub fn groups(steps: &[Step]) -> Vec<GroupRow> {
    let mut by: BTreeMap<GroupKey, (usize, usize, f64, GpuTime, Vec<&Step>)> = BTreeMap::new();
    for s in steps {
        let e = by.entry(GroupKey::of(&s.name)).or_default();
        e.0 += 1;
        e.2 += s.dur_us;
        e.4.push(s);
        if let Some(g) = &s.gpu {
            e.1 += 1;
            e.3.add(g);
        }
    }
    by.into_iter()
        .map(|(key, (n, on_gpu, wall, gpu, members))| GroupRow {
            group: key.label(),
            steps: n,
            steps_on_gpu: on_gpu,
            mean_wall_us: wall / n.max(1) as f64,
            per_step: gpu.per(n),
            verdict: gpu.verdict,
            floor: GroupFloor::of(members),
        })
        .collect()
}

/// `#12 decode 5-8 req 5-8 tok`: the step's index and its group, shorter than its name.
fn step_label(s: &Step) -> String {
    let key = GroupKey::of(&s.name);
    match s.step {
        Some(i) => format!("#{i} {}", key.label()),
        None => short(&s.name, 30),
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x))
}

/// Each step against its floor, and its groups; or, once, why there is no floor.
pub fn render_floors(r: &Summary, rows: &[GroupRow]) -> String {
    if let Some(why) = &r.floor_missing {
        return format!("\n  {why}\n");
    }
    let Some(peaks) = &r.peaks else {
        return String::new();
    };
    let mut o = format!(
        "\n  each step against its floor: max(FLOPs at {:.1} TFLOP/s, bytes at {:.0} GB/s; {}) (ms)\n  \
         step                             tokens    KV read     GFLOP      GB     floor  bound               wall   of wall    busy   of busy\n",
        peaks.tflops, peaks.gbs, peaks.source
    );
    for s in &r.steps {
        let (Some(f), Some(w)) = (&s.floor, &s.work) else {
            continue;
        };
        let _ = std::fmt::Write::write_fmt(
            &mut o,
            format_args!(
                "  {:<30} {:>8} {:>10} {:>9.3} {:>7.3} {:>9} {:<16} {:>9} {:>9} {:>7} {:>9}\n",
                short(&step_label(s), 30),
                w.tokens(),
                w.context.sk + w.generation.sk,
                f.flops / 1e9,
                f.bytes / 1e9,
                ms(f.floor_us),
                f.bound.as_str(),
                ms(s.dur_us),
                pct(Some(f.of_wall)),
                s.gpu.as_ref().map_or("-".into(), |g| ms(g.busy_us)),
                pct(f.of_busy)
            ),
        );
    }
    if rows.iter().any(|g| g.floor.is_some()) {
        o.push_str(
            "  per group: mean floor, Σ floor / Σ wall, Σ floor / Σ GPU busy, the roof of most of it\n",
        );
        for g in rows {
            let Some(f) = &g.floor else { continue };
            let _ = std::fmt::Write::write_fmt(
                &mut o,
                format_args!(
                    "  {:<30} {:>5} steps  floor {:>9}  {:>7} of wall  {:>7} of busy  {}\n",
                    short(&g.group, 30),
                    f.steps,
                    ms(f.floor_us),
                    pct(Some(f.of_wall)),
                    pct(f.of_busy),
                    f.bound.as_str()
                ),
            );
        }
    }
    o
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
