//! The config's types, with vLLM's defaults, and the schedule's policy built from them.

use std::time::Duration;

use serde::Serialize;

use crate::iteration::Stage;
use crate::schedule::{stage_bit, Budget, Policy, SlowStep, ALL_STAGES};

/// The environment variable read by [`ProfilerConfig::from_env`]: JSON text, or a path to a
/// JSON file.
pub const CONFIG_ENV: &str = "STEPSCOPE_CONFIG";

/// Which backend captures the selected iterations (vLLM's `profiler` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfilerKind {
    /// PyTorch's Kineto profiler: Chrome/Perfetto traces in `torch_profiler_dir`.
    Torch,
    /// The CUDA profiler API (`cuProfilerStart`/`cuProfilerStop`), for
    /// `nsys profile --capture-range=cudaProfilerApi`.
    Cuda,
}

impl ProfilerKind {
    /// The name used in the config and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ProfilerKind::Torch => "torch",
            ProfilerKind::Cuda => "cuda",
        }
    }
}

/// An activity the torch profiler records (vLLM's `torch_profiler_activities` entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TorchActivity {
    /// CPU operators.
    #[serde(rename = "CPU")]
    Cpu,
    /// CUDA kernels, memcpys and memsets (through CUPTI).
    #[serde(rename = "CUDA")]
    Cuda,
    /// Intel GPU activity.
    #[serde(rename = "XPU")]
    Xpu,
    /// A PrivateUse1 out-of-tree device.
    #[serde(rename = "PrivateUse1")]
    PrivateUse1,
}

impl TorchActivity {
    pub(super) const ALL: [(&'static str, TorchActivity); 4] = [
        ("CPU", TorchActivity::Cpu),
        ("CUDA", TorchActivity::Cuda),
        ("PrivateUse1", TorchActivity::PrivateUse1),
        ("XPU", TorchActivity::Xpu),
    ];
}

/// When iterations get an NVTX range (`"stepscope": {"nvtx": ...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NvtxMode {
    /// While the profiler is running (captured iterations only).
    #[default]
    Running,
    /// Every iteration, for NVTX-only users (an nsys run of the whole process).
    Always,
    /// Never.
    Off,
}

/// When a stop's caller gets the answer (`"stepscope": {"stop_returns": ...}`), in the engine
/// plugins that wait for it (the library's own `stop()` always returns at once; a caller waits
/// with `flush` or `writes_since`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReturns {
    /// Once every trace the stop ended is on disk (`complete`) or has failed, bounded by
    /// `flush_timeout_s`: the contract of vLLM's own profiler. The engine keeps serving while
    /// the caller waits.
    #[default]
    Written,
    /// At once; the traces follow (their manifests say `writing` until they are in place).
    AtOnce,
}

/// Who writes a torch capture's JSON (`"stepscope": {"serializer": ...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Serializer {
    /// stepscope's: the plain bulk of the events (CPU ops, Python frames, CUDA runtime and
    /// driver calls, kernels, copies, sets) written by stepscope, the rest by Kineto's own
    /// writer, spliced into one trace of the same events and fields.
    #[default]
    Stepscope,
    /// Kineto's own writer alone (torch's `export_chrome_trace`).
    Kineto,
    /// stepscope's, and Kineto's own of the same capture beside it as `{stem}.kineto.json`
    /// (uncompressed), to compare the two.
    Compare,
}

/// stepscope's own settings: the `"stepscope": {...}` object of the config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StepscopeConfig {
    /// NVTX domain of the iteration ranges and capture marks (default `"stepscope"`).
    pub nvtx_domain: String,
    /// When iterations get an NVTX range (default: while running).
    pub nvtx: NvtxMode,
    /// CUDA device whose primary context the `cuda` profiler makes current when the engine
    /// thread has none. `None`: the worker's local rank.
    pub cuda_device: Option<u32>,
    /// How long dropping a profiler waits for traces still being written
    /// (`flush_timeout_s`, default 600 s). Unfinished traces are marked in their manifests.
    #[serde(rename = "flush_timeout_s", serialize_with = "seconds")]
    pub flush_timeout: Duration,
    /// When the engine plugins answer a stop (default: once its traces are written).
    pub stop_returns: StopReturns,
    /// The gzip level of `.json.gz` traces, 1 (fastest) to 9 (smallest); default
    /// [`GZIP_LEVEL`].
    pub gzip_level: u32,
    /// Who writes a torch capture's JSON; default [`Serializer::Stepscope`].
    pub serializer: Serializer,
    /// torch.profiler's `with_modules` (module hierarchy in the trace; TorchScript models
    /// only), which vLLM's config has no field for: set by `profiler_kwargs` through the
    /// Python package, or here. Default false.
    pub torch_with_modules: bool,
    /// Capture control beyond vLLM's delay and max; all absent by default, which keeps
    /// vLLM's semantics exact.
    #[serde(flatten)]
    pub capture: CaptureControl,
    /// Captured iterations carry the ids of the requests they served (in the trace and the
    /// manifest); engines pass them to `step()` only while this is on. Default false.
    pub request_ids: bool,
    /// What one capture may cost the process: memory (its own, and that of the captures still
    /// waiting to be written), time, disk. On by default: a capture never takes the engine
    /// down.
    #[serde(flatten)]
    pub budget: CaptureBudget,
    /// The step timeline's size in steps (`timeline`: `true` for [`TIMELINE_STEPS`], or
    /// `{"steps": N}`); `None` (the default) keeps none, so that an idle `step()` stays one
    /// relaxed load.
    #[serde(serialize_with = "timeline")]
    pub timeline: Option<usize>,
    /// The request log's sizes (`requests`: `true` for [`REQUEST_LOG_SIZE`], or
    /// `{"requests": N, "steps": M}`): each request's lifecycle and the engine steps it
    /// waited through, kept by the engine plugins' scheduler hooks; `None` (the default) keeps
    /// none.
    #[serde(serialize_with = "request_log")]
    pub requests: Option<RequestLogSize>,
    /// Each finished request's engine steps as OpenTelemetry spans (`otel`: `true` for the
    /// defaults of [`OtelExport`], or an object of its fields), built from the request log
    /// (which it needs) and exported off the engine's thread; `None` (the default) exports
    /// none.
    pub otel: Option<OtelExport>,
}

/// `stepscope.otel`: where and how the engine plugins export request spans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtelExport {
    /// The OTLP traces endpoint (`http://host:4317` for gRPC, `.../v1/traces` for
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`); `None`: the engine's own
    /// (`--otlp-traces-endpoint`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    pub endpoint: Option<String>,
    /// One span per engine step too, linked from the requests' spans (default false).
    pub steps: bool,
    /// Finished requests waiting to be exported, at most; what does not fit is dropped and
    /// counted (default [`OTEL_QUEUE`]).
    pub queue: usize,
    /// Requests built and exported together, at most (default [`OTEL_BATCH`]).
    pub batch: usize,
    /// A request's costliest steps named on its span (default [`OTEL_COSTLIEST`]).
    pub costliest: usize,
}

/// `stepscope.otel.queue`'s default.
pub const OTEL_QUEUE: usize = 1024;
/// `stepscope.otel.batch`'s default.
pub const OTEL_BATCH: usize = 64;
/// `stepscope.otel.costliest`'s default: the span builder's.
pub const OTEL_COSTLIEST: usize = stepscope_format::requests::COSTLIEST;

impl Default for OtelExport {
    fn default() -> Self {
        OtelExport {
            endpoint: None,
            steps: false,
            queue: OTEL_QUEUE,
            batch: OTEL_BATCH,
            costliest: OTEL_COSTLIEST,
        }
    }
}

/// How many requests and engine steps a request log keeps (`stepscope.requests`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestLogSize {
    /// Requests, the latest kept (rounded up to a power of two).
    pub requests: usize,
    /// Engine steps, the latest kept (rounded up to a power of two).
    pub steps: usize,
}

/// The request log's size when `stepscope.requests` is `true`.
pub const REQUEST_LOG_SIZE: RequestLogSize = RequestLogSize {
    requests: 4096,
    steps: 4096,
};

/// The fewest and most requests, or steps, a request log may keep.
pub const REQUEST_LOG_RANGE: (usize, usize) = (16, 1 << 20);

fn request_log<S: serde::Serializer>(
    size: &Option<RequestLogSize>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match size {
        None => s.serialize_bool(false),
        Some(size) => size.serialize(s),
    }
}

/// The timeline's size when `stepscope.timeline` is `true`.
pub const TIMELINE_STEPS: usize = 4096;

/// The fewest and most steps a timeline may keep (`stepscope.steps`).
pub const TIMELINE_STEPS_RANGE: (usize, usize) = (16, 1 << 20);

fn timeline<S: serde::Serializer>(
    steps: &Option<usize>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    match steps {
        None => s.serialize_bool(false),
        Some(n) => {
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry("steps", n)?;
            m.end()
        }
    }
}

/// What one capture window may cost before it ends itself, or is not begun
/// (`"stepscope": {"max_capture_mb", "max_capture_s", "min_free_disk_mb"}`). A window that
/// goes over `max_capture_mb` or `max_capture_s` ends at the next step boundary through the
/// full stop (its trace is written as usual and says it was cut short); 0 turns either off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CaptureBudget {
    /// What one capture may cost the process, MB: its growth over the window times what torch
    /// needs to write it ([`ProfilerConfig::capture_budget`]); also what the captures still
    /// waiting to be written may hold before a new window is refused.
    /// Default: an eighth of the memory the process may use (the machine's, or its cgroup's
    /// limit when lower), at least 256 MB and at most 2048 MB
    /// ([`CaptureBudget::default_max_capture_mb`]).
    pub max_capture_mb: u64,
    /// How long a window may run (`max_capture_s`, default 300 s).
    #[serde(rename = "max_capture_s", serialize_with = "seconds")]
    pub max_capture: Duration,
    /// A window is not begun while the trace directory has less free space than this, MB
    /// (default 1024; 0: no check). Backends that write no files ignore it.
    pub min_free_disk_mb: u64,
}

impl CaptureBudget {
    /// The default of `max_capture_mb` on this machine: an eighth of the memory the process may
    /// use, clamped to 256..=2048 MB (2048 where the memory cannot be read). An eighth leaves
    /// the engine its own memory on a loaded worker; 2 GB holds minutes of a Kineto capture
    /// with stacks (about 160 MB/s measured on a CPU engine), far more than the few iterations
    /// a window is for.
    pub fn default_max_capture_mb() -> u64 {
        crate::sys::usable_memory()
            .map_or(2048, |b| (b >> 20) / 8)
            .clamp(256, 2048)
    }
}

/// The writer's expansion the budget assumes for Kineto captures with Python stacks: torch
/// makes an event of every Python call when it finalizes the capture (74x the window's growth
/// measured for a Python-heavy loop with torch 2.13 on CPU, `scripts/bench_capture_budget.py`).
pub const EXPANSION_TORCH_STACKS: u64 = 80;
/// ... and for Kineto captures without Python stacks (8.4x measured for operators alone).
pub const EXPANSION_TORCH: u64 = 10;

impl ProfilerConfig {
    /// The schedule's budget of this config: the memory and time limits, and the expansion
    /// from a window's growth to what its trace needs to be written (1 for the CUDA profiler
    /// API, whose tool keeps its buffers).
    pub fn capture_budget(&self) -> Budget {
        let b = &self.stepscope.budget;
        Budget {
            max_growth_bytes: b.max_capture_mb.saturating_mul(1 << 20),
            max_age_ns: u64::try_from(b.max_capture.as_nanos()).unwrap_or(u64::MAX),
            expansion: match self.profiler {
                Some(ProfilerKind::Torch) if self.torch_profiler_with_stack => {
                    EXPANSION_TORCH_STACKS
                }
                Some(ProfilerKind::Torch) => EXPANSION_TORCH,
                Some(ProfilerKind::Cuda) | None => 1,
            },
        }
    }
}

impl Default for CaptureBudget {
    fn default() -> Self {
        CaptureBudget {
            max_capture_mb: Self::default_max_capture_mb(),
            max_capture: Duration::from_secs(300),
            min_free_disk_mb: 1024,
        }
    }
}

/// A positive, finite factor (`stepscope.slow_step_factor`): never NaN, so equality is total.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
#[serde(transparent)]
pub struct Factor(f64);

impl Eq for Factor {}

impl Factor {
    /// `value` when it is finite and greater than 1.
    pub fn new(value: f64) -> Option<Factor> {
        (value.is_finite() && value > 1.0).then_some(Factor(value))
    }

    /// The factor.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// stepscope's capture-control keys (`"stepscope": {"ranks": …, "stages": …, …}`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[non_exhaustive]
pub struct CaptureControl {
    /// Global ranks that profile; on other ranks start and stop are no-ops. `None`: all.
    pub ranks: Option<Vec<u32>>,
    /// The absolute step index (the worker's `step()` count) at which a window begins, in
    /// place of `delay_iterations`: with one value on every rank, all ranks capture the same
    /// iterations whenever the start request reaches them.
    pub start_at_step: Option<u64>,
    /// Only iterations of these stages count toward delay and max; the backend is paused
    /// over the others. `None`: every stage.
    pub stages: Option<Vec<Stage>>,
    /// The delay starts counting at the first iteration with at least this many requests
    /// (context + generation). 0: off.
    pub min_batch_requests: u64,
    /// … and at least this many scheduled tokens. 0: off.
    pub min_batch_tokens: u64,
    /// Windows per start: each captures `max_iterations`, then the next begins
    /// `repeat_every` steps after the previous one began. 1: vLLM's single window.
    pub repeat: u64,
    /// Steps from one window's first step to the next's (with `repeat` > 1).
    pub repeat_every: u64,
    /// The slow-step trigger's absolute threshold: after `start()`, a window begins in the
    /// iteration after the first one slower than this (`slow_step_ms`).
    #[serde(rename = "slow_step_ms", serialize_with = "millis_opt")]
    pub slow_step: Option<Duration>,
    /// The relative threshold: slower than this many times the running median of the last
    /// 256 timed steps (`slow_step_factor`). With both, a step must exceed both.
    pub slow_step_factor: Option<Factor>,
}

/// The schedule's policy of a config's `"stepscope"` capture keys: the schedule knows nothing of
/// configs.
impl From<&CaptureControl> for Policy {
    fn from(c: &CaptureControl) -> Self {
        Policy {
            stages: match c.stages.as_ref() {
                None => 0,
                Some(list) => match list.iter().fold(0, |bits, s| bits | stage_bit(*s)) {
                    ALL_STAGES => 0,
                    bits => bits,
                },
            },
            min_batch_requests: c.min_batch_requests,
            min_batch_tokens: c.min_batch_tokens,
            start_at_step: c.start_at_step,
            repeat: c.repeat,
            repeat_every: c.repeat_every,
            slow: c.slow_step_trigger(),
        }
    }
}

impl CaptureControl {
    /// Whether any key changes vLLM's schedule.
    pub fn is_vllm_exact(&self) -> bool {
        self.start_at_step.is_none()
            && self.stages.is_none()
            && self.min_batch_requests == 0
            && self.min_batch_tokens == 0
            && self.repeat <= 1
            && self.slow_step_trigger().is_none()
    }

    /// The key that sets the slow-step trigger (`stepscope.slow_step_ms` when both do), for
    /// errors about it; `None` without a trigger.
    pub fn slow_step_key(&self) -> Option<&'static str> {
        match (self.slow_step, self.slow_step_factor) {
            (Some(_), _) => Some("stepscope.slow_step_ms"),
            (None, Some(_)) => Some("stepscope.slow_step_factor"),
            (None, None) => None,
        }
    }

    /// The slow-step trigger the keys ask for, if any.
    pub fn slow_step_trigger(&self) -> Option<SlowStep> {
        self.slow_step_key()?;
        Some(SlowStep {
            min_ns: self
                .slow_step
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            factor: self.slow_step_factor.map_or(0.0, Factor::get),
        })
    }
}

fn millis_opt<S: serde::Serializer>(
    d: &Option<Duration>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64() * 1e3),
        None => s.serialize_none(),
    }
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// `stepscope.flush_timeout_s`'s default: how long a stop, a flush or a shutdown waits for
/// traces being written. Written here only; the Python package reads it from the extension.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(600);

/// `stepscope.gzip_level`'s default. The writer's compression shares one core with Kineto's
/// serializer wherever the engine is pinned (vLLM's CPU workers), and the stop waits for both:
/// level 1 (zlib-rs) compressed a 35 MB Kineto trace 7x faster than level 6 into a file 1.8x as
/// large (docs/engines.md has the writer bench's figures).
pub const GZIP_LEVEL: u32 = 1;

/// The gzip levels `stepscope.gzip_level` accepts.
pub const GZIP_LEVELS: std::ops::RangeInclusive<u32> = 1..=9;

impl Default for StepscopeConfig {
    fn default() -> Self {
        StepscopeConfig {
            nvtx_domain: "stepscope".into(),
            nvtx: NvtxMode::Running,
            cuda_device: None,
            flush_timeout: DEFAULT_FLUSH_TIMEOUT,
            stop_returns: StopReturns::default(),
            gzip_level: GZIP_LEVEL,
            serializer: Serializer::default(),
            torch_with_modules: false,
            request_ids: false,
            timeline: None,
            requests: None,
            otel: None,
            budget: CaptureBudget::default(),
            capture: CaptureControl {
                repeat: 1,
                ..CaptureControl::default()
            },
        }
    }
}

/// A validated profiler config. Field names, defaults and rules are vLLM 0.32's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ProfilerConfig {
    /// Which backend to drive; `None` profiles nothing (steps are still counted).
    pub profiler: Option<ProfilerKind>,
    /// Where torch traces go. Absolute after validation (`~` expanded), or a URI kept as is.
    pub torch_profiler_dir: String,
    /// Activities for the torch profiler; `None` means the platform default.
    pub torch_profiler_activities: Option<Vec<TorchActivity>>,
    /// Record Python/C++ stacks (default true).
    pub torch_profiler_with_stack: bool,
    /// Estimate FLOPs of matmuls and convolutions.
    pub torch_profiler_with_flops: bool,
    /// Write `.json.gz` instead of `.json` (default true).
    pub torch_profiler_use_gzip: bool,
    /// Write the top-ops table by device time next to the trace (default true).
    pub torch_profiler_dump_cuda_time_total: bool,
    /// Record operator input shapes.
    pub torch_profiler_record_shapes: bool,
    /// Record tensor memory allocations.
    pub torch_profiler_with_memory: bool,
    /// Profile CUDA graph capture on rank 0 (torch only).
    pub capture_torch_profiler: bool,
    /// Name iterations with roofline sums (`sk`, `sqsq`, `sqsk`), as vLLM's detailed names.
    pub detailed_trace_annotation: bool,
    /// Do not profile vLLM's front-end process (only meaningful inside vLLM).
    pub ignore_frontend: bool,
    /// Iterations to let pass after a start before the backend starts (0: at once).
    pub delay_iterations: u64,
    /// Iterations to capture before stopping by itself (0: until stop). The profiler stops in
    /// the step whose count exceeds this (`> N`), as vLLM does.
    pub max_iterations: u64,
    /// Torch schedule: iterations recorded and discarded before the active ones.
    pub warmup_iterations: u64,
    /// Torch schedule: iterations recorded after wait and warmup (default 5, at least 1).
    pub active_iterations: u64,
    /// Torch schedule: iterations skipped with the profiler off before warmup.
    pub wait_iterations: u64,
    /// stepscope's own keys.
    pub stepscope: StepscopeConfig,
}

impl Default for ProfilerConfig {
    fn default() -> Self {
        ProfilerConfig {
            profiler: None,
            torch_profiler_dir: String::new(),
            torch_profiler_activities: None,
            torch_profiler_with_stack: true,
            torch_profiler_with_flops: false,
            torch_profiler_use_gzip: true,
            torch_profiler_dump_cuda_time_total: true,
            torch_profiler_record_shapes: false,
            torch_profiler_with_memory: false,
            capture_torch_profiler: false,
            detailed_trace_annotation: false,
            ignore_frontend: false,
            delay_iterations: 0,
            max_iterations: 0,
            warmup_iterations: 0,
            active_iterations: 5,
            wait_iterations: 0,
            stepscope: StepscopeConfig::default(),
        }
    }
}
