//! The summary of one trace as it is serialized: what a trace's devices and CPU did, per
//! kernel, per operator, per iteration — the summary a worker writes into each capture's
//! manifest and `stepscope analyze` prints. [`Summarizer`](super::Summarizer) computes it.

use serde::{Deserialize, Serialize};

use super::event::DeviceProperties;
use super::floor::{peaks, Cost, Floor, PeakOverride, Peaks};
use super::gpu_time::{GpuTime, KernelKind, StreamIdle};
use super::header::{StepWork, Trigger};
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
    /// What the profiler recorded after the capture stopped, left out of every figure above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_stop: Option<AfterStop>,
}

/// Device work launched after a capture stopped: the engine thread only detaches the session
/// at the stop (so that it never waits), and CUPTI records until the writer thread stops it,
/// so the next step's launches and some of their kernels reach the trace. A stepscope trace's
/// header says when the capture stopped (`stop_unix_ns`); what was launched after it is left
/// out of the summary and counted here.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AfterStop {
    /// Runtime calls (launches, copies, synchronizations) begun after the stop.
    pub runtime_calls: u64,
    /// Kernels, memcpys and memsets they launched.
    pub device_events: u64,
    /// Those events' summed duration, µs.
    pub device_us: f64,
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
        // A step that scheduled nothing ran no forward: it has no floor.
        fn worked(s: &Step) -> Option<&StepWork> {
            s.work.as_ref().filter(|w| w.tokens() > 0)
        }
        let with_work = self.steps.iter().filter(|s| worked(s).is_some()).count();
        let no_work = "no step carries its work (the tokens and context lengths stepscope's \
                       plugins record, or vLLM's detailed_trace_annotation names), or every \
                       step scheduled nothing";
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
                    if let Some(w) = worked(s) {
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
