//! The slow-step trigger's detector: which timed step is slow, against an absolute threshold,
//! a running median of the last [`WINDOW`] steps, or both. Fixed-size state, no allocation
//! after construction, no clock: the profiler measures, this decides.

pub use stepscope_format::window::SlowStepSeen;

/// Steps the running median is taken over.
pub const WINDOW: usize = 256;

/// Steps timed before a relative threshold can fire: a median of a handful of steps is noise.
pub const MIN_SAMPLES: usize = 16;

/// The slow-step trigger (`stepscope.slow_step_ms`, `stepscope.slow_step_factor`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SlowStep {
    /// Slower than this many nanoseconds (0: no absolute threshold).
    pub min_ns: u64,
    /// Slower than this many times the running median (0: no relative threshold; else > 1).
    pub factor: f64,
}

// `factor` is never NaN: the config accepts only finite factors > 1.
impl Eq for SlowStep {}

/// The detector: the trigger, the last [`WINDOW`] durations (a ring, and the same values
/// sorted, for the median), and the slowest step seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detector {
    trigger: SlowStep,
    /// Kept only with a relative threshold.
    history: Option<Box<History>>,
    slowest: Option<SlowStepSeen>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct History {
    ring: [u64; WINDOW],
    sorted: [u64; WINDOW],
    len: usize,
    /// The ring's oldest entry, once full.
    head: usize,
}

impl History {
    fn median(&self) -> Option<u64> {
        (self.len >= MIN_SAMPLES).then(|| self.sorted[self.len / 2])
    }

    fn push(&mut self, value: u64) {
        if self.len == WINDOW {
            let oldest = self.ring[self.head];
            self.ring[self.head] = value;
            self.head = (self.head + 1) % WINDOW;
            // Replace the oldest value in the sorted array, then move the new one into place.
            let mut i = self.sorted.partition_point(|v| *v < oldest);
            self.sorted[i] = value;
            while i > 0 && self.sorted[i - 1] > self.sorted[i] {
                self.sorted.swap(i - 1, i);
                i -= 1;
            }
            while i + 1 < WINDOW && self.sorted[i + 1] < self.sorted[i] {
                self.sorted.swap(i, i + 1);
                i += 1;
            }
        } else {
            self.ring[self.len] = value;
            let at = self.sorted[..self.len].partition_point(|v| *v <= value);
            self.sorted.copy_within(at..self.len, at + 1);
            self.sorted[at] = value;
            self.len += 1;
        }
    }
}

impl Detector {
    /// A detector for `trigger`; the median's state is allocated here, once.
    pub fn new(trigger: SlowStep) -> Self {
        Detector {
            trigger,
            history: (trigger.factor > 0.0).then(|| {
                Box::new(History {
                    ring: [0; WINDOW],
                    sorted: [0; WINDOW],
                    len: 0,
                    head: 0,
                })
            }),
            slowest: None,
        }
    }

    /// The trigger.
    pub fn trigger(&self) -> SlowStep {
        self.trigger
    }

    /// Forgets every step timed (a new session).
    pub fn reset(&mut self) {
        if let Some(h) = self.history.as_mut() {
            h.len = 0;
            h.head = 0;
        }
        self.slowest = None;
    }

    /// The running median, once [`MIN_SAMPLES`] steps have been timed.
    pub fn median_ns(&self) -> Option<u64> {
        self.history.as_ref().and_then(|h| h.median())
    }

    /// The slowest step timed since the last reset.
    pub fn slowest(&self) -> Option<SlowStepSeen> {
        self.slowest
    }

    /// Judges step `step`, which took `duration_ns`, against the steps before it, then adds it
    /// to them. Returns the step when it is slow.
    pub fn observe(&mut self, step: u64, duration_ns: u64) -> Option<SlowStepSeen> {
        let median_ns = self.median_ns();
        let absolute = duration_ns > self.trigger.min_ns;
        let relative = match (self.history.is_some(), median_ns) {
            (false, _) => true,
            // Not enough steps for a median yet: nothing is slow relative to it.
            (true, None) => false,
            (true, Some(m)) => duration_ns as f64 > self.trigger.factor * m as f64,
        };
        let seen = SlowStepSeen {
            step,
            duration_ns,
            median_ns,
        };
        if self.slowest.is_none_or(|s| duration_ns > s.duration_ns) {
            self.slowest = Some(seen);
        }
        if let Some(h) = self.history.as_mut() {
            h.push(duration_ns);
        }
        (absolute && relative).then_some(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn median_of(values: &[u64]) -> u64 {
        let mut v = values.to_vec();
        v.sort_unstable();
        v[v.len() / 2]
    }

    #[test]
    fn running_median_is_exact_over_the_last_window() {
        let mut d = Detector::new(SlowStep {
            min_ns: 0,
            factor: 2.0,
        });
        // A deterministic sequence with repeats and trends, longer than the window.
        let values: Vec<u64> = (0..1000u64).map(|i| (i * 7919) % 613 + i / 3).collect();
        for (i, v) in values.iter().enumerate() {
            d.observe(i as u64, *v);
            let seen = &values[(i + 1).saturating_sub(WINDOW)..=i];
            let expect = (seen.len() >= MIN_SAMPLES).then(|| median_of(seen));
            assert_eq!(d.median_ns(), expect, "after {} values", i + 1);
        }
    }

    #[test]
    fn absolute_threshold_fires_strictly_above() {
        let mut d = Detector::new(SlowStep {
            min_ns: 100,
            factor: 0.0,
        });
        assert_eq!(d.observe(1, 100), None);
        assert_eq!(d.observe(2, 101).map(|s| s.step), Some(2));
        assert_eq!(d.slowest().map(|s| s.duration_ns), Some(101));
    }

    #[test]
    fn relative_threshold_needs_samples_and_ignores_a_uniformly_slow_run() {
        let mut d = Detector::new(SlowStep {
            min_ns: 0,
            factor: 3.0,
        });
        // The first steps cannot fire, however slow.
        assert_eq!(d.observe(1, 1_000_000), None);
        for i in 2..1000 {
            assert_eq!(d.observe(i, 50_000_000), None, "step {i}");
        }
        assert_eq!(d.observe(1000, 149_000_000), None);
        assert!(d.observe(1001, 151_000_000).is_some());
    }

    #[test]
    fn both_thresholds_must_be_exceeded() {
        let mut d = Detector::new(SlowStep {
            min_ns: 10_000,
            factor: 2.0,
        });
        for i in 0..MIN_SAMPLES as u64 {
            d.observe(i, 1_000);
        }
        // 5x the median but under the floor.
        assert_eq!(d.observe(100, 5_000), None);
        assert!(d.observe(101, 20_000).is_some());
    }
}
