//! The guard `step()` returns: the iteration's annotation stays open for its life.

use std::marker::PhantomData;

use super::WorkerProfiler;

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
    pub(super) fn idle() -> Self {
        IterationGuard {
            profiler: None,
            captured: false,
            _not_send: PhantomData,
        }
    }

    /// A guard closing `profiler`'s iteration (if any) when it drops.
    #[inline]
    pub(super) fn new(profiler: Option<&'a WorkerProfiler>, captured: bool) -> IterationGuard<'a> {
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
