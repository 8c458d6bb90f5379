//! `stepscope.RequestLog`: the request log (`stepscope.requests`) for Python engines' scheduler
//! hooks. Each call records one step's requests in one crossing (sequences of ids and counts,
//! read in place: no list is copied).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use stepscope::config::RequestLogSize;
use stepscope::requests::{
    otlp_json, otlp_protobuf, request_spans, step_spans, Finish, RequestLog, RoleHint, SpanOptions,
    SpanParent, COSTLIEST, ENGINE_SPAN,
};

use crate::config::parse_config;

/// Each request's lifecycle in the engine (queued, scheduled, prefill chunks, first token,
/// decode, preemptions, end) and the engine steps it lived through, in rings allocated once:
/// the last ``requests`` requests and ``steps`` steps (each rounded up to a power of two).
/// Recording never allocates. ``document_json(since)`` is what ``GET /stepscope/requests``
/// serves and ``stepscope ctl requests`` reads.
#[pyclass(module = "stepscope", name = "RequestLog")]
pub struct PyRequestLog {
    log: RequestLog,
}

/// The items of a sequence, each read by `each` in place; the error names the argument.
fn each<'py>(
    seq: &Bound<'py, PyAny>,
    name: &str,
    mut f: impl FnMut(Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    for item in seq
        .try_iter()
        .map_err(|_| PyValueError::new_err(format!("{name} must be a sequence")))?
    {
        f(item?)?;
    }
    Ok(())
}

fn id_of<'a>(item: &'a Bound<'_, PyAny>) -> PyResult<&'a str> {
    item.cast::<PyString>()
        .map_err(|_| PyValueError::new_err("request ids must be str"))?
        .to_str()
}

fn count(item: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    item.extract::<u32>()
        .map_err(|_| PyValueError::new_err(format!("{name} must be integers from 0 to 2^32-1")))
}

#[pymethods]
impl PyRequestLog {
    #[new]
    // Literals, so that Python's signature shows them: the config's `true` sizes
    // (REQUEST_LOG_SIZE; tests/python/test_api.py checks they agree).
    #[pyo3(signature = (requests = 4096, steps = 4096))]
    fn new(requests: usize, steps: usize) -> Self {
        PyRequestLog {
            log: RequestLog::new(RequestLogSize { requests, steps }),
        }
    }

    /// The log a profiler config asks for (``"stepscope": {"requests": ...}``; a dict, JSON
    /// text or a path), or ``None`` when it asks for none. Raises ``ConfigError`` naming a bad
    /// field.
    #[staticmethod]
    fn from_config(config: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        let config = parse_config(config)?;
        Ok(config.stepscope.requests.map(|size| PyRequestLog {
            log: RequestLog::new(size),
        }))
    }

    /// ``(requests, steps)``: what it keeps, each rounded up to a power of two.
    #[getter]
    fn capacity(&self) -> (u64, u64) {
        let c = self.log.capacity();
        (c.requests, c.steps)
    }

    /// The steps begun so far (the last one's index): ``document_json``'s ``since`` for what
    /// comes after now.
    #[getter]
    fn step_index(&self) -> u64 {
        self.log.step_index()
    }

    /// Its memory in bytes, allocated once.
    #[getter]
    fn memory_bytes(&self) -> usize {
        self.log.memory_bytes()
    }

    /// Request ``id`` reached the scheduler's queue now with ``prompt_tokens`` tokens;
    /// ``arrival_time``: when it arrived at the engine's front door, seconds since the Unix
    /// epoch (vLLM's ``Request.arrival_time``), if known.
    #[pyo3(signature = (id, prompt_tokens, arrival_time = None))]
    fn arrived(&mut self, id: &str, prompt_tokens: u32, arrival_time: Option<f64>) {
        let arrival = arrival_time
            .filter(|t| t.is_finite() && *t > 0.0)
            .map(|t| (t * 1e9) as u64);
        self.log.arrived(id, prompt_tokens, arrival);
    }

    /// The engine begins scheduling a step now (``waiting``: requests in its queue); returns
    /// the step's index, which the step's other calls name.
    #[pyo3(signature = (waiting = 0))]
    fn begin_step(&mut self, waiting: u32) -> u64 {
        self.log.begin_step(waiting)
    }

    /// Step ``step`` scheduled ``tokens[i]`` tokens of request ``ids[i]``, of which the engine
    /// had computed ``computed[i]`` before (three sequences of one length). What the engine
    /// knows of each one's role, at most one of: ``outputs``, the tokens each had produced
    /// before (the log decides by them: prefill until the first token), or ``prefill``, each
    /// one's role itself (``True``: prefill); neither: the log's own count decides.
    #[pyo3(signature = (step, ids, tokens, computed, prefill = None, outputs = None))]
    fn scheduled(
        &mut self,
        step: u64,
        ids: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        computed: &Bound<'_, PyAny>,
        prefill: Option<&Bound<'_, PyAny>>,
        outputs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if prefill.is_some() && outputs.is_some() {
            return Err(PyValueError::new_err("give prefill or outputs, not both"));
        }
        let mut t = tokens.try_iter()?;
        let mut c = computed.try_iter()?;
        let mut p = prefill.map(|p| p.try_iter()).transpose()?;
        let mut o = outputs.map(|o| o.try_iter()).transpose()?;
        let short = || {
            PyValueError::new_err(
                "ids, tokens, computed and prefill or outputs must have one length",
            )
        };
        each(ids, "ids", |item| {
            let n = count(&t.next().ok_or_else(short)??, "tokens")?;
            let before = count(&c.next().ok_or_else(short)??, "computed")?;
            let hint = match (p.as_mut(), o.as_mut()) {
                (Some(p), _) => RoleHint::Prefill(
                    p.next()
                        .ok_or_else(short)??
                        .extract::<bool>()
                        .map_err(|_| PyValueError::new_err("prefill must be bools"))?,
                ),
                (None, Some(o)) => {
                    RoleHint::OutputsBefore(count(&o.next().ok_or_else(short)??, "outputs")?)
                }
                (None, None) => RoleHint::Infer,
            };
            self.log.scheduled_as(step, id_of(&item)?, n, before, hint);
            Ok(())
        })?;
        let more = |i: Option<pyo3::Bound<'_, pyo3::types::PyIterator>>| {
            i.is_some_and(|mut i| i.next().is_some())
        };
        if t.next().is_some() || c.next().is_some() || more(p) || more(o) {
            return Err(short());
        }
        Ok(())
    }

    /// Step ``step`` preempted the requests ``ids``.
    fn preempted(&mut self, step: u64, ids: &Bound<'_, PyAny>) -> PyResult<()> {
        each(ids, "ids", |item| {
            self.log.preempted(step, id_of(&item)?);
            Ok(())
        })
    }

    /// Step ``step`` scheduled nothing: taken back if it is the last begun and recorded no
    /// request (an engine polling its scheduler keeps no room in the ring). Returns whether
    /// it was.
    fn discard_step(&mut self, step: u64) -> bool {
        self.log.discard_step(step)
    }

    /// Step ``step``'s output has been processed: it ends now.
    fn end_step(&mut self, step: u64) {
        self.log.end_step(step);
    }

    /// Step ``step`` gave request ``ids[i]`` ``tokens[i]`` tokens.
    fn produced(
        &mut self,
        step: u64,
        ids: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut t = tokens.try_iter()?;
        let short = || PyValueError::new_err("ids and tokens must have one length");
        each(ids, "ids", |item| {
            let n = count(&t.next().ok_or_else(short)??, "tokens")?;
            self.log.produced(step, id_of(&item)?, n);
            Ok(())
        })?;
        if t.next().is_some() {
            return Err(short());
        }
        Ok(())
    }

    /// Request ``id`` finished for ``reason`` (``stop``, ``length``, ``abort``, ``error``; any
    /// other is ``other``) at the end of step ``step``, or now between steps (``None``).
    fn finished(&mut self, step: Option<u64>, id: &str, reason: &str) {
        self.log.finished(step, id, Finish::from_name(reason));
    }

    /// The steps above ``since`` and the requests active after it, as JSON text:
    /// ``{"pid", "step_index", "now_unix_ns", "clock", "capacity", "recorded",
    /// "evicted_running", "steps": [...], "requests": [...]}``.
    #[pyo3(signature = (since = 0))]
    fn document_json(&self, since: u64) -> String {
        serde_json::to_string(&self.log.document(since)).unwrap_or_default()
    }

    /// The OpenTelemetry spans of the finished requests among ``wanted`` (each ``(id,
    /// trace_id, span_id)``: the engine's span of the request, or ``(id, None, None)``), as
    /// an OTLP ``ExportTraceServiceRequest``: OTLP/JSON text, or with ``protobuf`` its
    /// protobuf bytes (see docs/otel.md for each span and attribute): ``(message, requests,
    /// spans, steps_through, steps_lost)``, ``requests`` those of ``wanted`` the log held
    /// finished. ``salt`` makes this process's ids its own; ``costliest``: steps named per
    /// request (None: the builder's default). With ``steps_after`` (an int, or ``-1`` for
    /// "from the first step these requests lived through") the spans
    /// of the engine steps ended since that step go with them, each once: call again with the
    /// ``steps_through`` returned (``steps_lost``: those the log no longer held); the request
    /// spans then link to them. Reads those requests' records alone (``document_of``), then
    /// lets the log go and builds without the GIL: the engine's thread goes on recording.
    #[pyo3(signature = (wanted, *, salt, costliest = None, steps_after = None, protobuf = false))]
    fn spans_otlp(
        slf: PyRef<'_, Self>,
        py: Python<'_>,
        wanted: Vec<(String, Option<String>, Option<String>)>,
        salt: u64,
        costliest: Option<usize>,
        steps_after: Option<i64>,
        protobuf: bool,
    ) -> (Py<PyAny>, usize, usize, Option<u64>, u64) {
        let ids: Vec<&str> = wanted.iter().map(|w| w.0.as_str()).collect();
        let doc = slf.log.document_of(&ids);
        let after = steps_after.map(|a| match u64::try_from(a) {
            Ok(a) => a,
            // From the step before the first these requests lived through.
            Err(_) => doc
                .steps
                .first()
                .map_or(slf.log.step_index(), |s| s.step - 1),
        });
        let steps = after.map(|a| slf.log.steps_after(a));
        // The log is free again before the build: the engine's thread records into it while
        // this one builds without the GIL.
        drop(slf);
        let (message, requests, spans, through, lost) = py.detach(move || {
            let wanted: Vec<(String, Option<SpanParent>)> = wanted
                .into_iter()
                .map(|(id, trace, span)| {
                    let parent = trace
                        .zip(span)
                        .map(|(trace_id, span_id)| SpanParent { trace_id, span_id });
                    (id, parent)
                })
                .collect();
            let opts = SpanOptions {
                salt,
                costliest: costliest.unwrap_or(COSTLIEST),
                steps: steps.is_some(),
            };
            let mut spans = request_spans(&doc, &wanted, opts);
            let requests = spans.iter().filter(|s| s.name == ENGINE_SPAN).count();
            let (through, lost) = match steps {
                Some(st) => {
                    spans.extend(step_spans(doc.pid, &st.steps, salt));
                    (Some(st.through), st.lost)
                }
                None => (None, 0),
            };
            let message = if protobuf {
                Ok(otlp_protobuf(&spans, "stepscope", stepscope::VERSION))
            } else {
                Err(otlp_json(&spans, "stepscope", stepscope::VERSION))
            };
            (message, requests, spans.len(), through, lost)
        });
        let message = match message {
            Ok(bytes) => PyBytes::new(py, &bytes).into_any().unbind(),
            Err(text) => PyString::new(py, &text).into_any().unbind(),
        };
        (message, requests, spans, through, lost)
    }

    /// ``document_json(since)`` as a dict.
    #[pyo3(signature = (since = 0))]
    fn document(&self, py: Python<'_>, since: u64) -> PyResult<Py<PyAny>> {
        crate::value::serialized(py, &self.log.document(since))
    }

    /// Writes ``document_json(since)`` to ``path``, whole or not at all: into a temporary
    /// beside it (named after this process), fsynced, then renamed into place. Raises
    /// ``OSError`` naming the file when it cannot.
    #[pyo3(signature = (path, since = 0))]
    fn write_json(&self, py: Python<'_>, path: std::path::PathBuf, since: u64) -> PyResult<()> {
        // The engine's other threads go on while the file is written.
        let log = &self.log;
        py.detach(|| log.write_document(&path, since))
            .map_err(|e| crate::to_py(&e))
    }

    fn __repr__(&self) -> String {
        let c = self.log.capacity();
        format!("RequestLog(requests={}, steps={})", c.requests, c.steps)
    }
}
