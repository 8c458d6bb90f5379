//! vLLM's `--profiler-config` JSON, parsed verbatim, plus stepscope's own keys.
//!
//! Every field of vLLM 0.32's `vllm.config.ProfilerConfig` is accepted with vLLM's default and
//! vLLM's validation, so the JSON a user already passes to `vllm serve --profiler-config` works
//! unchanged. stepscope's own settings live under one optional object, `"stepscope": {...}`.
//! Unknown keys are an error that names the key: a typo must not silently profile the wrong
//! thing. README.md has the reference of every key.
//!
//! ```
//! use stepscope::config::{ProfilerConfig, ProfilerKind};
//! let cfg = ProfilerConfig::from_json_str(r#"{"profiler": "cuda", "delay_iterations": 10, "max_iterations": 3}"#)?;
//! assert_eq!(cfg.profiler, Some(ProfilerKind::Cuda));
//! assert_eq!((cfg.delay_iterations, cfg.max_iterations), (10, 3));
//!
//! let err = ProfilerConfig::from_json_str(r#"{"max_iterations": -1}"#).unwrap_err();
//! assert_eq!(err.field(), Some("max_iterations"));
//! # Ok::<(), stepscope::Error>(())
//! ```

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::iteration::Stage;
use crate::schedule::{stage_bit, Policy, ALL_STAGES};

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
    const ALL: [(&'static str, TorchActivity); 4] = [
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
    /// torch.profiler's `with_modules` (module hierarchy in the trace; TorchScript models
    /// only), which vLLM's config has no field for: set by `profiler_kwargs` through the
    /// Python package, or here. Default false.
    pub torch_with_modules: bool,
    /// Capture control beyond vLLM's delay and max; all absent by default, which keeps
    /// vLLM's semantics exact.
    #[serde(flatten)]
    pub capture: CaptureControl,
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
    }
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Default for StepscopeConfig {
    fn default() -> Self {
        StepscopeConfig {
            nvtx_domain: "stepscope".into(),
            nvtx: NvtxMode::Running,
            cuda_device: None,
            flush_timeout: Duration::from_secs(600),
            torch_with_modules: false,
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

/// vLLM's Proton options and their defaults. stepscope does not drive Proton, so each is
/// accepted only at its default (exactly what vLLM requires when `profiler` is not "proton").
const PROTON_KEYS: [&str; 8] = [
    "proton_profiler_dir",
    "proton_context",
    "proton_data",
    "proton_backend",
    "proton_mode",
    "proton_hook",
    "proton_output_format",
    "proton_graph_attribution",
];

fn proton_default(key: &str) -> Value {
    match key {
        "proton_profiler_dir" => Value::String(String::new()),
        "proton_context" => Value::String("shadow".into()),
        "proton_data" => Value::String("tree".into()),
        "proton_graph_attribution" => Value::Bool(false),
        _ => Value::Null,
    }
}

impl ProfilerConfig {
    /// Parses and validates config JSON (vLLM's `--profiler-config` text).
    pub fn from_json_str(text: &str) -> Result<Self> {
        Self::parse_text(text, "config")
    }

    /// Parses and validates an already-decoded JSON value.
    pub fn from_value(value: &Value) -> Result<Self> {
        let Value::Object(map) = value else {
            return Err(Error::Json {
                source: "config".into(),
                message: format!("expected a JSON object, found {}", kind_of(value)),
            });
        };
        Self::from_map(map.clone())
    }

    /// Reads a JSON config file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(path, format!("cannot read profiler config: {e}"), e))?;
        Self::parse_text(&text, &path.display().to_string())
    }

    /// Reads the config from `STEPSCOPE_CONFIG`: JSON text (starting with `{`) or a path to a
    /// JSON file. `Ok(None)` when the variable is unset or empty.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(CONFIG_ENV) {
            Ok(v) if !v.trim().is_empty() => Self::from_spec(&v, CONFIG_ENV).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Json {
                source: CONFIG_ENV.into(),
                message: "the variable is not valid UTF-8".into(),
            }),
        }
    }

    /// JSON text if `spec` starts with `{`, otherwise a path to a JSON file. `origin` names
    /// where the spec came from in error messages.
    pub fn from_spec(spec: &str, origin: &str) -> Result<Self> {
        if spec.trim_start().starts_with('{') {
            Self::parse_text(spec, origin)
        } else {
            Self::from_path(spec.trim())
        }
    }

    fn parse_text(text: &str, origin: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| Error::Json {
            source: origin.to_string(),
            message: e.to_string(),
        })?;
        match value {
            Value::Object(map) => Self::from_map(map),
            other => Err(Error::Json {
                source: origin.to_string(),
                message: format!("expected a JSON object, found {}", kind_of(&other)),
            }),
        }
    }

    fn from_map(map: Map<String, Value>) -> Result<Self> {
        let mut f = Fields::new(map, "");
        let d = ProfilerConfig::default();
        let profiler = match f.take("profiler") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(match s.as_str() {
                "torch" => ProfilerKind::Torch,
                "cuda" => ProfilerKind::Cuda,
                "proton" => {
                    return Err(Error::config(
                        "profiler",
                        "is 'proton': stepscope does not drive Triton's Proton profiler; \
                         use 'torch' or 'cuda', or let vLLM run Proton without stepscope",
                    ))
                }
                other => {
                    return Err(Error::config(
                        "profiler",
                        format!("must be \"torch\", \"cuda\" or null, not {other:?}"),
                    ))
                }
            }),
            Some(other) => {
                return Err(Error::config(
                    "profiler",
                    format!(
                        "must be \"torch\", \"cuda\" or null, not {}",
                        kind_of(&other)
                    ),
                ))
            }
        };
        let mut cfg = ProfilerConfig {
            profiler,
            torch_profiler_dir: f.string("torch_profiler_dir", "")?,
            torch_profiler_activities: f.activities("torch_profiler_activities")?,
            torch_profiler_with_stack: f
                .bool("torch_profiler_with_stack", d.torch_profiler_with_stack)?,
            torch_profiler_with_flops: f
                .bool("torch_profiler_with_flops", d.torch_profiler_with_flops)?,
            torch_profiler_use_gzip: f
                .bool("torch_profiler_use_gzip", d.torch_profiler_use_gzip)?,
            torch_profiler_dump_cuda_time_total: f.bool(
                "torch_profiler_dump_cuda_time_total",
                d.torch_profiler_dump_cuda_time_total,
            )?,
            torch_profiler_record_shapes: f.bool(
                "torch_profiler_record_shapes",
                d.torch_profiler_record_shapes,
            )?,
            torch_profiler_with_memory: f
                .bool("torch_profiler_with_memory", d.torch_profiler_with_memory)?,
            capture_torch_profiler: f.bool("capture_torch_profiler", d.capture_torch_profiler)?,
            detailed_trace_annotation: f
                .bool("detailed_trace_annotation", d.detailed_trace_annotation)?,
            ignore_frontend: f.bool("ignore_frontend", d.ignore_frontend)?,
            delay_iterations: f.count("delay_iterations", d.delay_iterations, 0)?,
            max_iterations: f.count("max_iterations", d.max_iterations, 0)?,
            warmup_iterations: f.count("warmup_iterations", d.warmup_iterations, 0)?,
            active_iterations: f.count("active_iterations", d.active_iterations, 1)?,
            wait_iterations: f.count("wait_iterations", d.wait_iterations, 0)?,
            stepscope: StepscopeConfig::default(),
        };
        let mut proton_set = Vec::new();
        for key in PROTON_KEYS {
            if let Some(v) = f.take(key) {
                if v != proton_default(key) {
                    proton_set.push(key);
                }
            }
        }
        if let Some(v) = f.take("stepscope") {
            cfg.stepscope = StepscopeConfig::from_value(v)?;
        }
        f.finish()?;

        if !proton_set.is_empty() {
            return Err(Error::config(
                proton_set[0],
                format!(
                    "is only applicable when profiler is set to 'proton' ({} set), and \
                     stepscope does not drive Proton: remove {}",
                    proton_set.join(", "),
                    if proton_set.len() == 1 { "it" } else { "them" }
                ),
            ));
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// vLLM's cross-field rules, then directory normalization.
    fn validate(&mut self) -> Result<()> {
        let torch = self.profiler == Some(ProfilerKind::Torch);
        if let Some(acts) = &self.torch_profiler_activities {
            if !torch {
                return Err(Error::config(
                    "torch_profiler_activities",
                    "is only applicable when profiler is set to 'torch'",
                ));
            }
            for (i, a) in acts.iter().enumerate() {
                if acts[..i].contains(a) {
                    return Err(Error::config(
                        "torch_profiler_activities",
                        format!(
                            "must not contain duplicates ({} appears twice)",
                            serde_json::to_string(a).unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        if !self.torch_profiler_dir.is_empty() && !torch {
            return Err(Error::config(
                "torch_profiler_dir",
                "is only applicable when profiler is set to 'torch'",
            ));
        }
        if torch && self.torch_profiler_dir.is_empty() {
            return Err(Error::config(
                "torch_profiler_dir",
                "must be set when profiler is 'torch' (the directory traces are written to)",
            ));
        }
        if !self.torch_profiler_dir.is_empty() && !is_uri_path(&self.torch_profiler_dir) {
            self.torch_profiler_dir = absolute_dir(&self.torch_profiler_dir)?;
        }
        let capture = &self.stepscope.capture;
        if capture.start_at_step.is_some() && self.delay_iterations > 0 {
            return Err(Error::config(
                "stepscope.start_at_step",
                "takes the place of delay_iterations: set one of them",
            ));
        }
        if capture.repeat > 1 {
            if self.max_iterations == 0 {
                return Err(Error::config(
                    "stepscope.repeat",
                    "needs max_iterations > 0: each window captures max_iterations iterations",
                ));
            }
            if capture.repeat_every <= self.max_iterations {
                return Err(Error::config(
                    "stepscope.repeat_every",
                    format!(
                        "must be greater than max_iterations ({}): windows {} steps apart \
                         would overlap",
                        self.max_iterations, capture.repeat_every
                    ),
                ));
            }
        }
        if self.capture_torch_profiler && !torch {
            return Err(Error::config(
                "capture_torch_profiler",
                "is only applicable when profiler is set to 'torch'",
            ));
        }
        if torch
            && (self.delay_iterations > 0 || self.max_iterations > 0)
            && !self.ignore_frontend
            && self
                .torch_profiler_activities
                .as_ref()
                .is_none_or(|a| a.contains(&TorchActivity::Cpu))
        {
            log::warn!(
                "Using 'torch' profiler with delay_iterations or max_iterations while \
                 ignore_frontend is False may result in high overhead."
            );
        }
        Ok(())
    }

    /// Running steps after each backend start that do not count toward `max_iterations`:
    /// the wait and warmup steps of vLLM's torch schedule, less the one that the torch
    /// profiler's own start consumes. Zero for the CUDA profiler and without a schedule.
    pub fn uncounted_steps_after_start(&self) -> u64 {
        let uses_schedule = self.warmup_iterations > 0 || self.wait_iterations > 0;
        if self.profiler == Some(ProfilerKind::Torch) && uses_schedule {
            (self.wait_iterations + self.warmup_iterations).saturating_sub(1)
        } else {
            0
        }
    }
}

impl StepscopeConfig {
    fn from_value(value: Value) -> Result<Self> {
        let Value::Object(map) = value else {
            return Err(Error::config(
                "stepscope",
                format!("must be an object, not {}", kind_of(&value)),
            ));
        };
        let mut f = Fields::new(map, "stepscope.");
        let d = StepscopeConfig::default();
        let nvtx_domain = f.string("nvtx_domain", &d.nvtx_domain)?;
        if nvtx_domain.is_empty() || !nvtx_domain.is_ascii() || nvtx_domain.contains('\0') {
            return Err(Error::config(
                "stepscope.nvtx_domain",
                "must be a non-empty ASCII string without NUL characters",
            ));
        }
        let nvtx = match f.take("nvtx") {
            None => d.nvtx,
            Some(Value::String(s)) if s == "running" => NvtxMode::Running,
            Some(Value::String(s)) if s == "always" => NvtxMode::Always,
            Some(Value::String(s)) if s == "off" => NvtxMode::Off,
            Some(v) => {
                return Err(Error::config(
                    "stepscope.nvtx",
                    format!("must be \"running\", \"always\" or \"off\", not {v}"),
                ))
            }
        };
        let cuda_device = match f.take("cuda_device") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if n <= i32::MAX as u32 => Some(n),
                _ => {
                    return Err(Error::config(
                        "stepscope.cuda_device",
                        format!("must be a device ordinal (an integer >= 0) or null, not {v}"),
                    ))
                }
            },
        };
        let flush_timeout = match f.take("flush_timeout_s") {
            None => d.flush_timeout,
            Some(v) => match v.as_f64().and_then(|s| Duration::try_from_secs_f64(s).ok()) {
                Some(t) => t,
                None => {
                    return Err(Error::config(
                        "stepscope.flush_timeout_s",
                        format!("must be a number of seconds >= 0, not {v}"),
                    ))
                }
            },
        };
        let torch_with_modules = f.bool("torch_with_modules", d.torch_with_modules)?;
        let capture = CaptureControl::from_fields(&mut f)?;
        f.finish()?;
        Ok(StepscopeConfig {
            nvtx_domain,
            nvtx,
            cuda_device,
            flush_timeout,
            torch_with_modules,
            capture,
        })
    }
}

impl CaptureControl {
    fn from_fields(f: &mut Fields) -> Result<Self> {
        let ranks = match f.take("ranks") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) if !items.is_empty() => {
                let mut ranks = Vec::with_capacity(items.len());
                for v in items {
                    match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                        Some(r) if !ranks.contains(&r) => ranks.push(r),
                        Some(r) => {
                            return Err(Error::config(
                                "stepscope.ranks",
                                format!("lists rank {r} twice"),
                            ))
                        }
                        None => {
                            return Err(Error::config(
                                "stepscope.ranks",
                                format!("must list global ranks (integers >= 0), not {v}"),
                            ))
                        }
                    }
                }
                Some(ranks)
            }
            Some(v) => {
                return Err(Error::config(
                    "stepscope.ranks",
                    format!(
                        "must be a non-empty list of global ranks (leave it out to profile every \
                         rank), not {v}"
                    ),
                ))
            }
        };
        let start_at_step = match f.take("start_at_step") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Some(n),
                _ => {
                    return Err(Error::config(
                        "stepscope.start_at_step",
                        format!("must be a step index >= 1 (the first step() is 1), not {v}"),
                    ))
                }
            },
        };
        let stages = match f.take("stages") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) if !items.is_empty() => {
                let mut stages = Vec::with_capacity(items.len());
                for v in items {
                    match v.as_str().and_then(Stage::from_name) {
                        Some(s) if !stages.contains(&s) => stages.push(s),
                        Some(s) => {
                            return Err(Error::config(
                                "stepscope.stages",
                                format!("lists {:?} twice", s.as_str()),
                            ))
                        }
                        None => {
                            return Err(Error::config(
                                "stepscope.stages",
                                format!(
                                "entries must be \"prefill\", \"decode\", \"mixed\" or \"idle\", \
                                     not {v}"
                            ),
                            ))
                        }
                    }
                }
                Some(stages)
            }
            Some(v) => {
                return Err(Error::config(
                    "stepscope.stages",
                    format!("must be a non-empty list of stages, not {v}"),
                ))
            }
        };
        let min_batch_requests = f.count("min_batch_requests", 0, 0)?;
        let min_batch_tokens = f.count("min_batch_tokens", 0, 0)?;
        let repeat = f.count("repeat", 1, 1)?;
        let repeat_every = f.count("repeat_every", 0, 0)?;
        let c = CaptureControl {
            ranks,
            start_at_step,
            stages,
            min_batch_requests,
            min_batch_tokens,
            repeat,
            repeat_every,
        };
        if c.start_at_step.is_some() && (c.min_batch_requests > 0 || c.min_batch_tokens > 0) {
            return Err(Error::config(
                "stepscope.start_at_step",
                "cannot be combined with min_batch_requests/min_batch_tokens: a fixed step and \
                 a batch-size trigger would pick different iterations on different ranks",
            ));
        }
        if c.repeat > 1 && c.repeat_every == 0 {
            return Err(Error::config(
                "stepscope.repeat_every",
                format!(
                    "must be set (steps between window starts) when repeat is {}",
                    c.repeat
                ),
            ));
        }
        Ok(c)
    }
}

/// vLLM's `_is_uri_path`: `scheme://…` with a scheme longer than one character (so `C://`
/// stays a Windows drive).
pub fn is_uri_path(path: &str) -> bool {
    match path.split_once("://") {
        Some((scheme, _)) => scheme.chars().count() > 1,
        None => false,
    }
}

/// `os.path.abspath(os.path.expanduser(dir))`: `~` becomes `$HOME`, a relative path is joined
/// to the current directory, and `.`/`..` are resolved lexically (symlinks are not followed).
fn absolute_dir(dir: &str) -> Result<String> {
    let expanded: PathBuf = match dir.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(rest.trim_start_matches('/')),
            None => PathBuf::from(dir),
        },
        _ => PathBuf::from(dir),
    };
    let joined = if expanded.is_absolute() {
        expanded
    } else {
        let cwd = std::env::current_dir().map_err(|e| {
            let message = format!("cannot resolve relative torch_profiler_dir {dir:?}: {e}");
            Error::io(".", message, e)
        })?;
        cwd.join(expanded)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out.to_string_lossy().into_owned())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Takes typed fields out of a JSON object; whatever is left at the end is an unknown key.
struct Fields {
    map: Map<String, Value>,
    prefix: &'static str,
}

impl Fields {
    fn new(map: Map<String, Value>, prefix: &'static str) -> Self {
        Fields { map, prefix }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key)
    }

    fn bool(&mut self, key: &str, default: bool) -> Result<bool> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(v) => Err(Error::config(
                self.name(key),
                format!("must be true or false, not {}", kind_of(&v)),
            )),
        }
    }

    fn string(&mut self, key: &str, default: &str) -> Result<String> {
        match self.take(key) {
            None => Ok(default.to_string()),
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(Error::config(
                self.name(key),
                format!("must be a string, not {}", kind_of(&v)),
            )),
        }
    }

    /// A non-negative integer count, at least `min`.
    fn count(&mut self, key: &str, default: u64, min: u64) -> Result<u64> {
        let v = match self.take(key) {
            None => return Ok(default),
            Some(v) => v,
        };
        let n = match &v {
            Value::Number(n) => n,
            other => {
                return Err(Error::config(
                    self.name(key),
                    format!("must be an integer >= {min}, not {}", kind_of(other)),
                ))
            }
        };
        match (n.as_u64(), n.as_i64()) {
            (Some(u), _) if u >= min => Ok(u),
            (Some(_), _) | (None, Some(_)) => Err(Error::config(
                self.name(key),
                format!("must be greater than or equal to {min} (got {n})"),
            )),
            (None, None) => Err(Error::config(
                self.name(key),
                format!("must be an integer >= {min} (got {n})"),
            )),
        }
    }

    fn activities(&mut self, key: &str) -> Result<Option<Vec<TorchActivity>>> {
        let allowed = "\"CPU\", \"CUDA\", \"PrivateUse1\" or \"XPU\"";
        let items = match self.take(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(v) => {
                return Err(Error::config(
                    self.name(key),
                    format!("must be a list of {allowed}, not {}", kind_of(&v)),
                ))
            }
        };
        if items.is_empty() {
            return Err(Error::config(
                self.name(key),
                format!("must not be empty: list at least one of {allowed}"),
            ));
        }
        items
            .iter()
            .map(|item| {
                let found = item
                    .as_str()
                    .and_then(|s| TorchActivity::ALL.iter().find(|(n, _)| *n == s));
                match found {
                    Some((_, a)) => Ok(*a),
                    None => Err(Error::config(
                        self.name(key),
                        format!("entries must be {allowed}, not {item}"),
                    )),
                }
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn finish(self) -> Result<()> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => Err(Error::config(
                self.name(key),
                if self.prefix.is_empty() {
                    "is not a profiler config key (vLLM 0.32's ProfilerConfig fields and the \
                     \"stepscope\" object are accepted; see the config reference in README.md)"
                        .to_string()
                } else {
                    "is not a stepscope key (see the config reference in README.md for the \
                     keys the \"stepscope\" object accepts)"
                        .to_string()
                },
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_paths_follow_vllm() {
        assert!(is_uri_path("s3://bucket/traces"));
        assert!(is_uri_path("gs://b"));
        assert!(!is_uri_path("C://traces"));
        assert!(!is_uri_path("/tmp/traces"));
    }

    #[test]
    fn absolute_dir_resolves_dots_lexically() {
        assert_eq!(absolute_dir("/a/b/../c/./d").unwrap(), "/a/c/d");
    }

    #[test]
    fn uncounted_steps_need_a_torch_schedule() {
        let mut c = ProfilerConfig {
            profiler: Some(ProfilerKind::Torch),
            wait_iterations: 1,
            warmup_iterations: 2,
            ..ProfilerConfig::default()
        };
        assert_eq!(c.uncounted_steps_after_start(), 2);
        c.profiler = Some(ProfilerKind::Cuda);
        assert_eq!(c.uncounted_steps_after_start(), 0);
    }
}
