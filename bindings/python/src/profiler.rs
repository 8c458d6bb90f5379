//! `stepscope.WorkerProfiler`'s native half: the library's profiler, its config, and every
//! call that can reach a backend made with the GIL released.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use stepscope::timeline::StepTuple;
use stepscope::{
    model::ModelShape, Error, ProfilerConfig, ScheduledRequests, StartOptions, WorkerProfiler,
};

use crate::args::rank_arg;
use crate::config::parse_config;
use crate::errors::to_py;
use crate::iteration::PyIteration;
use crate::value::{serialized, to_object};

/// The engine-side profiler of one worker, vLLM's `WorkerProfiler` semantics. See the
/// `stepscope.WorkerProfiler` docs for the full API.
#[pyclass(
    module = "stepscope._native",
    name = "WorkerProfiler",
    subclass,
    frozen
)]
pub(crate) struct PyWorkerProfiler {
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

    /// Runs `call` (with the GIL released), then, where the backend was running before it and
    /// is not after, takes torch's Python tracer off this thread (see
    /// [`drop_python_tracer`]). Both readings are the profiler's gate (no lock): this thread
    /// made the transition, so it reads its own.
    fn ending<T>(&self, py: Python<'_>, call: impl FnOnce() -> T + Send) -> T
    where
        T: Send,
    {
        let p = &self.inner;
        let was_running = p.is_running_here();
        let out = py.detach(call);
        if was_running && !p.is_running_here() {
            drop_python_tracer(py);
        }
        out
    }
}

/// Takes torch's Python tracer (the `sys.setprofile` object of type `TraceContext` that
/// `with_stack` installs) off the calling thread, once stepscope's torch backend has stopped on
/// it. torch removes it when the capture is finalized, on stepscope's finalizer thread, and
/// until then it records every Python call the engine thread makes after the stop: in a probe
/// whose thread kept calling a function while its trace was written, those calls were 55-82%
/// of the trace's events. torch's own `stop()` removes it at once, on the thread that stops.
/// The calls recorded before stay in the trace; a frame still open here ends where torch ends
/// open frames, at the finalize. Anything else set with `sys.setprofile` is left alone.
fn drop_python_tracer(py: Python<'_>) {
    let Ok(sys) = py.import("sys") else {
        return;
    };
    let Ok(current) = sys.call_method0("getprofile") else {
        return;
    };
    let torch_tracer = !current.is_none()
        && current
            .get_type()
            .name()
            .is_ok_and(|name| name.to_str().is_ok_and(|n| n == "TraceContext"));
    if torch_tracer {
        let _ = sys.call_method1("setprofile", (py.None(),));
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
        Self::swallow_backend(self.ending(py, || p.stop()))
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
        self.ending(py, || {
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
        self.ending(py, || p.step_end());
    }

    /// Stops a running session (the engine loop has ended), as vLLM's `shutdown()`.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let p = &self.inner;
        Self::swallow_backend(self.ending(py, || p.shutdown()))
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

    /// The profiler's state as a dict: ``phase``, ``step_index``, the session's limits and
    /// start step, ``window_first_step``, ``iterations_captured``, ``windows``/``windows_done``/
    /// ``next_window_at`` (``repeat``), the capture budget (``max_capture_mb``,
    /// ``max_capture_s``, ``last_cut``: the last window it ended, with ``by``, ``step``,
    /// ``grew_mb``), ``pending_writes``, ``rank``/``selected`` and ``last_error``.
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialized(py, &self.inner.status())
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
    /// `stepscope.WorkerProfiler.set_model`). Returns the shape recorded, as a dict.
    #[pyo3(signature = (config_json, *, tensor_parallel = None, weight_dtype = None,
        kv_cache_dtype = None, params = None))]
    fn _set_model(
        &self,
        config_json: &str,
        tensor_parallel: Option<u32>,
        weight_dtype: Option<String>,
        kv_cache_dtype: Option<String>,
        params: Option<u64>,
        py: Python<'_>,
    ) -> PyResult<Py<PyAny>> {
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
        serialized(py, &shape)
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
    /// Where the traces since ``ticket`` (:meth:`write_ticket`, taken before a stop) stand:
    /// ``{"settled": bool, "stopping": bool, "pending_writes": int, "traces": [{"seq",
    /// "trace_file", "manifest_file", "status", "error"}]}``. ``settled`` is true once every
    /// such trace is ``complete`` or ``failed`` and no stop waits for the engine thread: what
    /// a caller that must return only with the traces on disk polls (never blocking the
    /// engine thread).
    fn writes_since(&self, py: Python<'_>, ticket: u64) -> PyResult<Py<PyAny>> {
        let writes = self.inner.writes_since(ticket);
        let mut doc =
            serde_json::to_value(&writes).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        doc["settled"] = writes.settled().into();
        to_object(py, &doc)
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

    /// The config the next session uses (``set_profiler_kwargs`` included), every field filled
    /// in, as a dict (a copy: the profiler owns it).
    #[getter]
    fn config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialized(py, &*self.config.lock())
    }

    /// The config the profiler was made with, as JSON text (what `set_profiler_kwargs` starts
    /// from).
    #[getter]
    fn base_config_json(&self) -> String {
        serde_json::to_string(&self.base).unwrap_or_default()
    }

    /// The config the profiler was made with, as a dict (what `set_profiler_kwargs` starts
    /// from).
    #[getter]
    fn base_config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialized(py, &self.base)
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

    /// :meth:`timeline_json`'s document as a dict.
    #[pyo3(signature = (since = 0, last = None))]
    fn timeline_dict(
        &self,
        py: Python<'_>,
        since: u64,
        last: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let p = &self.inner;
        let doc = py.detach(|| p.timeline_document(since, last));
        serialized(py, &doc)
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
