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

mod args;
mod config;
mod errors;
mod iteration;
mod profiler;
mod requests;
mod value;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use errors::{to_py, BackendError, ConfigError, StartRefused};
use iteration::PyIteration;
use profiler::PyWorkerProfiler;

/// Adds a directory searched for the Kineto glue (`libstepscope_kineto-torch{X}.{Y}.so`); the
/// package adds its own and the user cache at import.
#[pyfunction]
fn _add_kineto_glue_dir(dir: std::path::PathBuf) {
    stepscope::backend::add_glue_dir(dir);
}

/// The Kineto glue this process uses, loading it if needed: `{"path": ..., "built_for":
/// "2.13.0", "has_trace_only": true, "writes_python_parents": true}`. Raises `BackendError` when none matches the torch loaded (the message names the
/// torch found and the versions there is glue for) or torch is not loaded.
#[pyfunction]
fn kineto_glue(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = py
        .detach(stepscope::backend::glue_info)
        .map_err(|e| to_py(&e))?;
    let d = PyDict::new(py);
    d.set_item("path", info.path.map(|p| p.display().to_string()))?;
    d.set_item("built_for", info.built_for)?;
    d.set_item("has_trace_only", info.has_trace_only)?;
    d.set_item("writes_python_parents", info.writes_python_parents)?;
    Ok(d)
}

/// One event as `_op_table` takes it: a dict of torch's `KinetoEvent`'s values under the names
/// of its methods, and `on_device` (its device is not the CPU) and `overhead` (its
/// `activity_type` is `overhead`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct EventItem {
    name: String,
    start_thread_id: u64,
    end_thread_id: u64,
    start_ns: u64,
    duration_ns: u64,
    correlation_id: u64,
    linked_correlation_id: u64,
    on_device: bool,
    is_async: bool,
    is_hidden_event: bool,
    is_user_annotation: bool,
    is_python_function: bool,
    overhead: bool,
}

/// The op table stepscope writes to `{worker}.profiler_out.txt` for `events`, sorted by
/// torch's `sort_by` key (`self_device_time_total` or `self_cpu_time_total`), with `device`
/// naming the device columns, at most `row_limit` rows (the writer's: vLLM's limit for that
/// sort), as `torch_version`'s `key_averages()` counts them. The rule the writer applies to a capture's events, for holding it against torch's
/// own `key_averages().table()` on the same events (`tests/python/test_op_table.py`).
#[pyfunction]
#[pyo3(signature = (events, sort_by, device, torch_version, row_limit=None))]
fn _op_table(
    events: Vec<EventItem>,
    sort_by: &str,
    device: &str,
    torch_version: &str,
    row_limit: Option<usize>,
) -> PyResult<String> {
    use stepscope::backend::op_table::{render, OpEvent, SortBy};
    let sort = SortBy::from_torch_key(sort_by).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "sort_by: {sort_by:?} is not self_device_time_total or self_cpu_time_total"
        ))
    })?;
    let events: Vec<OpEvent<'_>> = events
        .iter()
        .map(|e| OpEvent {
            name: &e.name,
            thread: e.start_thread_id,
            end_thread: e.end_thread_id,
            start_ns: e.start_ns,
            duration_ns: e.duration_ns,
            correlation: e.correlation_id,
            linked_correlation: e.linked_correlation_id,
            device: e.on_device,
            is_async: e.is_async,
            hidden: e.is_hidden_event,
            user_annotation: e.is_user_annotation,
            python_function: e.is_python_function,
            overhead: e.overhead,
        })
        .collect();
    let limit = row_limit.unwrap_or(sort.row_limit());
    Ok(render(&events, sort, limit, device, torch_version))
}

/// The manifest at `path` as a dict (its keys documented in the format crate's `manifest.rs`);
/// raises `OSError`/`ValueError` naming the file when it cannot be read.
#[pyfunction]
fn read_manifest(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Py<PyAny>> {
    let manifest = py
        .detach(|| stepscope::manifest::Manifest::read(&path))
        .map_err(|e| to_py(&e))?;
    value::serialized(py, &manifest)
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

/// The ``"stepscope"`` object of ``STEPSCOPE_CONFIG`` (empty when unset), its form checked
/// by the library (the one reader of the variable); raises ``ConfigError`` naming what is
/// wrong.
#[pyfunction]
fn stepscope_keys_from_env(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let keys = stepscope::ProfilerConfig::stepscope_keys_from_env().map_err(|e| to_py(&e))?;
    value::to_object(py, &serde_json::Value::Object(keys))
}

/// The OpenTelemetry export a profiler config asks for (``"stepscope": {"otel": ...}``; a
/// dict, JSON text or a path) with its defaults filled in (``{"endpoint", "steps", "queue",
/// "batch", "costliest"}``), or ``None`` when it asks for none. Raises ``ConfigError`` naming a
/// bad field (``otel`` without ``requests`` included).
#[pyfunction]
fn otel_settings(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    let config = config::parse_config(config)?;
    config
        .stepscope
        .otel
        .map(|o| value::serialized(py, &o))
        .transpose()
}

/// The file name of a window's request log with stem ``stem``: ``{stem}.requests.json``.
#[pyfunction]
fn request_log_name(stem: &str) -> String {
    stepscope::manifest::request_log_name(stem)
}

/// The stem of engine core ``engine``'s request log of the window that stopped at
/// ``stop_ns``: ``engine{N}.{stop ns}``.
#[pyfunction]
fn engine_log_stem(engine: u32, stop_ns: u128) -> String {
    stepscope::manifest::engine_log_stem(engine, stop_ns)
}

/// The manifest's file name for a trace stem: `{stem}.stepscope.json`.
#[pyfunction]
fn manifest_name(stem: &str) -> String {
    stepscope::manifest::manifest_name(stem)
}

/// The file that says process `pid` has traces being finalized or written:
/// `$TMPDIR/stepscope-flushing-{pid}` (`/tmp` when TMPDIR is unset), holding the longest flush
/// timeout (`stepscope.flush_timeout_s`) of its writers in seconds, then when the process
/// started. The library keeps it while a trace is in flight. A process manager that would kill
/// the process after a short grace period can wait while the marker is there, up to that many
/// seconds (the vLLM plugin does). `flushing_markers` lists those of processes that still run:
/// not the marker of a process killed with traces in flight, even where a later process has
/// its pid.
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
    m.add_function(wrap_pyfunction!(read_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(_op_table, m)?)?;
    m.add_function(wrap_pyfunction!(stepscope_keys_from_env, m)?)?;
    m.add_function(wrap_pyfunction!(manifest_name, m)?)?;
    m.add_function(wrap_pyfunction!(request_log_name, m)?)?;
    m.add_function(wrap_pyfunction!(otel_settings, m)?)?;
    m.add_function(wrap_pyfunction!(engine_log_stem, m)?)?;
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
