//! The profiler's state behind its lock, and what the slow paths do with it: backend starts
//! and stops (on the engine thread), pauses for stages, pending work from other threads, the
//! iteration's annotations.

use std::thread::{self, ThreadId};
use std::time::Instant;

use super::options::{StartOutcome, StopOutcome};
use crate::backend::nvtx::Nvtx;
use crate::backend::{Backend, CaptureStart, WindowEnd};
use crate::config::{NvtxMode, ProfilerConfig};
use crate::error::{Error, Result};
use crate::iteration::{IterationInfo, RequestIds};
use crate::schedule::{
    Budget, CutShort, Limits, Policy, Schedule, StartDecision, StartOptions, StepBegin, StepInfo,
    StopDecision,
};
use crate::sys::Rss;

/// What the budget measures a running window from: when its backend started and the
/// process's resident memory then.
pub(super) struct Meter {
    began: Instant,
    rss: Option<u64>,
    /// Steps since the last check.
    since: u32,
    /// The window's age at the last reading of its memory; none yet: the first check reads
    /// it, whatever the steps' pace.
    memory_read_at_ns: Option<u64>,
}

/// The budget checks a running window every this many steps: a clock read, averaged under
/// 1 ns a step. A window goes over its time budget by at most 32 steps.
pub(super) const MEASURE_EVERY: u32 = 32;

/// The budget reads the process's memory at a check when this long has passed since its last
/// reading: a `pread` of /proc/self/statm costs some 380-700 ns (the kernel formats the file),
/// so at most 0.07% of the engine thread's time whatever its step rate (every 32nd step once
/// 32 steps take a millisecond: any real engine's; a window's first check always reads it). A
/// window goes over its memory budget by at most what it grows between two readings: 32
/// steps, or a millisecond and 32 steps where steps are shorter than 31 µs.
pub(super) const READ_MEMORY_EVERY_NS: u64 = 1_000_000;

pub(super) struct Inner {
    pub(super) worker_name: String,
    pub(super) schedule: Schedule,
    pub(super) backend: Box<dyn Backend>,
    pub(super) engine_thread: Option<ThreadId>,
    pub(super) pending_stop: bool,
    pub(super) pending_start: bool,
    /// The backend's annotation of the current iteration is open.
    pub(super) backend_range_open: bool,
    /// What the backend does with each captured iteration, asked as its window starts.
    pub(super) hooks: IterationHooks,
    /// Present only while an NVTX tool listens and NVTX is not off.
    pub(super) nvtx: Option<Nvtx>,
    pub(super) nvtx_always: bool,
    pub(super) detailed_names: bool,
    /// The current iteration's name, reused so naming allocates only until it has grown.
    pub(super) name: String,
    pub(super) last_error: Option<Error>,
    /// The worker's global rank, for `stepscope.ranks`.
    pub(super) rank: Option<u32>,
    /// `stepscope.ranks`: only these ranks profile.
    pub(super) ranks: Option<Vec<u32>>,
    /// The file stem of the next capture's trace ([`WorkerProfiler::set_trace_name`]), taken
    /// by the backend start that uses it.
    pub(super) trace_name: Option<String>,
    /// When the step being timed began (only while a slow-step trigger watches).
    pub(super) step_began: Option<Instant>,
    /// When that step ended, if `step_end()` said so; else the next step's begin ends it.
    pub(super) step_ended: Option<Instant>,
    /// `stepscope.max_capture_mb` / `max_capture_s`.
    pub(super) budget: Budget,
    /// The process's resident memory, opened at the first window the budget measures.
    pub(super) rss: Option<Rss>,
    /// Present while a window's backend runs and the budget is on.
    pub(super) meter: Option<Meter>,
    /// The last window the budget ended, for status.
    pub(super) last_cut: Option<CutShort>,
}

/// What a backend does with each captured iteration: [`Backend::uses_names`] and
/// [`Backend::has_iteration_range`], asked once as each window starts rather than on every
/// step (two calls through the backend's vtable that the running step no longer makes; the
/// step bench's `running_no_tool` without this cache: a median 3-7 ns longer in 30 alternated
/// runs, twice).
#[derive(Debug, Clone, Copy)]
pub(super) struct IterationHooks {
    /// `begin_iteration` reads the iteration's name: the profiler formats it.
    pub(super) names: bool,
    /// `begin_iteration` opens what `end_iteration` must close.
    pub(super) range: bool,
}

impl IterationHooks {
    fn of(backend: &dyn Backend) -> Self {
        IterationHooks {
            names: backend.uses_names(),
            range: backend.has_iteration_range(),
        }
    }
}

impl Inner {
    /// The state of a new profiler for `config`, driving `backend`.
    pub(super) fn new(
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
        let hooks = IterationHooks::of(&*backend);
        Inner {
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
            hooks,
            nvtx,
            nvtx_always,
            detailed_names: config.detailed_trace_annotation,
            name: String::with_capacity(128),
            last_error: None,
            rank: rank_from_env(),
            ranks: config.stepscope.capture.ranks.clone(),
            step_began: None,
            step_ended: None,
            budget: config.capture_budget(),
            rss: None,
            meter: None,
            last_cut: None,
        }
    }

    /// The worker's global rank (`stepscope.ranks` selects by it).
    pub(super) fn set_rank(&mut self, rank: u32) {
        self.rank = Some(rank);
    }

    /// A start (see `WorkerProfiler::start_with`), `now` the last step's index.
    pub(super) fn start(&mut self, options: StartOptions, now: u64) -> Result<StartOutcome> {
        if !self.selected()? {
            log::info!(
                "stepscope: start ignored: rank {} is not in stepscope.ranks",
                self.rank.unwrap_or_default()
            );
            return Ok(StartOutcome::NotSelected);
        }
        let here = self.is_engine_thread();
        if here {
            self.run_pending(now + 1);
        }
        if !self.schedule.is_active() {
            // A step timed in an earlier session must not span the gap to this one.
            self.step_began = None;
            self.step_ended = None;
            // No disk, or too many traces still to write: the start fails now, visibly,
            // rather than at the window's first step.
            if let Err(e) = self.backend.preflight() {
                let e = match e {
                    Error::Refused { key, message } => Error::Refused {
                        key,
                        message: format!("{message} (worker {})", self.worker_name),
                    },
                    other => other,
                };
                log::warn!("stepscope: {e}");
                self.last_error = Some(e.clone());
                return Err(e);
            }
        }
        match self.schedule.start(options, now) {
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
            StartDecision::StartBackend if here => {
                self.start_backend(now + 1).map(|()| StartOutcome::Started)
            }
            StartDecision::StartBackend => {
                self.pending_start = true;
                Ok(StartOutcome::Deferred)
            }
        }
    }

    /// A stop (see `WorkerProfiler::stop`), `now` the last step's index.
    pub(super) fn stop(&mut self, now: u64) -> Result<StopOutcome> {
        if !self.selected().unwrap_or(true) {
            return Ok(StopOutcome::NotSelected);
        }
        let here = self.is_engine_thread();
        if here {
            self.run_pending(now + 1);
        }
        match self.schedule.stop() {
            StopDecision::NotActive => {
                log::debug!("stop received while no session is active; ignoring it");
                Ok(StopOutcome::NotActive)
            }
            StopDecision::Disarmed => Ok(StopOutcome::Disarmed),
            StopDecision::CancelStart => {
                self.pending_start = false;
                Ok(StopOutcome::Disarmed)
            }
            StopDecision::StopBackend if here => {
                self.stop_backend(now).map(|()| StopOutcome::Stopped)
            }
            StopDecision::StopBackend => {
                self.pending_stop = true;
                Ok(StopOutcome::Deferred)
            }
        }
    }

    /// vLLM's `shutdown()` on the calling thread, `now` the last step's index.
    pub(super) fn shutdown(&mut self, now: u64) -> Result<()> {
        self.close_range();
        let decision = self.schedule.shutdown();
        if decision == StopDecision::CancelStart {
            self.pending_start = false;
        }
        if self.pending_stop || decision == StopDecision::StopBackend {
            self.pending_stop = false;
            self.stop_backend(now)
        } else {
            Ok(())
        }
    }

    /// One step's slow path on the engine thread: pending work, the budget, the schedule's
    /// decisions carried out on the backend, the step's timing for a slow-step trigger.
    /// Returns whether the step is timed (its guard's drop ends its span).
    pub(super) fn step(&mut self, index: u64, info: &IterationInfo) -> bool {
        if self.engine_thread.is_none() {
            self.engine_thread = Some(thread::current().id());
        }
        self.close_range();
        self.run_pending(index);
        // A window over its budget ends here, before this step counts.
        self.enforce_budget(index);
        // A slow-step trigger watches: the clock is read once per step, and only then.
        let now = self.schedule.times_steps().then(Instant::now);
        let previous = self.take_step_time(now);
        let step = StepInfo::of(index, info).after(previous);
        let outcome = match self.schedule.begin_step(step) {
            // On failure the session stays active, not running; the error is kept.
            StepBegin::StartBackend => self.start_backend(index),
            StepBegin::PauseBackend => self.pause_backend(index),
            StepBegin::ResumeBackend => self.resume_backend(index),
            StepBegin::Inactive | StepBegin::Counted => Ok(()),
        };
        if let Err(e) = outcome {
            self.last_error = Some(e);
        }
        let end = self.schedule.end_step();
        if end.advance_backend {
            self.backend.advance();
        }
        if end.stop_backend {
            if let Err(e) = self.stop_backend(index) {
                self.last_error = Some(e);
            }
        }
        let timed = self.schedule.times_steps();
        if timed {
            self.step_began = Some(now.unwrap_or_else(Instant::now));
        }
        timed
    }

    /// The engine thread's step ended (its guard dropped): the end of its timing.
    pub(super) fn step_ended(&mut self) {
        if self.step_began.is_some() && self.step_ended.is_none() {
            self.step_ended = Some(Instant::now());
        }
        self.close_range();
    }

    /// The trace name for the next session.
    pub(super) fn set_trace_name(&mut self, name: Option<&str>) {
        self.trace_name = name.map(str::to_string);
    }

    /// What the next session records (see `WorkerProfiler::reconfigure`).
    pub(super) fn reconfigure(&mut self, config: &ProfilerConfig) -> Result<()> {
        self.backend.reconfigure(config)?;
        self.budget = config.capture_budget();
        Ok(())
    }

    pub(super) fn pending_writes(&self) -> usize {
        self.backend.pending_writes().map_or(0, |p| p.count())
    }

    /// Whether the backend records: the schedule runs, or a stop asked from another thread
    /// waits for the engine thread's next step (until then the CUDA profiler or Kineto still
    /// records).
    pub(super) fn backend_running(&self) -> bool {
        self.schedule.is_running() || self.pending_stop
    }

    /// Whether this worker profiles under `stepscope.ranks`; an error when the list is set
    /// and the worker's rank is unknown.
    pub(super) fn selected(&self) -> Result<bool> {
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

    // The backend's transitions (start, stop, pause, resume) are out of line and cold: inlined
    // into the engine thread's step, with the pending work and the budget's check, they made
    // it 1,076 instructions (702 without them) for work a window does once.
    #[cold]
    #[inline(never)]
    pub(super) fn pause_backend(&mut self, step: u64) -> Result<()> {
        if let Some(nvtx) = &self.nvtx {
            nvtx.mark(c"capture pause", step);
        }
        let result = self.backend.pause();
        if let Err(e) = &result {
            log::warn!("stepscope: failed to pause the profiler: {e}");
        }
        result
    }

    #[cold]
    #[inline(never)]
    pub(super) fn resume_backend(&mut self, step: u64) -> Result<()> {
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

    pub(super) fn is_engine_thread(&self) -> bool {
        self.engine_thread
            .is_none_or(|id| id == thread::current().id())
    }

    /// Carries out backend work that other threads asked for, in the order it was asked: a
    /// stop always precedes a start (a start can only follow once the stop ended the session).
    /// Their errors cannot reach the threads that asked, so they are kept in `last_error`.
    #[inline]
    pub(super) fn run_pending(&mut self, next_step: u64) {
        if self.pending_stop || self.pending_start {
            self.run_pending_work(next_step);
        }
    }

    #[cold]
    #[inline(never)]
    fn run_pending_work(&mut self, next_step: u64) {
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

    #[cold]
    #[inline(never)]
    pub(super) fn start_backend(&mut self, first_step: u64) -> Result<()> {
        let capture = CaptureStart {
            worker_name: &self.worker_name,
            first_step,
            trace_name: self.trace_name.as_deref(),
            trigger: self.schedule.window_trigger(),
        };
        let trigger = capture.trigger;
        let result = self.backend.start(&capture);
        self.schedule.start_result(result.is_ok());
        match &result {
            Ok(()) => {
                self.trace_name = None;
                self.hooks = IterationHooks::of(&*self.backend);
                self.start_meter();
                if let Some(nvtx) = &self.nvtx {
                    if let Some(slow) = trigger {
                        nvtx.mark(c"slow step", slow.step);
                    }
                    nvtx.mark(c"capture start", first_step);
                }
            }
            Err(e) => log::warn!("stepscope: failed to start the profiler: {e}"),
        }
        result
    }

    /// Starts measuring the window that just began, when the budget is on.
    fn start_meter(&mut self) {
        if !self.budget.is_on() {
            return;
        }
        if self.rss.is_none() && self.budget.max_growth_bytes > 0 {
            self.rss = Rss::open();
        }
        self.meter = Some(Meter {
            began: Instant::now(),
            rss: self.rss.as_ref().and_then(|r| r.bytes().ok()),
            since: 0,
            memory_read_at_ns: None,
        });
    }

    /// How much the process has grown since the running window began, when measured.
    fn window_growth(&self) -> Option<u64> {
        let then = self.meter.as_ref()?.rss?;
        let now = self.rss.as_ref()?.bytes().ok()?;
        Some(now.saturating_sub(then))
    }

    /// Ends the running window in `step` when it is over its budget: through the full stop,
    /// as vLLM's automatic stop (the trace is written and says why). Checks only while a
    /// window runs, every [`MEASURE_EVERY`] steps: a clock read, and a `pread` of
    /// `/proc/self/statm` when [`READ_MEMORY_EVERY_NS`] has passed since the last one.
    pub(super) fn enforce_budget(&mut self, step: u64) {
        let Some(meter) = self.meter.as_mut() else {
            return;
        };
        meter.since += 1;
        if meter.since >= MEASURE_EVERY {
            meter.since = 0;
            self.check_budget(step);
        }
    }

    /// [`Inner::enforce_budget`]'s check, every [`MEASURE_EVERY`]th step: out of line, so the
    /// steps between checks pay for a counter only.
    #[inline(never)]
    fn check_budget(&mut self, step: u64) {
        let Some(meter) = self.meter.as_mut() else {
            return;
        };
        let age = u64::try_from(meter.began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let read_memory = meter
            .memory_read_at_ns
            .is_none_or(|at| age.saturating_sub(at) >= READ_MEMORY_EVERY_NS);
        if read_memory {
            meter.memory_read_at_ns = Some(age);
        }
        let grew = read_memory.then(|| self.window_growth()).flatten();
        let Some(cut) = self.budget.judge(step, grew, age) else {
            return;
        };
        // A cut records what the window grew, read now if this check did not.
        let cut = match grew {
            None => self
                .budget
                .judge(step, self.window_growth(), age)
                .unwrap_or(cut),
            Some(_) => cut,
        };
        log::warn!(
            "stepscope: capture cut short in step {step}: {cut}; its trace is written as usual \
             (raise {} in the \"stepscope\" config, or set it to 0 to turn the limit off)",
            cut.by.key()
        );
        if let Some(nvtx) = &self.nvtx {
            nvtx.mark(c"capture cut short", step);
        }
        self.last_cut = Some(cut);
        if self.schedule.stop() == StopDecision::StopBackend {
            if let Err(e) = self.stop_window(step, Some(cut)) {
                self.last_error = Some(e);
            }
        }
    }

    /// Stops the backend; `step` is the step it stops in (for the NVTX mark).
    pub(super) fn stop_backend(&mut self, step: u64) -> Result<()> {
        self.stop_window(step, None)
    }

    /// Stops the backend, telling it first what the window grew and why it ended.
    #[cold]
    #[inline(never)]
    fn stop_window(&mut self, step: u64, cut_short: Option<CutShort>) -> Result<()> {
        let end = WindowEnd {
            held_bytes: self.window_growth().map(|g| self.budget.projected(g)),
            cut_short,
        };
        self.meter = None;
        self.backend.window_ends(&end);
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
    /// Returns whether anything was opened that the iteration's end must close.
    pub(super) fn open_iteration(
        &mut self,
        step: u64,
        info: &IterationInfo,
        captured: bool,
        requests: Option<&dyn RequestIds>,
    ) -> bool {
        let nvtx = self.nvtx.is_some() && (captured || self.nvtx_always);
        if !captured && !nvtx {
            return false;
        }
        if nvtx || self.hooks.names {
            info.write_name(self.detailed_names, &mut self.name);
        } else {
            self.name.clear();
        }
        if let Some(n) = self.nvtx.as_mut().filter(|_| nvtx) {
            n.push_iteration(step, info, &self.name);
        }
        if captured {
            if let Some(ids) = requests {
                self.backend.record_requests(step, ids);
            }
            self.backend.begin_iteration(step, info, &self.name);
            self.backend_range_open = self.hooks.range;
        }
        if let (Some(n), Some(ids)) = (self.nvtx.as_mut().filter(|_| captured), requests) {
            n.mark_with(step, |text| {
                text.extend_from_slice(b"requests: ");
                let mut first = true;
                ids.for_each_id(&mut |id| {
                    if !first {
                        text.push(b',');
                    }
                    first = false;
                    text.extend_from_slice(id.as_bytes());
                });
            });
        }
        self.iteration_open()
    }

    /// How long the step being timed took, ending at `now` unless `step_end()` ended it; clears
    /// the timing. `None` when no step was being timed or `now` is not given.
    pub(super) fn take_step_time(&mut self, now: Option<Instant>) -> Option<u64> {
        let began = self.step_began.take();
        let ended = self.step_ended.take();
        let end = ended.or(now)?;
        let ns = end.saturating_duration_since(began?).as_nanos();
        Some(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    pub(super) fn iteration_open(&self) -> bool {
        self.backend_range_open || self.nvtx.as_ref().is_some_and(Nvtx::is_open)
    }

    /// Closes what `open_iteration` opened, innermost first.
    pub(super) fn close_range(&mut self) {
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
