//! `WorkerProfiler`: the schedule, a backend, and the thread rules between them.
//!
//! # Thread rules
//! `step()` is called by the engine thread, once per engine iteration. `start()` and `stop()`
//! may come from any thread. Backends with thread affinity (a CUDA context, Kineto's
//! thread-local state) must start and stop on the engine thread, so:
//!
//! - before the first `step()`, no engine thread is known and every call acts at once on the
//!   calling thread;
//! - afterwards, a call from the engine thread acts at once (vLLM's behaviour, where
//!   `start_profile` runs on the worker's own thread), while a backend start or stop requested
//!   from another thread is recorded and carried out by the engine thread at its next `step()`,
//!   before that step is counted. The schedule's own state (active, counters) changes at once.
//!
//! `shutdown()` acts on the calling thread: the engine loop has ended by then.
//!
//! # Cost
//! With nothing armed, `step()` is one relaxed load of the gate plus the engine-owned step
//! counter's increment (a relaxed load and store, no read-modify-write): no lock, no allocation,
//! no formatting. Everything else lives in `#[cold]` functions. `benches/step.rs` measures it.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::thread::{self, ThreadId};
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::nvtx::Nvtx;
use crate::backend::{self, Backend, CaptureStart};
use crate::config::{NvtxMode, ProfilerConfig};
use crate::error::{Error, Result};
use crate::iteration::IterationInfo;
use crate::schedule::{
    Limits, Phase, Policy, Schedule, StartDecision, StartOptions, StepBegin, StepInfo, StopDecision,
};

/// Gate bit: a session is active, backend work is pending, a range is open, or every iteration
/// gets an NVTX range (`nvtx: "always"` with a tool attached). `step()` must take the slow path.
const GATE_ARMED: u8 = 1;
/// Gate bit: no engine thread is known yet; the first `step()` registers it.
const GATE_UNREGISTERED: u8 = 2;

/// Constructors from the signed values the C ABI and Python pass.
impl StartOptions {
    /// From signed values, as the C ABI and Python pass them: a negative value is an
    /// [`Error::InvalidArgument`] naming the field.
    pub fn from_signed(delay_iterations: Option<i64>, max_iterations: Option<i64>) -> Result<Self> {
        fn check(name: &str, v: Option<i64>) -> Result<Option<u64>> {
            match v {
                None => Ok(None),
                Some(v) => u64::try_from(v)
                    .map(Some)
                    .map_err(|_| Error::InvalidArgument {
                        name: name.into(),
                        message: format!("must be greater than or equal to 0 (got {v})"),
                    }),
            }
        }
        Ok(StartOptions {
            delay_iterations: check("delay_iterations", delay_iterations)?,
            max_iterations: check("max_iterations", max_iterations)?,
            start_at_step: None,
        })
    }

    /// The same options starting at an absolute step (signed, as the C ABI and Python pass
    /// it): a value below 1 is an [`Error::InvalidArgument`] naming `start_at_step`.
    pub fn at_step(mut self, start_at_step: Option<i64>) -> Result<Self> {
        self.start_at_step = match start_at_step {
            None => None,
            Some(v) => Some(u64::try_from(v).ok().filter(|s| *s >= 1).ok_or_else(|| {
                Error::InvalidArgument {
                    name: "start_at_step".into(),
                    message: format!("must be a step index >= 1 (got {v})"),
                }
            })?),
        };
        Ok(self)
    }
}

/// What [`WorkerProfiler::start_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOutcome {
    /// The backend started.
    Started,
    /// The backend starts in the step whose count since now equals `delay`.
    Armed {
        /// The session's delay.
        delay: u64,
    },
    /// The engine thread starts the backend at its next `step()`.
    Deferred,
    /// The backend starts in the step with this index (`start_at_step`).
    ArmedAt {
        /// The session's start step.
        step: u64,
    },
    /// A session was already active; the request was ignored (as vLLM does).
    AlreadyActive,
    /// This worker's rank is not in `stepscope.ranks`: nothing starts here.
    NotSelected,
}

/// What [`WorkerProfiler::stop`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// The backend stopped.
    Stopped,
    /// The session ended before its backend started; the backend was not touched.
    Disarmed,
    /// The session ended; the engine thread stops the backend at its next `step()`.
    Deferred,
    /// No session was active; the request was ignored (as vLLM does).
    NotActive,
    /// This worker's rank is not in `stepscope.ranks`: nothing to stop here.
    NotSelected,
}

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
    gate: AtomicU8,
    steps: AtomicU64,
    inner: Mutex<Inner>,
}

struct Inner {
    worker_name: String,
    schedule: Schedule,
    backend: Box<dyn Backend>,
    engine_thread: Option<ThreadId>,
    pending_stop: bool,
    pending_start: bool,
    /// The backend's annotation of the current iteration is open.
    backend_range_open: bool,
    /// Present only while an NVTX tool listens and NVTX is not off.
    nvtx: Option<Nvtx>,
    nvtx_always: bool,
    detailed_names: bool,
    /// The current iteration's name, reused so naming allocates only until it has grown.
    name: String,
    last_error: Option<Error>,
    /// The worker's global rank, for `stepscope.ranks`.
    rank: Option<u32>,
    /// `stepscope.ranks`: only these ranks profile.
    ranks: Option<Vec<u32>>,
    /// The file stem of the next capture's trace ([`WorkerProfiler::set_trace_name`]), taken
    /// by the backend start that uses it.
    trace_name: Option<String>,
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
        let limits = Limits {
            delay: config.delay_iterations,
            max: config.max_iterations,
        };
        let nvtx = match config.stepscope.nvtx {
            NvtxMode::Off => None,
            NvtxMode::Running | NvtxMode::Always => Nvtx::attach(&config.stepscope.nvtx_domain),
        };
        let nvtx_always = nvtx.is_some() && config.stepscope.nvtx == NvtxMode::Always;
        let profiler = WorkerProfiler {
            gate: AtomicU8::new(GATE_UNREGISTERED),
            steps: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                worker_name: worker_name.to_string(),
                trace_name: None,
                schedule: Schedule::with_policy(
                    limits,
                    config.uncounted_steps_after_start(),
                    Policy::from(&config.stepscope.capture),
                ),
                backend,
                engine_thread: None,
                pending_stop: false,
                pending_start: false,
                backend_range_open: false,
                nvtx,
                nvtx_always,
                detailed_names: config.detailed_trace_annotation,
                name: String::with_capacity(128),
                last_error: None,
                rank: rank_from_env(),
                ranks: config.stepscope.capture.ranks.clone(),
            }),
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
        if !g.selected()? {
            log::info!(
                "stepscope: start ignored: rank {} is not in stepscope.ranks",
                g.rank.unwrap_or_default()
            );
            return Ok(StartOutcome::NotSelected);
        }
        let here = g.is_engine_thread();
        if here {
            g.run_pending(self.next_step());
        }
        let result = match g.schedule.start(options, self.step_index()) {
            StartDecision::Passed { step, now } => Err(Error::InvalidArgument {
                name: "start_at_step".into(),
                message: format!(
                    "step {step} has already passed on this worker (it is at step {now}); \
                     pick a later step"
                ),
            }),
            StartDecision::ArmedAt { step } => Ok(StartOutcome::ArmedAt { step }),
            StartDecision::AlreadyActive => {
                log::debug!("start received while a session is active; ignoring it");
                Ok(StartOutcome::AlreadyActive)
            }
            StartDecision::Armed { delay } => Ok(StartOutcome::Armed { delay }),
            StartDecision::StartBackend if here => g
                .start_backend(self.next_step())
                .map(|()| StartOutcome::Started),
            StartDecision::StartBackend => {
                g.pending_start = true;
                Ok(StartOutcome::Deferred)
            }
        };
        self.sync_gate(&g);
        result
    }

    /// Ends the session. Ignored when none is active; a stop during the delay never touches
    /// the backend. An `Err` is the backend's stop failure; the session is ended regardless.
    pub fn stop(&self) -> Result<StopOutcome> {
        let mut g = self.inner.lock();
        if !g.selected().unwrap_or(true) {
            return Ok(StopOutcome::NotSelected);
        }
        let here = g.is_engine_thread();
        if here {
            g.run_pending(self.next_step());
        }
        let result = match g.schedule.stop() {
            StopDecision::NotActive => {
                log::debug!("stop received while no session is active; ignoring it");
                Ok(StopOutcome::NotActive)
            }
            StopDecision::Disarmed => Ok(StopOutcome::Disarmed),
            StopDecision::CancelStart => {
                g.pending_start = false;
                Ok(StopOutcome::Disarmed)
            }
            StopDecision::StopBackend if here => g
                .stop_backend(self.step_index())
                .map(|()| StopOutcome::Stopped),
            StopDecision::StopBackend => {
                g.pending_stop = true;
                Ok(StopOutcome::Deferred)
            }
        };
        self.sync_gate(&g);
        result
    }

    /// Ends a running session on the calling thread (the engine loop is over), as vLLM's
    /// `shutdown()`. A session still in its delay is left as it is.
    pub fn shutdown(&self) -> Result<()> {
        let mut g = self.inner.lock();
        g.close_range();
        let decision = g.schedule.shutdown();
        if decision == StopDecision::CancelStart {
            g.pending_start = false;
        }
        let result = if g.pending_stop || decision == StopDecision::StopBackend {
            g.pending_stop = false;
            g.stop_backend(self.step_index())
        } else {
            Ok(())
        };
        self.sync_gate(&g);
        result
    }

    /// Marks the start of one engine iteration; call it once per iteration on the engine
    /// thread. While capturing, the iteration is annotated until the returned guard drops (or
    /// [`WorkerProfiler::step_end`], or the next `step()`).
    ///
    /// Never fails into the engine: a backend error is logged and kept for
    /// [`WorkerProfiler::take_last_error`].
    #[inline]
    pub fn step(&self, info: &IterationInfo) -> Iteration<'_> {
        // The engine thread is the only writer of the counter, so a plain load and store
        // suffices: no locked read-modify-write on the per-iteration path.
        let index = self.steps.load(Relaxed) + 1;
        self.steps.store(index, Relaxed);
        if self.gate.load(Relaxed) == 0 {
            return Iteration::idle();
        }
        self.step_slow(index, info)
    }

    /// `step()` when it has nothing to do: with nothing armed (and the engine thread known),
    /// counts the step and returns true, in one relaxed load; otherwise does nothing and
    /// returns false, and the caller calls [`WorkerProfiler::step`]. For bindings that pay to
    /// enter `step()` (Python releases the GIL around it) and can skip that when idle.
    #[inline]
    pub fn try_step_idle(&self) -> bool {
        if self.gate.load(Relaxed) != 0 {
            return false;
        }
        self.steps.store(self.steps.load(Relaxed) + 1, Relaxed);
        true
    }

    #[cold]
    #[inline(never)]
    fn step_slow(&self, index: u64, info: &IterationInfo) -> Iteration<'_> {
        let mut g = self.inner.lock();
        if g.engine_thread.is_none() {
            g.engine_thread = Some(thread::current().id());
        }
        g.close_range();
        g.run_pending(index);
        let outcome = match g.schedule.begin_step(StepInfo::of(index, info)) {
            // On failure the session stays active, not running; the error is kept.
            StepBegin::StartBackend => g.start_backend(index),
            StepBegin::PauseBackend => g.pause_backend(index),
            StepBegin::ResumeBackend => g.resume_backend(index),
            StepBegin::Inactive | StepBegin::Counted => Ok(()),
        };
        if let Err(e) = outcome {
            g.last_error = Some(e);
        }
        let end = g.schedule.end_step();
        if end.advance_backend {
            g.backend.advance();
        }
        if end.stop_backend {
            if let Err(e) = g.stop_backend(index) {
                g.last_error = Some(e);
            }
        }
        let captured = g.schedule.is_running();
        let open = g.open_iteration(index, info, captured);
        self.sync_gate(&g);
        Iteration {
            profiler: open.then_some(self),
            captured,
            _not_send: PhantomData,
        }
    }

    /// Closes the current iteration's annotation, if one is open. The guard returned by
    /// `step()` calls this when it drops.
    #[inline]
    pub fn step_end(&self) {
        if self.gate.load(Relaxed) & GATE_ARMED != 0 {
            self.step_end_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn step_end_slow(&self) {
        let mut g = self.inner.lock();
        g.close_range();
        self.sync_gate(&g);
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

    /// A session is active (started and not stopped), vLLM's `_active`.
    pub fn is_active(&self) -> bool {
        self.inner.lock().schedule.is_active()
    }

    /// The backend captures, vLLM's `is_running`.
    pub fn is_running(&self) -> bool {
        self.inner.lock().schedule.is_running()
    }

    /// Whether iterations should be annotated: while running, as vLLM's `should_annotate`.
    pub fn should_annotate(&self) -> bool {
        self.is_running()
    }

    /// Whether the next `step()` can do anything with its [`IterationInfo`]: a session is
    /// active, backend work is pending, or every iteration gets an NVTX range. One relaxed
    /// load; engines that compute counts in an interpreted language (the vLLM plugin) skip
    /// that work while it is false.
    #[inline]
    pub fn is_armed(&self) -> bool {
        self.gate.load(Relaxed) & GATE_ARMED != 0
    }

    /// The session's named state.
    pub fn phase(&self) -> Phase {
        self.inner.lock().schedule.phase()
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
        self.inner.lock().rank = Some(rank);
    }

    /// The profiler's state, for `stepscope ctl status` and logs.
    pub fn status(&self) -> Status {
        let g = self.inner.lock();
        let s = &g.schedule;
        let limits = s.limits();
        Status {
            worker_name: g.worker_name.clone(),
            backend: g.backend.name().to_string(),
            rank: g.rank,
            selected: g.selected().unwrap_or(false),
            phase: s.phase().as_str(),
            active: s.is_active(),
            running: s.is_running(),
            step_index: self.step_index(),
            steps_since_start: s.steps_since_start(),
            delay_iterations: limits.delay,
            max_iterations: limits.max,
            start_at_step: s.target_step(),
            window_first_step: s.window_start(),
            iterations_captured: s.captured_steps(),
            windows: s.windows(),
            windows_done: s.windows_done(),
            next_window_at: s.next_window_at(),
            pending_writes: g.pending_writes(),
            last_error: g.last_error.as_ref().map(Error::to_string),
        }
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

    /// Names the next session's traces (vLLM's `set_output_name`). Ignored while a session is
    /// active, as in vLLM: returns whether the name was taken.
    pub fn set_worker_name(&self, name: &str) -> bool {
        let mut g = self.inner.lock();
        if g.schedule.is_active() {
            return false;
        }
        name.clone_into(&mut g.worker_name);
        true
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
            let bad = n.is_empty()
                || n.starts_with('.')
                || n.len() > 200
                || n.chars().any(|c| c == '/' || c == '\\' || c.is_control());
            if bad {
                return Err(Error::InvalidArgument {
                    name: "trace_name".to_string(),
                    message: format!(
                        "{n:?} is not a file name: non-empty, at most 200 bytes, not starting \
                         with '.', without '/', '\\' or control characters"
                    ),
                });
            }
        }
        let mut g = self.inner.lock();
        if g.schedule.is_active() {
            return Ok(false);
        }
        g.trace_name = name.map(str::to_string);
        Ok(true)
    }

    /// Changes what the next session records (for the torch backend: activities,
    /// record_shapes, with_memory, with_stack, with_flops), as a config with
    /// those fields changed. Where traces are written stays as the profiler was made. Ignored
    /// while a session is active or its stop is pending: returns whether it was applied.
    pub fn reconfigure(&self, config: &ProfilerConfig) -> Result<bool> {
        let mut g = self.inner.lock();
        if g.schedule.is_active() || g.pending_stop {
            return Ok(false);
        }
        g.backend.reconfigure(config).map(|()| true)
    }

    /// The last error that could not be returned to its caller (a backend failure inside
    /// `step()`, or in work another thread asked for), taken.
    pub fn take_last_error(&self) -> Option<Error> {
        self.inner.lock().last_error.take()
    }

    fn next_step(&self) -> u64 {
        self.steps.load(Relaxed) + 1
    }

    /// Recomputes the gate from the state; called at the end of every locked transition so
    /// the last writer under the lock leaves the right value.
    fn sync_gate(&self, g: &Inner) {
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
        self.gate.store(gate, Relaxed);
    }
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

impl Inner {
    fn pending_writes(&self) -> usize {
        self.backend.pending_writes().map_or(0, |p| p.count())
    }

    /// Whether this worker profiles under `stepscope.ranks`; an error when the list is set
    /// and the worker's rank is unknown.
    fn selected(&self) -> Result<bool> {
        match (&self.ranks, self.rank) {
            (None, _) => Ok(true),
            (Some(ranks), Some(rank)) => Ok(ranks.contains(&rank)),
            (Some(_), None) => Err(Error::config(
                "stepscope.ranks",
                "needs this worker's global rank: pass it (Rust: set_rank; Python: rank=) or \
                 set the RANK environment variable",
            )),
        }
    }

    fn pause_backend(&mut self, step: u64) -> Result<()> {
        if let Some(nvtx) = &self.nvtx {
            nvtx.mark(c"capture pause", step);
        }
        let result = self.backend.pause();
        if let Err(e) = &result {
            log::warn!("stepscope: failed to pause the profiler: {e}");
        }
        result
    }

    fn resume_backend(&mut self, step: u64) -> Result<()> {
        let result = self.backend.resume();
        match &result {
            Ok(()) => {
                if let Some(nvtx) = &self.nvtx {
                    nvtx.mark(c"capture resume", step);
                }
            }
            Err(e) => log::warn!("stepscope: failed to resume the profiler: {e}"),
        }
        result
    }

    fn is_engine_thread(&self) -> bool {
        self.engine_thread
            .is_none_or(|id| id == thread::current().id())
    }

    /// Carries out backend work that other threads asked for, in the order it was asked: a
    /// stop always precedes a start (a start can only follow once the stop ended the session).
    /// Their errors cannot reach the threads that asked, so they are kept in `last_error`.
    fn run_pending(&mut self, next_step: u64) {
        if self.pending_stop {
            self.pending_stop = false;
            if let Err(e) = self.stop_backend(next_step) {
                self.last_error = Some(e);
            }
        }
        if self.pending_start {
            self.pending_start = false;
            if let Err(e) = self.start_backend(next_step) {
                self.last_error = Some(e);
            }
        }
    }

    fn start_backend(&mut self, first_step: u64) -> Result<()> {
        let capture = CaptureStart {
            worker_name: &self.worker_name,
            first_step,
            trace_name: self.trace_name.as_deref(),
        };
        let result = self.backend.start(&capture);
        self.schedule.start_result(result.is_ok());
        match &result {
            Ok(()) => {
                self.trace_name = None;
                if let Some(nvtx) = &self.nvtx {
                    nvtx.mark(c"capture start", first_step);
                }
            }
            Err(e) => log::warn!("stepscope: failed to start the profiler: {e}"),
        }
        result
    }

    /// Stops the backend; `step` is the step it stops in (for the NVTX mark).
    fn stop_backend(&mut self, step: u64) -> Result<()> {
        self.close_range();
        if let Some(nvtx) = &self.nvtx {
            nvtx.mark(c"capture stop", step);
        }
        let result = self.backend.stop();
        if let Err(e) = &result {
            log::warn!("stepscope: failed to stop the profiler: {e}");
        }
        result
    }

    /// Opens the iteration's annotations: the backend's while capturing, NVTX's while
    /// capturing or always. The name is formatted only when one of them will use it.
    /// Returns whether anything was opened.
    fn open_iteration(&mut self, step: u64, info: &IterationInfo, captured: bool) -> bool {
        let nvtx = self.nvtx.is_some() && (captured || self.nvtx_always);
        if !captured && !nvtx {
            return false;
        }
        if nvtx || self.backend.uses_names() {
            info.write_name(self.detailed_names, &mut self.name);
        } else {
            self.name.clear();
        }
        if let Some(n) = self.nvtx.as_mut().filter(|_| nvtx) {
            n.push_iteration(step, info, &self.name);
        }
        if captured {
            self.backend.begin_iteration(step, info, &self.name);
            self.backend_range_open = true;
        }
        true
    }

    fn iteration_open(&self) -> bool {
        self.backend_range_open || self.nvtx.as_ref().is_some_and(Nvtx::is_open)
    }

    /// Closes what `open_iteration` opened, innermost first.
    fn close_range(&mut self) {
        if self.backend_range_open {
            self.backend_range_open = false;
            self.backend.end_iteration();
        }
        if let Some(n) = self.nvtx.as_mut() {
            n.pop_iteration();
        }
    }
}

/// The rank in torchrun's `RANK` variable, if set and a number.
fn rank_from_env() -> Option<u32> {
    std::env::var("RANK").ok()?.trim().parse().ok()
}

/// A profiler's state ([`WorkerProfiler::status`]); serializes to the JSON that
/// `stepscope_status_json` and Python's `status()` return.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Status {
    /// The name the next (or current) session's traces carry.
    pub worker_name: String,
    /// `cuda`, `torch`, `none`, or a user backend's name.
    pub backend: String,
    /// The worker's global rank, when known.
    pub rank: Option<u32>,
    /// Whether this worker profiles under `stepscope.ranks`.
    pub selected: bool,
    /// The session's state (see [`Phase::as_str`]).
    pub phase: &'static str,
    /// A session is active.
    pub active: bool,
    /// The backend captures.
    pub running: bool,
    /// The worker's step count.
    pub step_index: u64,
    /// Steps since the session's start.
    pub steps_since_start: u64,
    /// The session's delay.
    pub delay_iterations: u64,
    /// The session's max per window (0: until stop).
    pub max_iterations: u64,
    /// The session's absolute start step, if it has one.
    pub start_at_step: Option<u64>,
    /// The step the current window's capture started in.
    pub window_first_step: Option<u64>,
    /// Iterations captured in the current window, or in the last one after it ended (by its
    /// max or by a stop).
    pub iterations_captured: u64,
    /// Windows per session (`stepscope.repeat`).
    pub windows: u64,
    /// Windows completed in this (or the last) session, a window ended by a stop included.
    pub windows_done: u64,
    /// The step the next window is due in, between windows.
    pub next_window_at: Option<u64>,
    /// Stopped sessions whose traces are still being written.
    pub pending_writes: usize,
    /// The last backend error not returned to a caller, if any.
    pub last_error: Option<String>,
}

/// One engine iteration, from `step()` to the guard's drop. While capturing, the iteration's
/// annotation is open for the guard's life.
///
/// `!Send`: the annotation is a push/pop range on the engine thread, so it must close there.
#[must_use = "the iteration's annotation closes when this guard drops; bind it with `let _iteration = ...`"]
pub struct Iteration<'a> {
    profiler: Option<&'a WorkerProfiler>,
    captured: bool,
    _not_send: PhantomData<*const ()>,
}

impl Iteration<'_> {
    #[inline]
    fn idle() -> Self {
        Iteration {
            profiler: None,
            captured: false,
            _not_send: PhantomData,
        }
    }

    /// Whether this iteration is being captured (the backend runs).
    pub fn is_captured(&self) -> bool {
        self.captured
    }
}

impl Drop for Iteration<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(p) = self.profiler {
            p.step_end();
        }
    }
}
