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
use super::header::Trigger;
use super::stream::EventSink;

/// What a device event's time counts as, as Holistic Trace Analysis classifies kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelKind {
    /// Compute kernels.
    Computation,
    /// Collectives (NCCL, gloo).
    Communication,
    /// Memcpy and memset.
    Memory,
}

impl KernelKind {
    /// The kind of a kernel by its name.
    pub fn of(name: &str) -> Self {
        if name.starts_with("nccl") || name.contains("gloo:") {
            KernelKind::Communication
        } else if name.contains("Memcpy") || name.contains("Memset") {
            KernelKind::Memory
        } else {
            KernelKind::Computation
        }
    }

    /// `computation`, `communication` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelKind::Computation => "computation",
            KernelKind::Communication => "communication",
            KernelKind::Memory => "memory",
        }
    }
}

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
    /// The iterations found.
    pub steps: Vec<Step>,
    /// CPU operators by total time, longest first (the top N).
    #[serde(default)]
    pub cpu_ops: Vec<OpStat>,
    /// What started the capture, from stepscope's header (`{"slow_step": …}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
}

impl Summary {
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

/// A CPU operator: its interval, interned name and thread.
#[derive(Clone, Copy)]
struct CpuOp {
    ts: f64,
    end: f64,
    name: u32,
    thread: u32,
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
    first: f64,
    last: f64,
    kernels: HashMap<Box<str>, Acc>,
    kernel_count: u64,
    kernel_total: f64,
    /// Memcpy and memset time: the kernels' kinds come from their names, in `finish`.
    copy_us: f64,
    memcpy_count: u64,
    memset_count: u64,
    /// Device intervals, per device.
    intervals: HashMap<i64, Vec<(f64, f64)>>,
    /// (correlation, start) of each launch.
    launches: Vec<(u64, f64)>,
    /// (correlation, duration) of each kernel.
    kernel_launches: Vec<(u64, f64)>,
    op_names: Names,
    ops: Vec<Acc>,
    cpu_ops: Vec<CpuOp>,
    threads: HashMap<ThreadKey, u32>,
    profiler_steps: Vec<Annot>,
    execute_steps: Vec<Annot>,
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

    fn thread(&mut self, e: &Event<'_>) -> u32 {
        let key = match (&e.pid, &e.tid) {
            (Some(Id::Num(p)), Some(Id::Num(t))) => ThreadKey::Num(*p, *t),
            (None, Some(Id::Num(t))) => ThreadKey::Num(i64::MIN, *t),
            (p, t) => ThreadKey::Other(format!("{p:?}/{t:?}")),
        };
        let n = self.threads.len() as u32;
        *self.threads.entry(key).or_insert(n)
    }

    fn device_event(&mut self, e: &Event<'_>, device: Device, name: &str, ts: f64, dur: f64) {
        let args = e.args();
        let id = args
            .device
            .map(|d| d as i64)
            .or(match e.pid {
                Some(Id::Num(p)) => Some(p),
                _ => None,
            })
            .unwrap_or(-1);
        self.intervals.entry(id).or_default().push((ts, ts + dur));
        match device {
            Device::Memcpy => {
                self.memcpy_count += 1;
                self.copy_us += dur;
            }
            Device::Memset => {
                self.memset_count += 1;
                self.copy_us += dur;
            }
            Device::Kernel => {
                self.kernel_count += 1;
                self.kernel_total += dur;
                match self.kernels.get_mut(name) {
                    Some(a) => a.add(dur),
                    None => self.kernels.entry(name.into()).or_default().add(dur),
                }
                if let Some(c) = args.correlation {
                    self.kernel_launches.push((c, dur));
                }
            }
        }
    }

    /// Computes the summary. `top`: kernel and operator names kept (0: all).
    pub fn finish(mut self, meta: Meta, top: usize) -> Summary {
        let (first, span) = if self.first > self.last {
            (0.0, 0.0)
        } else {
            (self.first, self.last - self.first)
        };
        let (busy, devices, gaps) = self.busy_and_gaps(first);
        let steps = self.steps(&meta, first);
        let mut kernels: Vec<KernelStat> = std::mem::take(&mut self.kernels)
            .into_iter()
            .map(|(name, a)| KernelStat {
                kind: KernelKind::of(&name),
                mean_us: a.mean(),
                name: name.into(),
                count: a.count,
                total_us: a.total,
                max_us: a.max,
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
            steps,
            cpu_ops,
            trigger: meta.stepscope.trigger,
        };
        summary.keep_top(top);
        summary
    }

    /// Busy time (the union of each device's intervals, summed), devices, and the longest
    /// gaps between intervals with the CPU operator running as each began.
    fn busy_and_gaps(&mut self, first: f64) -> (f64, u64, Vec<Gap>) {
        let mut busy = 0.0;
        let mut gaps: Vec<(i64, f64, f64)> = Vec::new();
        let mut devices: Vec<i64> = self.intervals.keys().copied().collect();
        devices.sort_unstable();
        for dev in &devices {
            let mut iv = self.intervals.remove(dev).unwrap_or_default();
            iv.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut cur: Option<(f64, f64)> = None;
            for (s, e) in iv {
                match cur {
                    Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
                    Some((cs, ce)) => {
                        busy += ce - cs;
                        gaps.push((*dev, ce, s - ce));
                        if gaps.len() > 4 * GAPS {
                            keep_longest(&mut gaps);
                        }
                        cur = Some((s, e));
                    }
                    None => cur = Some((s, e)),
                }
            }
            if let Some((cs, ce)) = cur {
                busy += ce - cs;
            }
        }
        keep_longest(&mut gaps);
        let gaps = gaps
            .into_iter()
            .map(|(device, start, dur)| Gap {
                device,
                start_us: start - first,
                dur_us: dur,
                cpu_op: self
                    .cpu_ops
                    .iter()
                    .filter(|o| o.ts <= start && start < o.end)
                    .max_by(|a, b| a.ts.total_cmp(&b.ts))
                    .map(|o| self.op_names.get(o.name).to_string()),
            })
            .collect();
        (busy, devices.len() as u64, gaps)
    }

    /// The iterations: the engine's annotations when present, else torch's `ProfilerStep#`,
    /// with the kernels they launched and their CPU operator time.
    fn steps(&mut self, meta: &Meta, first: f64) -> Vec<Step> {
        let mut annots = if self.execute_steps.is_empty() {
            std::mem::take(&mut self.profiler_steps)
        } else {
            std::mem::take(&mut self.execute_steps)
        };
        annots.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        // Requests from the header, for annotations whose args lack them (Kineto writes an
        // annotation's requests only when the capture records shapes).
        let header: HashMap<u64, &Vec<String>> = meta
            .stepscope
            .steps
            .iter()
            .map(|s| (s.step, &s.requests))
            .collect();
        let mut steps: Vec<Step> = annots
            .iter_mut()
            .map(|a| Step {
                name: std::mem::take(&mut a.name),
                step: a.step,
                requests: match (a.requests.is_empty(), a.step) {
                    (true, Some(i)) => header.get(&i).map(|r| r.to_vec()).unwrap_or_default(),
                    _ => std::mem::take(&mut a.requests),
                },
                start_us: a.ts - first,
                dur_us: a.end - a.ts,
                cpu_op_us: 0.0,
                kernel_us: 0.0,
                kernel_count: 0,
            })
            .collect();
        if steps.is_empty() {
            return steps;
        }
        // The step an instant falls in: the last starting at or before it, if it has not ended.
        let step_at = |t: f64| {
            let i = annots.partition_point(|a| a.ts <= t);
            (i > 0 && t <= annots[i - 1].end).then(|| i - 1)
        };
        // Sorted by correlation, file order kept among equals: the last launch of an id wins.
        self.launches.sort_by_key(|l| l.0);
        for (corr, dur) in &self.kernel_launches {
            let after = self.launches.partition_point(|l| l.0 <= *corr);
            let Some(&(c, launch)) = after.checked_sub(1).and_then(|i| self.launches.get(i)) else {
                continue;
            };
            if c != *corr {
                continue;
            }
            if let Some(i) = step_at(launch) {
                steps[i].kernel_us += dur;
                steps[i].kernel_count += 1;
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
        for op in &self.cpu_ops {
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
        steps
    }
}

/// Keeps the `GAPS` longest gaps, longest first.
fn keep_longest(gaps: &mut Vec<(i64, f64, f64)>) {
    gaps.sort_by(|a, b| b.2.total_cmp(&a.2));
    gaps.truncate(GAPS);
}

impl EventSink for Summarizer {
    type Event<'de> = Event<'de>;

    fn event(&mut self, e: Event<'_>, _: &Meta) {
        self.events += 1;
        let Some(ts) = e.ts else { return };
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
                self.launches.push((c, ts));
            }
        } else if cat == "cpu_op" {
            let id = self.op_names.intern(name);
            if self.ops.len() <= id as usize {
                self.ops.resize(id as usize + 1, Acc::default());
            }
            self.ops[id as usize].add(dur);
            let thread = self.thread(&e);
            self.cpu_ops.push(CpuOp {
                ts,
                end: ts + dur,
                name: id,
                thread,
            });
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
