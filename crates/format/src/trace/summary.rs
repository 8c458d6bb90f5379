//! What a trace's devices and CPU did, per kernel, per operator, per iteration: the summary a
//! worker writes into each capture's manifest and `stepscope analyze` prints.
//!
//! [`Summarizer`] is an [`EventSink`]: it sees each event once, as the stream parses it, and
//! keeps only what the summary needs — per-name accumulators (kernels, CPU operators), the
//! iteration annotations, and a compact record (16-24 bytes) of each device interval, launch
//! and CPU operator, from which [`Summarizer::finish`] computes busy time, idle gaps and the
//! per-iteration figures. Nothing borrows the trace's bytes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::event::{DeviceProperties, Event, Id, Meta};
use super::explain::{
    explain, launch_of, CallKind, DeviceOp, Explained, GpuTime, Inputs, KernelKind, Launch,
    LaunchStats, OpClass, StreamIdle, NO_CORRELATION, NO_NAME,
};
use super::floor::{peaks, Cost, Floor, PeakOverride, Peaks};
use super::header::{StepRequests, StepWork, Trigger};
use super::stream::EventSink;
use crate::model::ModelShape;

/// Per kernel name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
    /// What its time counts as.
    pub kind: KernelKind,
}

/// All kernels of a trace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Kernels {
    /// Kernel launches (`cat: kernel`, `mtia_ccp_events`).
    pub count: u64,
    /// Their summed duration, µs.
    pub total_us: f64,
    /// Per name, by total time, longest first (the top N).
    pub by_name: Vec<KernelStat>,
}

/// Per CPU operator name (`cat: cpu_op`), inclusive of the operators it calls.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OpStat {
    /// Operator name.
    pub name: String,
    /// Calls.
    pub count: u64,
    /// Summed duration, µs.
    pub total_us: f64,
    /// Mean duration, µs.
    pub mean_us: f64,
    /// Longest call, µs.
    pub max_us: f64,
}

/// Device time by kind, over kernels, memcpys and memsets.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Split {
    /// Compute kernels, µs.
    pub computation_us: f64,
    /// Collectives (NCCL, gloo), µs.
    pub communication_us: f64,
    /// Memcpy and memset, µs.
    pub memory_us: f64,
}

/// An interval with no device activity on a device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Step {
    /// `ProfilerStep#N` or the iteration's `execute_…` annotation.
    pub name: String,
    /// The engine's step index, when stepscope annotated the iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The ids of the requests the iteration served (stepscope's `request_ids`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// The tokens scheduled for each request, in the order of `requests`, when the engine
    /// gave them (from stepscope's header; else empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<u32>,
    /// Whether each request was in prefill, in the order of `requests`, when the engine gave
    /// it (else empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefill: Vec<bool>,
    /// Start, µs from the trace's start.
    pub start_us: f64,
    /// Wall time, µs.
    pub dur_us: f64,
    /// CPU operator time inside the step, per thread (outermost operators), summed, µs.
    #[serde(default)]
    pub cpu_op_us: f64,
    /// Device time of the kernels launched during the step (by correlation id), µs.
    pub kernel_us: f64,
    /// Kernels launched during the step.
    pub kernel_count: u64,
    /// Why the step took what it took on its GPUs (absent without device work or launches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuTime>,
    /// Its work per phase: from stepscope's header, else from a detailed annotation name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<StepWork>,
    /// How close it ran to its floor (see `floor.rs`), when its work, the model's shape and
    /// the device's peaks are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Floor>,
}

/// The summary of one trace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// `distributedInfo.rank`.
    pub rank: Option<i64>,
    /// `distributedInfo.world_size`.
    pub world_size: Option<i64>,
    /// `deviceProperties`.
    pub devices: Vec<DeviceProperties>,
    /// Events read.
    pub events: u64,
    /// Kernels.
    pub kernels: Kernels,
    /// Device time by kind.
    pub split: Split,
    /// Memcpy events.
    pub memcpy_count: u64,
    /// Memset events.
    pub memset_count: u64,
    /// Union of kernel, memcpy and memset intervals, per device, summed over devices, µs.
    pub gpu_busy_us: f64,
    /// Devices with activity.
    pub gpu_devices: u64,
    /// First event start to last event end, µs.
    pub span_us: f64,
    /// `gpu_busy_us / (span_us × gpu_devices)`.
    pub utilization: f64,
    /// The longest idle gaps, longest first.
    pub idle_gaps: Vec<Gap>,
    /// Why the trace's device time went where it did (see `explain.rs`).
    #[serde(default)]
    pub gpu: GpuTime,
    /// Per stream, idle time by Holistic Trace Analysis's rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<StreamIdle>,
    /// The iterations found.
    pub steps: Vec<Step>,
    /// CPU operators by total time, longest first (the top N).
    #[serde(default)]
    pub cpu_ops: Vec<OpStat>,
    /// What started the capture, from stepscope's header (`{"slow_step": …}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// The served model's shape, from stepscope's header (or `analyze --model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelShape>,
    /// The peaks the steps' floors were computed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peaks: Option<Peaks>,
    /// Why the steps have no floor, when they have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_missing: Option<String>,
}

impl Summary {
    /// Computes each step's floor (see `floor.rs`) from its work, the model's shape and the
    /// device's peaks (the table's, each overridden by `given`), or says in
    /// [`Summary::floor_missing`] which of them is missing.
    pub fn apply_floor(&mut self, given: PeakOverride) {
        for s in &mut self.steps {
            s.floor = None;
        }
        self.peaks = None;
        self.floor_missing = None;
        let with_work = self.steps.iter().filter(|s| s.work.is_some()).count();
        let no_work = "no step carries its work (the tokens and context lengths stepscope's \
                       plugins record, or vLLM's detailed_trace_annotation names)";
        let cost = match (&self.model, with_work) {
            (None, 0) => Err(format!(
                "{no_work}, and the trace has no model shape (give analyze --model config.json)"
            )),
            (_, 0) => Err(no_work.to_string()),
            (None, _) => {
                Err("the trace has no model shape (give analyze --model config.json)".to_string())
            }
            (Some(m), _) => Cost::of(m),
        };
        let device = self.devices.first().and_then(|d| d.name.as_deref());
        let floor = cost.and_then(|c| Ok((peaks(device, c.weight_bytes(), given)?, c)));
        match floor {
            Err(why) => self.floor_missing = Some(format!("no floor: {why}")),
            Ok((peaks, cost)) => {
                for s in &mut self.steps {
                    if let Some(w) = &s.work {
                        let busy = s.gpu.as_ref().map(|g| g.busy_us);
                        s.floor = Some(cost.floor(w, &peaks, s.dur_us, busy));
                    }
                }
                self.peaks = Some(peaks);
            }
        }
    }

    /// Keeps the `top` longest kernels and operators (0: all).
    pub fn keep_top(&mut self, top: usize) {
        if top > 0 {
            self.kernels.by_name.truncate(top);
            self.cpu_ops.truncate(top);
        }
    }
}

/// Idle gaps listed.
const GAPS: usize = 5;

#[derive(Default, Clone, Copy)]
struct Acc {
    count: u64,
    total: f64,
    max: f64,
}

impl Acc {
    fn add(&mut self, dur: f64) {
        self.count += 1;
        self.total += dur;
        self.max = self.max.max(dur);
    }

    fn mean(&self) -> f64 {
        if self.count > 0 {
            self.total / self.count as f64
        } else {
            0.0
        }
    }
}

/// An iteration annotation.
struct Annot {
    name: String,
    ts: f64,
    end: f64,
    /// The step index stepscope gave an iteration annotation, and its requests, if any.
    step: Option<u64>,
    requests: Vec<String>,
}

/// A CPU operator (or, with a breakdown, a user annotation: `name` has [`ANNOTATION`] set):
/// its interval, interned name and thread.
#[derive(Clone, Copy)]
struct CpuOp {
    ts: f64,
    end: f64,
    name: u32,
    thread: u32,
}

/// The bit of [`CpuOp::name`] that marks a user annotation (its name is in the annotations'
/// table): kept in the operators' list so self times are computed over both in one walk.
const ANNOTATION: u32 = 1 << 31;

impl CpuOp {
    fn is_annotation(&self) -> bool {
        self.name & ANNOTATION != 0
    }
}

/// A process and thread id, owned (numbers in Kineto's traces; strings elsewhere).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ThreadKey {
    Num(i64, i64),
    Other(String),
}

/// Interned strings: each distinct name is stored once.
#[derive(Default)]
struct Names {
    ids: HashMap<Box<str>, u32>,
    names: Vec<Box<str>>,
}

impl Names {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.into());
        self.ids.insert(name.into(), id);
        id
    }

    fn get(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", |n| n)
    }
}

/// The device categories, and what their events count as.
enum Device {
    Kernel,
    Memcpy,
    Memset,
}

fn device_category(cat: &str) -> Option<Device> {
    match cat {
        // MTIA's on-device events are Kineto's CONCURRENT_KERNEL under another name.
        "kernel" | "mtia_ccp_events" => Some(Device::Kernel),
        "gpu_memcpy" => Some(Device::Memcpy),
        "gpu_memset" => Some(Device::Memset),
        _ => None,
    }
}

/// Host-side runtime calls whose correlation id links them to a device event.
fn is_launch_category(cat: &str) -> bool {
    matches!(cat, "cuda_runtime" | "cuda_driver" | "mtia_runtime")
}

/// The summarizing sink; see the module docs.
#[derive(Default)]
pub struct Summarizer {
    events: u64,
    /// The whole µs every time is kept relative to (the first event's), so that an f64 keeps
    /// a nanosecond trace's digits.
    base: Option<i64>,
    first: f64,
    last: f64,
    kernel_names: Names,
    kernels: Vec<Acc>,
    kernel_count: u64,
    kernel_total: f64,
    /// Memcpy and memset time: the kernels' kinds come from their names, in `finish`.
    copy_us: f64,
    memcpy_count: u64,
    memset_count: u64,
    /// Every kernel, memcpy and memset (40 bytes each).
    device_ops: Vec<DeviceOp>,
    /// Each runtime call with a correlation id (24 bytes each).
    launches: Vec<Launch>,
    /// The (device, stream) lanes of `device_ops`, interned.
    lanes: HashMap<(i64, i64), u32>,
    lane_list: Vec<(i64, i64)>,
    op_names: Names,
    ops: Vec<Acc>,
    cpu_ops: Vec<CpuOp>,
    threads: HashMap<ThreadKey, u32>,
    profiler_steps: Vec<Annot>,
    execute_steps: Vec<Annot>,
    /// Whether [`Summarizer::finish_with_breakdown`] will be asked for: user annotations are
    /// then kept too.
    breakdown: bool,
    annotation_names: Names,
}

impl Summarizer {
    /// An empty summary.
    pub fn new() -> Self {
        Summarizer {
            first: f64::INFINITY,
            last: f64::NEG_INFINITY,
            ..Default::default()
        }
    }

    /// An empty summary that also keeps what each step ran, per name
    /// ([`Summarizer::finish_with_breakdown`]): user annotations (`record_function` ranges)
    /// are kept beside the CPU operators.
    pub fn with_breakdown() -> Self {
        Summarizer {
            breakdown: true,
            ..Self::new()
        }
    }

    /// An event's start, µs after [`Summarizer::base`].
    fn time(&mut self, e: &Event<'_>) -> Option<f64> {
        let (whole, frac) = match e.ts_split {
            Some(split) => split,
            None => {
                let ts = e.ts?;
                (ts.floor() as i64, ts - ts.floor())
            }
        };
        let base = *self.base.get_or_insert(whole);
        Some(whole.wrapping_sub(base) as f64 + frac)
    }

    fn thread(&mut self, e: &Event<'_>) -> u32 {
        let key = match (&e.pid, &e.tid) {
            (Some(Id::Num(p)), Some(Id::Num(t))) => ThreadKey::Num(*p, *t),
            (None, Some(Id::Num(t))) => ThreadKey::Num(i64::MIN, *t),
            (p, t) => ThreadKey::Other(format!("{p:?}/{t:?}")),
        };
        let n = self.threads.len() as u32;
        *self.threads.entry(key).or_insert(n)
    }

    /// Keeps a CPU operator's (or annotation's) interval on its thread.
    fn push_cpu_range(&mut self, e: &Event<'_>, ts: f64, dur: f64, name: u32) {
        let thread = self.thread(e);
        self.cpu_ops.push(CpuOp {
            ts,
            end: ts + dur,
            name,
            thread,
        });
    }

    fn device_event(&mut self, e: &Event<'_>, device: Device, name: &str, ts: f64, dur: f64) {
        let args = e.args();
        let num = |id: &Option<Id<'_>>| match id {
            Some(Id::Num(n)) => Some(*n),
            _ => None,
        };
        let dev = args.device.map(|d| d as i64).or(num(&e.pid)).unwrap_or(-1);
        let stream = args.stream.map(|s| s as i64).or(num(&e.tid)).unwrap_or(-1);
        let next = self.lane_list.len() as u32;
        let lane = *self.lanes.entry((dev, stream)).or_insert(next);
        if lane == next {
            self.lane_list.push((dev, stream));
        }
        let (class, name) = match device {
            Device::Memcpy => {
                self.memcpy_count += 1;
                self.copy_us += dur;
                (OpClass::of_memcpy(name), NO_NAME)
            }
            Device::Memset => {
                self.memset_count += 1;
                self.copy_us += dur;
                (OpClass::Memset, NO_NAME)
            }
            Device::Kernel => {
                self.kernel_count += 1;
                self.kernel_total += dur;
                let id = self.kernel_names.intern(name);
                if self.kernels.len() <= id as usize {
                    self.kernels.resize(id as usize + 1, Acc::default());
                }
                self.kernels[id as usize].add(dur);
                (OpClass::of_kernel(name), id)
            }
        };
        self.device_ops.push(DeviceOp {
            ts,
            end: ts + dur,
            corr: args.correlation.unwrap_or(NO_CORRELATION),
            name,
            lane,
            class,
        });
    }

    /// Computes the summary. `top`: kernel and operator names kept (0: all).
    pub fn finish(self, meta: Meta, top: usize) -> Summary {
        self.finish_inner(meta, top, None)
    }

    /// Computes the summary and what each of its steps ran, per name (see [`Breakdown`]).
    /// Without [`Summarizer::with_breakdown`], user annotations are missing from it.
    pub fn finish_with_breakdown(self, meta: Meta, top: usize) -> (Summary, Breakdown) {
        let mut breakdown = Breakdown::default();
        let summary = self.finish_inner(meta, top, Some(&mut breakdown));
        (summary, breakdown)
    }

    fn finish_inner(
        mut self,
        meta: Meta,
        top: usize,
        breakdown: Option<&mut Breakdown>,
    ) -> Summary {
        let (first, span) = if self.first > self.last {
            (0.0, 0.0)
        } else {
            (self.first, self.last - self.first)
        };
        // Sorted by correlation, file order kept among equals: the last launch of an id wins.
        self.launches.sort_by_key(|l| l.corr);
        let (steps, explained) = self.steps(&meta, first, breakdown);
        let busy = explained.trace.busy_us;
        let devices = explained.devices;
        let gaps = self.gaps(explained.gaps, first);
        let mut kernels: Vec<KernelStat> = self
            .kernels
            .iter()
            .enumerate()
            .map(|(id, a)| {
                let name = self.kernel_names.get(id as u32);
                KernelStat {
                    kind: KernelKind::of(name),
                    mean_us: a.mean(),
                    name: name.to_string(),
                    count: a.count,
                    total_us: a.total,
                    max_us: a.max,
                }
            })
            .collect();
        kernels.sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.name.cmp(&b.name)));
        let mut split = Split {
            memory_us: self.copy_us,
            ..Split::default()
        };
        for k in &kernels {
            *match k.kind {
                KernelKind::Computation => &mut split.computation_us,
                KernelKind::Communication => &mut split.communication_us,
                KernelKind::Memory => &mut split.memory_us,
            } += k.total_us;
        }
        let mut cpu_ops: Vec<OpStat> = self
            .ops
            .iter()
            .enumerate()
            .map(|(id, a)| OpStat {
                name: self.op_names.get(id as u32).to_string(),
                count: a.count,
                total_us: a.total,
                mean_us: a.mean(),
                max_us: a.max,
            })
            .collect();
        cpu_ops.sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.name.cmp(&b.name)));
        let mut summary = Summary {
            rank: meta.rank,
            world_size: meta.world_size,
            devices: meta.devices,
            events: self.events,
            kernels: Kernels {
                count: self.kernel_count,
                total_us: self.kernel_total,
                by_name: kernels,
            },
            split,
            memcpy_count: self.memcpy_count,
            memset_count: self.memset_count,
            gpu_busy_us: busy,
            gpu_devices: devices,
            span_us: span,
            utilization: if span > 0.0 && devices > 0 {
                busy / (span * devices as f64)
            } else {
                0.0
            },
            idle_gaps: gaps,
            gpu: explained.trace,
            streams: explained.streams,
            steps,
            cpu_ops,
            trigger: meta.stepscope.trigger,
            model: meta.stepscope.model,
            peaks: None,
            floor_missing: None,
        };
        summary.apply_floor(PeakOverride::default());
        summary.keep_top(top);
        summary
    }

    /// The longest gaps (device, start, length) with the CPU operator running as each began.
    fn gaps(&self, gaps: Vec<(i64, f64, f64)>, first: f64) -> Vec<Gap> {
        let gaps = gaps
            .into_iter()
            .map(|(device, start, dur)| Gap {
                device,
                start_us: start - first,
                dur_us: dur,
                cpu_op: self
                    .cpu_ops
                    .iter()
                    .filter(|o| !o.is_annotation() && o.ts <= start && start < o.end)
                    .max_by(|a, b| a.ts.total_cmp(&b.ts))
                    .map(|o| self.op_names.get(o.name).to_string()),
            })
            .collect();
        gaps
    }

    /// The iterations: the engine's annotations when present, else torch's `ProfilerStep#`,
    /// with the kernels they launched, their CPU operator time and their explanation (with
    /// the trace's own).
    fn steps(
        &mut self,
        meta: &Meta,
        first: f64,
        breakdown: Option<&mut Breakdown>,
    ) -> (Vec<Step>, Explained) {
        let mut annots = if self.execute_steps.is_empty() {
            std::mem::take(&mut self.profiler_steps)
        } else {
            std::mem::take(&mut self.execute_steps)
        };
        annots.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        // Requests from the header, for annotations whose args lack them (Kineto writes an
        // annotation's requests only when the capture records shapes).
        // Each request's tokens and phase are in the header only.
        let header: HashMap<u64, &StepRequests> =
            meta.stepscope.steps.iter().map(|s| (s.step, s)).collect();
        let mut steps: Vec<Step> = annots
            .iter_mut()
            .map(|a| {
                let listed = a.step.and_then(|i| header.get(&i));
                let requests = match (a.requests.is_empty(), listed) {
                    (true, Some(s)) => s.requests.clone(),
                    _ => std::mem::take(&mut a.requests),
                };
                // Shares apply only to the ids they were given with.
                let (tokens, prefill) = match listed {
                    Some(s)
                        if s.requests == requests
                            && s.tokens.len() == requests.len()
                            && s.prefill.len() == requests.len() =>
                    {
                        (s.tokens.clone(), s.prefill.clone())
                    }
                    _ => (Vec::new(), Vec::new()),
                };
                let work = listed
                    .and_then(|s| s.work)
                    .or_else(|| StepWork::from_annotation(&a.name));
                Step {
                    work,
                    floor: None,
                    name: std::mem::take(&mut a.name),
                    step: a.step,
                    requests,
                    tokens,
                    prefill,
                    start_us: a.ts - first,
                    dur_us: a.end - a.ts,
                    cpu_op_us: 0.0,
                    kernel_us: 0.0,
                    kernel_count: 0,
                    gpu: None,
                }
            })
            .collect();
        // The step an instant falls in: the last starting at or before it, if it has not ended.
        let step_at = |t: f64| {
            let i = annots.partition_point(|a| a.ts <= t);
            (i > 0 && t <= annots[i - 1].end).then(|| i - 1)
        };
        let explained = explain(Inputs {
            ops: &mut self.device_ops,
            launches: &self.launches,
            lanes: &self.lane_list,
            step_at: &step_at,
            steps: steps.len(),
            gaps: GAPS,
        });
        for (step, gpu) in steps.iter_mut().zip(&explained.steps) {
            step.gpu =
                (gpu.timeline_us() > 0.0 || gpu.launches != LaunchStats::default()).then_some(*gpu);
        }
        if steps.is_empty() {
            return (steps, explained);
        }
        // Per (step, name id in the breakdown's table): count and time.
        let mut per_step: HashMap<(u32, u32), (u32, f64)> = HashMap::new();
        let op_base = self.kernel_names.names.len() as u32;
        let annotation_base = op_base + self.op_names.names.len() as u32;
        let keep = breakdown.is_some();
        for op in self.device_ops.iter().filter(|o| o.name != NO_NAME) {
            let Some(launch) = launch_of(&self.launches, op.corr) else {
                continue;
            };
            if let Some(i) = step_at(launch.ts) {
                let dur = op.end - op.ts;
                steps[i].kernel_us += dur;
                steps[i].kernel_count += 1;
                if keep {
                    let e = per_step.entry((i as u32, op.name)).or_default();
                    e.0 += 1;
                    e.1 += dur;
                }
            }
        }
        // Outermost operators per thread: sorted by start (longest first), an operator inside
        // the one before it is nested.
        self.cpu_ops.sort_by(|a, b| {
            a.thread
                .cmp(&b.thread)
                .then(a.ts.total_cmp(&b.ts))
                .then(b.end.total_cmp(&a.end))
        });
        let mut covered: Option<(u32, f64)> = None;
        for op in self.cpu_ops.iter().filter(|o| !o.is_annotation()) {
            if let Some((thread, end)) = covered {
                if thread == op.thread && op.ts < end {
                    continue;
                }
            }
            covered = Some((op.thread, op.end));
            if let Some(i) = step_at(op.ts) {
                steps[i].cpu_op_us += op.end.min(annots[i].end) - op.ts;
            }
        }
        if let Some(breakdown) = breakdown {
            // Self times: the operators and annotations are sorted by thread, then start,
            // longest first, so each one's enclosing ranges are on the stack.
            let mut stack: Vec<(f64, usize)> = Vec::new();
            let mut own: Vec<f64> = self.cpu_ops.iter().map(|o| o.end - o.ts).collect();
            for (i, op) in self.cpu_ops.iter().enumerate() {
                if i > 0 && self.cpu_ops[i - 1].thread != op.thread {
                    stack.clear();
                }
                while stack.last().is_some_and(|&(end, _)| end <= op.ts) {
                    stack.pop();
                }
                if let Some(&(end, parent)) = stack.last() {
                    own[parent] -= op.end.min(end) - op.ts;
                }
                stack.push((op.end, i));
            }
            for (op, own) in self.cpu_ops.iter().zip(own) {
                let Some(i) = step_at(op.ts) else { continue };
                let name = if op.is_annotation() {
                    annotation_base + (op.name & !ANNOTATION)
                } else {
                    op_base + op.name
                };
                let e = per_step.entry((i as u32, name)).or_default();
                e.0 += 1;
                e.1 += own.max(0.0);
            }
            breakdown.names = (self.kernel_names.names.iter())
                .chain(&self.op_names.names)
                .chain(&self.annotation_names.names)
                .cloned()
                .collect();
            breakdown.steps = vec![Vec::new(); steps.len()];
            for ((step, name), (count, us)) in per_step {
                let category = if name < op_base {
                    NameCategory::Kernel
                } else if name < annotation_base {
                    NameCategory::CpuOp
                } else {
                    NameCategory::Annotation
                };
                if let Some(list) = breakdown.steps.get_mut(step as usize) {
                    list.push(NameTime {
                        name,
                        category,
                        count,
                        us,
                    });
                }
            }
            for list in &mut breakdown.steps {
                list.sort_by_key(|n| n.name);
            }
        }
        (steps, explained)
    }
}

/// What each step of a summary ran, per name: its kernels' device time, its CPU operators' and
/// user annotations' self time (their time less that of the operators and annotations they
/// enclose on their thread), each counted in the step its start falls in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakdown {
    /// The names [`NameTime::name`] indexes.
    pub names: Vec<Box<str>>,
    /// Per step of [`Summary::steps`], in its order: what it ran, by name id.
    pub steps: Vec<Vec<NameTime>>,
}

impl Breakdown {
    /// The name of an id.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", |n| n)
    }
}

/// What a [`Breakdown`]'s name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NameCategory {
    /// A GPU kernel (`cat: kernel`), timed on the device.
    Kernel,
    /// A CPU operator (`cat: cpu_op`), self time.
    CpuOp,
    /// A user annotation (`record_function`, `cat: user_annotation`) other than the steps'
    /// own, self time.
    Annotation,
}

impl NameCategory {
    /// `kernel`, `cpu_op` or `annotation`.
    pub fn as_str(self) -> &'static str {
        match self {
            NameCategory::Kernel => "kernel",
            NameCategory::CpuOp => "cpu_op",
            NameCategory::Annotation => "annotation",
        }
    }
}

/// One name's part of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NameTime {
    /// Into [`Breakdown::names`].
    pub name: u32,
    /// What it is.
    pub category: NameCategory,
    /// Kernels launched or operator calls begun in the step.
    pub count: u32,
    /// Device time (kernels) or self time (operators, annotations), µs.
    pub us: f64,
}

impl EventSink for Summarizer {
    type Event<'de> = Event<'de>;

    fn event(&mut self, e: Event<'_>, _: &Meta) {
        self.events += 1;
        let Some(ts) = self.time(&e) else { return };
        let dur = e.dur.unwrap_or(0.0);
        let ph = e.ph.as_deref();
        if ph != Some("M") {
            self.first = self.first.min(ts);
            self.last = self.last.max(ts + dur);
        }
        if ph != Some("X") {
            return;
        }
        let cat = e.cat.as_deref().unwrap_or("");
        let name = e.name.as_deref().unwrap_or("");
        if let Some(device) = device_category(cat) {
            self.device_event(&e, device, name, ts, dur);
        } else if is_launch_category(cat) {
            if let Some(c) = e.args().correlation {
                self.launches.push(Launch {
                    corr: c,
                    ts,
                    dur: dur as f32,
                    kind: CallKind::of(name),
                });
            }
        } else if cat == "cpu_op" {
            let id = self.op_names.intern(name);
            if self.ops.len() <= id as usize {
                self.ops.resize(id as usize + 1, Acc::default());
            }
            self.ops[id as usize].add(dur);
            self.push_cpu_range(&e, ts, dur, id);
        }
        if self.breakdown
            && cat == "user_annotation"
            && !name.starts_with("ProfilerStep#")
            && !name.starts_with("execute_")
        {
            let id = self.annotation_names.intern(name) | ANNOTATION;
            self.push_cpu_range(&e, ts, dur, id);
        }
        if name.starts_with("ProfilerStep#") {
            self.profiler_steps.push(Annot {
                name: name.to_string(),
                ts,
                end: ts + dur,
                step: None,
                requests: Vec::new(),
            });
        } else if name.starts_with("execute_") && !matches!(cat, "kernel" | "gpu_user_annotation") {
            let args = e.args();
            self.execute_steps.push(Annot {
                name: name.to_string(),
                ts,
                end: ts + dur,
                step: args.record_function_id.filter(|id| *id > 0),
                requests: args.requests.unwrap_or_default(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::EventStream;

    fn summarize(json: &str) -> (Summary, Breakdown) {
        let mut sink = Summarizer::with_breakdown();
        let mut stream = EventStream::new();
        stream.feed(json.as_bytes(), &mut sink).unwrap();
        let meta = stream.finish(&mut sink).unwrap();
        sink.finish_with_breakdown(meta, 0)
    }

    #[test]
    fn a_breakdown_has_each_steps_kernels_and_self_times() {
        // Step 1 (0-100): an annotation "fwd" (0-60) enclosing aten::mm (10-40), which
        // encloses aten::copy_ (20-25); a kernel launched at 30. Step 2 (200-300): aten::mm
        // (210-230) on another thread, a kernel launched at 215 and one at 150 (no step).
        let (summary, b) = summarize(
            r#"{"traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "user_annotation", "name": "fwd", "ts": 0, "dur": 60, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 30, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 20, "dur": 5, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 30, "dur": 2, "pid": 1, "tid": 1, "args": {"correlation": 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 50, "dur": 40, "pid": 0, "tid": 7, "args": {"correlation": 1, "device": 0}},
            {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)", "ts": 200, "dur": 100, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 210, "dur": 20, "pid": 1, "tid": 2},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 215, "dur": 2, "pid": 1, "tid": 2, "args": {"correlation": 2}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 250, "dur": 30, "pid": 0, "tid": 7, "args": {"correlation": 2, "device": 0}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 150, "dur": 2, "pid": 1, "tid": 1, "args": {"correlation": 3}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 160, "dur": 10, "pid": 0, "tid": 7, "args": {"correlation": 3, "device": 0}}
            ]}"#,
        );
        let named = |step: usize| -> Vec<(&str, NameCategory, u32, f64)> {
            let mut v: Vec<_> = b.steps[step]
                .iter()
                .map(|n| (b.name(n.name), n.category, n.count, n.us))
                .collect();
            v.sort_by(|x, y| x.0.cmp(y.0));
            v
        };
        assert_eq!(b.steps.len(), 2);
        assert_eq!(
            named(0),
            [
                ("aten::copy_", NameCategory::CpuOp, 1, 5.0),
                ("aten::mm", NameCategory::CpuOp, 1, 25.0),
                ("fwd", NameCategory::Annotation, 1, 30.0),
                ("gemm", NameCategory::Kernel, 1, 40.0),
            ]
        );
        assert_eq!(
            named(1),
            [
                ("aten::mm", NameCategory::CpuOp, 1, 20.0),
                ("gemm", NameCategory::Kernel, 1, 30.0),
            ]
        );
        // The summary itself is what `finish` gives: the annotation is not a CPU operator.
        assert_eq!(summary.cpu_ops.len(), 2);
        assert_eq!(summary.steps[0].cpu_op_us, 30.0);
        assert_eq!(summary.kernels.by_name[0].count, 3);
    }
}
