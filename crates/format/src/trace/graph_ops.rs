//! The operators inside CUDA graph replays. A replay's kernels come from one `cudaGraphLaunch`
//! and carry no operator: the operators ran once, when the graph was captured. A trace of that
//! capture (vLLM's `capture_torch_profiler`, SGLang's `--enable-profile-cuda-graph`, or any
//! `torch.profiler` around `torch.cuda.graph`) records, between the stream's
//! `cudaStreamBeginCapture` and `cudaStreamEndCapture`, each launch the graph's nodes were made
//! from and the operator that made it. Stream capture records a single-stream graph's nodes as
//! a chain in launch order, and a replay runs a chain in that order, so the replay's i-th
//! device event (by start time, on one stream) is the capture's i-th launch.
//!
//! [`CaptureReader`] reads capture traces into a [`CaptureMap`]; [`ReplayReader`] keeps a
//! trace's graph launches, device events and steps; [`graph_ops`] joins them into
//! [`GraphOps`]: time per operator inside the replays. What the join can check, it does; a
//! replay is mapped only when:
//!
//! - it was launched inside one of the trace's steps, where the trace has steps (a replay
//!   launched after a window is recorded in part);
//! - its device events are on one stream;
//! - some capture region launched, in order, exactly its kinds of node (kernel, memcpy,
//!   memset), and every such region names the same operators in the same order.
//!
//! Otherwise it is counted as unmapped with the reason. A capture region is left out, and said
//! why, when order cannot stand for its nodes: a capture begun inside another, one never ended,
//! a graph launched inside it (a child graph), a wait on another stream's event (branches). A
//! replay of a graph whose capture is not among the traces given can still meet a region of
//! the same node kinds: give the capture traces of the graphs the trace replays.
//!
//! Checked on a real H100 capture and replay (`cli/tests/graphs.rs`): each replay's kernels in
//! time order equal, name by name, the kernels an eager run of the same code launched from the
//! same operators.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::event::{
    device_category, device_lane, is_launch_category, is_step_annotation, Event, Meta, NodeKind,
    ThreadKey,
};
use super::explain::CallKind;
use super::stream::EventSink;

/// One capture region: each launch's operator and kind, in launch order.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureRegion {
    /// The annotation around `cudaStreamBeginCapture`: the innermost named `capture_…`
    /// (vLLM's `capture_{batch}_{mode}`), else the innermost, if any.
    pub label: Option<String>,
    /// The trace it came from.
    pub source: String,
    /// Per launch, its innermost CPU operator (`?` where none encloses it).
    pub ops: Vec<String>,
    /// Per launch, what it made.
    pub kinds: Vec<NodeKind>,
}

/// Every capture region read, and those that could not be used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaptureMap {
    /// In the order read: per trace, per thread, in time order.
    pub regions: Vec<CaptureRegion>,
    /// (source, why) of each capture region left out.
    pub skipped: Vec<(String, String)>,
}

impl CaptureMap {
    /// Adds what one capture trace held.
    pub fn extend(&mut self, reader: CaptureReader, source: &str) {
        let (regions, skipped) = reader.regions();
        self.regions.extend(regions.into_iter().map(|mut r| {
            r.source = source.to_string();
            r
        }));
        self.skipped
            .extend(skipped.into_iter().map(|why| (source.to_string(), why)));
    }
}

#[derive(Debug, Clone)]
struct Span {
    ts: f64,
    end: f64,
    name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Begin,
    End,
    Launch(NodeKind),
    /// `cudaGraphLaunch` while capturing: a child graph's node.
    Graph,
    /// `cudaStreamWaitEvent`: a branch joined from another stream.
    Wait,
}

/// A runtime or driver call of the capture trace.
#[derive(Debug, Clone, Copy)]
struct CallAt {
    ts: f64,
    end: f64,
    call: Call,
    driver: bool,
}

/// Reads a capture trace: its runtime calls, CPU operators and annotations, per thread.
#[derive(Debug, Default)]
pub struct CaptureReader {
    calls: HashMap<ThreadKey, Vec<CallAt>>,
    ops: HashMap<ThreadKey, Vec<Span>>,
    annotations: HashMap<ThreadKey, Vec<Span>>,
}

fn call_of(name: &str) -> Option<Call> {
    Some(if name.contains("BeginCapture") {
        Call::Begin
    } else if name.contains("EndCapture") {
        Call::End
    } else if name.contains("StreamWaitEvent") {
        Call::Wait
    } else {
        match CallKind::of(name) {
            CallKind::Kernel => Call::Launch(NodeKind::Kernel),
            CallKind::AsyncCopy if name.contains("Memset") => Call::Launch(NodeKind::Memset),
            CallKind::AsyncCopy => Call::Launch(NodeKind::Memcpy),
            CallKind::Graph => Call::Graph,
            _ => return None,
        }
    })
}

impl EventSink for CaptureReader {
    type Event<'de> = Event<'de>;

    fn event(&mut self, e: Event<'_>, _: &Meta) {
        if e.ph.as_deref() != Some("X") {
            return;
        }
        let (Some(ts), Some(name)) = (e.ts, e.name.as_deref()) else {
            return;
        };
        let dur = e.dur.unwrap_or(0.0);
        match e.cat.as_deref().unwrap_or("") {
            cat if is_launch_category(cat) => {
                let Some(call) = call_of(name) else { return };
                self.calls
                    .entry(ThreadKey::of(&e))
                    .or_default()
                    .push(CallAt {
                        ts,
                        end: ts + dur,
                        call,
                        driver: cat == "cuda_driver",
                    });
            }
            cat @ ("cpu_op" | "user_annotation") => {
                let span = Span {
                    ts,
                    end: ts + dur,
                    name: name.to_string(),
                };
                let to = if cat == "cpu_op" {
                    &mut self.ops
                } else {
                    &mut self.annotations
                };
                to.entry(ThreadKey::of(&e)).or_default().push(span);
            }
            _ => {}
        }
    }
}

/// For each time in `at` (ascending), the innermost span of `spans` around it.
fn innermost<'a>(spans: &'a mut [Span], at: &[f64]) -> Vec<Option<&'a str>> {
    // Outer spans first where two start together.
    spans.sort_by(|a, b| a.ts.total_cmp(&b.ts).then(b.end.total_cmp(&a.end)));
    let mut open: Vec<&Span> = Vec::new();
    let mut next = 0;
    let mut out = Vec::with_capacity(at.len());
    for &t in at {
        while next < spans.len() && spans[next].ts <= t {
            open.push(&spans[next]);
            next += 1;
        }
        // A span that ended before `t` encloses nothing from here on; one that started later
        // than a span still open and ended sooner is nested in it.
        while open.last().is_some_and(|s| s.end < t) {
            open.pop();
        }
        out.push(
            open.iter()
                .rev()
                .find(|s| s.end >= t)
                .map(|s| s.name.as_str()),
        );
    }
    out
}

/// A region being read, and why it cannot be used, if it cannot.
struct Open {
    region: CaptureRegion,
    spoiled: Option<&'static str>,
    depth: u32,
}

impl CaptureReader {
    /// The capture regions, in time order per thread, and why each one left out was.
    fn regions(mut self) -> (Vec<CaptureRegion>, Vec<String>) {
        let (mut out, mut skipped) = (Vec::new(), Vec::new());
        let mut threads: Vec<ThreadKey> = self.calls.keys().cloned().collect();
        threads.sort();
        for thread in threads {
            let Some(mut calls) = self.calls.remove(&thread) else {
                continue;
            };
            calls.sort_by(|a, b| a.ts.total_cmp(&b.ts));
            // A driver launch made inside a runtime launch is that launch, not another node.
            let runtime: Vec<(f64, f64)> = calls
                .iter()
                .filter(|c| !c.driver && matches!(c.call, Call::Launch(_)))
                .map(|c| (c.ts, c.end))
                .collect();
            calls.retain(|c| {
                !(c.driver
                    && matches!(c.call, Call::Launch(_))
                    && runtime.iter().any(|(a, b)| *a <= c.ts && c.ts <= *b))
            });
            let mut ops = self.ops.remove(&thread).unwrap_or_default();
            let mut annotations = self.annotations.remove(&thread).unwrap_or_default();
            let at = |want: fn(Call) -> bool| -> Vec<f64> {
                calls
                    .iter()
                    .filter(|c| want(c.call))
                    .map(|c| c.ts)
                    .collect()
            };
            let launch_times = at(|c| matches!(c, Call::Launch(_)));
            let begin_times = at(|c| c == Call::Begin);
            let op_names: Vec<String> = innermost(&mut ops, &launch_times)
                .into_iter()
                .map(|o| o.unwrap_or("?").to_string())
                .collect();
            let mut captures: Vec<Span> = annotations
                .iter()
                .filter(|a| a.name.starts_with("capture_"))
                .cloned()
                .collect();
            let named = innermost(&mut captures, &begin_times);
            let any = innermost(&mut annotations, &begin_times);
            let labels: Vec<Option<String>> = named
                .into_iter()
                .zip(any)
                .map(|(n, a)| n.or(a).map(str::to_string))
                .collect();
            let (mut launch, mut begin) = (0, 0);
            let mut current: Option<Open> = None;
            for c in &calls {
                match (c.call, current.as_mut()) {
                    (Call::Begin, None) => {
                        current = Some(Open {
                            region: CaptureRegion {
                                label: labels.get(begin).cloned().flatten(),
                                source: String::new(),
                                ops: Vec::new(),
                                kinds: Vec::new(),
                            },
                            spoiled: None,
                            depth: 1,
                        });
                    }
                    (Call::Begin, Some(o)) => {
                        o.depth += 1;
                        o.spoiled
                            .get_or_insert("a capture began inside another on the same thread");
                    }
                    (Call::End, Some(o)) => {
                        o.depth -= 1;
                        if o.depth == 0 {
                            if let Some(o) = current.take() {
                                match o.spoiled {
                                    None => out.push(o.region),
                                    Some(why) => skipped.push(why.to_string()),
                                }
                            }
                        }
                    }
                    (Call::Launch(kind), Some(o)) => {
                        o.region
                            .ops
                            .push(op_names.get(launch).cloned().unwrap_or_default());
                        o.region.kinds.push(kind);
                    }
                    (Call::Graph, Some(o)) => {
                        o.spoiled
                            .get_or_insert("a graph was launched inside it (a child graph node)");
                    }
                    (Call::Wait, Some(o)) => {
                        o.spoiled.get_or_insert(
                            "it waits on another stream's event (branches with no single order)",
                        );
                    }
                    (Call::End | Call::Graph | Call::Wait | Call::Launch(_), None) => {}
                }
                match c.call {
                    Call::Launch(_) => launch += 1,
                    Call::Begin => begin += 1,
                    _ => {}
                }
            }
            if current.is_some() {
                skipped.push(
                    "it began and never ended (the profiler stopped inside the capture?)".into(),
                );
            }
        }
        (out, skipped)
    }
}

/// A device event of a replay, as [`ReplayReader`] keeps it.
#[derive(Debug, Clone, Copy)]
struct Device {
    corr: u64,
    ts: f64,
    dur: f64,
    lane: (i64, i64),
    kind: NodeKind,
}

/// Reads a trace for [`graph_ops`]: its graph launches, its device events and its steps.
#[derive(Debug, Default)]
pub struct ReplayReader {
    /// (correlation, start) of each `cudaGraphLaunch`.
    launches: Vec<(u64, f64)>,
    devices: Vec<Device>,
    /// (start, end) of each step annotation ([`is_step_annotation`]).
    steps: Vec<(f64, f64)>,
}

impl EventSink for ReplayReader {
    type Event<'de> = Event<'de>;

    fn event(&mut self, e: Event<'_>, _: &Meta) {
        if e.ph.as_deref() != Some("X") {
            return;
        }
        let Some(ts) = e.ts else { return };
        let cat = e.cat.as_deref().unwrap_or("");
        let name = e.name.as_deref().unwrap_or("");
        let Some(kind) = device_category(cat) else {
            if is_launch_category(cat) && CallKind::of(name) == CallKind::Graph {
                if let Some(c) = e.args().correlation {
                    self.launches.push((c, ts));
                }
            } else if is_step_annotation(cat, name) {
                self.steps.push((ts, ts + e.dur.unwrap_or(0.0)));
            }
            return;
        };
        let args = e.args();
        let Some(corr) = args.correlation else { return };
        let lane = device_lane(&e, &args);
        self.devices.push(Device {
            corr,
            ts,
            dur: e.dur.unwrap_or(0.0),
            lane,
            kind,
        });
    }
}

/// Time per operator inside a trace's CUDA graph replays.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GraphOps {
    /// Graph launches in the trace with device events.
    pub replays: u64,
    /// Those mapped to a capture region.
    pub mapped: u64,
    /// Those not mapped, by reason.
    pub unmapped: Vec<Unmapped>,
    /// Per operator, over the mapped replays, by GPU time, longest first.
    pub ops: Vec<GraphOp>,
    /// The capture regions mapped to, by label (or source where unlabelled; `a | b | …` where
    /// several regions name the same operators): replays each.
    pub captures: Vec<(String, u64)>,
}

/// Replays left unmapped for one reason.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Unmapped {
    /// Why they could not be mapped.
    pub why: String,
    /// How many.
    pub replays: u64,
}

/// One operator's device events inside the mapped replays.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GraphOp {
    /// The operator (innermost CPU op at capture).
    pub op: String,
    /// Its kernels, memcpys and memsets over the mapped replays.
    pub events: u64,
    /// Their summed duration, µs.
    pub total_us: f64,
}

/// Capture labels named in a group before the rest are counted.
const LABELS: usize = 3;

/// The name of the regions a replay was mapped to.
fn label_of(regions: &[&CaptureRegion]) -> String {
    let mut names: Vec<String> = regions
        .iter()
        .map(|r| r.label.clone().unwrap_or_else(|| r.source.clone()))
        .collect();
    names.sort();
    names.dedup();
    if names.len() > LABELS {
        let more = names.len() - LABELS;
        names.truncate(LABELS);
        names.push(format!("{more} more"));
    }
    names.join(" | ")
}

/// Joins a trace's replays with the capture regions (see the module docs).
pub fn graph_ops(map: &CaptureMap, replay: ReplayReader) -> GraphOps {
    let ReplayReader {
        mut launches,
        mut devices,
        steps,
    } = replay;
    launches.sort_unstable_by_key(|l| l.0);
    launches.dedup_by_key(|l| l.0);
    let launch_ts = |corr: u64| -> Option<f64> {
        let i = launches.binary_search_by_key(&corr, |l| l.0).ok()?;
        Some(launches[i].1)
    };
    devices.retain(|d| launch_ts(d.corr).is_some());
    devices.sort_by(|a, b| a.corr.cmp(&b.corr).then(a.ts.total_cmp(&b.ts)));
    let mut out = GraphOps::default();
    let mut unmapped: HashMap<String, u64> = HashMap::new();
    let mut ops: HashMap<&str, (u64, f64)> = HashMap::new();
    let mut captures: HashMap<String, u64> = HashMap::new();
    for replay in devices.chunk_by(|a, b| a.corr == b.corr) {
        out.replays += 1;
        let kinds: Vec<NodeKind> = replay.iter().map(|d| d.kind).collect();
        let launched = launch_ts(replay[0].corr).unwrap_or(f64::NAN);
        let matching: Vec<&CaptureRegion> =
            map.regions.iter().filter(|r| r.kinds == kinds).collect();
        let why =
            if !steps.is_empty() && !steps.iter().any(|(a, b)| *a <= launched && launched <= *b) {
                Err(
                    "launched outside the trace's steps (work after a window is recorded in part)"
                        .into(),
                )
            } else if replay.iter().any(|d| d.lane != replay[0].lane) {
                Err("its device events are on several streams (no launch order to map by)".into())
            } else {
                match matching.as_slice() {
                    [] => Err(format!(
                        "no capture region launched its {} kernels, copies and sets in its order",
                        replay.len()
                    )),
                    [first, rest @ ..] if rest.iter().all(|r| r.ops == first.ops) => Ok(first),
                    _ => Err(format!(
                        "capture regions that match its {} device events name different operators",
                        replay.len()
                    )),
                }
            };
        match why {
            Ok(region) => {
                out.mapped += 1;
                for (d, op) in replay.iter().zip(&region.ops) {
                    let e = ops.entry(op.as_str()).or_default();
                    e.0 += 1;
                    e.1 += d.dur;
                }
                *captures.entry(label_of(&matching)).or_default() += 1;
            }
            Err(why) => *unmapped.entry(why).or_default() += 1,
        }
    }
    out.ops = ops
        .into_iter()
        .map(|(op, (events, total_us))| GraphOp {
            op: op.to_string(),
            events,
            total_us,
        })
        .collect();
    out.ops
        .sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.op.cmp(&b.op)));
    out.unmapped = unmapped
        .into_iter()
        .map(|(why, replays)| Unmapped { why, replays })
        .collect();
    out.unmapped
        .sort_by(|a, b| b.replays.cmp(&a.replays).then(a.why.cmp(&b.why)));
    out.captures = captures.into_iter().collect();
    out.captures.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::EventStream;

    fn read<S: EventSink>(json: &str, mut sink: S) -> S {
        EventStream::new()
            .read_all(json.as_bytes(), &mut sink)
            .expect("a trace");
        sink
    }

    fn x(cat: &str, name: &str, ts: f64, dur: f64, args: &str) -> String {
        format!(
            r#"{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}, "args": {{{args}}}}}"#
        )
    }

    fn capture(ops: &[&str], label: &str) -> String {
        let mut ev = vec![
            x("user_annotation", label, 0.0, 1000.0, ""),
            // Launched before the capture began: not a node.
            x("cpu_op", "aten::fill_", 1.0, 2.0, ""),
            x(
                "cuda_runtime",
                "cudaLaunchKernel",
                1.5,
                0.5,
                r#""correlation": 1"#,
            ),
            x("cuda_runtime", "cudaStreamBeginCapture", 5.0, 1.0, ""),
        ];
        for (i, op) in ops.iter().enumerate() {
            let t = 10.0 + 10.0 * i as f64;
            ev.push(x("cpu_op", op, t, 8.0, ""));
            ev.push(x("cpu_op", "aten::empty", t + 1.0, 1.0, "")); // nested, before the launch
            ev.push(x(
                "cuda_runtime",
                "cudaLaunchKernel",
                t + 4.0,
                1.0,
                r#""correlation": 9"#,
            ));
        }
        ev.push(x("cuda_runtime", "cudaStreamEndCapture", 900.0, 1.0, ""));
        format!(r#"{{"traceEvents": [{}]}}"#, ev.join(","))
    }

    fn replays(kernels_per_replay: &[usize], streams: &[i64]) -> String {
        let mut ev = Vec::new();
        let mut t = 0.0;
        for (r, &n) in kernels_per_replay.iter().enumerate() {
            let corr = 100 + r;
            ev.push(x(
                "cuda_runtime",
                "cudaGraphLaunch",
                t,
                5.0,
                &format!(r#""correlation": {corr}"#),
            ));
            for k in 0..n {
                let stream = streams[k % streams.len()];
                ev.push(x(
                    "kernel",
                    &format!("k{k}"),
                    t + 10.0 + k as f64 * 10.0,
                    (k + 1) as f64,
                    &format!(r#""correlation": {corr}, "device": 0, "stream": {stream}"#),
                ));
            }
            t += 1000.0;
        }
        // A kernel launch outside any graph.
        ev.push(x(
            "cuda_runtime",
            "cudaLaunchKernel",
            t,
            5.0,
            r#""correlation": 7"#,
        ));
        ev.push(x(
            "kernel",
            "eager",
            t + 10.0,
            3.0,
            r#""correlation": 7, "device": 0, "stream": 7"#,
        ));
        format!(r#"{{"traceEvents": [{}]}}"#, ev.join(","))
    }

    #[test]
    fn each_replay_kernel_gets_the_operator_of_its_launch_at_capture() {
        let mut map = CaptureMap::default();
        map.extend(
            read(
                &capture(&["aten::mm", "aten::add", "aten::mm"], "capture_8_FULL"),
                CaptureReader::default(),
            ),
            "c.json",
        );
        assert_eq!(map.regions.len(), 1);
        assert_eq!(map.regions[0].ops, ["aten::mm", "aten::add", "aten::mm"]);
        assert_eq!(map.regions[0].label.as_deref(), Some("capture_8_FULL"));
        assert_eq!(map.regions[0].source, "c.json");
        let got = graph_ops(&map, read(&replays(&[3, 3], &[7]), ReplayReader::default()));
        assert_eq!((got.replays, got.mapped), (2, 2));
        assert!(got.unmapped.is_empty());
        // k0 (1 µs) and k2 (3 µs) from aten::mm in each of two replays; k1 (2 µs) from add.
        let mm = GraphOp {
            op: "aten::mm".into(),
            events: 4,
            total_us: 8.0,
        };
        assert_eq!(got.ops[0], mm);
        assert_eq!(got.ops[1].op, "aten::add");
        assert_eq!((got.ops[1].events, got.ops[1].total_us), (2, 4.0));
        assert_eq!(got.captures, vec![("capture_8_FULL".to_string(), 2)]);
    }

    fn map_of(traces: &[String]) -> CaptureMap {
        let mut map = CaptureMap::default();
        for (i, t) in traces.iter().enumerate() {
            map.extend(read(t, CaptureReader::default()), &format!("t{i}"));
        }
        map
    }

    #[test]
    fn a_replay_is_left_unmapped_when_the_map_is_not_certain() {
        let map = map_of(&[
            capture(&["aten::mm", "aten::add"], "capture_8_FULL"),
            capture(&["aten::add", "aten::mm"], "capture_16_FULL"),
        ]);
        // Two regions of two launches naming different operators; none of three.
        let got = graph_ops(&map, read(&replays(&[2, 3], &[7]), ReplayReader::default()));
        assert_eq!((got.replays, got.mapped), (2, 0));
        let whys: Vec<&str> = got.unmapped.iter().map(|u| u.why.as_str()).collect();
        assert!(
            whys.contains(
                &"capture regions that match its 2 device events name different operators"
            ),
            "{whys:?}"
        );
        assert!(
            whys.contains(
                &"no capture region launched its 3 kernels, copies and sets in its order"
            ),
            "{whys:?}"
        );
        // Several streams: no order.
        let one = map_of(&[capture(&["aten::mm", "aten::add"], "c")]);
        let got = graph_ops(&one, read(&replays(&[2], &[7, 8]), ReplayReader::default()));
        assert_eq!(got.mapped, 0);
        assert!(got.unmapped[0].why.contains("several streams"));
        assert!(got.ops.is_empty());
    }

    #[test]
    fn regions_naming_the_same_operators_map_as_one_group() {
        let map = map_of(&[
            capture(&["aten::mm", "aten::add"], "capture_8_FULL"),
            capture(&["aten::mm", "aten::add"], "capture_16_FULL"),
        ]);
        let got = graph_ops(&map, read(&replays(&[2, 2], &[7]), ReplayReader::default()));
        assert_eq!(got.mapped, 2);
        assert_eq!(
            got.captures,
            vec![("capture_16_FULL | capture_8_FULL".to_string(), 2)]
        );
    }

    #[test]
    fn a_memcpy_node_must_meet_a_memcpy() {
        // The capture launched a kernel then a copy; a replay of two kernels is another graph.
        let json = capture(&["aten::mm", "aten::copy_"], "c").replace(
            r#""name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 24"#,
            r#""name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": 24"#,
        );
        let map = map_of(&[json]);
        assert_eq!(map.regions[0].kinds, [NodeKind::Kernel, NodeKind::Memcpy]);
        let got = graph_ops(&map, read(&replays(&[2], &[7]), ReplayReader::default()));
        assert_eq!(got.mapped, 0);
    }

    fn calls(list: &[(&str, f64)]) -> String {
        let mut ev = vec![x("user_annotation", "capture_4_FULL", 0.0, 1000.0, "")];
        for (i, (name, ts)) in list.iter().enumerate() {
            ev.push(x("cpu_op", &format!("op{i}"), *ts - 0.5, 2.0, ""));
            ev.push(x("cuda_runtime", name, *ts, 0.5, r#""correlation": 1"#));
        }
        format!(r#"{{"traceEvents": [{}]}}"#, ev.join(","))
    }

    #[test]
    fn a_capture_that_cannot_be_mapped_by_order_is_left_out_saying_why() {
        let begin = "cudaStreamBeginCapture";
        let end = "cudaStreamEndCapture";
        let k = "cudaLaunchKernel";
        let cases = [
            (
                calls(&[
                    (begin, 1.0),
                    (k, 2.0),
                    (begin, 3.0),
                    (k, 4.0),
                    (end, 5.0),
                    (end, 6.0),
                ]),
                "a capture began inside another",
            ),
            (calls(&[(begin, 1.0), (k, 2.0)]), "never ended"),
            (
                calls(&[(begin, 1.0), (k, 2.0), ("cudaGraphLaunch", 3.0), (end, 4.0)]),
                "child graph",
            ),
            (
                calls(&[
                    (begin, 1.0),
                    ("cudaStreamWaitEvent", 2.0),
                    (k, 3.0),
                    (end, 4.0),
                ]),
                "another stream's event",
            ),
        ];
        for (json, why) in cases {
            let map = map_of(&[json]);
            assert!(map.regions.is_empty(), "{why}: {map:?}");
            assert_eq!(map.skipped.len(), 1, "{why}");
            assert!(map.skipped[0].1.contains(why), "{:?}", map.skipped);
        }
    }

    #[test]
    fn a_driver_launch_inside_a_runtime_launch_is_one_node() {
        let mut json = capture(&["aten::mm"], "c");
        json = json.replace(
            r#"{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamEndCapture""#,
            r#"{"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 1, "ts": 14.5, "dur": 0.1, "args": {}},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamEndCapture""#,
        );
        assert!(json.contains("cuLaunchKernel"));
        let map = map_of(&[json]);
        assert_eq!(map.regions[0].ops, ["aten::mm"]);
    }

    #[test]
    fn a_replay_launched_outside_the_steps_is_not_mapped() {
        let map = map_of(&[capture(&["aten::mm", "aten::add"], "c")]);
        // One step around the first replay's launch only.
        let trace = replays(&[2, 2], &[7]).replace(
            r#"{"traceEvents": ["#,
            r#"{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_2(2)", "pid": 1, "tid": 1, "ts": 0, "dur": 100, "args": {}},"#,
        );
        let got = graph_ops(&map, read(&trace, ReplayReader::default()));
        assert_eq!((got.replays, got.mapped), (2, 1));
        assert!(got.unmapped[0]
            .why
            .starts_with("launched outside the trace's steps"));
    }
}
