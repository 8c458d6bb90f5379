//! The comparison itself: two sides' captures in, a [`DiffReport`] out. No I/O.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use stepscope_format::trace::{Breakdown, GpuTime, Step, Summary};

use crate::analyze::explain::GroupFloor;

use super::names::{self, NameRow, Totals};
use super::noise;
use super::shape::GroupKey;
use super::why::{self, GpuChange};
use crate::stats::{median, percentile};

/// One capture of a side: its summary, and what each step ran when its trace was read.
pub struct Capture {
    /// Its rank, from the trace or its file name.
    pub rank: Option<i64>,
    /// Its summary.
    pub summary: Summary,
    /// Per step, per name; `None` when the summary came from a manifest.
    pub breakdown: Option<Breakdown>,
}

/// How changes are judged.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Settings {
    /// Family-wise significance level of the rank tests (Holm over the groups, and over the
    /// ranks).
    pub alpha: f64,
    /// The smallest change of a group's typical step time (Hodges-Lehmann shift over the
    /// median before) reported as a change, as a fraction.
    pub min_change: f64,
    /// Steps a side needs in a group for the group to be judged.
    pub min_steps: usize,
    /// Whether names left unmatched are matched by their normalized form.
    pub normalize_names: bool,
}

/// A side's step times in one group (or rank).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepStats {
    /// Steps.
    pub steps: usize,
    /// Median step wall time, µs.
    pub median_us: f64,
    /// 90th percentile (nearest rank), µs.
    pub p90_us: f64,
}

impl StepStats {
    fn of(times: &[f64]) -> Option<Self> {
        let mut sorted = times.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(StepStats {
            steps: sorted.len(),
            median_us: median(sorted.clone())?,
            p90_us: percentile(&sorted, 90.0)?,
        })
    }
}

/// What the test says of a group or rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Slower after, beyond noise.
    Slower,
    /// Faster after, beyond noise.
    Faster,
    /// No change beyond noise.
    NoChange,
    /// Too few steps on a side to judge.
    TooFew,
    /// Steps of this kind before only.
    OnlyBefore,
    /// After only.
    OnlyAfter,
}

impl Verdict {
    /// For tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Slower => "SLOWER",
            Verdict::Faster => "FASTER",
            Verdict::NoChange => "no change beyond noise",
            Verdict::TooFew => "too few steps to judge",
            Verdict::OnlyBefore => "before only",
            Verdict::OnlyAfter => "after only",
        }
    }

    /// Slower or faster.
    pub fn changed(self) -> bool {
        matches!(self, Verdict::Slower | Verdict::Faster)
    }
}

/// The comparison of one group's (or rank's) step times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judged {
    /// Before's steps.
    pub before: Option<StepStats>,
    /// After's.
    pub after: Option<StepStats>,
    /// After's median over before's, less 1.
    pub change: Option<f64>,
    /// Hodges-Lehmann shift of the step time (after less before; over blocks of consecutive
    /// steps, see `noise`), µs.
    pub shift_us: Option<f64>,
    /// Its `1 - alpha` confidence interval, µs.
    pub shift_ci_us: Option<[f64; 2]>,
    /// The noise band: the shift two unchanged runs stay within if each run's level wanders
    /// as its blocks of steps do (`noise::band`), µs. A shift inside it is not called a change.
    pub noise_us: Option<f64>,
    /// Mann-Whitney two-sided p-value, on blocks of consecutive steps (before Holm's
    /// correction).
    pub p_value: Option<f64>,
    /// The verdict.
    pub verdict: Verdict,
}

/// One group of steps.
#[derive(Debug, Clone, Serialize)]
pub struct GroupDiff {
    /// E.g. `decode 3-4 req 3-4 tok`.
    pub group: String,
    /// Its stage and buckets.
    pub key: GroupKey,
    /// Its step times compared.
    #[serde(flatten)]
    pub judged: Judged,
    /// Whether its kernels and operators were compared (every capture's trace read).
    pub names_compared: bool,
    /// Per name, largest change first (the top N).
    pub names: Vec<NameRow>,
    /// Which part of its steps' device timeline moved, when both sides had device work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuChange>,
    /// The group against its floor before and after, when both sides' steps have floors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<[GroupFloor; 2]>,
}

/// A side's device time, per step over all its captures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GpuSide {
    /// Steps.
    pub steps: usize,
    /// Devices with activity (summed over captures).
    pub devices: u64,
    /// Busy time (union of device intervals) per step, µs.
    pub busy_us_per_step: f64,
    /// Compute kernels per step, µs.
    pub computation_us_per_step: f64,
    /// Collectives per step, µs.
    pub communication_us_per_step: f64,
    /// Memcpy and memset per step, µs.
    pub memory_us_per_step: f64,
    /// Busy over span × devices.
    pub utilization: f64,
    /// The longest idle gap of any device, µs.
    pub largest_gap_us: f64,
}

/// One rank on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct RankDiff {
    /// The rank.
    pub rank: i64,
    /// Its step times compared (all its steps).
    #[serde(flatten)]
    pub judged: Judged,
    /// Device time before.
    pub gpu_before: GpuSide,
    /// After.
    pub gpu_after: GpuSide,
}

/// What a side held.
#[derive(Debug, Clone, Serialize)]
pub struct SideInfo {
    /// The input as given.
    pub input: String,
    /// Captures read.
    pub captures: usize,
    /// Of which summarized from their manifests (no per-name breakdown).
    pub from_manifests: usize,
    /// Steps.
    pub steps: usize,
    /// Ranks found.
    pub ranks: Vec<i64>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// Before.
    pub before: SideInfo,
    /// After.
    pub after: SideInfo,
    /// How changes were judged.
    pub settings: Settings,
    /// Groups, changed first (by the time they add: shift × after's steps), then the rest.
    pub groups: Vec<GroupDiff>,
    /// Device time, when either side has any.
    pub gpu: Option<[GpuSide; 2]>,
    /// Ranks present on both sides (empty unless both have ranks).
    pub ranks: Vec<RankDiff>,
}

/// The comparison of two sides' step times; tested (a p-value) only with `min_steps` steps a
/// side, the verdict then left to [`decide`].
fn judge(before: &[f64], after: &[f64], settings: &Settings) -> Judged {
    let b = StepStats::of(before);
    let a = StepStats::of(after);
    let mut j = Judged {
        before: b,
        after: a,
        change: None,
        shift_us: None,
        shift_ci_us: None,
        noise_us: None,
        p_value: None,
        verdict: match (b, a) {
            (None, _) => Verdict::OnlyAfter,
            (_, None) => Verdict::OnlyBefore,
            _ => Verdict::TooFew,
        },
    };
    let (Some(b), Some(a)) = (b, a) else {
        return j;
    };
    if b.median_us > 0.0 {
        j.change = Some(a.median_us / b.median_us - 1.0);
    }
    // Tested on blocks of consecutive steps (see `noise`).
    let (bb, ab) = (noise::block_medians(before), noise::block_medians(after));
    j.noise_us = Some(noise::band(&bb, &ab, settings.alpha));
    if let Some((s, lo, hi)) = noise::shift(&bb, &ab, settings.alpha) {
        j.shift_us = Some(s);
        j.shift_ci_us = Some([lo, hi]);
    }
    if b.steps >= settings.min_steps && a.steps >= settings.min_steps {
        j.p_value = Some(noise::mann_whitney(&bb, &ab));
        j.verdict = Verdict::NoChange;
    }
    j
}

/// Sets the verdicts of those tested (with a p-value): Holm's correction over them, then the
/// minimum change and the noise.
fn decide<'a>(all: impl Iterator<Item = &'a mut Judged>, settings: &Settings) {
    let mut tested: Vec<&mut Judged> = all.filter(|j| j.p_value.is_some()).collect();
    let p: Vec<f64> = tested.iter().map(|j| j.p_value.unwrap_or(1.0)).collect();
    let significant = noise::holm(&p, settings.alpha);
    for (j, sig) in tested.iter_mut().zip(significant) {
        let base = j.before.map_or(0.0, |b| b.median_us);
        let shift = j.shift_us.unwrap_or(0.0);
        let big = base > 0.0
            && (shift / base).abs() >= settings.min_change
            && shift.abs() > j.noise_us.unwrap_or(0.0);
        j.verdict = match (sig && big, shift > 0.0) {
            (true, true) => Verdict::Slower,
            (true, false) => Verdict::Faster,
            (false, _) => Verdict::NoChange,
        };
    }
}

fn gpu_side<'a>(captures: impl Iterator<Item = &'a Capture>) -> GpuSide {
    let mut g = GpuSide::default();
    let (mut busy, mut capacity) = (0.0, 0.0);
    for c in captures {
        let s = &c.summary;
        g.steps += s.steps.len();
        g.devices += s.gpu_devices;
        busy += s.gpu_busy_us;
        capacity += s.span_us * s.gpu_devices as f64;
        g.computation_us_per_step += s.split.computation_us;
        g.communication_us_per_step += s.split.communication_us;
        g.memory_us_per_step += s.split.memory_us;
        for gap in &s.idle_gaps {
            g.largest_gap_us = g.largest_gap_us.max(gap.dur_us);
        }
    }
    let n = g.steps.max(1) as f64;
    g.busy_us_per_step = busy / n;
    g.computation_us_per_step /= n;
    g.communication_us_per_step /= n;
    g.memory_us_per_step /= n;
    g.utilization = if capacity > 0.0 { busy / capacity } else { 0.0 };
    g
}

/// Step times and name totals per group, of one side.
#[derive(Default)]
struct SideGroups<'a> {
    times: BTreeMap<GroupKey, Vec<f64>>,
    names: HashMap<GroupKey, Totals>,
    /// The steps' explanations summed, per group.
    gpu: HashMap<GroupKey, GpuTime>,
    /// The steps, per group (for their floors).
    steps: HashMap<GroupKey, Vec<&'a Step>>,
}

fn side_groups(captures: &[Capture]) -> SideGroups<'_> {
    let mut out = SideGroups::default();
    for c in captures {
        for (i, step) in c.summary.steps.iter().enumerate() {
            let key = GroupKey::of(&step.name);
            out.times.entry(key).or_default().push(step.dur_us);
            out.steps.entry(key).or_default().push(step);
            if let Some(g) = &step.gpu {
                out.gpu.entry(key).or_default().add(g);
            }
            let Some(b) = &c.breakdown else { continue };
            let totals = out.names.entry(key).or_default();
            for n in b.steps.get(i).into_iter().flatten() {
                let t = totals
                    .entry((n.category, b.name(n.name).to_string()))
                    .or_default();
                t.0 += u64::from(n.count);
                t.1 += n.us;
            }
        }
    }
    out
}

fn side_info(input: &str, captures: &[Capture]) -> SideInfo {
    let mut ranks: Vec<i64> = captures.iter().filter_map(|c| c.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    SideInfo {
        input: input.to_string(),
        captures: captures.len(),
        from_manifests: captures.iter().filter(|c| c.breakdown.is_none()).count(),
        steps: captures.iter().map(|c| c.summary.steps.len()).sum(),
        ranks,
    }
}

/// Compares `before` with `after`. `top`: name rows kept per group (0: all).
pub fn compare(
    (before_input, before): (&str, &[Capture]),
    (after_input, after): (&str, &[Capture]),
    settings: Settings,
    top: usize,
) -> DiffReport {
    let b = side_groups(before);
    let a = side_groups(after);
    let names_compared = before.iter().chain(after).all(|c| c.breakdown.is_some());
    let mut keys: Vec<GroupKey> = b.times.keys().chain(a.times.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let empty = Vec::new();
    let empty_totals = Totals::new();
    let mut groups = Vec::new();
    for key in keys {
        let bt = b.times.get(&key).unwrap_or(&empty);
        let at = a.times.get(&key).unwrap_or(&empty);
        let j = judge(bt, at, &settings);
        let mut rows = if names_compared {
            names::rows(
                b.names.get(&key).unwrap_or(&empty_totals),
                bt.len(),
                a.names.get(&key).unwrap_or(&empty_totals),
                at.len(),
                settings.normalize_names,
            )
        } else {
            Vec::new()
        };
        if top > 0 {
            rows.truncate(top);
        }
        let gpu = match (b.gpu.get(&key), a.gpu.get(&key)) {
            (Some(x), Some(y)) => Some(why::change(x.per(bt.len()), y.per(at.len()))),
            _ => None,
        };
        let floor_of = |side: &SideGroups<'_>| {
            side.steps
                .get(&key)
                .and_then(|s| GroupFloor::of(s.iter().copied()))
        };
        let floor = floor_of(&b).zip(floor_of(&a)).map(|(x, y)| [x, y]);
        groups.push(GroupDiff {
            group: key.label(),
            key,
            judged: j,
            names_compared,
            names: rows,
            gpu,
            floor,
        });
    }
    decide(groups.iter_mut().map(|g| &mut g.judged), &settings);
    groups.sort_by(|x, y| {
        let weight = |g: &GroupDiff| {
            let steps = g.judged.after.or(g.judged.before).map_or(0, |s| s.steps) as f64;
            (g.judged.shift_us.unwrap_or(0.0) * steps).abs()
        };
        let class = |g: &GroupDiff| match g.judged.verdict {
            Verdict::Slower | Verdict::Faster => 0,
            Verdict::NoChange => 1,
            _ => 2,
        };
        class(x)
            .cmp(&class(y))
            .then(weight(y).total_cmp(&weight(x)))
            .then(x.key.cmp(&y.key))
    });

    let gpu = {
        let gb = gpu_side(before.iter());
        let ga = gpu_side(after.iter());
        (gb.devices + ga.devices > 0).then_some([gb, ga])
    };

    let before_info = side_info(before_input, before);
    let after_info = side_info(after_input, after);
    let mut ranks = Vec::new();
    for &rank in before_info
        .ranks
        .iter()
        .filter(|r| after_info.ranks.contains(r))
    {
        let of = |side: &[Capture]| -> Vec<f64> {
            side.iter()
                .filter(|c| c.rank == Some(rank))
                .flat_map(|c| c.summary.steps.iter().map(|s| s.dur_us))
                .collect()
        };
        ranks.push(RankDiff {
            rank,
            judged: judge(&of(before), &of(after), &settings),
            gpu_before: gpu_side(before.iter().filter(|c| c.rank == Some(rank))),
            gpu_after: gpu_side(after.iter().filter(|c| c.rank == Some(rank))),
        });
    }
    decide(ranks.iter_mut().map(|r| &mut r.judged), &settings);
    DiffReport {
        before: before_info,
        after: after_info,
        settings,
        groups,
        gpu,
        ranks,
    }
}
