//! Why a step took what it took on its GPUs: device time by class, idle time by cause,
//! launches and graph replays, exposed communication, and a verdict naming the figure that
//! decides it. Computed by the summarizer from its compact records of device events and
//! host-side runtime calls, for each step and for the whole trace; `analyze`, `report` and
//! `diff` only render and compare it. Every figure is defined here and in docs/analyze.md; the
//! figures' serialized types are in `gpu_time.rs`.
//!
//! Definitions (per device, summed over devices):
//!
//! - **A step's device work** is every kernel, memcpy and memset whose launch (the runtime
//!   call with its correlation id) began inside the step, wherever on the GPU timeline it ran.
//! - **Busy** is the union of that work's intervals. Each instant of it counts as one class,
//!   the first running of: computation, communication, memcpy (H2D, D2H, D2D, other), memset.
//!   So the classes add up to busy, and communication's part is its **exposed** time (no
//!   computation running beside it); its **overlapped** time is the rest of its union.
//! - **Idle** is a gap in the union of *all* of a device's work (any step's, any stream's).
//!   A gap belongs to the step of the event that ends it, and its cause is:
//!   **host wait** when that event's launch began after the device went idle (nothing was
//!   queued: the host was late), **dependency wait** when it was launched before (queued, yet
//!   not started: waiting on an event, another stream, a collective's peers), **other** when
//!   no launch of it is in the trace.
//! - **Launches** count the step's runtime calls by kind (kernel launches, `cudaGraphLaunch`
//!   replays, memcpy/memset calls); each replay's device events are its **graph kernels**.
//!   **Launch delay** is, for each event launched by a kernel launch or an async memcpy/memset
//!   call, the time from the call's end to the event's start, 0 when negative (Holistic Trace
//!   Analysis's `launch_delay`); a **short** event ran for less time than its launch call took
//!   on the CPU (HTA's outliers: a stream of them cannot keep the GPU busy).
//! - **Sync** is the CPU time of the step's `cuda{Device,Stream,Event}Synchronize` (and the
//!   driver's `cu{Ctx,Stream,Event}Synchronize`) calls begun in it.
//! - **Verdict**: of the step's device timeline (busy + idle), the largest of host wait,
//!   computation, exposed communication, copies (memcpy + memset), and dependency wait.
//!
//! Per stream, for comparison with Holistic Trace Analysis, [`StreamIdle`] applies HTA's own
//! rule (`get_idle_time_breakdown`): gaps between consecutive events of one stream, host wait
//! when the next event's launch began after the previous one ended, else kernel wait under
//! [`KERNEL_WAIT_US`], else other.

use super::gpu_time::{GpuTime, IdleSplit, KernelKind, StreamIdle, CLASSES};

/// HTA's `consecutive_kernel_delay` default: 30, compared with timestamps in µs (HTA's docs
/// say ns; its code compares it with the trace's µs), so 30 µs.
pub const KERNEL_WAIT_US: f64 = 30.0;

/// What a device event's time counts as, by priority: an instant when several run counts as
/// the first of them in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(crate) enum OpClass {
    Computation = 0,
    Communication = 1,
    MemcpyH2D = 2,
    MemcpyD2H = 3,
    MemcpyD2D = 4,
    MemcpyOther = 5,
    Memset = 6,
}

impl OpClass {
    /// A kernel's class by its kind ([`KernelKind::of`] its name: a kernel named like a copy
    /// is an other memcpy).
    pub(crate) fn of_kernel(kind: KernelKind) -> Self {
        match kind {
            KernelKind::Computation => OpClass::Computation,
            KernelKind::Communication => OpClass::Communication,
            KernelKind::Memory => OpClass::MemcpyOther,
        }
    }

    /// A memcpy's class by its name (Kineto's `Memcpy HtoD (Pageable -> Device)`, …).
    pub(crate) fn of_memcpy(name: &str) -> Self {
        if name.contains("HtoD") {
            OpClass::MemcpyH2D
        } else if name.contains("DtoH") {
            OpClass::MemcpyD2H
        } else if name.contains("DtoD") {
            OpClass::MemcpyD2D
        } else {
            OpClass::MemcpyOther
        }
    }
}

/// What a host-side runtime call is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum CallKind {
    /// `cudaLaunchKernel`, `cudaLaunchKernelExC`, `cuLaunchKernel`, `cudaLaunchCooperativeKernel`, …
    Kernel,
    /// `cudaGraphLaunch`, `cuGraphLaunch`.
    Graph,
    /// `cudaMemcpyAsync`, `cudaMemsetAsync` and the driver's async copies and sets.
    AsyncCopy,
    /// Synchronous copies and sets (`cudaMemcpy`, …).
    Copy,
    /// `cudaDeviceSynchronize`, `cudaStreamSynchronize`, `cudaEventSynchronize` and the
    /// driver's `cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`.
    Sync,
    /// Any other call.
    Other,
}

/// The synchronizing runtime calls ([`CallKind::Sync`]), by their whole name.
const SYNC_CALLS: [&str; 6] = [
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
];

impl CallKind {
    /// By the words its name holds, in this order: `GraphLaunch`; `LaunchKernel` or
    /// `LaunchCooperativeKernel`; `Memcpy` or `Memset` (with `Async`, or not); else the
    /// synchronizing calls by their whole name. One pass over the name: a search of it for each
    /// word was 3% of `analyze`'s instructions on a trace of 9k runtime calls (callgrind).
    pub(crate) fn of(name: &str) -> Self {
        let b = name.as_bytes();
        let (mut graph, mut kernel, mut copy, mut asynchronous) = (false, false, false, false);
        for (i, &c) in b.iter().enumerate() {
            let rest = &b[i..];
            match c {
                b'G' => graph |= rest.starts_with(b"GraphLaunch"),
                b'L' => {
                    kernel |= rest.starts_with(b"LaunchKernel")
                        || rest.starts_with(b"LaunchCooperativeKernel")
                }
                b'M' => copy |= rest.starts_with(b"Memcpy") || rest.starts_with(b"Memset"),
                b'A' => asynchronous |= rest.starts_with(b"Async"),
                _ => {}
            }
        }
        if graph {
            CallKind::Graph
        } else if kernel {
            CallKind::Kernel
        } else if copy {
            if asynchronous {
                CallKind::AsyncCopy
            } else {
                CallKind::Copy
            }
        } else if SYNC_CALLS.contains(&name) {
            CallKind::Sync
        } else {
            CallKind::Other
        }
    }

    /// Whether a launch delay is measured for what it launched (HTA's set: kernel launches
    /// and async copies; a graph's kernels queue behind each other).
    fn delay_measured(self) -> bool {
        matches!(self, CallKind::Kernel | CallKind::AsyncCopy)
    }
}

/// A device event, as the summarizer keeps it (40 bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceOp {
    pub ts: f64,
    pub end: f64,
    /// Its correlation id, [`NO_CORRELATION`] when it has none.
    pub corr: u64,
    /// The kernel name's id in the summarizer's table ([`NO_NAME`] for copies and sets).
    pub name: u32,
    /// Its (device, stream), in the summarizer's lane table.
    pub lane: u32,
    pub class: OpClass,
}

/// [`DeviceOp::corr`] of an event without one.
pub(crate) const NO_CORRELATION: u64 = u64::MAX;
/// [`DeviceOp::name`] of a copy or set.
pub(crate) const NO_NAME: u32 = u32::MAX;

/// A host-side runtime call that carries a correlation id (24 bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch {
    pub corr: u64,
    pub ts: f64,
    pub dur: f32,
    pub kind: CallKind,
}

/// The explanation of a trace: its steps' and its own.
pub(crate) struct Explained {
    pub trace: GpuTime,
    pub steps: Vec<GpuTime>,
    pub streams: Vec<StreamIdle>,
    /// Devices with work.
    pub devices: u64,
    /// The longest gaps of any device: (device, start, length), longest first.
    pub gaps: Vec<(i64, f64, f64)>,
}

/// What [`explain`] reads.
pub(crate) struct Inputs<'a> {
    /// Device events, in any order (sorted here).
    pub ops: &'a mut [DeviceOp],
    /// Runtime calls sorted by correlation, file order kept among equals.
    pub launches: &'a [Launch],
    /// Each lane's (device, stream).
    pub lanes: &'a [(i64, i64)],
    /// The step each instant falls in (see `Summarizer::steps`).
    pub step_at: &'a dyn Fn(f64) -> Option<usize>,
    pub steps: usize,
    /// Gaps listed.
    pub gaps: usize,
}

const NO_STEP: u32 = u32::MAX;

/// The launch of correlation `corr`: the last call with that id in file order.
pub(crate) fn launch_of(launches: &[Launch], corr: u64) -> Option<&Launch> {
    if corr == NO_CORRELATION {
        return None;
    }
    let after = launches.partition_point(|l| l.corr <= corr);
    let l = launches.get(after.checked_sub(1)?)?;
    (l.corr == corr).then_some(l)
}

/// A device event with what the explanation needs of its launch.
#[derive(Clone, Copy)]
struct Placed {
    ts: f64,
    end: f64,
    device: u32,
    step: u32,
    class: OpClass,
    /// Its launch's start, NaN when unknown.
    launch_ts: f64,
}

/// Computes the explanation. `ops` are left sorted by lane, then start.
pub(crate) fn explain(inp: Inputs<'_>) -> Explained {
    let mut steps = vec![GpuTime::default(); inp.steps];
    let mut trace = GpuTime::default();

    // Launch counts and sync time, per step by the call's start.
    for l in inp.launches {
        let step = (inp.step_at)(l.ts);
        let count = |g: &mut GpuTime| match l.kind {
            CallKind::Kernel => g.launches.kernel_launches += 1,
            CallKind::Graph => g.launches.graph_launches += 1,
            CallKind::AsyncCopy | CallKind::Copy => g.launches.copy_launches += 1,
            CallKind::Sync => g.sync_us += f64::from(l.dur),
            CallKind::Other => {}
        };
        count(&mut trace);
        if let Some(i) = step {
            count(&mut steps[i]);
        }
    }

    // Each event placed: its device, step and launch; launch delays and short events.
    // Devices are numbered by their first lane's order.
    let mut devices: Vec<i64> = inp.lanes.iter().map(|l| l.0).collect();
    devices.sort_unstable();
    devices.dedup();
    let device_of = |lane: u32| -> u32 {
        let d = inp.lanes.get(lane as usize).map_or(-1, |l| l.0);
        devices.binary_search(&d).unwrap_or(0) as u32
    };
    let mut delays: Vec<(u32, f64)> = Vec::new();
    let mut placed: Vec<Placed> = Vec::with_capacity(inp.ops.len());
    for op in inp.ops.iter() {
        let launch = launch_of(inp.launches, op.corr);
        let step = launch
            .and_then(|l| (inp.step_at)(l.ts))
            .map_or(NO_STEP, |i| i as u32);
        if let Some(l) = launch {
            if l.kind == CallKind::Graph {
                trace.launches.graph_kernels += 1;
                if let Some(g) = steps.get_mut(step as usize) {
                    g.launches.graph_kernels += 1;
                }
            }
            if l.kind.delay_measured() {
                let dur = op.end - op.ts;
                let delay = (op.ts - (l.ts + f64::from(l.dur))).max(0.0);
                let short = dur < f64::from(l.dur);
                delays.push((step, delay));
                for g in [Some(&mut trace), steps.get_mut(step as usize)]
                    .into_iter()
                    .flatten()
                {
                    g.launches.delays += 1;
                    g.launches.short += u64::from(short);
                }
            }
        }
        placed.push(Placed {
            ts: op.ts,
            end: op.end,
            device: device_of(op.lane),
            step,
            class: op.class,
            launch_ts: launch.map_or(f64::NAN, |l| l.ts),
        });
    }
    quantiles(&delays, &mut trace, &mut steps);

    // The trace's busy split and every device gap, each gap to the step of the event ending
    // it: all events of a device by start.
    placed.sort_by(|a, b| a.device.cmp(&b.device).then(a.ts.total_cmp(&b.ts)));
    let with_work = placed.chunk_by(|a, b| a.device == b.device).count() as u64;
    let mut gaps = Gaps {
        keep: inp.gaps,
        list: Vec::new(),
    };
    for run in placed.chunk_by(|a, b| a.device == b.device) {
        let device = devices.get(run[0].device as usize).copied().unwrap_or(-1);
        sweep(run, &mut trace, &mut steps, |start, len| {
            gaps.push((device, start, len))
        });
    }
    // Each step's busy split: its own events, per device, by start: grouped by step in one
    // pass, the (device, start) order kept within each (the order of a stable sort by step).
    let (placed, _) = group_by_step(&placed, steps.len(), |p| p.step);
    for run in placed.chunk_by(|a, b| a.step == b.step && a.device == b.device) {
        let Some(g) = steps.get_mut(run[0].step as usize) else {
            continue;
        };
        busy_only(run, g);
    }

    for g in steps.iter_mut().chain([&mut trace]) {
        g.verdict = g.judge();
    }
    let streams = stream_idle(inp.ops, inp.launches, inp.lanes);
    Explained {
        trace,
        steps,
        streams,
        devices: with_work,
        gaps: gaps.list,
    }
}

/// Why a gap ended when it did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cause {
    Host,
    Dependency,
    Other,
}

fn add_idle(idle: &mut IdleSplit, cause: Cause, us: f64) {
    match cause {
        Cause::Host => idle.host_wait_us += us,
        Cause::Dependency => idle.dependency_wait_us += us,
        Cause::Other => idle.other_us += us,
    }
}

/// One device's events sorted by start: busy time by class into `into`, and each gap (with its
/// cause) into `into.idle` and into the idle of the step of the event that ends it.
fn sweep(
    run: &[Placed],
    into: &mut GpuTime,
    steps: &mut [GpuTime],
    mut gap_seen: impl FnMut(f64, f64),
) {
    let mut timeline = Timeline::default();
    for op in run {
        if let Some(gap_start) = timeline.advance_to(op.ts, into) {
            let gap = op.ts - gap_start;
            if gap > 0.0 {
                let cause = if op.launch_ts.is_nan() {
                    Cause::Other
                } else if op.launch_ts > gap_start {
                    Cause::Host
                } else {
                    Cause::Dependency
                };
                add_idle(&mut into.idle, cause, gap);
                gap_seen(gap_start, gap);
                if let Some(g) = steps.get_mut(op.step as usize) {
                    add_idle(&mut g.idle, cause, gap);
                }
            }
        }
        timeline.push(op);
    }
    timeline.drain(into);
}

/// One step's events on one device sorted by start: busy time by class, no gaps.
fn busy_only(run: &[Placed], into: &mut GpuTime) {
    let mut timeline = Timeline::default();
    for op in run {
        timeline.advance_to(op.ts, into);
        timeline.push(op);
    }
    timeline.drain(into);
}

/// The running events of a sweep: their ends in a min-heap, a count per class.
#[derive(Default)]
struct Timeline {
    /// (end, class) of the running events, earliest end first.
    running: std::collections::BinaryHeap<std::cmp::Reverse<(Ordered, u8)>>,
    active: [u32; CLASSES],
    /// Time accounted up to.
    now: f64,
    started: bool,
}

/// An f64 ordered by `total_cmp`, for the heap.
#[derive(Clone, Copy, PartialEq)]
struct Ordered(f64);
impl Eq for Ordered {}
impl PartialOrd for Ordered {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ordered {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

impl Timeline {
    /// Accounts time up to `t`: each stretch to the first running class. Returns where the
    /// device went idle when nothing runs at `t` (after something ran).
    fn advance_to(&mut self, t: f64, into: &mut GpuTime) -> Option<f64> {
        while let Some(std::cmp::Reverse((Ordered(end), class))) = self.running.peek().copied() {
            if end > t {
                break;
            }
            self.account(end, into);
            self.running.pop();
            self.active[class as usize] -= 1;
        }
        if self.running.is_empty() {
            let idle_from = self.started.then_some(self.now);
            self.now = self.now.max(t);
            idle_from
        } else {
            self.account(t, into);
            None
        }
    }

    fn account(&mut self, t: f64, into: &mut GpuTime) {
        let dt = t - self.now;
        if dt <= 0.0 {
            return;
        }
        if let Some(class) = self.active.iter().position(|&n| n > 0) {
            into.busy_us += dt;
            *into.busy.slot(class) += dt;
            if class == OpClass::Computation as usize
                && self.active[OpClass::Communication as usize] > 0
            {
                into.communication_overlapped_us += dt;
            }
        }
        self.now = t;
    }

    fn push(&mut self, op: &Placed) {
        if !self.started {
            self.started = true;
            self.now = op.ts;
        }
        self.active[op.class as usize] += 1;
        self.running.push(std::cmp::Reverse((
            Ordered(op.end.max(op.ts)),
            op.class as u8,
        )));
    }

    fn drain(&mut self, into: &mut GpuTime) {
        self.advance_to(f64::INFINITY, into);
    }
}

/// The longest gaps seen, longest first (of equal ones, the first seen), at most `keep`: a
/// gap is placed as it comes, by a walk over the few kept (a sort of the list each time it
/// outgrew a bound was most of `explain`'s time on a trace of a few thousand device events).
struct Gaps {
    keep: usize,
    list: Vec<(i64, f64, f64)>,
}

impl Gaps {
    fn push(&mut self, gap: (i64, f64, f64)) {
        // After every kept gap at least as long: the order of a stable sort, longest first.
        let at = self
            .list
            .iter()
            .position(|g| g.2.total_cmp(&gap.2).is_lt())
            .unwrap_or(self.list.len());
        if at < self.keep {
            self.list.truncate(self.keep - 1);
            self.list.insert(at, gap);
        }
    }
}

/// The median and 90th percentile of the launch delays, of the trace and of each step: the
/// delays grouped by step (a counting sort), each group's ranks found by selection, O(n) in
/// all (two sorts of them were a third of `explain`'s time on HTA's 35 MB trace).
fn quantiles(delays: &[(u32, f64)], trace: &mut GpuTime, steps: &mut [GpuTime]) {
    let mut values: Vec<f64> = delays.iter().map(|d| d.1).collect();
    trace.launches.delay_median_us = quantile(&mut values, 0.5);
    trace.launches.delay_p90_us = quantile(&mut values, 0.9);
    // Those of no step are grouped last, and dropped.
    let (grouped, bounds) = group_by_step(delays, steps.len(), |d| d.0);
    for (g, range) in steps.iter_mut().zip(bounds.windows(2)) {
        if range[0] < range[1] {
            values.clear();
            values.extend(grouped[range[0]..range[1]].iter().map(|d| d.1));
            g.launches.delay_median_us = quantile(&mut values, 0.5);
            g.launches.delay_p90_us = quantile(&mut values, 0.9);
        }
    }
}

/// The `q` quantile of `values`, linearly interpolated between the closest ranks (numpy's
/// default; ranks as `f64::total_cmp` orders them). Reorders `values`: the ranks are found by
/// selection, not a sort.
pub(crate) fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
    let lo = pos.floor() as usize;
    let (_, &mut low, above) = values.select_nth_unstable_by(lo, f64::total_cmp);
    // The next rank: the least of those above, or this one again at the last.
    let high = above.iter().copied().min_by(f64::total_cmp).unwrap_or(low);
    Some(low + (high - low) * (pos - lo as f64))
}

/// `items` stably grouped by step, steps in order (of `steps`) and those of no step (a step of
/// `steps` or more, [`NO_STEP`] among them) last, with where each group begins (`steps + 2`
/// offsets, the last the end): a counting sort, O(n) where a comparison sort of the same order
/// costs O(n log n).
fn group_by_step<T: Copy>(
    items: &[T],
    steps: usize,
    step_of: impl Fn(&T) -> u32,
) -> (Vec<T>, Vec<usize>) {
    let bucket = |t: &T| (step_of(t) as usize).min(steps);
    let mut starts = vec![0usize; steps + 2];
    for t in items {
        starts[bucket(t) + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let bounds = starts.clone();
    let mut out = items.to_vec();
    for t in items {
        let slot = &mut starts[bucket(t)];
        out[*slot] = *t;
        *slot += 1;
    }
    (out, bounds)
}

/// Idle time per stream by HTA's rule. Sorts `ops` by lane, then start.
fn stream_idle(ops: &mut [DeviceOp], launches: &[Launch], lanes: &[(i64, i64)]) -> Vec<StreamIdle> {
    ops.sort_by(|a, b| a.lane.cmp(&b.lane).then(a.ts.total_cmp(&b.ts)));
    let mut out = Vec::new();
    for run in ops.chunk_by(|a, b| a.lane == b.lane) {
        let (device, stream) = lanes.get(run[0].lane as usize).copied().unwrap_or((-1, -1));
        let mut s = StreamIdle {
            device,
            stream,
            events: run.len() as u64,
            busy_us: run.iter().map(|o| o.end - o.ts).sum(),
            host_wait_us: 0.0,
            kernel_wait_us: 0.0,
            other_us: 0.0,
        };
        for pair in run.windows(2) {
            let (prev, op) = (&pair[0], &pair[1]);
            let gap = op.ts - prev.end;
            let host = launch_of(launches, op.corr).is_some_and(|l| l.ts > prev.end);
            if host {
                s.host_wait_us += gap;
            } else if gap < KERNEL_WAIT_US {
                s.kernel_wait_us += gap;
            } else {
                s.other_us += gap;
            }
        }
        out.push(s);
    }
    out
}

#[cfg(test)]
mod tests {
    //! Traces of known structure, each figure worked out by hand in the comments.

    use crate::trace::{Bound, EventStream, Summarizer, Summary};

    use super::*;

    /// A trace of the given events, each `(cat, name, ts, dur, tid, args)`.
    fn summarize(events: &[(&str, &str, f64, f64, i64, &str)]) -> Summary {
        let body: Vec<String> = events
            .iter()
            .map(|(cat, name, ts, dur, tid, args)| {
                format!(
                    r#"{{"ph": "X", "cat": "{cat}", "name": "{name}", "ts": {ts}, "dur": {dur}, "pid": 1, "tid": {tid}, "args": {{{args}}}}}"#
                )
            })
            .collect();
        let json = format!(r#"{{"traceEvents": [{}]}}"#, body.join(",\n"));
        let mut sink = Summarizer::new();
        let mut stream = EventStream::new();
        stream.feed(json.as_bytes(), &mut sink).unwrap();
        let meta = stream.finish(&mut sink).unwrap();
        sink.finish(meta, 0)
    }

    const STEP: &str = "user_annotation";

    fn launch(corr: u64, ts: f64, dur: f64) -> (&'static str, &'static str, f64, f64, i64, String) {
        (
            "cuda_runtime",
            "cudaLaunchKernel",
            ts,
            dur,
            1,
            format!(r#""correlation": {corr}"#),
        )
    }

    fn on_gpu(
        cat: &'static str,
        name: &'static str,
        corr: u64,
        ts: f64,
        dur: f64,
        stream: u64,
    ) -> (&'static str, &'static str, f64, f64, i64, String) {
        (
            cat,
            name,
            ts,
            dur,
            stream as i64,
            format!(r#""correlation": {corr}, "device": 0, "stream": {stream}"#),
        )
    }

    fn run(events: Vec<(&'static str, &'static str, f64, f64, i64, String)>) -> Summary {
        let borrowed: Vec<(&str, &str, f64, f64, i64, &str)> = events
            .iter()
            .map(|(c, n, t, d, tid, a)| (*c, *n, *t, *d, *tid, a.as_str()))
            .collect();
        summarize(&borrowed)
    }

    fn step(ts: f64, dur: f64) -> (&'static str, &'static str, f64, f64, i64, String) {
        (
            STEP,
            "execute_context_0(0)_generation_4(4)",
            ts,
            dur,
            1,
            String::new(),
        )
    }

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_step_whose_launches_come_after_the_gpu_went_idle_is_host_bound() {
        // Three kernels of 50 µs, each launched (a 10 µs call) long after the one before
        // ended, starting 10 µs after its call: the GPU idles 170-420 and 470-720, both host
        // wait, 500 µs against 150 busy.
        let s = run(vec![
            step(0.0, 1000.0),
            launch(1, 100.0, 10.0),
            on_gpu("kernel", "gemm", 1, 120.0, 50.0, 7),
            launch(2, 400.0, 10.0),
            on_gpu("kernel", "gemm", 2, 420.0, 50.0, 7),
            launch(3, 700.0, 10.0),
            on_gpu("kernel", "gemm", 3, 720.0, 50.0, 7),
        ]);
        let g = s.steps[0].gpu.unwrap();
        assert!(near(g.busy_us, 150.0) && near(g.busy.computation_us, 150.0));
        assert!(near(g.idle.host_wait_us, 500.0), "{g:?}");
        assert_eq!(g.idle.dependency_wait_us, 0.0);
        let v = g.verdict.unwrap();
        assert_eq!(v.bound, Bound::Host);
        assert!(near(v.share(), 500.0 / 650.0));
        // Launch delay: each kernel starts 10 µs after its call ended; none ran shorter than
        // its call.
        assert_eq!(g.launches.kernel_launches, 3);
        assert_eq!(g.launches.delays, 3);
        assert_eq!(g.launches.delay_median_us, Some(10.0));
        assert_eq!(g.launches.short, 0);
    }

    #[test]
    fn a_step_of_back_to_back_queued_kernels_is_compute_bound() {
        // Four kernels launched up front (calls at 0-3), run 100-300, 300-500, 502-700,
        // 700-900: one 2 µs gap, queued (dependency wait), 798 µs of computation.
        let s = run(vec![
            step(0.0, 1000.0),
            launch(1, 0.0, 1.0),
            launch(2, 1.0, 1.0),
            launch(3, 2.0, 1.0),
            launch(4, 3.0, 1.0),
            on_gpu("kernel", "gemm", 1, 100.0, 200.0, 7),
            on_gpu("kernel", "gemm", 2, 300.0, 200.0, 7),
            on_gpu("kernel", "gemm", 3, 502.0, 198.0, 7),
            on_gpu("kernel", "gemm", 4, 700.0, 200.0, 7),
        ]);
        let g = s.steps[0].gpu.unwrap();
        assert!(near(g.busy.computation_us, 798.0));
        assert!(near(g.idle.dependency_wait_us, 2.0) && g.idle.host_wait_us == 0.0);
        assert_eq!(g.verdict.unwrap().bound, Bound::Compute);
        // The trace alike; and the median delay (99, 298, 499, 696 µs after the calls ended)
        // interpolated between the middle two.
        assert_eq!(s.gpu.verdict.unwrap().bound, Bound::Compute);
        assert_eq!(g.launches.delay_median_us, Some((298.0 + 499.0) / 2.0));
    }

    #[test]
    fn a_step_with_exposed_collective_time_is_communication_bound() {
        // A 500 µs NCCL kernel on stream 9 beside 100 µs of computation on stream 7: 400 µs
        // exposed, 100 overlapped; busy 500.
        let s = run(vec![
            step(0.0, 1000.0),
            launch(1, 10.0, 5.0),
            launch(2, 20.0, 5.0),
            on_gpu(
                "kernel",
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                1,
                100.0,
                500.0,
                9,
            ),
            on_gpu("kernel", "gemm", 2, 100.0, 100.0, 7),
        ]);
        let g = s.steps[0].gpu.unwrap();
        assert!(near(g.busy_us, 500.0));
        assert!(near(g.busy.communication_us, 400.0));
        assert!(near(g.communication_overlapped_us, 100.0));
        assert!(near(g.busy.computation_us, 100.0));
        let v = g.verdict.unwrap();
        assert_eq!((v.bound, v.part_us), (Bound::Communication, 400.0));
    }

    #[test]
    fn copies_split_by_direction_and_a_copy_heavy_step_is_copy_bound() {
        let s = run(vec![
            step(0.0, 1000.0),
            (
                "cuda_runtime",
                "cudaMemcpyAsync",
                1.0,
                1.0,
                1,
                r#""correlation": 1"#.into(),
            ),
            (
                "cuda_runtime",
                "cudaMemcpyAsync",
                2.0,
                1.0,
                1,
                r#""correlation": 2"#.into(),
            ),
            (
                "cuda_runtime",
                "cudaMemsetAsync",
                3.0,
                1.0,
                1,
                r#""correlation": 3"#.into(),
            ),
            launch(4, 4.0, 1.0),
            on_gpu(
                "gpu_memcpy",
                "Memcpy HtoD (Pageable -> Device)",
                1,
                10.0,
                300.0,
                7,
            ),
            on_gpu(
                "gpu_memcpy",
                "Memcpy DtoH (Device -> Pinned)",
                2,
                310.0,
                200.0,
                7,
            ),
            on_gpu("gpu_memset", "Memset (Device)", 3, 510.0, 10.0, 7),
            on_gpu("kernel", "gemm", 4, 520.0, 100.0, 7),
            // A DtoD copy running beside the kernel counts as computation there.
            on_gpu(
                "gpu_memcpy",
                "Memcpy DtoD (Device -> Device)",
                4,
                560.0,
                100.0,
                8,
            ),
        ]);
        let g = s.steps[0].gpu.unwrap();
        assert!(near(g.busy.memcpy_h2d_us, 300.0));
        assert!(near(g.busy.memcpy_d2h_us, 200.0));
        assert!(near(g.busy.memset_us, 10.0));
        assert!(near(g.busy.memcpy_d2d_us, 40.0));
        assert!(near(g.busy.computation_us, 100.0));
        assert!(near(g.busy_us, 650.0));
        assert_eq!(g.launches.copy_launches, 3);
        assert_eq!(g.verdict.unwrap().bound, Bound::Copy);
    }

    #[test]
    fn devices_with_work_are_counted_once_whatever_the_steps() {
        // Two steps, each running a kernel on device 0 and one on device 1.
        let on = |device: u64, corr: u64, ts: f64| {
            let args = format!(r#""correlation": {corr}, "device": {device}, "stream": 7"#);
            ("kernel", "gemm", ts, 10.0, 7, args)
        };
        let s = run(vec![
            step(0.0, 100.0),
            launch(1, 10.0, 2.0),
            launch(2, 12.0, 2.0),
            on(0, 1, 20.0),
            on(1, 2, 20.0),
            step(100.0, 100.0),
            launch(3, 110.0, 2.0),
            launch(4, 112.0, 2.0),
            on(0, 3, 120.0),
            on(1, 4, 120.0),
        ]);
        assert_eq!(s.gpu_devices, 2);
        // Each step's busy time: its two kernels, one per device.
        for st in &s.steps {
            assert!(near(st.gpu.unwrap().busy_us, 20.0), "{:?}", st.gpu);
        }
    }

    #[test]
    fn work_counts_for_the_step_that_launched_it_and_each_gap_for_the_step_it_delays() {
        // Step A (0-100) launches a kernel that runs 150-250, during step B (100-300), which
        // launches one at 260 that runs 270-300. The gap 250-270 ends with B's kernel, launched
        // after the GPU went idle: B's host wait. A's work is A's.
        let s = run(vec![
            step(0.0, 100.0),
            launch(1, 50.0, 5.0),
            step(100.0, 200.0),
            on_gpu("kernel", "gemm", 1, 150.0, 100.0, 7),
            launch(2, 260.0, 5.0),
            on_gpu("kernel", "gemm", 2, 270.0, 30.0, 7),
        ]);
        let (a, b) = (s.steps[0].gpu.unwrap(), s.steps[1].gpu.unwrap());
        assert!(near(a.busy_us, 100.0) && a.idle.total_us() == 0.0);
        assert!(near(b.busy_us, 30.0) && near(b.idle.host_wait_us, 20.0));
        assert_eq!(s.steps[0].kernel_count, 1);
        // The trace: busy 130, host wait 20.
        assert!(near(s.gpu.busy_us, 130.0) && near(s.gpu.idle.host_wait_us, 20.0));
    }

    #[test]
    fn a_graph_replay_counts_its_kernels_and_a_sync_call_its_cpu_time() {
        let s = run(vec![
            step(0.0, 1000.0),
            (
                "cuda_runtime",
                "cudaGraphLaunch",
                10.0,
                20.0,
                1,
                r#""correlation": 5"#.into(),
            ),
            on_gpu("kernel", "a", 5, 40.0, 10.0, 7),
            on_gpu("kernel", "b", 5, 50.0, 10.0, 7),
            on_gpu("kernel", "c", 5, 60.0, 10.0, 7),
            (
                "cuda_runtime",
                "cudaStreamSynchronize",
                30.0,
                45.0,
                1,
                r#""correlation": 6"#.into(),
            ),
            // A kernel with no launch in the trace ends a gap of unknown cause.
            on_gpu("kernel", "d", 99, 100.0, 10.0, 7),
        ]);
        let g = s.steps[0].gpu.unwrap();
        assert_eq!(g.launches.graph_launches, 1);
        assert_eq!(g.launches.graph_kernels, 3);
        assert_eq!(g.launches.kernel_launches, 0);
        // Graph kernels have no launch delay of their own.
        assert_eq!(g.launches.delays, 0);
        assert_eq!(s.steps[0].kernel_count, 3);
        assert!(near(g.sync_us, 45.0));
        assert!(near(s.gpu.idle.other_us, 30.0));
    }

    #[test]
    fn streams_follow_htas_rule() {
        // Stream 7: kernels at 0-10 (launched at -5), 50-60 (launched at 20 > 10: host wait
        // 40), 65-75 (launched at 0: queued, gap 5 < 30: kernel wait), 200-210 (queued, gap
        // 125: other).
        let s = run(vec![
            launch(1, -5.0, 1.0),
            launch(3, 0.0, 1.0),
            launch(4, 1.0, 1.0),
            launch(2, 20.0, 1.0),
            on_gpu("kernel", "k", 1, 0.0, 10.0, 7),
            on_gpu("kernel", "k", 2, 50.0, 10.0, 7),
            on_gpu("kernel", "k", 3, 65.0, 10.0, 7),
            on_gpu("kernel", "k", 4, 200.0, 10.0, 7),
        ]);
        let st = &s.streams[0];
        assert_eq!((st.device, st.stream, st.events), (0, 7, 4));
        assert!(near(st.host_wait_us, 40.0));
        assert!(near(st.kernel_wait_us, 5.0));
        assert!(near(st.other_us, 125.0));
        // The device-level causes: host 40, dependency 130.
        assert!(near(s.gpu.idle.host_wait_us, 40.0));
        assert!(near(s.gpu.idle.dependency_wait_us, 130.0));
    }

    #[test]
    fn nanosecond_digits_of_epoch_timestamps_survive() {
        // At 1.7e15 µs an f64 keeps 0.25 µs; the reader keeps the written digits.
        let json = br#"{"traceEvents": [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1712137898000000.001, "dur": 0.002, "pid": 1, "tid": 1, "args": {"correlation": 1}},
            {"ph": "X", "cat": "kernel", "name": "k", "ts": 1712137898000000.010, "dur": 0.003, "pid": 0, "tid": 7, "args": {"correlation": 1, "device": 0, "stream": 7}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1712137898000000.020, "dur": 0.002, "pid": 1, "tid": 1, "args": {"correlation": 2}},
            {"ph": "X", "cat": "kernel", "name": "k", "ts": 1712137898000000.030, "dur": 0.003, "pid": 0, "tid": 7, "args": {"correlation": 2, "device": 0, "stream": 7}}
        ]}"#;
        let mut sink = Summarizer::new();
        let mut stream = EventStream::new();
        stream.feed(json, &mut sink).unwrap();
        let meta = stream.finish(&mut sink).unwrap();
        let s = sink.finish(meta, 0);
        assert!((s.gpu.busy_us - 0.006).abs() < 1e-9, "{}", s.gpu.busy_us);
        assert!(
            (s.gpu.idle.host_wait_us - 0.017).abs() < 1e-9,
            "{:?}",
            s.gpu.idle
        );
    }

    #[test]
    fn quantiles_interpolate_as_numpy() {
        assert_eq!(quantile(&mut [], 0.5), None);
        assert_eq!(quantile(&mut [3.0], 0.9), Some(3.0));
        assert_eq!(quantile(&mut [4.0, 1.0, 3.0, 2.0], 0.5), Some(2.5));
        // numpy.percentile([1, 2, 3, 4, 10], 90) == 7.6
        assert!((quantile(&mut [10.0, 2.0, 4.0, 1.0, 3.0], 0.9).unwrap() - 7.6).abs() < 1e-12);
        // By selection as by a sort, with ties and a NaN ranked last.
        let mut seed = 5u64;
        for n in [1, 2, 3, 10, 101, 1_000] {
            let mut values: Vec<f64> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((seed >> 40) % 50) as f64 / 8.0
                })
                .collect();
            if n > 2 {
                values[1] = f64::NAN;
            }
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            for q in [0.0, 0.1, 0.5, 0.9, 0.99, 1.0] {
                let pos = q * (n - 1) as f64;
                let lo = pos.floor() as usize;
                let hi = (lo + 1).min(n - 1);
                let want = sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64);
                let got = quantile(&mut values, q).unwrap();
                assert!(
                    got.to_bits() == want.to_bits(),
                    "n {n} q {q}: {got} against {want}"
                );
            }
        }
    }

    #[test]
    fn the_longest_gaps_are_kept_longest_first_the_first_seen_among_equals() {
        // Lengths from a small set, so that many tie; each gap's start is its order.
        let mut seed = 7u64;
        for keep in [0, 1, 5, 12] {
            let mut gaps = Gaps {
                keep,
                list: Vec::new(),
            };
            let mut all = Vec::new();
            for i in 0..2_000 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let gap = (
                    (seed >> 60) as i64,
                    i as f64,
                    ((seed >> 33) % 40) as f64 / 4.0,
                );
                gaps.push(gap);
                all.push(gap);
            }
            // What a stable sort of every gap, longest first, keeps.
            all.sort_by(|a, b| b.2.total_cmp(&a.2));
            all.truncate(keep);
            assert_eq!(gaps.list, all, "keep {keep}");
        }
    }

    #[test]
    fn a_calls_kind_is_that_of_the_words_its_name_holds() {
        // The rule as written: a search of the whole name for each word.
        fn by_search(name: &str) -> CallKind {
            if name.contains("GraphLaunch") {
                CallKind::Graph
            } else if name.contains("LaunchKernel") || name.contains("LaunchCooperativeKernel") {
                CallKind::Kernel
            } else if name.contains("Memcpy") || name.contains("Memset") {
                if name.contains("Async") {
                    CallKind::AsyncCopy
                } else {
                    CallKind::Copy
                }
            } else if SYNC_CALLS.contains(&name) {
                CallKind::Sync
            } else {
                CallKind::Other
            }
        }
        let names = [
            "cudaLaunchKernel",
            "cudaLaunchKernelExC",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel",
            "cudaLaunchCooperativeKernelMultiDevice",
            "cudaGraphLaunch",
            "cuGraphLaunch",
            "cudaMemcpyAsync",
            "cudaMemcpy",
            "cudaMemsetAsync",
            "cudaMemset",
            "cuMemcpyHtoDAsync_v2",
            "cuMemcpyDtoH_v2",
            "cudaMemcpy2DAsync",
            "cudaDeviceSynchronize",
            "cudaStreamSynchronize",
            "cudaEventSynchronize",
            "cuCtxSynchronize",
            "cuStreamSynchronize",
            "cuEventSynchronize",
            "cudaEventRecord",
            "cudaStreamWaitEvent",
            "cudaFuncGetAttributes",
            "hipLaunchKernel",
            "hipMemcpyAsync",
            "hipExtLaunchKernel",
            "cudaGraphLaunchKernel",
            "MemcpyGraphLaunch",
            "LaunchKernelMemcpy",
            "GraphLaunc",
            "LaunchKerne",
            "Memcp",
            "Asyn",
            "AsyncMemset",
            "cudaDeviceSynchronize2",
            "",
            "G",
            "L",
            "M",
            "A",
            "GGraphLaunch",
            "LLaunchKernel",
            "MMemset",
            "AAsyncMemcpy",
            "cudaMemcpyPeerAsync",
            "xLaunchCooperativeKernelx",
            "Löschen Memset Async",
        ];
        for name in names {
            assert_eq!(CallKind::of(name), by_search(name), "{name:?}");
        }
    }
}
