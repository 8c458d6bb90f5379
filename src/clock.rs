//! The clock the engine thread's rings are timed by: the CPU's time-stamp counter where it is
//! invariant (x86-64; a few ns a read, where `clock_gettime` costs about 25), converted to
//! nanoseconds only when read; elsewhere the monotonic clock. Anchored to Unix time when made.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where step times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The CPU's invariant time-stamp counter (x86-64).
    Tsc,
    /// Nanoseconds of the monotonic clock since the anchor.
    Monotonic,
}

/// Ticks of a source, and the anchor that turns them into Unix time.
pub(crate) struct Clock {
    pub(crate) source: Source,
    /// Taken together when the timeline was made.
    pub(crate) anchor: Instant,
    pub(crate) anchor_ticks: u64,
    pub(crate) anchor_unix_ns: u64,
    /// ns per tick, fixed at the first read a second or more after the anchor: from then on
    /// every read converts a step the same way.
    pub(crate) settled: OnceLock<f64>,
}

/// How long the TSC is measured against the monotonic clock before its rate is fixed.
pub(crate) const SETTLE: Duration = Duration::from_secs(1);

impl Clock {
    pub(crate) fn fastest() -> Self {
        let source = if tsc::invariant() {
            Source::Tsc
        } else {
            Source::Monotonic
        };
        Self::anchored(source)
    }

    pub(crate) fn anchored(source: Source) -> Self {
        let anchor_unix_ns = unix_now_ns();
        let (anchor_ticks, anchor) = match source {
            Source::Tsc => tsc_with_instant(),
            // Ticks are ns since the anchor.
            Source::Monotonic => (0, Instant::now()),
        };
        Clock {
            source,
            anchor,
            anchor_ticks,
            anchor_unix_ns,
            settled: OnceLock::new(),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self.source {
            Source::Tsc => "tsc",
            Source::Monotonic => "monotonic",
        }
    }

    #[inline]
    pub(crate) fn ticks(&self) -> u64 {
        match self.source {
            Source::Tsc => tsc::read(),
            Source::Monotonic => {
                u64::try_from(self.anchor.elapsed().as_nanos()).unwrap_or(u64::MAX)
            }
        }
    }

    /// Ticks to ns: measured over the timeline's life so far, then fixed once that is
    /// [`SETTLE`] long.
    pub(crate) fn scale(&self) -> Scale {
        let ns_per_tick = match self.source {
            Source::Monotonic => 1.0,
            Source::Tsc => match self.settled.get() {
                Some(k) => *k,
                None => {
                    let (now_ticks, now) = tsc_with_instant();
                    let ticks = now_ticks.saturating_sub(self.anchor_ticks);
                    let elapsed = now.saturating_duration_since(self.anchor);
                    let k = if ticks == 0 {
                        1.0
                    } else {
                        elapsed.as_nanos() as f64 / ticks as f64
                    };
                    if elapsed >= SETTLE {
                        *self.settled.get_or_init(|| k)
                    } else {
                        k
                    }
                }
            },
        };
        Scale {
            ns_per_tick,
            anchor_ticks: self.anchor_ticks,
            anchor_unix_ns: self.anchor_unix_ns,
        }
    }
}

/// Tries at reading the counter and the monotonic clock together.
const PAIR_TRIES: usize = 8;

/// The counter and the monotonic clock read together: of [`PAIR_TRIES`] tries, the `Instant`
/// whose two counter reads around it lie closest, with their midpoint. The rate is measured
/// between two such pairs; a thread preempted for a time d between the two reads of one pair
/// would put it off by d over the settle time, and every duration the timeline gives with it.
fn tsc_with_instant() -> (u64, Instant) {
    // (the gap between the counter's reads, their midpoint, the instant between them)
    let read = || {
        let before = tsc::read();
        let now = Instant::now();
        let gap = tsc::read().wrapping_sub(before);
        (gap, before.wrapping_add(gap / 2), now)
    };
    let mut best = read();
    for _ in 1..PAIR_TRIES {
        let next = read();
        if next.0 < best.0 {
            best = next;
        }
    }
    (best.1, best.2)
}

/// A clock's ticks as ns, fixed for one read of a ring.
pub(crate) struct Scale {
    ns_per_tick: f64,
    anchor_ticks: u64,
    anchor_unix_ns: u64,
}

impl Scale {
    pub(crate) fn ns(&self, ticks: u64) -> u64 {
        (ticks as f64 * self.ns_per_tick).round() as u64
    }

    /// A reading of the clock as ns since the Unix epoch.
    pub(crate) fn unix_ns(&self, ticks: u64) -> u64 {
        self.anchor_unix_ns + self.ns(ticks.saturating_sub(self.anchor_ticks))
    }
}

mod tsc {
    //! The time-stamp counter, where it counts at a constant rate in every power state.

    #[cfg(target_arch = "x86_64")]
    pub(super) fn invariant() -> bool {
        use std::arch::x86_64::__cpuid;
        // CPUID is always available on x86-64. Leaf 0x8000_0007 EDX bit 8: invariant TSC.
        let max = __cpuid(0x8000_0000).eax;
        max >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: RDTSC is available on every x86-64 CPU and has no memory effects.
        unsafe { std::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) fn invariant() -> bool {
        false
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) fn read() -> u64 {
        0
    }
}

/// The wall clock now, ns since the Unix epoch (0 before it).
pub(crate) fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
