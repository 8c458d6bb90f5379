//! Reading a config from JSON text, a file, or `STEPSCOPE_CONFIG`: every key taken by the
//! field walker, so an unknown or mistyped one is an error naming it.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use super::fields::{kind_of, Fields};
use super::types::*;
use super::vllm::{proton_default, PROTON_KEYS};
use crate::iteration::Stage;
use stepscope_format::error::{Error, Result};

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

    /// The `"stepscope"` object of `STEPSCOPE_CONFIG` as the engine plugins take it (empty
    /// when the variable is unset): only its form checked here (readable, JSON, an object
    /// holding only `"stepscope"`, itself an object), since some keys' values are validated
    /// with the engine's own fields when a worker's profiler is made (`repeat` needs
    /// `max_iterations`). An error names what is wrong. The one reader of the variable for
    /// every surface.
    pub fn stepscope_keys_from_env() -> Result<Map<String, Value>> {
        let spec = match std::env::var(CONFIG_ENV) {
            Ok(v) if !v.trim().is_empty() => v,
            Ok(_) | Err(std::env::VarError::NotPresent) => return Ok(Map::new()),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(Error::Json {
                    source: CONFIG_ENV.into(),
                    message: "the variable is not valid UTF-8".into(),
                })
            }
        };
        let spec = spec.trim();
        let (text, origin) = if spec.starts_with('{') {
            (spec.to_string(), CONFIG_ENV.to_string())
        } else {
            let text = std::fs::read_to_string(spec).map_err(|e| Error::Json {
                source: CONFIG_ENV.into(),
                message: format!("cannot read {spec}: {e}"),
            })?;
            (text, spec.to_string())
        };
        let bad = |message: String| Error::Json {
            source: origin.clone(),
            message,
        };
        let value: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let Value::Object(mut map) = value else {
            return Err(bad("expected a JSON object".into()));
        };
        let mut others: Vec<&String> = map.keys().filter(|k| *k != "stepscope").collect();
        others.sort();
        if !others.is_empty() {
            let others: Vec<&str> = others.iter().map(|k| k.as_str()).collect();
            return Err(bad(format!(
                "{}: vLLM's keys come from --profiler-config; {CONFIG_ENV} holds only the \
                 \"stepscope\" object",
                others.join(", ")
            )));
        }
        match map.remove("stepscope") {
            None => Ok(Map::new()),
            Some(Value::Object(keys)) => Ok(keys),
            Some(_) => Err(bad("\"stepscope\" must be a JSON object".into())),
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
        let nvtx = f.choice(
            "nvtx",
            d.nvtx,
            &[
                ("running", NvtxMode::Running),
                ("always", NvtxMode::Always),
                ("off", NvtxMode::Off),
            ],
        )?;
        let cuda_device = f.optional(
            "cuda_device",
            "a device ordinal (an integer >= 0) or null",
            |v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n <= i32::MAX as u32)
            },
        )?;
        let flush_timeout = f.seconds("flush_timeout_s", d.flush_timeout, "")?;
        let stop_returns = f.choice(
            "stop_returns",
            d.stop_returns,
            &[
                ("written", StopReturns::Written),
                ("at_once", StopReturns::AtOnce),
            ],
        )?;
        let gzip_must_be = format!(
            "an integer from {} to {}",
            GZIP_LEVELS.start(),
            GZIP_LEVELS.end()
        );
        let gzip_level = f
            .optional("gzip_level", &gzip_must_be, |v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| GZIP_LEVELS.contains(n))
            })?
            .unwrap_or(d.gzip_level);
        let serializer = f.choice(
            "serializer",
            d.serializer,
            &[
                ("stepscope", Serializer::Stepscope),
                ("kineto", Serializer::Kineto),
                ("compare", Serializer::Compare),
            ],
        )?;
        let torch_with_modules = f.bool("torch_with_modules", d.torch_with_modules)?;
        let request_ids = f.bool("request_ids", d.request_ids)?;
        let timeline = timeline_steps(f.take("timeline"))?;
        let requests = request_log_size(f.take("requests"))?;
        let otel = otel_export(f.take("otel"))?;
        if otel.is_some() && requests.is_none() {
            return Err(Error::config(
                "stepscope.otel",
                "needs the request log (\"requests\": true): the spans are built from it",
            ));
        }
        let capture = CaptureControl::from_fields(&mut f)?;
        let budget = CaptureBudget::from_fields(&mut f, d.budget)?;
        f.finish()?;
        Ok(StepscopeConfig {
            nvtx_domain,
            nvtx,
            cuda_device,
            flush_timeout,
            stop_returns,
            gzip_level,
            serializer,
            torch_with_modules,
            capture,
            request_ids,
            budget,
            timeline,
            requests,
            otel,
        })
    }
}

/// `stepscope.timeline`: `true` (the default size), `false` or null (off), or
/// `{"steps": N}`.
fn timeline_steps(v: Option<Value>) -> Result<Option<usize>> {
    let (lo, hi) = TIMELINE_STEPS_RANGE;
    let bad = |what: String| {
        Error::config(
            "stepscope.timeline",
            format!(
                "must be true, false, or {{\"steps\": N}} with N from {lo} to {hi}, not {what}"
            ),
        )
    };
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(TIMELINE_STEPS)),
        Some(Value::Object(mut m)) => {
            if let Some(k) = m.keys().find(|k| *k != "steps") {
                return Err(Error::unknown_key(
                    format!("stepscope.timeline.{k}"),
                    "is not a timeline setting (it has only \"steps\")",
                ));
            }
            match m.remove("steps") {
                None => Ok(Some(TIMELINE_STEPS)),
                Some(n) => match n.as_u64().and_then(|n| usize::try_from(n).ok()) {
                    Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(bad(format!("{{\"steps\": {n}}}"))),
                },
            }
        }
        Some(v) => Err(bad(v.to_string())),
    }
}

/// `stepscope.requests`: `true` (the default sizes), `false` or null (off), or
/// `{"requests": N, "steps": M}` (either may be left out).
fn request_log_size(v: Option<Value>) -> Result<Option<RequestLogSize>> {
    let (lo, hi) = REQUEST_LOG_RANGE;
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(REQUEST_LOG_SIZE)),
        Some(Value::Object(mut m)) => {
            if let Some(k) = m.keys().find(|k| *k != "requests" && *k != "steps") {
                return Err(Error::unknown_key(
                    format!("stepscope.requests.{k}"),
                    "is not a request log setting (it has \"requests\" and \"steps\")",
                ));
            }
            let mut size = |key: &str, default: usize| match m.remove(key) {
                None => Ok(default),
                Some(n) => match n.as_u64().and_then(|n| usize::try_from(n).ok()) {
                    Some(n) if (lo..=hi).contains(&n) => Ok(n),
                    _ => Err(Error::config(
                        format!("stepscope.requests.{key}"),
                        format!("must be an integer from {lo} to {hi}, not {n}"),
                    )),
                },
            };
            Ok(Some(RequestLogSize {
                requests: size("requests", REQUEST_LOG_SIZE.requests)?,
                steps: size("steps", REQUEST_LOG_SIZE.steps)?,
            }))
        }
        Some(v) => Err(Error::config(
            "stepscope.requests",
            format!(
                "must be true, false, or {{\"requests\": N, \"steps\": M}} with each from {lo} \
                 to {hi}, not {v}"
            ),
        )),
    }
}

/// `stepscope.otel`: `true` (the defaults), `false` or null (off), or an object of
/// [`OtelExport`]'s fields (each may be left out).
fn otel_export(v: Option<Value>) -> Result<Option<OtelExport>> {
    const KEYS: [&str; 5] = ["endpoint", "steps", "queue", "batch", "costliest"];
    let d = OtelExport::default();
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(d)),
        Some(Value::Object(mut m)) => {
            if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str())) {
                return Err(Error::unknown_key(
                    format!("stepscope.otel.{k}"),
                    format!("is not an OpenTelemetry export setting (it has {KEYS:?})"),
                ));
            }
            let mut count = |key: &str, default: usize, lo: usize, hi: usize| match m.remove(key) {
                None | Some(Value::Null) => Ok(default),
                Some(n) => match n.as_u64().and_then(|n| usize::try_from(n).ok()) {
                    Some(n) if (lo..=hi).contains(&n) => Ok(n),
                    _ => Err(Error::config(
                        format!("stepscope.otel.{key}"),
                        format!("must be an integer from {lo} to {hi}, not {n}"),
                    )),
                },
            };
            let queue = count("queue", d.queue, 1, 1 << 20)?;
            let batch = count("batch", d.batch, 1, 4096)?;
            let costliest = count("costliest", d.costliest, 0, 64)?;
            let endpoint = match m.remove("endpoint") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if !s.trim().is_empty() => Some(s),
                Some(v) => {
                    return Err(Error::config(
                        "stepscope.otel.endpoint",
                        format!("must be a URL (text) or null, not {v}"),
                    ))
                }
            };
            let steps = match m.remove("steps") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(v) => {
                    return Err(Error::config(
                        "stepscope.otel.steps",
                        format!("must be true or false, not {v}"),
                    ))
                }
            };
            Ok(Some(OtelExport {
                endpoint,
                steps,
                queue,
                batch,
                costliest,
            }))
        }
        Some(v) => Err(Error::config(
            "stepscope.otel",
            format!("must be true, false, or an object of {KEYS:?}, not {v}"),
        )),
    }
}

impl CaptureBudget {
    fn from_fields(f: &mut Fields, d: CaptureBudget) -> Result<Self> {
        Ok(CaptureBudget {
            max_capture_mb: f.count("max_capture_mb", d.max_capture_mb, 0)?,
            max_capture: f.seconds("max_capture_s", d.max_capture, " (0: no limit)")?,
            min_free_disk_mb: f.count("min_free_disk_mb", d.min_free_disk_mb, 0)?,
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
        let start_at_step = f.optional(
            "start_at_step",
            "a step index >= 1 (the first step() is 1)",
            |v| v.as_u64().filter(|n| *n >= 1),
        )?;
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
        let slow_step = f.optional("slow_step_ms", "a number of milliseconds > 0", |v| {
            v.as_f64()
                .filter(|ms| *ms > 0.0)
                .and_then(|ms| Duration::try_from_secs_f64(ms / 1e3).ok())
        })?;
        let slow_step_factor = f.optional(
            "slow_step_factor",
            "a number > 1 (a step slower than that many times the running median triggers)",
            |v| v.as_f64().and_then(Factor::new),
        )?;
        let c = CaptureControl {
            ranks,
            start_at_step,
            stages,
            min_batch_requests,
            min_batch_tokens,
            repeat,
            repeat_every,
            slow_step,
            slow_step_factor,
        };
        if let Some(trigger_key) = c.slow_step_key() {
            if c.start_at_step.is_some() {
                return Err(Error::config(
                    trigger_key,
                    "cannot be combined with start_at_step: the window begins after a slow \
                     step, not at a fixed one",
                ));
            }
            if c.repeat_every > 0 {
                return Err(Error::config(
                    "stepscope.repeat_every",
                    "does not apply with a slow-step trigger: each window of a repeat waits \
                     for a new slow step; leave repeat_every out",
                ));
            }
        }
        if c.start_at_step.is_some() && (c.min_batch_requests > 0 || c.min_batch_tokens > 0) {
            return Err(Error::config(
                "stepscope.start_at_step",
                "cannot be combined with min_batch_requests/min_batch_tokens: a fixed step and \
                 a batch-size trigger would pick different iterations on different ranks",
            ));
        }
        if c.repeat > 1 && c.repeat_every == 0 && c.slow_step_trigger().is_none() {
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
