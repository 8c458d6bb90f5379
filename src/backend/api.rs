//! What every backend implements ([`Backend`]) and what the profiler tells it ([`CaptureStart`],
//! [`WindowEnd`]); the backend that does nothing ([`NoBackend`]).

use crate::config::ProfilerConfig;
use crate::error::Result;
use crate::flush::PendingWrites;
use crate::iteration::{IterationInfo, RequestIds};
use crate::model::ModelShape;
use crate::schedule::{CutShort, SlowStepSeen};

/// What a backend learns when a capture starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureStart<'a> {
    /// The worker's name (trace file prefix).
    pub worker_name: &'a str,
    /// Index of the first step the capture covers (1-based count of `step()` calls), or 0 when
    /// the capture starts in `start()` before the next step.
    pub first_step: u64,
    /// The exact file stem of this capture's trace (see
    /// [`crate::WorkerProfiler::set_trace_name`]); `None`: `{worker}.{time_ns}.pt`.
    pub trace_name: Option<&'a str>,
    /// The slow step this capture follows, when a slow-step trigger started it.
    pub trigger: Option<SlowStepSeen>,
}

/// What the profiler knows of a window as it ends ([`Backend::window_ends`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WindowEnd {
    /// What the capture is projected to hold at its peak until it is written (its growth over
    /// the window times the writer's expansion), when the budget measured it.
    pub held_bytes: Option<u64>,
    /// Why the window ended early, when the capture budget ended it.
    pub cut_short: Option<CutShort>,
}

/// A profiling backend.
///
/// Errors are values: a backend never panics into the engine. A failed `start` leaves the
/// session active and not running (vLLM's behaviour); a failed `stop` is reported and the
/// backend is treated as stopped.
pub trait Backend: Send {
    /// Short name used in messages and manifests: `cuda`, `torch`, …
    fn name(&self) -> &str;

    /// Begins capturing.
    fn start(&mut self, capture: &CaptureStart<'_>) -> Result<()>;

    /// Ends capturing. Slow work (serialization, compression, I/O) belongs on a writer thread,
    /// not here: this runs on the engine thread between two iterations.
    fn stop(&mut self) -> Result<()>;

    /// One running step passed: advance the backend's own schedule (torch's
    /// wait/warmup/active). Called before the step's iteration is annotated.
    fn advance(&mut self) {}

    /// A captured iteration begins: open its annotation (e.g. a `record_function` range).
    /// `name` is vLLM's annotation name for it (see [`IterationInfo::write_name`]). The NVTX
    /// range is the profiler's, not the backend's.
    fn begin_iteration(&mut self, _step: u64, _info: &IterationInfo, _name: &str) {}

    /// The requests the captured iteration `step` serves (`stepscope.request_ids`), told just
    /// before its `begin_iteration`. Backends that record nothing per request ignore them.
    fn record_requests(&mut self, _step: u64, _requests: &dyn RequestIds) {}

    /// Stops recording over an iteration of a stage the session does not capture
    /// (`stepscope.stages`), keeping the session. Backends that cannot pause record through
    /// (the default): their traces then hold those iterations, unannotated and uncounted.
    fn pause(&mut self) -> Result<()> {
        Ok(())
    }

    /// Records again after [`Backend::pause`].
    fn resume(&mut self) -> Result<()> {
        Ok(())
    }

    /// Takes what the next session records from `config` (between sessions only: the
    /// profiler never calls it while one is active). What is fixed when the backend is made,
    /// such as where traces are written, stays. Backends with nothing to change accept it.
    fn reconfigure(&mut self, _config: &ProfilerConfig) -> Result<()> {
        Ok(())
    }

    /// Whether `begin_iteration` reads its `name`. When no backend does and no NVTX tool
    /// listens, the profiler does not format names at all (an empty `name` is passed). Asked
    /// once as each window starts (a successful `start`), not on every step.
    fn uses_names(&self) -> bool {
        true
    }

    /// The captured iteration ends: close what `begin_iteration` opened.
    fn end_iteration(&mut self) {}

    /// Whether `begin_iteration` opens something `end_iteration` must close (the default). A
    /// backend that opens nothing per iteration lets the `IterationGuard` of an iteration
    /// that nothing else annotates (no NVTX tool listening), times (no slow-step trigger) or
    /// records (no timeline) end without taking the profiler's lock again. An explicit
    /// `step_end()` (the C ABI's, the Python scope's) still takes it while a session is armed.
    /// Asked once as each window starts, as [`Backend::uses_names`] is.
    fn has_iteration_range(&self) -> bool {
        true
    }

    /// Whether a window could begin now: a backend that writes files checks its disk
    /// (`stepscope.min_free_disk_mb`) and what the captures it has not written yet hold in
    /// memory (against `stepscope.max_capture_mb`). Called by `start()` (its error is the
    /// caller's) and by `start` itself.
    fn preflight(&self) -> Result<()> {
        Ok(())
    }

    /// The running window ends; `stop` follows at once. A backend that writes a trace records
    /// a cut in it and its manifest, and counts what the capture holds against the budget.
    fn window_ends(&mut self, _end: &WindowEnd) {}

    /// Adds a key to the header of the traces this backend writes from now on, `json_value`
    /// being valid JSON (e.g. vLLM's `vllm_version`, torch's `distributedInfo`); a key given
    /// again replaces its value. Backends that write no trace ignore it (the default).
    fn set_trace_metadata(&mut self, _key: &str, _json_value: &str) {}

    /// The served model's shape, for the header and manifest of the traces written from now
    /// on. Backends that write no trace ignore it (the default).
    fn set_model(&mut self, _model: &ModelShape) {}

    /// The backend's count of background writes, if it writes in the background. The profiler
    /// waits on it for `flush()` without holding its own lock.
    fn pending_writes(&self) -> Option<PendingWrites> {
        None
    }
}

/// The backend of a config without `profiler`: starting and stopping do nothing, so the
/// schedule still runs (and step indices still count) with nothing captured.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoBackend;

impl Backend for NoBackend {
    fn name(&self) -> &str {
        "none"
    }

    fn uses_names(&self) -> bool {
        false
    }

    fn has_iteration_range(&self) -> bool {
        false
    }

    fn start(&mut self, _capture: &CaptureStart<'_>) -> Result<()> {
        Ok(())
    }

    fn stop(&mut self) -> Result<()> {
        Ok(())
    }
}
