//! `stepscope analyze`: what a trace's GPU did, per kernel, per iteration, per rank.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::trace::{self, DeviceProperties, Event, Id, TraceError};

/// Per kernel name.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelStat {
    /// Kernel name.
    pub name: String,
    /// Launches.
    pub count: u64,
    /// Summed duration, µs.
    pub total_us: f64,
    /// Mean duration, µs.
    pub mean_us: f64,
    /// Longest launch, µs.
    pub max_us: f64,
    /// `computation`, `communication` or `memory`, as HTA classifies kernels.
    pub kind: &'static str,
}

/// All kernels of a trace.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Kernels {
    /// Kernel launches (`cat: kernel`).
    pub count: u64,
    /// Their summed duration, µs.
    pub total_us: f64,
    /// Per name, by total time, longest first (the top N with `--top`).
    pub by_name: Vec<KernelStat>,
}

/// GPU time by kind, over kernels, memcpys and memsets.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Split {
    /// Compute kernels, µs.
    pub computation_us: f64,
    /// Collectives (NCCL, gloo), µs.
    pub communication_us: f64,
    /// Memcpy and memset, µs.
    pub memory_us: f64,
}

/// An interval with no GPU activity on a device.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Gap {
    /// The device.
    pub device: i64,
    /// Start, µs from the trace's start.
    pub start_us: f64,
    /// Length, µs.
    pub dur_us: f64,
    /// The innermost CPU operator running when the gap began, if any.
    pub cpu_op: Option<String>,
}

/// One engine iteration.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Step {
    /// `ProfilerStep#N` or the iteration's `execute_…` annotation.
    pub name: String,
    /// The engine's step index, when stepscope annotated the iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The ids of the requests the iteration served (stepscope's `request_ids`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// Start, µs from the trace's start.
    pub start_us: f64,
    /// Wall time, µs.
    pub dur_us: f64,
    /// GPU time of the kernels launched during the step (by correlation id), µs.
    pub kernel_us: f64,
    /// Kernels launched during the step.
    pub kernel_count: u64,
}

/// The analysis of one trace.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceReport {
    /// The file.
    pub file: String,
    /// `distributedInfo.rank`, else from the file name.
    pub rank: Option<i64>,
    /// `distributedInfo.world_size`.
    pub world_size: Option<i64>,
    /// `deviceProperties`.
    pub devices: Vec<DeviceProperties>,
    /// Events read.
    pub events: u64,
    /// Kernels.
    pub kernels: Kernels,
    /// GPU time by kind.
    pub split: Split,
    /// Memcpy events.
    pub memcpy_count: u64,
    /// Memset events.
    pub memset_count: u64,
    /// Union of kernel, memcpy and memset intervals, per device, summed over devices, µs.
    pub gpu_busy_us: f64,
    /// Devices with GPU activity.
    pub gpu_devices: u64,
    /// First event start to last event end, µs.
    pub span_us: f64,
    /// `gpu_busy_us / (span_us × gpu_devices)`.
    pub utilization: f64,
    /// The longest idle gaps, longest first.
    pub idle_gaps: Vec<Gap>,
    /// The iterations found.
    pub steps: Vec<Step>,
    /// What started the capture, from stepscope's header (e.g. `{"slow_step": …}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<serde_json::Value>,
}

/// HTA's classification of a GPU event by name.
pub fn kind_of(name: &str) -> &'static str {
    if name.starts_with("nccl") || name.contains("gloo:") {
        "communication"
    } else if name.contains("Memcpy") || name.contains("Memset") {
        "memory"
    } else {
        "computation"
    }
}

#[derive(Default)]
struct Acc {
    count: u64,
    total: f64,
    max: f64,
}

/// An annotation or CPU op; its name borrows from the trace buffer.
struct Annot<'a> {
    name: Cow<'a, str>,
    ts: f64,
    end: f64,
    /// The step index stepscope gave an iteration annotation, and its requests, if any.
    step: Option<u64>,
    requests: Vec<String>,
}

/// Reads and analyzes one trace. `top`: kernel names kept (0: all).
pub fn analyze_file(path: &Path, top: usize) -> Result<TraceReport, TraceError> {
    let bytes = trace::read(path)?;
    analyze_bytes(path, &bytes, top)
}

/// Analyzes a trace already in memory.
pub fn analyze_bytes(path: &Path, bytes: &[u8], top: usize) -> Result<TraceReport, TraceError> {
    let mut events = 0u64;
    let mut kernels: HashMap<String, Acc> = HashMap::new();
    let mut kernel_count = 0u64;
    let mut kernel_total = 0.0;
    let mut split = Split::default();
    let (mut memcpy_count, mut memset_count) = (0u64, 0u64);
    let mut intervals: HashMap<i64, Vec<(f64, f64)>> = HashMap::new();
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut launches: HashMap<u64, f64> = HashMap::new();
    // (correlation, dur) of each kernel, for step attribution.
    let mut kernel_corr: Vec<(u64, f64)> = Vec::new();
    let mut cpu_ops: Vec<Annot<'_>> = Vec::new();
    let mut profiler_steps: Vec<Annot<'_>> = Vec::new();
    let mut execute_steps: Vec<Annot<'_>> = Vec::new();

    let meta = trace::for_each_event(path, bytes, |e: Event<'_>| {
        events += 1;
        let Some(ts) = e.ts else { return };
        let dur = e.dur.unwrap_or(0.0);
        if e.ph.as_deref() != Some("M") {
            first = first.min(ts);
            last = last.max(ts + dur);
        }
        if e.ph.as_deref() != Some("X") {
            return;
        }
        let cat = e.cat.as_deref().unwrap_or("");
        let name_cow = e.name.clone().unwrap_or(Cow::Borrowed(""));
        let name = name_cow.as_ref();
        match cat {
            "kernel" | "gpu_memcpy" | "gpu_memset" => {
                let args = e.args();
                let device = args
                    .device
                    .map(|d| d as i64)
                    .or(match e.pid {
                        Some(Id::Num(p)) => Some(p),
                        _ => None,
                    })
                    .unwrap_or(-1);
                intervals.entry(device).or_default().push((ts, ts + dur));
                let kind = match cat {
                    "gpu_memcpy" | "gpu_memset" => "memory",
                    _ => kind_of(name),
                };
                match kind {
                    "communication" => split.communication_us += dur,
                    "memory" => split.memory_us += dur,
                    _ => split.computation_us += dur,
                }
                match cat {
                    "gpu_memcpy" => memcpy_count += 1,
                    "gpu_memset" => memset_count += 1,
                    _ => {
                        kernel_count += 1;
                        kernel_total += dur;
                        let acc = match kernels.get_mut(name) {
                            Some(a) => a,
                            None => kernels.entry(name.to_string()).or_default(),
                        };
                        acc.count += 1;
                        acc.total += dur;
                        acc.max = acc.max.max(dur);
                        if let Some(c) = args.correlation {
                            kernel_corr.push((c, dur));
                        }
                    }
                }
            }
            "cuda_runtime" | "cuda_driver" => {
                if let Some(c) = e.args().correlation {
                    launches.insert(c, ts);
                }
            }
            "cpu_op" => cpu_ops.push(Annot {
                name: name_cow.clone(),
                ts,
                end: ts + dur,
                step: None,
                requests: Vec::new(),
            }),
            _ => {}
        }
        if name.starts_with("ProfilerStep#") {
            profiler_steps.push(Annot {
                name: name_cow.clone(),
                ts,
                end: ts + dur,
                step: None,
                requests: Vec::new(),
            });
        } else if name.starts_with("execute_") && !matches!(cat, "kernel" | "gpu_user_annotation") {
            let args = e.args();
            execute_steps.push(Annot {
                name: name_cow.clone(),
                ts,
                end: ts + dur,
                step: args.record_function_id.filter(|id| *id > 0),
                requests: args.requests.unwrap_or_default(),
            });
        }
    })?;

    if first > last {
        first = 0.0;
        last = 0.0;
    }
    let span = last - first;

    // GPU busy time: the union of intervals per device; the gaps between them.
    let mut busy = 0.0;
    let mut gaps: Vec<(i64, f64, f64)> = Vec::new();
    let mut devices_seen: Vec<i64> = intervals.keys().copied().collect();
    devices_seen.sort_unstable();
    for dev in &devices_seen {
        let iv = intervals
            .get_mut(dev)
            .map(std::mem::take)
            .unwrap_or_default();
        let mut iv = iv;
        iv.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cur: Option<(f64, f64)> = None;
        for (s, e) in iv {
            match cur {
                Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    busy += ce - cs;
                    gaps.push((*dev, ce, s - ce));
                    cur = Some((s, e));
                }
                None => cur = Some((s, e)),
            }
        }
        if let Some((cs, ce)) = cur {
            busy += ce - cs;
        }
    }
    gaps.sort_by(|a, b| b.2.total_cmp(&a.2));
    gaps.truncate(5);
    let idle_gaps = gaps
        .into_iter()
        .map(|(device, start, dur)| Gap {
            device,
            start_us: start - first,
            dur_us: dur,
            cpu_op: cpu_ops
                .iter()
                .filter(|o| o.ts <= start && start < o.end)
                .max_by(|a, b| a.ts.total_cmp(&b.ts))
                .map(|o| o.name.to_string()),
        })
        .collect();

    // Steps: the engine's iteration annotations when present, else torch's ProfilerStep#.
    let mut step_annots = if execute_steps.is_empty() {
        profiler_steps
    } else {
        execute_steps
    };
    step_annots.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    // Requests from the header, for annotations whose args lack them (Kineto writes an
    // annotation's requests only when the capture records shapes).
    let header_requests: HashMap<u64, &Vec<String>> = meta
        .stepscope
        .steps
        .iter()
        .map(|s| (s.step, &s.requests))
        .collect();
    let mut steps: Vec<Step> = step_annots
        .iter()
        .map(|a| Step {
            name: a.name.to_string(),
            step: a.step,
            requests: match (a.requests.is_empty(), a.step) {
                (true, Some(i)) => header_requests
                    .get(&i)
                    .map(|r| r.to_vec())
                    .unwrap_or_default(),
                _ => a.requests.clone(),
            },
            start_us: a.ts - first,
            dur_us: a.end - a.ts,
            kernel_us: 0.0,
            kernel_count: 0,
        })
        .collect();
    if !steps.is_empty() {
        for (corr, dur) in &kernel_corr {
            let Some(&launch) = launches.get(corr) else {
                continue;
            };
            // The last step starting at or before the launch, if the launch is inside it.
            let i = step_annots.partition_point(|a| a.ts <= launch);
            if i > 0 && launch <= step_annots[i - 1].end {
                steps[i - 1].kernel_us += dur;
                steps[i - 1].kernel_count += 1;
            }
        }
    }

    let mut by_name: Vec<KernelStat> = kernels
        .into_iter()
        .map(|(name, a)| KernelStat {
            kind: kind_of(&name),
            mean_us: if a.count > 0 {
                a.total / a.count as f64
            } else {
                0.0
            },
            name,
            count: a.count,
            total_us: a.total,
            max_us: a.max,
        })
        .collect();
    by_name.sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.name.cmp(&b.name)));
    if top > 0 {
        by_name.truncate(top);
    }
    let gpu_devices = devices_seen.len() as u64;
    Ok(TraceReport {
        file: path.display().to_string(),
        rank: meta.rank.or_else(|| trace::rank_from_name(path)),
        world_size: meta.world_size,
        devices: meta.devices,
        events,
        kernels: Kernels {
            count: kernel_count,
            total_us: kernel_total,
            by_name,
        },
        split,
        memcpy_count,
        memset_count,
        gpu_busy_us: busy,
        gpu_devices,
        span_us: span,
        utilization: if span > 0.0 && gpu_devices > 0 {
            busy / (span * gpu_devices as f64)
        } else {
            0.0
        },
        idle_gaps,
        steps,
        trigger: meta.stepscope.trigger,
    })
}

/// Analyzes files in parallel (one thread per core); results in the files' order.
pub fn analyze_all(files: &[PathBuf], top: usize) -> Vec<Result<TraceReport, TraceError>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    crate::par_map(files, threads, |f| analyze_file(f, top))
        .into_iter()
        .zip(files)
        .map(|(r, f)| {
            r.unwrap_or_else(|| {
                Err(TraceError {
                    path: f.clone(),
                    message: "internal error: not analyzed".into(),
                })
            })
        })
        .collect()
}

/// Median of a rank's step durations.
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// A rank's line in the cross-rank table.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RankRow {
    /// The rank.
    pub rank: Option<i64>,
    /// The file.
    pub file: String,
    /// Steps found.
    pub steps: usize,
    /// Median step wall time, µs.
    pub median_step_us: Option<f64>,
    /// GPU busy time, µs.
    pub gpu_busy_us: f64,
    /// Utilization.
    pub utilization: f64,
    /// Median step time at least 1.2× the median over ranks.
    pub straggler: bool,
}

/// Per-rank rows with stragglers: ranks whose median step time is 20% or more above the median
/// of all ranks' medians.
pub fn ranks(reports: &[TraceReport]) -> Vec<RankRow> {
    let medians: Vec<Option<f64>> = reports
        .iter()
        .map(|r| median(r.steps.iter().map(|s| s.dur_us).collect()))
        .collect();
    let overall = median(medians.iter().flatten().copied().collect());
    reports
        .iter()
        .zip(medians)
        .map(|(r, m)| RankRow {
            rank: r.rank,
            file: r.file.clone(),
            steps: r.steps.len(),
            median_step_us: m,
            gpu_busy_us: r.gpu_busy_us,
            utilization: r.utilization,
            straggler: match (m, overall) {
                (Some(m), Some(o)) if reports.len() > 1 && o > 0.0 => m >= 1.2 * o,
                _ => false,
            },
        })
        .collect()
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1000.0)
}

fn short(name: &str, n: usize) -> String {
    if name.chars().count() <= n {
        name.to_string()
    } else {
        let s: String = name.chars().take(n - 1).collect();
        format!("{s}…")
    }
}

/// Steps listed with their requests in the report.
const SLOWEST_STEPS: usize = 5;

/// The first `n` ids, then how many more.
fn id_list(ids: &[String], n: usize) -> String {
    let mut out = ids.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if ids.len() > n {
        out.push_str(&format!(", … (+{} more)", ids.len() - n));
    }
    out
}

/// The human-readable report of one trace.
pub fn render(r: &TraceReport) -> String {
    let mut o = String::new();
    let rank = r.rank.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
    o.push_str(&format!("== {}  (rank {rank}", r.file));
    if let Some(w) = r.world_size {
        o.push_str(&format!(" of {w}"));
    }
    o.push_str(")\n");
    for d in r.devices.iter().take(1) {
        o.push_str(&format!(
            "device: {} (sm_{}{}, {} SMs, {:.0} GiB) ×{}\n",
            d.name.as_deref().unwrap_or("?"),
            d.compute_major.unwrap_or(0),
            d.compute_minor.unwrap_or(0),
            d.num_sms.unwrap_or(0),
            d.total_global_mem.unwrap_or(0) as f64 / (1u64 << 30) as f64,
            r.devices.len()
        ));
    }
    let gpu_total = r.split.computation_us + r.split.communication_us + r.split.memory_us;
    let pct = |x: f64| {
        if gpu_total > 0.0 {
            100.0 * x / gpu_total
        } else {
            0.0
        }
    };
    o.push_str(&format!(
        "span {}   GPU busy {} on {} device(s)   utilization {:.1}%\n",
        ms(r.span_us),
        ms(r.gpu_busy_us),
        r.gpu_devices,
        100.0 * r.utilization
    ));
    o.push_str(&format!(
        "kernels {} ({})   memcpy {}   memset {}\n",
        r.kernels.count,
        ms(r.kernels.total_us),
        r.memcpy_count,
        r.memset_count
    ));
    o.push_str(&format!(
        "GPU time: computation {:.1}%  communication {:.1}%  memory {:.1}%\n",
        pct(r.split.computation_us),
        pct(r.split.communication_us),
        pct(r.split.memory_us)
    ));
    if !r.kernels.by_name.is_empty() {
        o.push_str("\n  total       count    mean      max   kind           kernel\n");
        for k in &r.kernels.by_name {
            o.push_str(&format!(
                "  {:>10}  {:>6}  {:>7.1}  {:>7.1}   {:<13}  {}\n",
                ms(k.total_us),
                k.count,
                k.mean_us,
                k.max_us,
                k.kind,
                short(&k.name, 90)
            ));
        }
    }
    if !r.steps.is_empty() {
        o.push_str("\n  step                                           start        wall   GPU kernels   count\n");
        for s in &r.steps {
            o.push_str(&format!(
                "  {:<44}  {:>10}  {:>10}  {:>12}  {:>6}\n",
                short(&s.name, 44),
                ms(s.start_us),
                ms(s.dur_us),
                ms(s.kernel_us),
                s.kernel_count
            ));
        }
    }
    if let Some(slow) = r.trigger.as_ref().and_then(|t| t.get("slow_step")) {
        let step = slow.get("step").and_then(|v| v.as_u64()).unwrap_or(0);
        let ns = slow
            .get("duration_ns")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        o.push_str(&format!(
            "\n  captured after slow step {step} ({})\n",
            ms(ns / 1e3)
        ));
    }
    if r.steps.iter().any(|s| !s.requests.is_empty()) {
        let mut slowest: Vec<&Step> = r.steps.iter().collect();
        slowest.sort_by(|a, b| b.dur_us.total_cmp(&a.dur_us));
        o.push_str("\n  slowest steps and the requests they served\n");
        for s in slowest.iter().take(SLOWEST_STEPS) {
            let step = s.step.map_or_else(|| "?".into(), |i| i.to_string());
            o.push_str(&format!(
                "  step {step:<8} {:>10}  {} request(s): {}\n",
                ms(s.dur_us),
                s.requests.len(),
                id_list(&s.requests, 8)
            ));
        }
    }
    if !r.idle_gaps.is_empty() {
        o.push_str("\n  largest GPU idle gaps (device, at, length, CPU op running)\n");
        for g in &r.idle_gaps {
            o.push_str(&format!(
                "  gpu {:<3} {:>10}  {:>10}  {}\n",
                g.device,
                ms(g.start_us),
                ms(g.dur_us),
                short(g.cpu_op.as_deref().unwrap_or("-"), 80)
            ));
        }
    }
    o
}

/// The cross-rank table.
pub fn render_ranks(rows: &[RankRow]) -> String {
    let mut o =
        String::from("\n== ranks\n  rank   steps   median step     GPU busy   util  file\n");
    for r in rows {
        o.push_str(&format!(
            "  {:>4}  {:>6}  {:>12}  {:>11}  {:>4.0}%  {}{}\n",
            r.rank.map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
            r.steps,
            r.median_step_us.map(ms).unwrap_or_else(|| "-".into()),
            ms(r.gpu_busy_us),
            100.0 * r.utilization,
            r.file,
            if r.straggler { "   <- straggler" } else { "" }
        ));
    }
    o
}
