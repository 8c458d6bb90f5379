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
//! trace's graph launches and device events; [`graph_ops`] joins them into [`GraphOps`]: time
//! per operator inside the replays. A replay is mapped only when that is unambiguous: its
//! device events on one stream, and every capture region with as many launches naming the
//! same operators in the same order. Otherwise it is counted as unmapped with the reason.
//!
//! Checked on a real H100 capture and replay (`cli/tests/graphs.rs`): each replay's kernels in
//! time order equal, name by name, the kernels an eager run of the same code launched from the
//! same operators.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::event::{Event, Id, Meta};
use super::explain::CallKind;
use super::stream::EventSink;

/// One capture region: the operator of each launch, in launch order.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureRegion {
    /// The innermost annotation around `cudaStreamBeginCapture` (vLLM's
    /// `capture_{batch}_{mode}`), if any.
    pub label: Option<String>,
    /// The trace it came from.
    pub source: String,
    /// Per launch, its innermost CPU operator (`?` where none encloses it).
    pub ops: Vec<String>,
}

/// Every capture region read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaptureMap {
    /// In the order read: per trace, per thread, in time order.
    pub regions: Vec<CaptureRegion>,
}

impl CaptureMap {
    /// Adds what one capture trace held.
    pub fn extend(&mut self, reader: CaptureReader, source: &str) {
        self.regions.extend(reader.regions(source));
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
    Launch,
}

/// Reads a capture trace: its runtime calls, CPU operators and annotations, per thread.
#[derive(Debug, Default)]
pub struct CaptureReader {
    calls: HashMap<String, Vec<(f64, Call)>>,
    ops: HashMap<String, Vec<Span>>,
    annotations: HashMap<String, Vec<Span>>,
}

fn thread_key(e: &Event<'_>) -> String {
    let id = |i: &Option<Id<'_>>| match i {
        Some(Id::Num(n)) => n.to_string(),
        Some(Id::Str(s)) => s.to_string(),
        None => String::new(),
    };
    format!("{}/{}", id(&e.pid), id(&e.tid))
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
            "cuda_runtime" | "cuda_driver" => {
                let call = if name.contains("BeginCapture") {
                    Call::Begin
                } else if name.contains("EndCapture") {
                    Call::End
                } else if matches!(CallKind::of(name), CallKind::Kernel | CallKind::AsyncCopy) {
                    Call::Launch
                } else {
                    return;
                };
                self.calls
                    .entry(thread_key(&e))
                    .or_default()
                    .push((ts, call));
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
                to.entry(thread_key(&e)).or_default().push(span);
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

impl CaptureReader {
    /// The capture regions, in time order per thread.
    fn regions(mut self, source: &str) -> Vec<CaptureRegion> {
        let mut out = Vec::new();
        let mut threads: Vec<String> = self.calls.keys().cloned().collect();
        threads.sort();
        for thread in threads {
            let Some(mut calls) = self.calls.remove(&thread) else {
                continue;
            };
            calls.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut ops = self.ops.remove(&thread).unwrap_or_default();
            let mut annotations = self.annotations.remove(&thread).unwrap_or_default();
            let launch_times: Vec<f64> = calls
                .iter()
                .filter(|c| c.1 == Call::Launch)
                .map(|c| c.0)
                .collect();
            let begin_times: Vec<f64> = calls
                .iter()
                .filter(|c| c.1 == Call::Begin)
                .map(|c| c.0)
                .collect();
            let op_names: Vec<String> = innermost(&mut ops, &launch_times)
                .into_iter()
                .map(|o| o.unwrap_or("?").to_string())
                .collect();
            let labels: Vec<Option<String>> = innermost(&mut annotations, &begin_times)
                .into_iter()
                .map(|a| a.map(str::to_string))
                .collect();
            let (mut launch, mut begin) = (0, 0);
            let mut current: Option<CaptureRegion> = None;
            for (_, call) in calls {
                match call {
                    Call::Begin => {
                        current = Some(CaptureRegion {
                            label: labels.get(begin).cloned().flatten(),
                            source: source.to_string(),
                            ops: Vec::new(),
                        });
                        begin += 1;
                    }
                    Call::Launch => {
                        if let (Some(r), Some(op)) = (current.as_mut(), op_names.get(launch)) {
                            r.ops.push(op.clone());
                        }
                        launch += 1;
                    }
                    Call::End => out.extend(current.take()),
                }
            }
        }
        out
    }
}

/// A device event of a replay, as [`ReplayReader`] keeps it.
#[derive(Debug, Clone, Copy)]
struct Device {
    corr: u64,
    ts: f64,
    dur: f64,
    lane: (i64, i64),
}

/// Reads a trace for [`graph_ops`]: its graph launches and its device events.
#[derive(Debug, Default)]
pub struct ReplayReader {
    launches: Vec<u64>,
    devices: Vec<Device>,
}

impl EventSink for ReplayReader {
    type Event<'de> = Event<'de>;

    fn event(&mut self, e: Event<'_>, _: &Meta) {
        if e.ph.as_deref() != Some("X") {
            return;
        }
        let cat = e.cat.as_deref().unwrap_or("");
        let name = e.name.as_deref().unwrap_or("");
        match cat {
            "cuda_runtime" | "cuda_driver" if CallKind::of(name) == CallKind::Graph => {
                if let Some(c) = e.args().correlation {
                    self.launches.push(c);
                }
            }
            "kernel" | "gpu_memcpy" | "gpu_memset" => {
                let args = e.args();
                let (Some(corr), Some(ts)) = (args.correlation, e.ts) else {
                    return;
                };
                let lane = (
                    args.device.map_or(-1, |d| d as i64),
                    args.stream.map_or(-1, |s| s as i64),
                );
                self.devices.push(Device {
                    corr,
                    ts,
                    dur: e.dur.unwrap_or(0.0),
                    lane,
                });
            }
            _ => {}
        }
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
    /// The capture regions mapped to, by label (or source where unlabelled): replays each.
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

/// Joins a trace's replays with the capture regions (see the module docs).
pub fn graph_ops(map: &CaptureMap, replay: ReplayReader) -> GraphOps {
    let ReplayReader {
        mut launches,
        mut devices,
    } = replay;
    launches.sort_unstable();
    launches.dedup();
    devices.retain(|d| launches.binary_search(&d.corr).is_ok());
    devices.sort_by(|a, b| a.corr.cmp(&b.corr).then(a.ts.total_cmp(&b.ts)));
    let mut by_len: HashMap<usize, Vec<&CaptureRegion>> = HashMap::new();
    for r in &map.regions {
        by_len.entry(r.ops.len()).or_default().push(r);
    }
    let mut out = GraphOps::default();
    let mut unmapped: HashMap<String, u64> = HashMap::new();
    let mut ops: HashMap<&str, (u64, f64)> = HashMap::new();
    let mut captures: HashMap<String, u64> = HashMap::new();
    for replay in devices.chunk_by(|a, b| a.corr == b.corr) {
        out.replays += 1;
        let why = if replay.iter().any(|d| d.lane != replay[0].lane) {
            Err("its device events are on several streams (no launch order to map by)".into())
        } else {
            match by_len.get(&replay.len()).map(Vec::as_slice) {
                None | Some([]) => Err(format!("no capture region has {} launches", replay.len())),
                Some([first, rest @ ..]) if rest.iter().all(|r| r.ops == first.ops) => Ok(*first),
                Some(_) => Err(format!(
                    "capture regions with {} launches name different operators",
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
                let label = region
                    .label
                    .clone()
                    .unwrap_or_else(|| region.source.clone());
                *captures.entry(label).or_default() += 1;
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
        let got = graph_ops(&map, read(&replays(&[3, 3], &[7]), ReplayReader::default()));
        assert_eq!((got.replays, got.mapped), (2, 2));
        assert!(got.unmapped.is_empty());
        // k0 (1 µs) and k2 (3 µs) from aten::mm in each of two replays; k1 (2 µs) from add.
        assert_eq!(
            got.ops[0],
            GraphOp {
                op: "aten::mm".into(),
                events: 4,
                total_us: 8.0
            }
        );
        assert_eq!(
            got.ops[1],
            GraphOp {
                op: "aten::add".into(),
                events: 2,
                total_us: 4.0
            }
        );
        assert_eq!(got.captures, vec![("capture_8_FULL".to_string(), 2)]);
    }

    #[test]
    fn a_replay_is_left_unmapped_when_the_map_is_not_certain() {
        let mut map = CaptureMap::default();
        map.extend(
            read(
                &capture(&["aten::mm", "aten::add"], "capture_8_FULL"),
                CaptureReader::default(),
            ),
            "a",
        );
        map.extend(
            read(
                &capture(&["aten::add", "aten::mm"], "capture_16_FULL"),
                CaptureReader::default(),
            ),
            "b",
        );
        // Two regions of two launches naming different operators; none of three.
        let got = graph_ops(&map, read(&replays(&[2, 3], &[7]), ReplayReader::default()));
        assert_eq!((got.replays, got.mapped), (2, 0));
        let whys: Vec<&str> = got.unmapped.iter().map(|u| u.why.as_str()).collect();
        assert!(
            whys.contains(&"capture regions with 2 launches name different operators"),
            "{whys:?}"
        );
        assert!(
            whys.contains(&"no capture region has 3 launches"),
            "{whys:?}"
        );
        // Several streams: no order.
        let mut one = CaptureMap::default();
        one.extend(
            read(
                &capture(&["aten::mm", "aten::add"], "c"),
                CaptureReader::default(),
            ),
            "a",
        );
        let got = graph_ops(&one, read(&replays(&[2], &[7, 8]), ReplayReader::default()));
        assert_eq!(got.mapped, 0);
        assert!(got.unmapped[0].why.contains("several streams"));
        assert!(got.ops.is_empty());
    }
}
