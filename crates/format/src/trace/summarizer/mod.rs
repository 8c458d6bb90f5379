//! The sink that computes a trace's [`Summary`] as its events stream in: its state, and its
//! pass over the events (what [`Summarizer::finish`] computes from that state is in
//! `finish.rs`).
//!
//! [`Summarizer`] is an [`EventSink`]: it sees each event once, as the stream parses it, and
//! keeps only what the summary needs — per-name accumulators (kernels, CPU operators), the
//! iteration annotations, and a compact record (16-24 bytes) of each device interval, launch
//! and CPU operator, from which [`Summarizer::finish`] computes busy time, idle gaps and the
//! per-iteration figures. Nothing borrows the trace's bytes.

mod finish;

use crate::hash::FastMap;

use super::event::{
    device_category, device_lane, is_launch_category, is_step_annotation, Event, Meta, NodeKind,
    ThreadKey,
};
use super::explain::{CallKind, DeviceOp, Launch, OpClass, NO_CORRELATION, NO_NAME};
use super::gpu_time::KernelKind;
use super::stream::EventSink;

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

/// A table of the summarizer's: a key to its index (under the crate's per-event hash).
type Table<K> = FastMap<K, u32>;

/// Interned strings: each distinct name is stored once.
#[derive(Default)]
struct Names {
    ids: Table<Box<str>>,
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
    /// Each kernel name's kind, by its id in `kernel_names` (found once per name: the kernel
    /// table's and the explanation's classes are taken from it).
    kernel_kinds: Vec<KernelKind>,
    /// Every kernel, memcpy and memset (40 bytes each): the kernel table and the copy totals
    /// are counted from these in `finish`, once what is left out is gone.
    device_ops: Vec<DeviceOp>,
    /// Each runtime call with a correlation id (24 bytes each).
    launches: Vec<Launch>,
    /// The (device, stream) lanes of `device_ops`, interned.
    lanes: Table<(i64, i64)>,
    lane_list: Vec<(i64, i64)>,
    op_names: Names,
    ops: Vec<Acc>,
    cpu_ops: Vec<CpuOp>,
    threads: Table<ThreadKey>,
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
        let key = ThreadKey::of(e);
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

    fn device_event(&mut self, e: &Event<'_>, device: NodeKind, name: &str, ts: f64, dur: f64) {
        let args = e.args();
        let (dev, stream) = device_lane(e, &args);
        let next = self.lane_list.len() as u32;
        let lane = *self.lanes.entry((dev, stream)).or_insert(next);
        if lane == next {
            self.lane_list.push((dev, stream));
        }
        let (class, name) = match device {
            NodeKind::Memcpy => (OpClass::of_memcpy(name), NO_NAME),
            NodeKind::Memset => (OpClass::Memset, NO_NAME),
            NodeKind::Kernel => {
                let id = self.kernel_names.intern(name);
                let kind = match self.kernel_kinds.get(id as usize) {
                    Some(&kind) => kind,
                    // A name seen for the first time: ids are given in order.
                    None => {
                        let kind = KernelKind::of(name);
                        self.kernel_kinds.push(kind);
                        kind
                    }
                };
                (OpClass::of_kernel(kind), id)
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
        // The events whose `args` are read below (device events, launches, step annotations)
        // are those `args_read` names, for which the scanner finds the keys as it skips them.
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
        if !is_step_annotation(cat, name) {
            return;
        }
        if name.starts_with("ProfilerStep#") {
            self.profiler_steps.push(Annot {
                name: name.to_string(),
                ts,
                end: ts + dur,
                step: None,
                requests: Vec::new(),
            });
        } else {
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
