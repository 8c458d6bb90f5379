//! The engine thread's per-iteration path: `step()` and its gate, the slow path past it,
//! `step_end()`, and the [`IterationGuard`] that calls it when the iteration ends.

use std::marker::PhantomData;
use std::sync::atomic::Ordering::Relaxed;

use super::handle::{WorkerProfiler, GATE_ARMED, GATE_TIMELINE};
use crate::iteration::{IterationInfo, RequestIds, RequestShare};
use crate::schedule::Phase;

impl WorkerProfiler {
    /// Marks the start of one engine iteration; call it once per iteration on the engine
    /// thread. While capturing, the iteration is annotated until the returned guard drops (or
    /// [`WorkerProfiler::step_end`], or the next `step()`).
    ///
    /// Never fails into the engine: a backend error is logged and kept for
    /// [`WorkerProfiler::take_last_error`].
    #[inline]
    pub fn step(&self, info: &IterationInfo) -> IterationGuard<'_> {
        self.enter(info, None)
    }

    /// [`WorkerProfiler::step`] for an iteration serving these requests: with
    /// `stepscope.request_ids` on, a captured iteration records their ids (in the trace's
    /// annotation and header, the manifest, and an NVTX marker inside the iteration's range).
    /// The ids are read only when the iteration is captured; pass them only while
    /// [`WorkerProfiler::wants_request_ids`] is true, which spares the engine collecting them.
    /// With each request's tokens and phase ([`crate::ScheduledRequests`]), the header and
    /// manifest list those too, for `stepscope analyze --requests`.
    ///
    /// ```
    /// use stepscope::{IterationInfo, ProfilerConfig, WorkerProfiler};
    /// let cfg = ProfilerConfig::from_json_str(r#"{"stepscope": {"request_ids": true}}"#)?;
    /// let profiler = WorkerProfiler::new(&cfg, "worker0")?;
    /// profiler.start()?;
    /// let batch = ["cmpl-1-0", "cmpl-2-0"];
    /// let info = IterationInfo::new(0, 0, 2, 2);
    /// let it = if profiler.wants_request_ids() {
    ///     profiler.step_with_requests(&info, &batch[..])
    /// } else {
    ///     profiler.step(&info)
    /// };
    /// assert!(it.is_captured());
    /// # Ok::<(), stepscope::Error>(())
    /// ```
    #[inline]
    pub fn step_with_requests<R: RequestIds + ?Sized>(
        &self,
        info: &IterationInfo,
        requests: &R,
    ) -> IterationGuard<'_> {
        let requests = SizedIds(requests);
        self.enter(
            info,
            self.request_ids.then_some(&requests as &dyn RequestIds),
        )
    }

    /// The per-iteration entry of `step()` and `step_with_requests()`.
    #[inline]
    fn enter(&self, info: &IterationInfo, requests: Option<&dyn RequestIds>) -> IterationGuard<'_> {
        // The engine thread is the only writer of the counter, so a plain load and store
        // suffices: no locked read-modify-write on the per-iteration path.
        let index = self.steps.load(Relaxed) + 1;
        self.steps.store(index, Relaxed);
        if self.gate.load(Relaxed) == 0 {
            return IterationGuard::idle();
        }
        self.step_gated(index, info, requests)
    }

    /// `step()` past the gate. With only the timeline to serve, the step goes into it without
    /// the lock; else the slow path. Out of line, so that the idle path stays one load.
    #[inline(never)]
    fn step_gated(
        &self,
        index: u64,
        info: &IterationInfo,
        requests: Option<&dyn RequestIds>,
    ) -> IterationGuard<'_> {
        match &self.timeline {
            Some(t) if self.gate.load(Relaxed) == GATE_TIMELINE => {
                t.begin(index, info, Phase::Idle);
                IterationGuard::new(Some(self), false)
            }
            _ => self.step_slow(index, info, requests),
        }
    }

    /// Whether the next step could record request ids: `stepscope.request_ids` is on and a
    /// session is armed. One relaxed load; engines collect ids only while it is true.
    #[inline]
    pub fn wants_request_ids(&self) -> bool {
        self.request_ids && self.is_armed()
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
    fn step_slow(
        &self,
        index: u64,
        info: &IterationInfo,
        requests: Option<&dyn RequestIds>,
    ) -> IterationGuard<'_> {
        // The step begins now for the timeline, whatever the backend does below.
        let began = self.timeline.as_ref().map(|t| t.now());
        let mut g = self.inner.lock();
        let timed = g.step(index, info);
        let captured = g.schedule.is_running();
        let open = g.open_iteration(index, info, captured, requests);
        if let (Some(t), Some(began)) = (&self.timeline, began) {
            t.begin_at(began, index, info, g.schedule.phase());
        }
        self.sync_gate(&g);
        // While timed, the guard's drop (step_end) ends the step's own span.
        let guarded = open || timed || self.timeline.is_some();
        IterationGuard::new(guarded.then_some(self), captured)
    }

    /// Closes the current iteration's annotation, if one is open. The guard returned by
    /// `step()` calls this when it drops.
    #[inline]
    pub fn step_end(&self) {
        let gate = self.gate.load(Relaxed);
        if gate != 0 {
            self.step_end_gated(gate);
        }
    }

    /// The iteration's annotation closes first, then the timeline's step: as `step()` stamps the
    /// step's begin before the backend's work, the step's span holds the annotation's and the
    /// profiler's own work (the other order let the annotation outlast the step, by 56 and 99 us
    /// in the live timeline test under make test's load).
    #[inline(never)]
    fn step_end_gated(&self, gate: u8) {
        if gate & GATE_ARMED != 0 {
            self.step_end_slow();
        }
        if let Some(t) = &self.timeline {
            t.end();
        }
    }

    #[cold]
    #[inline(never)]
    fn step_end_slow(&self) {
        let mut g = self.inner.lock();
        g.step_ended();
        self.sync_gate(&g);
    }

    /// Whether the next `step()` can do anything with its [`IterationInfo`]: a session is
    /// active, backend work is pending, or every iteration gets an NVTX range. One relaxed
    /// load; engines that compute counts in an interpreted language (the vLLM plugin) skip
    /// that work while it is false.
    #[inline]
    pub fn is_armed(&self) -> bool {
        self.gate.load(Relaxed) & GATE_ARMED != 0
    }
}

/// Request ids of any type behind a sized reference, so that a slice passes as
/// `&dyn RequestIds`.
struct SizedIds<'a, R: ?Sized>(&'a R);

impl<R: RequestIds + ?Sized> RequestIds for SizedIds<'_, R> {
    fn count(&self) -> usize {
        self.0.count()
    }

    fn for_each_id(&self, f: &mut dyn FnMut(&str)) {
        self.0.for_each_id(f);
    }

    fn for_each_share(&self, f: &mut dyn FnMut(RequestShare)) -> bool {
        self.0.for_each_share(f)
    }
}

/// One engine iteration, from `step()` to the guard's drop. While capturing, the iteration's
/// annotation is open for the guard's life.
///
/// `!Send`: the annotation is a push/pop range on the engine thread, so it must close there.
#[must_use = "the iteration's annotation closes when this guard drops; bind it with `let _iteration = ...`"]
pub struct IterationGuard<'a> {
    profiler: Option<&'a WorkerProfiler>,
    captured: bool,
    _not_send: PhantomData<*const ()>,
}

impl<'a> IterationGuard<'a> {
    #[inline]
    fn idle() -> Self {
        IterationGuard {
            profiler: None,
            captured: false,
            _not_send: PhantomData,
        }
    }

    /// A guard closing `profiler`'s iteration (if any) when it drops.
    #[inline]
    fn new(profiler: Option<&'a WorkerProfiler>, captured: bool) -> IterationGuard<'a> {
        IterationGuard {
            profiler,
            captured,
            _not_send: PhantomData,
        }
    }

    /// Whether this iteration is being captured (the backend runs).
    pub fn is_captured(&self) -> bool {
        self.captured
    }
}

impl Drop for IterationGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(p) = self.profiler {
            p.step_end();
        }
    }
}
