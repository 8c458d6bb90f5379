//! The step timeline (`stepscope.timeline`): the last N steps of the engine thread, always
//! available without a trace — each step's index, start, duration, counts and the session's
//! phase — for `stepscope ctl top` and `stepscope ctl timeline`.
//!
//! # Layout and cost
//! A ring of N fixed slots (N a power of two), allocated once when the profiler is made. The
//! engine thread is its only writer: `begin` fills the next slot and leaves it open, `end`
//! closes it (the guard's drop, or the next `begin`: the same begin and end as the slow-step
//! trigger's). No allocation and no lock on that path: relaxed stores and two clock reads per
//! step. The clock is the CPU's time-stamp counter where it is invariant (x86-64; a few ns a
//! read, where `clock_gettime` costs about 25), converted to nanoseconds only when read;
//! elsewhere the monotonic clock.
//!
//! # Readers
//! Any thread copies the ring out ([`Timeline::steps`]) while the engine writes: each slot
//! has its own sequence number (a seqlock per slot: odd while written or open), so a reader
//! never blocks the engine and never returns a half-written step; the open step (not yet
//! ended) is left out.

use crate::clock::{Clock, Scale};
use crate::iteration::IterationInfo;
use crate::schedule::Phase;
use std::sync::atomic::Ordering::Release;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed};

pub use crate::config::TIMELINE_STEPS_RANGE as STEPS_RANGE;

pub use stepscope_format::timeline::{
    StepTuple, TimelineDocument, TimelineInfo, TimelineStep, FIELDS,
};

/// One step's slot: a sequence number (odd while written or open) and the step, all atomics
/// so that a reader racing the writer reads stale or torn values, never undefined ones (the
/// sequence number tells it to drop them).
#[repr(align(64))]
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    step: AtomicU64,
    begin: AtomicU64,
    end: AtomicU64,
    /// `num_ctx_reqs << 32 | num_gen_reqs`.
    requests: AtomicU64,
    /// `num_ctx_tokens << 32 | num_gen_tokens`.
    tokens: AtomicU64,
    phase: AtomicU64,
}

/// The engine thread's last N steps.
pub struct Timeline {
    slots: Box<[Slot]>,
    clock: Clock,
    /// Steps begun in all; the next goes into slot `next % N`. Written by the engine thread.
    next: AtomicU64,
    /// The last begun step is not ended yet. Written by the engine thread.
    open: AtomicBool,
}

impl Timeline {
    /// A timeline of `steps` steps (rounded up to a power of two, within [`STEPS_RANGE`]) on
    /// the fastest clock this machine has.
    pub fn new(steps: usize) -> Self {
        Self::with_clock(steps, Clock::fastest())
    }

    fn with_clock(steps: usize, clock: Clock) -> Self {
        let n = steps
            .clamp(STEPS_RANGE.0, STEPS_RANGE.1)
            .next_power_of_two();
        Timeline {
            slots: (0..n).map(|_| Slot::default()).collect(),
            clock,
            next: AtomicU64::new(0),
            open: AtomicBool::new(false),
        }
    }

    /// How many steps it keeps.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Its size and fill.
    pub fn info(&self) -> TimelineInfo {
        TimelineInfo {
            capacity: self.slots.len() as u64,
            recorded: self.next.load(Relaxed),
            clock: self.clock.name(),
        }
    }

    /// Step `step` begins now (ending the previous one if its guard did not). Engine thread
    /// only.
    #[inline]
    pub fn begin(&self, step: u64, info: &IterationInfo, phase: Phase) {
        self.begin_at(self.clock.ticks(), step, info, phase);
    }

    /// The current step ends now, if one is open. Engine thread only.
    #[inline]
    pub fn end(&self) {
        if self.open.load(Relaxed) {
            self.end_at(self.clock.ticks());
        }
    }

    /// The clock's ticks now, for [`Timeline::begin_at`].
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.ticks()
    }

    /// [`Timeline::begin`] with the step's begin read earlier (`now()`): the profiler's slow
    /// path reads it before its own work, which belongs to the step.
    #[inline]
    pub(crate) fn begin_at(&self, now: u64, step: u64, info: &IterationInfo, phase: Phase) {
        if self.open.load(Relaxed) {
            self.end_at(now);
        }
        let n = self.next.load(Relaxed);
        let slot = self.slot(n);
        let seq = slot.seq.load(Relaxed);
        // Odd: a reader drops what it reads from here until the step ends.
        slot.seq.store(seq | 1, Relaxed);
        fence(Release);
        slot.step.store(step, Relaxed);
        slot.begin.store(now, Relaxed);
        slot.requests.store(
            u64::from(info.num_ctx_reqs) << 32 | u64::from(info.num_gen_reqs),
            Relaxed,
        );
        slot.tokens.store(
            u64::from(info.num_ctx_tokens) << 32 | u64::from(info.num_gen_tokens),
            Relaxed,
        );
        slot.phase.store(phase as u64, Relaxed);
        self.next.store(n + 1, Relaxed);
        self.open.store(true, Relaxed);
    }

    #[inline]
    fn end_at(&self, now: u64) {
        let slot = self.slot(self.next.load(Relaxed).wrapping_sub(1));
        slot.end.store(now, Relaxed);
        let seq = slot.seq.load(Relaxed);
        // Even: the step is whole; Release orders the stores above before it.
        slot.seq.store(seq + 1, Release);
        self.open.store(false, Relaxed);
    }

    #[inline]
    fn slot(&self, n: u64) -> &Slot {
        // The length is a power of two: the mask is the modulo.
        &self.slots[(n as usize) & (self.slots.len() - 1)]
    }

    /// The ended steps it holds whose index is above `since` (0: all), oldest first. Any
    /// thread; never blocks the engine.
    pub fn steps(&self, since: u64) -> Vec<TimelineStep> {
        let scale = self.clock.scale();
        let mut out: Vec<TimelineStep> = self
            .slots
            .iter()
            .filter_map(read)
            .filter(|r| r.step > since)
            .map(|r| step_of(&scale, r))
            .collect();
        out.sort_unstable_by_key(|s| s.step);
        out
    }
}

/// A slot's values, read whole.
#[derive(Clone, Copy)]
struct Raw {
    step: u64,
    begin: u64,
    end: u64,
    requests: u64,
    tokens: u64,
    phase: u64,
}

/// Reads a slot under its sequence number; `None` when it is empty, open, or was rewritten
/// while read (three tries).
fn read(slot: &Slot) -> Option<Raw> {
    for _ in 0..3 {
        let before = slot.seq.load(Acquire);
        if before & 1 == 1 {
            // Open (the current step) or being rewritten.
            return None;
        }
        if before == 0 {
            return None;
        }
        let raw = Raw {
            step: slot.step.load(Relaxed),
            begin: slot.begin.load(Relaxed),
            end: slot.end.load(Relaxed),
            requests: slot.requests.load(Relaxed),
            tokens: slot.tokens.load(Relaxed),
            phase: slot.phase.load(Relaxed),
        };
        fence(Acquire);
        if slot.seq.load(Relaxed) == before {
            return Some(raw);
        }
    }
    None
}

fn phase_of(code: u64) -> Phase {
    const ALL: [Phase; 8] = [
        Phase::Idle,
        Phase::Delaying,
        Phase::Starting,
        Phase::Running,
        Phase::StartFailed,
        Phase::Paused,
        Phase::Between,
        Phase::Watching,
    ];
    ALL.into_iter()
        .find(|p| *p as u64 == code)
        .unwrap_or(Phase::Idle)
}

/// A slot's values as a step, on the clock's scale of one read.
fn step_of(scale: &Scale, r: Raw) -> TimelineStep {
    TimelineStep {
        step: r.step,
        start_unix_ns: scale.unix_ns(r.begin),
        duration_ns: scale.ns(r.end.saturating_sub(r.begin)),
        num_ctx_reqs: (r.requests >> 32) as u32,
        num_ctx_tokens: (r.tokens >> 32) as u32,
        num_gen_reqs: r.requests as u32,
        num_gen_tokens: r.tokens as u32,
        phase: phase_of(r.phase).as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Source, SETTLE};
    use std::time::{SystemTime, UNIX_EPOCH};

    /// A timeline whose ticks are the ns the test passes (the monotonic source read by hand),
    /// anchored at Unix time `anchor`.
    fn manual(steps: usize, anchor: u64) -> Timeline {
        let mut t = Timeline::with_clock(steps, Clock::anchored(Source::Monotonic));
        t.clock.anchor_ticks = 0;
        t.clock.anchor_unix_ns = anchor;
        t
    }

    #[test]
    fn each_step_is_its_begin_and_end_with_its_counts_and_phase() {
        let t = manual(16, 1_000);
        t.begin_at(100, 1, &IterationInfo::new(2, 300, 0, 0), Phase::Idle);
        t.end_at(250);
        t.begin_at(400, 2, &IterationInfo::new(0, 0, 5, 5), Phase::Running);
        t.end_at(410);
        // The open step is not read.
        t.begin_at(500, 3, &IterationInfo::new(1, 1, 1, 1), Phase::Watching);
        let steps = t.steps(0);
        assert_eq!(
            steps,
            [
                TimelineStep {
                    step: 1,
                    start_unix_ns: 1_100,
                    duration_ns: 150,
                    num_ctx_reqs: 2,
                    num_ctx_tokens: 300,
                    num_gen_reqs: 0,
                    num_gen_tokens: 0,
                    phase: "idle",
                },
                TimelineStep {
                    step: 2,
                    start_unix_ns: 1_400,
                    duration_ns: 10,
                    num_ctx_reqs: 0,
                    num_ctx_tokens: 0,
                    num_gen_reqs: 5,
                    num_gen_tokens: 5,
                    phase: "running",
                },
            ]
        );
        assert_eq!(t.steps(1).len(), 1);
        assert_eq!(t.info().recorded, 3);
    }

    #[test]
    fn a_step_whose_guard_outlived_it_ends_at_the_next_begin() {
        let t = manual(16, 0);
        t.begin_at(0, 1, &IterationInfo::default(), Phase::Idle);
        t.begin_at(70, 2, &IterationInfo::default(), Phase::Idle);
        t.end_at(75);
        // A second end (a guard dropped after step_end) changes nothing.
        t.end();
        let d: Vec<(u64, u64)> = t.steps(0).iter().map(|s| (s.step, s.duration_ns)).collect();
        assert_eq!(d, [(1, 70), (2, 5)]);
    }

    #[test]
    fn the_ring_keeps_the_last_n_steps() {
        let t = manual(16, 0);
        assert_eq!(t.capacity(), 16);
        for i in 1..=40u64 {
            t.begin_at(
                i * 10,
                i,
                &IterationInfo::new(0, 0, i as u32, 1),
                Phase::Idle,
            );
            t.end_at(i * 10 + i);
        }
        let steps = t.steps(0);
        let idx: Vec<u64> = steps.iter().map(|s| s.step).collect();
        assert_eq!(idx, (25..=40).collect::<Vec<_>>());
        assert!(steps
            .iter()
            .all(|s| s.duration_ns == s.step && s.num_gen_reqs as u64 == s.step));
        assert_eq!(t.steps(38).len(), 2);
    }

    #[test]
    fn sizes_round_up_to_a_power_of_two_within_the_range() {
        assert_eq!(manual(1, 0).capacity(), 16);
        assert_eq!(manual(1000, 0).capacity(), 1024);
        assert_eq!(manual(usize::MAX, 0).capacity(), STEPS_RANGE.1);
    }

    #[test]
    fn readers_on_other_threads_see_only_whole_steps() {
        // Every step's duration equals its index and its counts repeat it: a torn read
        // would break one of them. How many whole steps a read finds while the writer laps
        // the ring depends on the machine (a fast writer can leave none whole), so the
        // reader reads for as long as the writer writes, then once more after it is done,
        // when the last 16 steps must all be there.
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let t = manual(16, 0);
        let reading = AtomicBool::new(false);
        let written = AtomicBool::new(false);
        let check = |st: &TimelineStep| {
            assert_eq!(st.duration_ns, st.step % 1000);
            assert_eq!(st.num_ctx_reqs as u64, st.step);
            assert_eq!(st.num_gen_tokens as u64, st.step);
        };
        let last = std::thread::scope(|s| {
            let reader = s.spawn(|| {
                reading.store(true, SeqCst);
                while !written.load(SeqCst) {
                    t.steps(0).iter().for_each(check);
                }
                t.steps(0)
            });
            while !reading.load(SeqCst) {
                std::hint::spin_loop();
            }
            for i in 1..=200_000u64 {
                let c = i as u32;
                t.begin_at(i * 1000, i, &IterationInfo::new(c, c, c, c), Phase::Idle);
                t.end_at(i * 1000 + i % 1000);
            }
            written.store(true, SeqCst);
            reader.join().unwrap()
        });
        last.iter().for_each(check);
        let idx: Vec<u64> = last.iter().map(|s| s.step).collect();
        assert_eq!(idx, (199_985..=200_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_settled_clock_converts_every_read_alike() {
        let mut t = Timeline::new(16);
        // As if made a while ago: the rate is fixed at the first read.
        t.clock.anchor -= SETTLE;
        t.begin(1, &IterationInfo::default(), Phase::Idle);
        t.end();
        let first = t.steps(0);
        assert!(t.clock.source == Source::Monotonic || t.clock.settled.get().is_some());
        assert_eq!(t.steps(0), first);
    }

    #[test]
    fn the_fastest_clock_converts_to_wall_time() {
        let t = Timeline::new(16);
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        t.begin(1, &IterationInfo::default(), Phase::Idle);
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.end();
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let s = t.steps(0)[0];
        // Within the wall clock's bounds (a coarse check of the conversion, not a timing).
        assert!(
            s.start_unix_ns + 1_000_000 >= before && s.start_unix_ns <= after,
            "{s:?}"
        );
        assert!(s.duration_ns >= 1_000_000 && s.duration_ns <= after - before + 1_000_000);
    }
}
