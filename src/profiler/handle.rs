//! The profiler's handle, [`WorkerProfiler`]: its gate, and every call but the per-iteration
//! ones (making it; start, stop, shutdown; flushing and write tickets; its state, timeline and
//! names; the gate's recomputation after each locked transition).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;

use super::driver::Inner;
use super::options::{StartOutcome, StopOutcome};
use super::status::{Status, Writes};
use crate::backend::{self, Backend};
use crate::config::ProfilerConfig;
use crate::error::{Error, Result};
use crate::flush::PendingWrites;
use crate::schedule::{Phase, StartOptions};
use crate::timeline::{Timeline, TimelineDocument, TimelineStep};

/// Gate bit: a session is active, backend work is pending, a range is open, or every iteration
/// gets an NVTX range (`nvtx: "always"` with a tool attached). `step()` must take the slow path.
pub(super) const GATE_ARMED: u8 = 1;
/// Gate bit: no engine thread is known yet; the first `step()` registers it.
const GATE_UNREGISTERED: u8 = 2;
/// Gate bit: the step timeline is on (`stepscope.timeline`); alone, `step()` records the step
/// in it without the lock.
pub(super) const GATE_TIMELINE: u8 = 4;
/// Gate bit: the backend captures ([`WorkerProfiler::is_running`]); set only with
/// [`GATE_ARMED`], so the idle and timeline-only paths read the gate as before.
const GATE_RUNNING: u8 = 8;

/// The engine-side profiler of one worker: vLLM's `WorkerProfiler`, driven by one `step()`
/// per engine iteration.
///
/// ```
/// use stepscope::{IterationInfo, ProfilerConfig, WorkerProfiler};
/// let cfg = ProfilerConfig::from_json_str(r#"{"delay_iterations": 2, "max_iterations": 3}"#)?;
/// let profiler = WorkerProfiler::new(&cfg, "worker0")?;
/// profiler.start()?;
/// let mut captured = Vec::new();
/// for i in 1..=8u32 {
///     let _iteration = profiler.step(&IterationInfo::new(0, 0, i, i));
///     if profiler.is_running() {
///         captured.push(i);
///     }
///     // ... run the model for this iteration ...
/// }
/// assert_eq!(captured, [2, 3, 4]);
/// assert!(!profiler.is_active());
/// # Ok::<(), stepscope::Error>(())
/// ```
pub struct WorkerProfiler {
    pub(super) gate: AtomicU8,
    pub(super) steps: AtomicU64,
    /// `stepscope.request_ids`: captured iterations record the ids `step_with_requests` gets.
    pub(super) request_ids: bool,
    /// `stepscope.timeline`: the last N steps, written by the engine thread without the lock.
    pub(super) timeline: Option<Box<Timeline>>,
    pub(super) inner: Mutex<Inner>,
}

impl WorkerProfiler {
    /// A profiler with the backend the config names (`profiler`; none when it names none),
    /// for local rank 0. See [`WorkerProfiler::with_local_rank`].
    pub fn new(config: &ProfilerConfig, worker_name: &str) -> Result<Self> {
        Self::with_local_rank(config, worker_name, 0)
    }

    /// A profiler for the worker of local rank `local_rank`: the `cuda` profiler uses that
    /// CUDA device's primary context when the engine thread has no current context.
    pub fn with_local_rank(
        config: &ProfilerConfig,
        worker_name: &str,
        local_rank: u32,
    ) -> Result<Self> {
        let backend = backend::for_config(config, local_rank)?;
        Ok(Self::with_backend(config, worker_name, backend))
    }

    /// A profiler driving the given backend with the config's schedule.
    pub fn with_backend(
        config: &ProfilerConfig,
        worker_name: &str,
        backend: Box<dyn Backend>,
    ) -> Self {
        let profiler = WorkerProfiler {
            gate: AtomicU8::new(GATE_UNREGISTERED),
            steps: AtomicU64::new(0),
            request_ids: config.stepscope.request_ids,
            timeline: config
                .stepscope
                .timeline
                .map(|n| Box::new(Timeline::new(n))),
            inner: Mutex::new(Inner::new(config, worker_name, backend)),
        };
        profiler.sync_gate(&profiler.inner.lock());
        profiler
    }

    /// Starts a session with the config's delay and max. See [`WorkerProfiler::start_with`].
    pub fn start(&self) -> Result<StartOutcome> {
        self.start_with(StartOptions::default())
    }

    /// Starts a session; the overrides hold for this session only.
    ///
    /// A start while a session is active is ignored ([`StartOutcome::AlreadyActive`]). With
    /// delay 0 the backend starts now (or at the engine's next step, when called from another
    /// thread). `Err(Error::Backend)` means the backend failed to start: as in vLLM the session
    /// stays active and not running until `stop()`.
    pub fn start_with(&self, options: StartOptions) -> Result<StartOutcome> {
        let mut g = self.inner.lock();
        let result = g.start(options, self.step_index());
        self.sync_gate(&g);
        result
    }

    /// Ends the session. Ignored when none is active; a stop during the delay never touches
    /// the backend. An `Err` is the backend's stop failure; the session is ended regardless.
    pub fn stop(&self) -> Result<StopOutcome> {
        let mut g = self.inner.lock();
        let result = g.stop(self.step_index());
        self.sync_gate(&g);
        result
    }

    /// Ends a running session on the calling thread (the engine loop is over), as vLLM's
    /// `shutdown()`. A session still in its delay is left as it is.
    pub fn shutdown(&self) -> Result<()> {
        let mut g = self.inner.lock();
        let result = g.shutdown(self.step_index());
        self.sync_gate(&g);
        result
    }

    /// Waits up to `timeout` for the backend's background trace writing. `Ok(true)` when
    /// nothing is pending. Never holds the profiler's lock while waiting.
    pub fn flush(&self, timeout: Duration) -> Result<bool> {
        let pending = self.inner.lock().backend.pending_writes();
        Ok(pending.is_none_or(|p| p.wait(timeout)))
    }

    /// How many stopped sessions' traces are still being written in the background.
    pub fn pending_writes(&self) -> usize {
        self.inner.lock().pending_writes()
    }

    /// A mark to read trace outcomes from: taken before a `stop()`,
    /// [`WorkerProfiler::writes_since`] with it reports every trace that stop ends (and any
    /// still being written when the mark was taken). 0 for a backend that writes no files.
    pub fn write_ticket(&self) -> u64 {
        let pending = self.inner.lock().backend.pending_writes();
        pending.map_or(0, |p| p.ticket())
    }

    /// Where the traces since `ticket` ([`WorkerProfiler::write_ticket`]) stand: what a caller
    /// who must not return before a stop's traces are on disk polls, without ever waiting on
    /// the engine thread. Done when [`Writes::settled`].
    pub fn writes_since(&self, ticket: u64) -> Writes {
        let g = self.inner.lock();
        let pending = g.backend.pending_writes();
        Writes {
            stopping: g.pending_stop,
            pending_writes: pending.as_ref().map_or(0, PendingWrites::count),
            traces: pending.map_or_else(Vec::new, |p| p.traces_since(ticket)),
        }
    }

    /// A session is active (started and not stopped), vLLM's `_active`.
    pub fn is_active(&self) -> bool {
        self.inner.lock().schedule.is_active()
    }

    /// The backend captures, vLLM's `is_running`: also after a `stop()` from another thread
    /// until the engine thread has stopped the backend (at its next step).
    pub fn is_running(&self) -> bool {
        self.inner.lock().backend_running()
    }

    /// [`WorkerProfiler::is_running`] as the last transition left it, without the lock (one
    /// relaxed load): exact on the thread that made that transition (the engine thread after
    /// its own `step()`, `step_end()` or `stop()`), possibly a moment late on another. For a
    /// caller that must know, around each of its own calls, whether that call stopped the
    /// backend (the Python binding, which then takes torch's Python tracer off the thread).
    #[inline]
    pub fn is_running_here(&self) -> bool {
        self.gate.load(Relaxed) & GATE_RUNNING != 0
    }

    /// Whether iterations should be annotated: while running, as vLLM's `should_annotate`.
    pub fn should_annotate(&self) -> bool {
        self.is_running()
    }

    /// The session's named state.
    pub fn phase(&self) -> Phase {
        self.inner.lock().schedule.phase()
    }

    /// The profiler's state, for `stepscope ctl status` and logs.
    pub fn status(&self) -> Status {
        let mut status = Status::of(&self.inner.lock(), self.step_index(), self.request_ids);
        status.timeline = self.timeline.as_ref().map(|t| t.info());
        status
    }

    /// Whether `stepscope.timeline` is on: every `step()` then reads its counts, and the
    /// guard's drop (or `step_end`) ends the step's time.
    #[inline]
    pub fn has_timeline(&self) -> bool {
        self.timeline.is_some()
    }

    /// The timeline's ended steps above index `since` (0: all it holds), oldest first; `None`
    /// when `stepscope.timeline` is off. Any thread: it never blocks the engine.
    pub fn timeline(&self, since: u64) -> Option<Vec<TimelineStep>> {
        self.timeline.as_ref().map(|t| t.steps(since))
    }

    /// The timeline as every surface serves it: the worker's name, rank, phase and step count,
    /// its clock now, and its ended steps above `since` (the last `last` of them, when given)
    /// as arrays in [`FIELDS`](crate::timeline::FIELDS) order. Never blocks the engine thread.
    pub fn timeline_document(&self, since: u64, last: Option<usize>) -> TimelineDocument {
        let status = self.status();
        let steps = self.timeline(since).map(|steps| {
            let skip = last.map_or(0, |n| steps.len().saturating_sub(n));
            steps[skip..].iter().map(TimelineStep::as_tuple).collect()
        });
        TimelineDocument {
            worker_name: status.worker_name,
            rank: status.rank,
            phase: status.phase,
            step_index: status.step_index,
            now_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            timeline: status.timeline,
            fields: crate::timeline::FIELDS,
            steps,
        }
    }

    /// How many times `step()` has been called (the last step's index; the first is 1).
    pub fn step_index(&self) -> u64 {
        self.steps.load(Relaxed)
    }

    /// The worker's name.
    pub fn worker_name(&self) -> String {
        self.inner.lock().worker_name.clone()
    }

    /// Sets the worker's global rank, which `stepscope.ranks` selects by. Without it the
    /// `RANK` environment variable (torchrun's, read when the profiler is made) is used.
    pub fn set_rank(&self, rank: u32) {
        self.inner.lock().set_rank(rank);
    }

    /// Adds `key` to the header of the traces written from now on (the torch backend's; other
    /// backends write none), as torch's `add_metadata_json` does: `json_value` must be valid
    /// JSON, else [`Error::InvalidArgument`] naming the key. A key given again is replaced.
    pub fn set_trace_metadata(&self, key: &str, json_value: &str) -> Result<()> {
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(json_value) {
            return Err(Error::InvalidArgument {
                name: key.to_string(),
                message: format!("trace metadata must be valid JSON: {e}"),
            });
        }
        self.inner
            .lock()
            .backend
            .set_trace_metadata(key, json_value);
        Ok(())
    }

    /// Records the served model's shape in the header and manifest of the traces written
    /// from now on (the torch backend's), for `stepscope analyze`'s floor of each step.
    pub fn set_model(&self, model: &crate::model::ModelShape) {
        self.inner.lock().backend.set_model(model);
    }

    /// Names the next session's traces (vLLM's `set_output_name`): they are
    /// `{name}.{time_ns}.pt.trace.json.gz`. A name that is no file name is an
    /// [`Error::InvalidArgument`] naming `worker_name`, as [`WorkerProfiler::set_trace_name`]'s
    /// rule. Ignored while a session is active, as in vLLM: returns whether the name was taken.
    pub fn set_worker_name(&self, name: &str) -> Result<bool> {
        check_file_stem("worker_name", name)?;
        let mut g = self.inner.lock();
        if g.schedule.is_active() {
            return Ok(false);
        }
        name.clone_into(&mut g.worker_name);
        Ok(true)
    }

    /// Names the files of the next capture exactly: `{name}.trace.json.gz` (or `.json`),
    /// `{name}.stepscope.json` and, when the config asks for the op table,
    /// `{name}.profiler_out.txt`, in place of `{worker}.{time_ns}.pt.trace.json.gz` (engines
    /// such as SGLang name their traces themselves). The name is used by the next backend start
    /// only; later captures (the next windows of a `repeat` series) are named as usual. `None`
    /// drops a name not used yet. A name that is empty, starts with `.`, or holds `/`, a backslash or
    /// a control character is an [`Error::InvalidArgument`] naming `trace_name`. Ignored
    /// while a session is active: returns whether it was taken.
    pub fn set_trace_name(&self, name: Option<&str>) -> Result<bool> {
        if let Some(n) = name {
            check_file_stem("trace_name", n)?;
        }
        let mut g = self.inner.lock();
        if g.schedule.is_active() {
            return Ok(false);
        }
        g.set_trace_name(name);
        Ok(true)
    }

    /// Changes what the next session records (for the torch backend: activities,
    /// record_shapes, with_memory, with_stack, with_flops; the capture budget), as a config with
    /// those fields changed. Where traces are written stays as the profiler was made. Ignored
    /// while a session is active or its stop is pending: returns whether it was applied.
    pub fn reconfigure(&self, config: &ProfilerConfig) -> Result<bool> {
        let mut g = self.inner.lock();
        if g.schedule.is_active() || g.pending_stop {
            return Ok(false);
        }
        g.reconfigure(config)?;
        Ok(true)
    }

    /// The last error that could not be returned to its caller (a backend failure inside
    /// `step()`, or in work another thread asked for), taken.
    pub fn take_last_error(&self) -> Option<Error> {
        self.inner.lock().last_error.take()
    }

    /// Recomputes the gate from the state; called at the end of every locked transition so
    /// the last writer under the lock leaves the right value.
    pub(super) fn sync_gate(&self, g: &Inner) {
        let mut gate = 0;
        if g.engine_thread.is_none() {
            gate |= GATE_UNREGISTERED;
        }
        if g.schedule.is_active()
            || g.pending_start
            || g.pending_stop
            || g.iteration_open()
            || g.nvtx_always
        {
            gate |= GATE_ARMED;
        }
        // The backend runs only within a session or while its stop is pending: never without
        // GATE_ARMED.
        if g.backend_running() {
            gate |= GATE_RUNNING;
        }
        if self.timeline.is_some() {
            gate |= GATE_TIMELINE;
        }
        self.gate.store(gate, Relaxed);
    }
}

/// A name that becomes the start of trace files' names: non-empty, at most 200 bytes, not
/// hidden (a leading `.` is what temporaries look like), no path separator or control
/// character. Else an [`Error::InvalidArgument`] naming `argument`.
fn check_file_stem(argument: &str, n: &str) -> Result<()> {
    let bad = n.is_empty()
        || n.starts_with('.')
        || n.len() > 200
        || n.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(Error::InvalidArgument {
            name: argument.to_string(),
            message: format!(
                "{n:?} is not a file name: non-empty, at most 200 bytes, not starting with \
                 '.', without '/', '\\' or control characters"
            ),
        });
    }
    Ok(())
}

impl Drop for WorkerProfiler {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            log::warn!("stepscope: stopping the profiler at drop failed: {e}");
        }
    }
}

impl std::fmt::Debug for WorkerProfiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.inner.lock();
        f.debug_struct("WorkerProfiler")
            .field("worker_name", &g.worker_name)
            .field("backend", &g.backend.name())
            .field("phase", &g.schedule.phase())
            .field("step_index", &self.step_index())
            .finish()
    }
}
