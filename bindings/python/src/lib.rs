//! `stepscope._native`: stepscope's `WorkerProfiler` for Python engines (vLLM, SGLang, RL
//! rollout workers). `python/stepscope/__init__.py` re-exports it with the vLLM drop-in methods
//! that live in Python (`annotate_context_manager`, `set_profiler_kwargs`, …).
//!
//! Thread rules: every call that can reach a backend (start, stop, step, shutdown, flush, the
//! constructor) runs with the GIL released. Kineto's Python tracer takes the GIL while the
//! background finalizer stops it, so holding it here could deadlock; and the engine's other
//! Python threads keep running while a trace is being finalized and written.
//!
//! Errors: config errors raise `ConfigError` (a `ValueError`) naming the field; a negative
//! override raises `ValueError` naming it. Backend failures in `start`, `stop`, `step` and
//! `shutdown` never raise into the engine loop (vLLM's behaviour): the library logs them, and
//! Rust's `log` records reach Python's `logging` under the `stepscope` logger.

mod requests;

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use stepscope::timeline::StepTuple;
use stepscope::{
    model::ModelShape, Error, IterationDetail, IterationInfo, PhaseSums, ProfilerConfig,
    RequestShare, ScheduledRequests, StartOptions, WorkerProfiler,
};

pyo3::create_exception!(
    stepscope,
    ConfigError,
    PyValueError,
    "A profiler config is invalid: malformed JSON, an unknown key, or a bad value. The message \
     names the field."
);
pyo3::create_exception!(
    stepscope,
    BackendError,
    PyRuntimeError,
    "A profiling backend failed (driver missing, driver call failed, Kineto error)."
);

pyo3::create_exception!(
    stepscope,
    StartRefused,
    PyRuntimeError,
    "A start was refused by a capture limit (the disk short of stepscope.min_free_disk_mb, or \
     the captures still being written over stepscope.max_capture_mb): nothing was armed and the \
     engine goes on. `key` names the limit."
);

/// The Python exception for a library error. A `ConfigError` carries the offending field as
/// its `field` attribute (`None` for malformed JSON), so callers need not parse the message.
pub(crate) fn to_py(e: &Error) -> PyErr {
    let text = e.to_string();
    match e {
        Error::Config {
            field, unknown_key, ..
        } => {
            let err = ConfigError::new_err(text);
            Python::attach(|py| {
                // Setting an attribute on a fresh exception instance cannot fail in practice;
                // were it to, the message still names the field.
                let _ = err.value(py).setattr("field", field.as_str());
                let _ = err.value(py).setattr("unknown_key", *unknown_key);
            });
            err
        }
        Error::Json { .. } => {
            let err = ConfigError::new_err(text);
            Python::attach(|py| {
                let _ = err.value(py).setattr("field", py.None());
                let _ = err.value(py).setattr("unknown_key", false);
            });
            err
        }
        Error::InvalidArgument { .. } | Error::Format { .. } => PyValueError::new_err(text),
        Error::Io { .. } | Error::Write { .. } => PyOSError::new_err(text),
        Error::Timeout { .. } => PyTimeoutError::new_err(text),
        Error::Refused { key, .. } => {
            let err = StartRefused::new_err(text);
            Python::attach(|py| {
                let _ = err.value(py).setattr("key", key.as_str());
            });
            err
        }
        _ => BackendError::new_err(text),
    }
}

/// Parses `config`: a mapping (JSON-serializable), JSON text, or a path (str or `os.PathLike`)
/// to a JSON file.
fn parse_config(config: &Bound<'_, PyAny>) -> PyResult<ProfilerConfig> {
    let py = config.py();
    let parsed = if let Ok(text) = config.cast::<PyString>() {
        let text = text.to_str()?.to_owned();
        py.detach(|| ProfilerConfig::from_spec(&text, "config"))
    } else if config.cast::<PyDict>().is_ok() || config.hasattr("keys")? {
        let text: String = py
            .import("json")?
            .call_method1("dumps", (config,))
            .map_err(|e| {
                ConfigError::new_err(format!("config: the mapping is not JSON-serializable: {e}"))
            })?
            .extract()?;
        ProfilerConfig::from_json_str(&text)
    } else if config.hasattr("__fspath__")? {
        let path: std::path::PathBuf = py
            .import("os")?
            .call_method1("fspath", (config,))?
            .extract()?;
        py.detach(|| ProfilerConfig::from_path(&path))
    } else {
        return Err(PyTypeError::new_err(format!(
            "config must be a dict, JSON text or a path to a JSON file, not {}",
            config.get_type().name()?
        )));
    };
    parsed.map_err(|e| to_py(&e))
}

/// A rank from Python: a non-negative integer, or `ValueError` naming it.
fn rank_arg(name: &str, value: i64) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be greater than or equal to 0 (got {value})"
        ))
    })
}

/// A count from Python: a non-negative integer that fits `u32`, or `ValueError` naming it.
fn count(name: &str, value: i64) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be between 0 and {} (got {value})",
            u32::MAX
        ))
    })
}

fn sum(name: &str, value: Option<i64>) -> PyResult<u64> {
    value.map_or(Ok(0), |v| {
        u64::try_from(v).map_err(|_| {
            PyValueError::new_err(format!(
                "{name} must be greater than or equal to 0 (got {v})"
            ))
        })
    })
}

/// The counts of one engine iteration: context (prefill) and generation (decode) requests and
/// their scheduled tokens. The six optional sums are vLLM's roofline sums for
/// `detailed_trace_annotation` names; give all of a phase's or leave them out.
#[pyclass(module = "stepscope", name = "Iteration", frozen, eq)]
#[derive(Clone, PartialEq)]
struct PyIteration {
    info: IterationInfo,
    /// The ids of the requests the iteration serves (`stepscope.request_ids`).
    request_ids: Option<Vec<String>>,
    /// Each request's tokens and phase, in the order of `request_ids`, when given.
    shares: Vec<RequestShare>,
}

/// Each request's part of the iteration from `request_tokens` and its phase, given as
/// `request_prefill` or decided by the core from `request_outputs` (the tokens each had
/// produced before: `requests::in_prefill`, the one rule), and `request_computed` (with them,
/// or not at all): one per id (per token count when no ids are given), counts not negative.
fn shares_of(
    ids: Option<&Vec<String>>,
    tokens: Option<Vec<i64>>,
    prefill: Option<Vec<bool>>,
    outputs: Option<Vec<i64>>,
    computed: Option<Vec<i64>>,
) -> PyResult<Vec<RequestShare>> {
    let prefill = match (prefill, outputs) {
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "request_prefill and request_outputs say the same: give one",
            ))
        }
        (Some(p), None) => Some(p),
        (None, Some(o)) => Some(
            o.into_iter()
                .map(|n| count("request_outputs", n).map(stepscope::requests::in_prefill))
                .collect::<PyResult<Vec<bool>>>()?,
        ),
        (None, None) => None,
    };
    let (tokens, prefill) = match (tokens, prefill) {
        (None, None) => return Ok(Vec::new()),
        (Some(t), Some(p)) => (t, p),
        _ => {
            return Err(PyValueError::new_err(
                "request_tokens and request_prefill (or request_outputs) go together: give \
                 both or neither",
            ))
        }
    };
    let n = ids.map_or(tokens.len(), Vec::len);
    for (name, len) in [
        ("request_tokens", tokens.len()),
        ("request_prefill", prefill.len()),
        ("request_computed", computed.as_ref().map_or(n, Vec::len)),
    ] {
        if len != n {
            return Err(PyValueError::new_err(format!(
                "{name} must have one entry per request ({n}), got {len}"
            )));
        }
    }
    let computed = computed.map(|c| c.into_iter().map(Some).collect::<Vec<_>>());
    let computed = computed.unwrap_or_else(|| vec![None; n]);
    tokens
        .into_iter()
        .zip(prefill)
        .zip(computed)
        .map(|((t, prefill), c)| {
            Ok(RequestShare {
                tokens: count("request_tokens", t)?,
                computed: c.map(|c| count("request_computed", c)).transpose()?,
                prefill,
            })
        })
        .collect()
}

#[pymethods]
impl PyIteration {
    #[new]
    #[pyo3(signature = (
        num_ctx_reqs = 0, num_ctx_tokens = 0, num_gen_reqs = 0, num_gen_tokens = 0, *,
        ctx_seq_len_sum = None, ctx_qq_compute = None, ctx_qk_compute = None,
        gen_seq_len_sum = None, gen_qq_compute = None, gen_qk_compute = None,
        request_ids = None, request_tokens = None, request_prefill = None,
        request_computed = None, request_outputs = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_ctx_reqs: i64,
        num_ctx_tokens: i64,
        num_gen_reqs: i64,
        num_gen_tokens: i64,
        ctx_seq_len_sum: Option<i64>,
        ctx_qq_compute: Option<i64>,
        ctx_qk_compute: Option<i64>,
        gen_seq_len_sum: Option<i64>,
        gen_qq_compute: Option<i64>,
        gen_qk_compute: Option<i64>,
        request_ids: Option<Vec<String>>,
        request_tokens: Option<Vec<i64>>,
        request_prefill: Option<Vec<bool>>,
        request_computed: Option<Vec<i64>>,
        request_outputs: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let shares = shares_of(
            request_ids.as_ref(),
            request_tokens,
            request_prefill,
            request_outputs,
            request_computed,
        )?;
        let mut info = IterationInfo::new(
            count("num_ctx_reqs", num_ctx_reqs)?,
            count("num_ctx_tokens", num_ctx_tokens)?,
            count("num_gen_reqs", num_gen_reqs)?,
            count("num_gen_tokens", num_gen_tokens)?,
        );
        let sums = [
            ctx_seq_len_sum,
            ctx_qq_compute,
            ctx_qk_compute,
            gen_seq_len_sum,
            gen_qq_compute,
            gen_qk_compute,
        ];
        if sums.iter().any(Option::is_some) {
            info = info.with_detail(IterationDetail {
                ctx: PhaseSums {
                    seq_len_sum: sum("ctx_seq_len_sum", ctx_seq_len_sum)?,
                    qq_compute: sum("ctx_qq_compute", ctx_qq_compute)?,
                    qk_compute: sum("ctx_qk_compute", ctx_qk_compute)?,
                },
                gen: PhaseSums {
                    seq_len_sum: sum("gen_seq_len_sum", gen_seq_len_sum)?,
                    qq_compute: sum("gen_qq_compute", gen_qq_compute)?,
                    qk_compute: sum("gen_qk_compute", gen_qk_compute)?,
                },
            });
        } else if let Some(detail) = IterationDetail::of_shares(&shares) {
            // The core sums the requests' counts: the one owner of vLLM's rule.
            info = info.with_detail(detail);
        }
        Ok(PyIteration {
            info,
            request_ids,
            shares,
        })
    }

    /// The ids of the requests this iteration serves, if given: recorded for captured
    /// iterations with `"stepscope": {"request_ids": true}`.
    #[getter]
    fn request_ids(&self) -> Option<Vec<String>> {
        self.request_ids.clone()
    }

    /// The tokens scheduled for each request, in the order of `request_ids`, if given.
    #[getter]
    fn request_tokens(&self) -> Option<Vec<u32>> {
        (!self.shares.is_empty()).then(|| self.shares.iter().map(|s| s.tokens).collect())
    }

    /// Whether each request is in prefill (else decode), in the order of `request_ids`, if
    /// given.
    #[getter]
    fn request_prefill(&self) -> Option<Vec<bool>> {
        (!self.shares.is_empty()).then(|| self.shares.iter().map(|s| s.prefill).collect())
    }

    #[getter]
    fn num_ctx_reqs(&self) -> u32 {
        self.info.num_ctx_reqs
    }
    #[getter]
    fn num_ctx_tokens(&self) -> u32 {
        self.info.num_ctx_tokens
    }
    #[getter]
    fn num_gen_reqs(&self) -> u32 {
        self.info.num_gen_reqs
    }
    #[getter]
    fn num_gen_tokens(&self) -> u32 {
        self.info.num_gen_tokens
    }

    /// `prefill`, `decode`, `mixed` or `idle`.
    #[getter]
    fn stage(&self) -> &'static str {
        self.info.stage().as_str()
    }

    /// vLLM's annotation name of this iteration, simple or detailed.
    #[pyo3(signature = (detailed = false))]
    fn name(&self, detailed: bool) -> String {
        self.info.name(detailed)
    }

    fn __repr__(&self) -> String {
        let i = &self.info;
        format!(
            "Iteration(num_ctx_reqs={}, num_ctx_tokens={}, num_gen_reqs={}, num_gen_tokens={})",
            i.num_ctx_reqs, i.num_ctx_tokens, i.num_gen_reqs, i.num_gen_tokens
        )
    }
}

/// The engine-side profiler of one worker, vLLM's `WorkerProfiler` semantics. See the
/// `stepscope.WorkerProfiler` docs for the full API.
#[pyclass(
    module = "stepscope._native",
    name = "WorkerProfiler",
    subclass,
    frozen
)]
struct PyWorkerProfiler {
    /// Dropped in `Drop`, without the GIL.
    inner: ManuallyDrop<Arc<WorkerProfiler>>,
    local_rank: u32,
    /// The config the profiler was made with: what `set_profiler_kwargs(None)` returns to.
    base: ProfilerConfig,
    /// The config the next session uses (`set_profiler_kwargs` applied): the one owner of it.
    config: parking_lot::Mutex<ProfilerConfig>,
}

impl PyWorkerProfiler {
    /// Backend failures of start/stop/step/shutdown were logged by the library; anything else
    /// (a bug in the caller's arguments, a start a capture limit refused) raises.
    fn swallow_backend<T>(result: stepscope::Result<T>) -> PyResult<()> {
        match result {
            Ok(_) => Ok(()),
            Err(
                e @ (Error::Config { .. }
                | Error::Json { .. }
                | Error::InvalidArgument { .. }
                | Error::Refused { .. }),
            ) => Err(to_py(&e)),
            Err(_) => Ok(()),
        }
    }
}

#[pymethods]
impl PyWorkerProfiler {
    #[new]
    #[pyo3(signature = (config, worker_name, local_rank = 0, rank = None))]
    fn new(
        config: &Bound<'_, PyAny>,
        worker_name: String,
        local_rank: i64,
        rank: Option<i64>,
    ) -> PyResult<Self> {
        let local_rank = rank_arg("local_rank", local_rank)?;
        let rank = rank.map(|r| rank_arg("rank", r)).transpose()?;
        let cfg = parse_config(config)?;
        let py = config.py();
        let inner = py
            .detach(|| WorkerProfiler::with_local_rank(&cfg, &worker_name, local_rank))
            .map_err(|e| to_py(&e))?;
        if let Some(rank) = rank {
            inner.set_rank(rank);
        }
        Ok(PyWorkerProfiler {
            inner: ManuallyDrop::new(Arc::new(inner)),
            local_rank,
            base: cfg.clone(),
            config: parking_lot::Mutex::new(cfg),
        })
    }

    /// Starts a session; the overrides hold for this session only. Ignored while a session is
    /// active. `start_at_step` starts the window in that absolute step instead of after a
    /// delay. A negative override, or a start step already passed, raises `ValueError`; a
    /// start a capture limit refuses raises `StartRefused` (nothing armed); a backend failure
    /// is logged.
    #[pyo3(signature = (*, delay_iterations = None, max_iterations = None, start_at_step = None))]
    fn start(
        &self,
        py: Python<'_>,
        delay_iterations: Option<i64>,
        max_iterations: Option<i64>,
        start_at_step: Option<i64>,
    ) -> PyResult<()> {
        let options = StartOptions::from_signed(delay_iterations, max_iterations)
            .and_then(|o| o.at_step(start_at_step))
            .map_err(|e| to_py(&e))?;
        let p = &self.inner;
        Self::swallow_backend(py.detach(|| p.start_with(options)))
    }

    /// Ends the session; ignored when none is active. Returns at once: the trace is written
    /// in the background (see `flush`).
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let p = &self.inner;
        Self::swallow_backend(py.detach(|| p.stop()))
    }

    /// One engine iteration begins. With an `Iteration`, its counts name the iteration's NVTX
    /// range and Kineto annotation, which stay open until `step_end()` or the next `step()`.
    #[pyo3(signature = (iteration = None))]
    fn step(&self, py: Python<'_>, iteration: Option<PyRef<'_, PyIteration>>) {
        let p = &self.inner;
        // Idle (the common case): no backend to reach, so no GIL to give up.
        if p.try_step_idle() {
            return;
        }
        let info = iteration.as_ref().map(|i| i.info).unwrap_or_default();
        let requests = iteration.as_ref().and_then(|i| {
            i.request_ids.as_ref().map(|ids| ScheduledRequests {
                ids: ids.as_slice(),
                shares: i.shares.as_slice(),
            })
        });
        py.detach(|| {
            // The annotation outlives this call: step_end() or the next step() closes it.
            match requests {
                Some(r) => std::mem::forget(p.step_with_requests(&info, &r)),
                None => std::mem::forget(p.step(&info)),
            }
            // Already logged by the library; the engine loop goes on.
            let _ = p.take_last_error();
        });
    }

    /// Closes the current iteration's annotation, if one is open.
    fn step_end(&self, py: Python<'_>) {
        let p = &self.inner;
        py.detach(|| p.step_end());
    }

    /// Stops a running session (the engine loop has ended), as vLLM's `shutdown()`.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let p = &self.inner;
        Self::swallow_backend(py.detach(|| p.shutdown()))
    }

    /// Waits up to `timeout` seconds (default: the config's `stepscope.flush_timeout_s`) for
    /// traces still being written. True when nothing is pending. Ctrl-C interrupts the wait.
    #[pyo3(signature = (timeout = None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let total = match timeout {
            None => self.config.lock().stepscope.flush_timeout,
            Some(t) => Duration::try_from_secs_f64(t).map_err(|_| {
                PyValueError::new_err(format!(
                    "timeout must be a finite number of seconds >= 0 (got {t})"
                ))
            })?,
        };
        let deadline = Instant::now() + total;
        let p = &self.inner;
        loop {
            let slice = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            let done = py.detach(|| p.flush(slice)).map_err(|e| to_py(&e))?;
            if done || Instant::now() >= deadline {
                return Ok(done);
            }
            py.check_signals()?;
        }
    }

    /// Sets the worker's global rank, which `stepscope.ranks` selects by.
    fn set_rank(&self, rank: i64) -> PyResult<()> {
        self.inner.set_rank(rank_arg("rank", rank)?);
        Ok(())
    }

    /// The profiler's state as JSON text (see `stepscope.WorkerProfiler.status`).
    fn status_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner.status())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Adds `key` with `json_value` (JSON text) to the header of the traces written from now
    /// on (see `stepscope.WorkerProfiler.set_trace_metadata`).
    fn _set_trace_metadata_json(&self, key: &str, json_value: &str) -> PyResult<()> {
        self.inner
            .set_trace_metadata(key, json_value)
            .map_err(|e| to_py(&e))
    }

    /// Records the served model's shape from its Hugging Face config (`config_json`, JSON
    /// text: `config.json`, or a model config's `to_dict()`) and what only the engine knows,
    /// for the header and manifest of the traces written from now on (see
    /// `stepscope.WorkerProfiler.set_model`). Returns the shape recorded, as JSON text.
    #[pyo3(signature = (config_json, *, tensor_parallel = None, weight_dtype = None,
        kv_cache_dtype = None, params = None))]
    fn _set_model(
        &self,
        config_json: &str,
        tensor_parallel: Option<u32>,
        weight_dtype: Option<String>,
        kv_cache_dtype: Option<String>,
        params: Option<u64>,
    ) -> PyResult<String> {
        let config: serde_json::Value = serde_json::from_str(config_json)
            .map_err(|e| PyValueError::new_err(format!("config_json: {e}")))?;
        if !config.is_object() {
            return Err(PyValueError::new_err("config_json: not a JSON object"));
        }
        let mut shape = ModelShape::from_hf_config(&config);
        shape.tensor_parallel = tensor_parallel.or(shape.tensor_parallel);
        shape.weight_dtype = weight_dtype.or(shape.weight_dtype);
        shape.kv_cache_dtype = kv_cache_dtype;
        shape.params = params;
        for (field, known) in [
            ("weight_dtype", shape.weight_dtype.is_some()),
            ("kv_cache_dtype", shape.kv_cache_dtype.is_some()),
            ("tensor_parallel", shape.tensor_parallel.is_some()),
            ("params", shape.params.is_some()),
        ] {
            if !known && !shape.unknown.iter().any(|u| u == field) {
                shape.unknown.push(field.to_string());
            }
        }
        self.inner.set_model(&shape);
        serde_json::to_string(&shape).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Names the next session's traces (vLLM's `set_output_name`); ignored while a session is
    /// active. A name that is no file name raises ValueError naming `worker_name`.
    fn set_output_name(&self, name: &str) -> PyResult<()> {
        self.inner.set_worker_name(name).map_err(|e| to_py(&e))?;
        Ok(())
    }

    /// A mark to read trace outcomes from: taken before `stop()`, `writes_since(ticket)`
    /// reports every trace that stop ends (see the Python docs).
    fn write_ticket(&self) -> u64 {
        self.inner.write_ticket()
    }

    /// Where the traces since `ticket` stand, as JSON text: `{"stopping", "pending_writes",
    /// "settled", "traces": [{"seq", "trace_file", "manifest_file", "status", "error"}]}`.
    fn _writes_since_json(&self, ticket: u64) -> PyResult<String> {
        let writes = self.inner.writes_since(ticket);
        let mut doc =
            serde_json::to_value(&writes).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        doc["settled"] = writes.settled().into();
        Ok(doc.to_string())
    }

    /// Names the next capture's files exactly (`{name}.trace.json.gz`, `{name}.stepscope.json`),
    /// or drops a name not used yet (`None`). A bad name raises ValueError naming
    /// `trace_name`; returns False, changing nothing, while a session is active.
    #[pyo3(signature = (name))]
    fn set_trace_name(&self, name: Option<&str>) -> PyResult<bool> {
        self.inner.set_trace_name(name).map_err(|e| to_py(&e))
    }

    /// Takes what the next session records from `config` (see `set_profiler_kwargs`).
    /// Returns False, changing nothing, while a session is active.
    fn _reconfigure(&self, config: &Bound<'_, PyAny>) -> PyResult<bool> {
        let cfg = parse_config(config)?;
        let p = &self.inner;
        let applied = config
            .py()
            .detach(|| p.reconfigure(&cfg))
            .map_err(|e| to_py(&e))?;
        if applied {
            *self.config.lock() = cfg;
        }
        Ok(applied)
    }

    /// The config the next session uses, as JSON text: every field, defaults filled in, with
    /// what `set_profiler_kwargs` applied.
    #[getter]
    fn config_json(&self) -> String {
        serde_json::to_string(&*self.config.lock()).unwrap_or_default()
    }

    /// The config the profiler was made with, as JSON text (what `set_profiler_kwargs` starts
    /// from).
    #[getter]
    fn base_config_json(&self) -> String {
        serde_json::to_string(&self.base).unwrap_or_default()
    }

    /// `stepscope.flush_timeout_s` of the config the next session uses, s.
    #[getter]
    fn flush_timeout_s(&self) -> f64 {
        self.config.lock().stepscope.flush_timeout.as_secs_f64()
    }

    /// A session is active (started, not stopped).
    #[getter]
    fn is_active(&self) -> bool {
        self.inner.is_active()
    }

    /// The backend is capturing.
    #[getter]
    fn is_running(&self) -> bool {
        self.inner.is_running()
    }

    /// Iterations should be annotated (the backend is capturing).
    #[getter]
    fn should_annotate(&self) -> bool {
        self.inner.should_annotate()
    }

    /// Whether the next `step()` reads its `Iteration`: a session is active, or every
    /// iteration gets an NVTX range. Compute counts only when this is true.
    #[getter]
    fn is_armed(&self) -> bool {
        self.inner.is_armed()
    }

    /// Whether the next `step()` can record request ids: `"stepscope": {"request_ids": true}`
    /// and a session armed. Collect ids for `Iteration(request_ids=...)` only when true.
    #[getter]
    fn wants_request_ids(&self) -> bool {
        self.inner.wants_request_ids()
    }

    /// The step timeline is on (`"stepscope": {"timeline": ...}`): every `step()` reads its
    /// `Iteration`'s counts, and `step_end()` ends the step's time.
    #[getter]
    fn has_timeline(&self) -> bool {
        self.inner.has_timeline()
    }

    /// The step timeline's ended steps above index `since` (0: all it holds), oldest first,
    /// as tuples in `TIMELINE_FIELDS` order; `None` when the timeline is off. Never blocks
    /// the engine thread.
    #[pyo3(signature = (since = 0))]
    fn timeline(&self, py: Python<'_>, since: u64) -> Option<Vec<StepTuple>> {
        let p = &self.inner;
        py.detach(|| p.timeline(since))
            .map(|steps| steps.iter().map(|s| s.as_tuple()).collect())
    }

    /// The timeline as the engine plugins serve it, as JSON text: `{"worker_name", "rank",
    /// "phase", "step_index", "now_unix_ns", "timeline", "fields", "steps"}`, the ended steps
    /// above `since` (the last `last` of them, when given) as arrays in `fields` order;
    /// `"steps": null` when the timeline is off. Never blocks the engine thread.
    #[pyo3(signature = (since = 0, last = None))]
    fn timeline_json(&self, py: Python<'_>, since: u64, last: Option<usize>) -> String {
        let p = &self.inner;
        py.detach(|| serde_json::to_string(&p.timeline_document(since, last)).unwrap_or_default())
    }

    /// Stopped sessions whose traces are still being written in the background.
    #[getter]
    fn pending_writes(&self) -> usize {
        self.inner.pending_writes()
    }

    /// `idle`, `delaying`, `watching`, `starting`, `running`, `paused`, `between` or
    /// `start_failed`.
    #[getter]
    fn phase(&self) -> &'static str {
        self.inner.phase().as_str()
    }

    /// How many times `step()` has been called.
    #[getter]
    fn step_index(&self) -> u64 {
        self.inner.step_index()
    }

    /// The name the next (or current) session's traces carry.
    #[getter]
    fn worker_name(&self) -> String {
        self.inner.worker_name()
    }

    #[getter]
    fn local_rank(&self) -> u32 {
        self.local_rank
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

impl Drop for PyWorkerProfiler {
    /// Dropping the profiler stops a running session and waits (up to
    /// `stepscope.flush_timeout_s`) for traces still being written. Kineto's Python tracer
    /// takes the GIL to finish a session, so that wait must not hold it: with the GIL held, a
    /// profiler collected by Python right after a stop would wait out the whole timeout.
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        let mut inner = Some(inner);
        // Not attached (the interpreter is shutting down): drop where we are.
        Python::try_attach(|py| {
            let owned = inner.take();
            py.detach(move || drop(owned));
        });
        drop(inner);
    }
}

/// Adds a directory searched for the Kineto glue (`libstepscope_kineto-torch{X}.{Y}.so`); the
/// package adds its own and the user cache at import.
#[pyfunction]
fn _add_kineto_glue_dir(dir: std::path::PathBuf) {
    stepscope::backend::add_glue_dir(dir);
}

/// The Kineto glue this process uses, loading it if needed: `{"path": ..., "built_for":
/// "2.13.0"}`. Raises `BackendError` when none matches the torch loaded (the message names the
/// torch found and the versions there is glue for) or torch is not loaded.
#[pyfunction]
fn kineto_glue(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = py
        .detach(stepscope::backend::glue_info)
        .map_err(|e| to_py(&e))?;
    let d = PyDict::new(py);
    d.set_item("path", info.path.map(|p| p.display().to_string()))?;
    d.set_item("built_for", info.built_for)?;
    Ok(d)
}

/// The manifest at `path` (`{stem}.stepscope.json`), read through the library's one manifest
/// type and returned as its JSON text: every key of the current format, whatever version wrote
/// it. Raises `OSError` when it cannot be read, `ValueError` when it is not a manifest.
#[pyfunction]
fn _read_manifest_json(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    let manifest = py
        .detach(|| stepscope::manifest::Manifest::read(&path))
        .map_err(|e| to_py(&e))?;
    Ok(String::from_utf8_lossy(&manifest.to_vec()).into_owned())
}

/// The trace the manifest at `path` describes, beside it: under the name it was written
/// under, or the manifest's own name when another tool renamed both. Raises `OSError` naming
/// the manifest and both names when it is in neither place.
#[pyfunction]
fn manifest_trace_path(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    py.detach(|| stepscope::manifest::Manifest::read(&path).and_then(|m| m.trace_path(&path)))
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| to_py(&e))
}

/// The manifest's file name for a trace stem: `{stem}.stepscope.json`.
#[pyfunction]
fn manifest_name(stem: &str) -> String {
    stepscope::manifest::manifest_name(stem)
}

/// Process `pid`'s flushing marker (see `stepscope.flushing_marker`).
#[pyfunction]
fn flushing_marker(pid: u32) -> String {
    stepscope::flush::flushing_marker_of(pid)
        .display()
        .to_string()
}

/// The flushing markers of processes that still run: `{pid: flush timeout in seconds}` (not a
/// dead process's, nor one whose pid a later process has taken).
#[pyfunction]
fn flushing_markers() -> std::collections::HashMap<u32, f64> {
    stepscope::flush::flushing_markers().into_iter().collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // The library's `log` records go to Python's logging, under `stepscope.*`. Nothing is
    // cached, so levels set later in Python apply; the library logs only off the hot path.
    if let Err(e) = pyo3_log::Logger::new(py, pyo3_log::Caching::Nothing)?.install() {
        // Another extension in this process installed its logger first.
        log::debug!("stepscope: Rust logging not forwarded to Python: {e}");
    }
    m.add_class::<PyWorkerProfiler>()?;
    m.add_class::<PyIteration>()?;
    m.add_class::<requests::PyRequestLog>()?;
    m.add_function(wrap_pyfunction!(_add_kineto_glue_dir, m)?)?;
    m.add_function(wrap_pyfunction!(kineto_glue, m)?)?;
    m.add_function(wrap_pyfunction!(_read_manifest_json, m)?)?;
    m.add_function(wrap_pyfunction!(manifest_name, m)?)?;
    m.add_function(wrap_pyfunction!(manifest_trace_path, m)?)?;
    m.add_function(wrap_pyfunction!(flushing_marker, m)?)?;
    m.add_function(wrap_pyfunction!(flushing_markers, m)?)?;
    m.add("MANIFEST_SUFFIX", stepscope::manifest::MANIFEST_SUFFIX)?;
    m.add("MANIFEST_VERSION", stepscope::manifest::MANIFEST_VERSION)?;
    m.add(
        "TIMELINE_FIELDS",
        pyo3::types::PyTuple::new(m.py(), stepscope::timeline::FIELDS)?,
    )?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("BackendError", py.get_type::<BackendError>())?;
    m.add("StartRefused", py.get_type::<StartRefused>())?;
    m.add("__version__", stepscope::VERSION)?;
    m.add(
        "DEFAULT_FLUSH_TIMEOUT_S",
        stepscope::config::DEFAULT_FLUSH_TIMEOUT.as_secs_f64(),
    )?;
    Ok(())
}
