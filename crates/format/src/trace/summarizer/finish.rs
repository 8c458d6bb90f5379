//! What [`Summarizer::finish`] computes from the sink's state: the summary's figures, each
//! step's (its kernels, CPU operator time, explanation), and on request the per-name
//! [`Breakdown`].

use std::collections::HashMap;

use super::{Acc, Summarizer, ANNOTATION};
use crate::trace::breakdown::{Breakdown, NameCategory, NameTime};
use crate::trace::event::Meta;
use crate::trace::explain::{explain, launch_of, DeviceOp, Explained, Inputs, OpClass, NO_NAME};
use crate::trace::floor::PeakOverride;
use crate::trace::gpu_time::{KernelKind, LaunchStats};
use crate::trace::header::{StepRequests, StepWork};
use crate::trace::summary::{AfterStop, Gap, KernelStat, Kernels, OpStat, Split, Step, Summary};

/// Idle gaps listed.
const GAPS: usize = 5;

/// The kernel table (by name id) and the copy totals of a trace's device events.
#[derive(Default)]
struct Totals {
    kernels: Vec<Acc>,
    kernel_count: u64,
    kernel_total: f64,
    memcpy_count: u64,
    memset_count: u64,
    /// Memcpy and memset time: the kernels' kinds come from their names.
    copy_us: f64,
}

impl Totals {
    /// Counted from `ops`, with a row for each of `names` kernel names.
    fn of(ops: &[DeviceOp], names: usize) -> Self {
        let mut t = Totals {
            kernels: vec![Acc::default(); names],
            ..Totals::default()
        };
        for op in ops {
            let dur = op.end - op.ts;
            if let Some(a) = t.kernels.get_mut(op.name as usize) {
                t.kernel_count += 1;
                t.kernel_total += dur;
                a.add(dur);
            } else {
                if op.class == OpClass::Memset {
                    t.memset_count += 1;
                } else {
                    t.memcpy_count += 1;
                }
                t.copy_us += dur;
            }
        }
        t
    }
}

impl Summarizer {
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
        // Sorted by correlation, file order kept among equals: the last launch of an id wins.
        self.launches.sort_by_key(|l| l.corr);
        let after_stop = self.leave_out_after_stop(&meta);
        let totals = Totals::of(&self.device_ops, self.kernel_names.names.len());
        let (first, span) = if self.first > self.last {
            (0.0, 0.0)
        } else {
            (self.first, self.last - self.first)
        };
        let (steps, explained) = self.steps(&meta, first, breakdown);
        let busy = explained.trace.busy_us;
        let devices = explained.devices;
        let gaps = self.gaps(explained.gaps, first);
        // A name whose every event was left out (launched after the stop) has no row.
        let mut kernels: Vec<KernelStat> = totals
            .kernels
            .iter()
            .enumerate()
            .filter(|(_, a)| a.count > 0)
            .map(|(id, a)| {
                let name = self.kernel_names.get(id as u32);
                KernelStat {
                    kind: self
                        .kernel_kinds
                        .get(id)
                        .copied()
                        .unwrap_or_else(|| KernelKind::of(name)),
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
            memory_us: totals.copy_us,
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
                count: totals.kernel_count,
                total_us: totals.kernel_total,
                by_name: kernels,
            },
            split,
            memcpy_count: totals.memcpy_count,
            memset_count: totals.memset_count,
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
            after_stop,
        };
        summary.apply_floor(PeakOverride::default());
        summary.keep_top(top);
        summary
    }

    /// Leaves out what was launched after the capture stopped (the header's `stop_unix_ns`,
    /// placed on the trace's clock by `baseTimeNanoseconds`): those runtime calls and the device
    /// events they launched (the kernel and copy totals are counted after, from the rest); the span
    /// ends at the last of what is kept. `None` when the trace does not say when it stopped,
    /// or nothing was launched after.
    fn leave_out_after_stop(&mut self, meta: &Meta) -> Option<AfterStop> {
        let (Some(stop_ns), Some(base_ns), Some(base)) =
            (meta.stepscope.stop_unix_ns, meta.base_time_ns, self.base)
        else {
            return None;
        };
        // The stop on this summary's clock: µs after `base`, the trace's first whole µs.
        let on_trace = i128::from(stop_ns) - i128::from(base_ns);
        let stop = (on_trace.div_euclid(1000) - i128::from(base)) as f64
            + on_trace.rem_euclid(1000) as f64 / 1000.0;
        let mut late: Vec<u64> = self
            .launches
            .iter()
            .filter(|l| l.ts > stop)
            .map(|l| l.corr)
            .collect();
        if late.is_empty() {
            return None;
        }
        late.sort_unstable();
        late.dedup();
        let is_late = |corr: u64| late.binary_search(&corr).is_ok();
        let mut out = AfterStop {
            runtime_calls: late.len() as u64,
            ..AfterStop::default()
        };
        self.device_ops.retain(|op| {
            let gone = is_late(op.corr);
            if gone {
                out.device_events += 1;
                out.device_us += op.end - op.ts;
            }
            !gone
        });
        self.launches.retain(|l| !is_late(l.corr));
        let kept_end = self
            .device_ops
            .iter()
            .map(|op| op.end)
            .fold(f64::NEG_INFINITY, f64::max);
        self.last = self.last.min(stop.max(kept_end));
        Some(out)
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
    fn what_was_launched_after_the_stop_is_left_out_and_counted() {
        // The stop at 1,000,000,150 µs of Unix time; the trace's clock starts at 1,000,000,000:
        // ts 150. A step launched a kernel (running past the stop: kept); the next step's
        // launch at 180 made a kernel and a memcpy (written before their launch: left out).
        let json = |header: &str| {
            format!(
                r#"{{"stepscope": {{"iterations": 1{header}}}, "baseTimeNanoseconds": 1000000000000000,
            "traceEvents": [
            {{"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)", "ts": 0, "dur": 100, "pid": 1, "tid": 1}},
            {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 30, "dur": 2, "pid": 1, "tid": 1, "args": {{"correlation": 1}}}},
            {{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 50, "dur": 140, "pid": 0, "tid": 7, "args": {{"correlation": 1, "device": 0, "stream": 7}}}},
            {{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 200, "dur": 40, "pid": 0, "tid": 7, "args": {{"correlation": 2, "device": 0, "stream": 7}}}},
            {{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 240, "dur": 5, "pid": 0, "tid": 7, "args": {{"correlation": 3, "device": 0, "stream": 7}}}},
            {{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 180, "dur": 2, "pid": 1, "tid": 1, "args": {{"correlation": 2}}}},
            {{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 185, "dur": 2, "pid": 1, "tid": 1, "args": {{"correlation": 3}}}}
            ]}}"#
            )
        };
        let (kept, _) = summarize(&json(r#", "stop_unix_ns": 1000000000150000"#));
        assert_eq!(
            kept.after_stop,
            Some(AfterStop {
                runtime_calls: 2,
                device_events: 2,
                device_us: 45.0
            })
        );
        assert_eq!((kept.kernels.count, kept.kernels.total_us), (1, 140.0));
        assert_eq!(kept.kernels.by_name[0].count, 1);
        assert_eq!((kept.memcpy_count, kept.split.memory_us), (0, 0.0));
        assert_eq!(kept.gpu_busy_us, 140.0);
        assert_eq!(kept.span_us, 190.0); // to the kept kernel's end, past the stop
                                         // Without the stop in the header, all of it counts.
        let (all, _) = summarize(&json(""));
        assert_eq!(all.after_stop, None);
        assert_eq!((all.kernels.count, all.memcpy_count), (2, 1));
        assert_eq!(all.gpu_busy_us, 185.0);
    }

    #[test]
    fn a_kernel_name_seen_only_after_the_stop_has_no_row() {
        let json = r#"{"stepscope": {"iterations": 1, "stop_unix_ns": 1000000000150000},
            "baseTimeNanoseconds": 1000000000000000, "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 30, "dur": 2, "pid": 1, "tid": 1, "args": {"correlation": 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 50, "dur": 40, "pid": 0, "tid": 7, "args": {"correlation": 1, "device": 0, "stream": 7}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 180, "dur": 2, "pid": 1, "tid": 1, "args": {"correlation": 2}},
            {"ph": "X", "cat": "kernel", "name": "next_steps_only", "ts": 190, "dur": 10, "pid": 0, "tid": 7, "args": {"correlation": 2, "device": 0, "stream": 7}}
            ]}"#;
        let (s, _) = summarize(json);
        let names: Vec<&str> = s.kernels.by_name.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["gemm"]);
        assert_eq!(s.after_stop.map(|a| a.device_events), Some(1));
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
