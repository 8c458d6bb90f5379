//! The capture budget's judgement, pure: given how much the process grew and how long the
//! window has run (the caller measures both), whether the window must end now, and the record
//! of why. The profiler measures; the manifest, the trace header, NVTX and status report.
//!
//! What a capture costs is not what it grows during its window: torch turns the window's
//! compact buffers into objects before the trace can be written, and that peak, on the writer
//! thread after the stop, is several times larger (measured with torch 2.13 on CPU: 8x for
//! operators alone, 74x with Python stacks, whose every call becomes an event). The budget
//! bounds that projected peak: the window's growth times the backend's [`Budget::expansion`].

pub use stepscope_format::window::{CutBy, CutShort};

const MB: f64 = (1u64 << 20) as f64;

/// The limits of one window (`stepscope.max_capture_mb`, `stepscope.max_capture_s`); 0 turns
/// either off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes the capture may cost at its peak: its growth over the window times `expansion`.
    pub max_growth_bytes: u64,
    /// Nanoseconds the window may run.
    pub max_age_ns: u64,
    /// How many times its growth over the window a capture needs to be written (at least 1).
    pub expansion: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_growth_bytes: 0,
            max_age_ns: 0,
            expansion: 1,
        }
    }
}

impl Budget {
    /// Whether either limit is on: only then does the caller measure anything.
    pub fn is_on(&self) -> bool {
        self.max_growth_bytes > 0 || self.max_age_ns > 0
    }

    /// What a capture that grew `grew_bytes` over its window is projected to cost at its peak.
    pub fn projected(&self, grew_bytes: u64) -> u64 {
        grew_bytes.saturating_mul(self.expansion.max(1))
    }

    /// The cut, if the window that has grown `grew_bytes` (when measured) in `age_ns` must end
    /// in `step`. Memory is judged first: it is what takes an engine down.
    pub fn judge(&self, step: u64, grew_bytes: Option<u64>, age_ns: u64) -> Option<CutShort> {
        let projected = grew_bytes.map(|g| self.projected(g));
        let over_memory =
            self.max_growth_bytes > 0 && projected.is_some_and(|p| p > self.max_growth_bytes);
        let over_time = self.max_age_ns > 0 && age_ns > self.max_age_ns;
        let by = if over_memory {
            CutBy::Memory
        } else if over_time {
            CutBy::Time
        } else {
            return None;
        };
        Some(CutShort {
            by,
            step,
            grew_mb: grew_bytes.map(|g| g as f64 / MB),
            expansion: self.expansion.max(1),
            projected_mb: projected.map(|p| p as f64 / MB),
            limit_mb: self.max_growth_bytes >> 20,
            seconds: age_ns as f64 / 1e9,
            limit_s: self.max_age_ns as f64 / 1e9,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const M: u64 = 1 << 20;

    fn budget(mb: u64, secs: u64, expansion: u64) -> Budget {
        Budget {
            max_growth_bytes: mb * M,
            max_age_ns: secs * S,
            expansion,
        }
    }

    #[test]
    fn a_window_ends_past_either_limit_and_memory_is_named_first() {
        let b = budget(300, 10, 1);
        assert!(b.is_on());
        assert_eq!(
            b.judge(5, Some(300 * M), 10 * S),
            None,
            "at the limits: not over"
        );
        let cut = b.judge(6, Some(301 * M), S).expect("over memory");
        assert_eq!((cut.by, cut.step, cut.limit_mb), (CutBy::Memory, 6, 300));
        assert!((cut.grew_mb.unwrap() - 301.0).abs() < 1e-9);
        assert_eq!(b.judge(7, Some(1), 11 * S).map(|c| c.by), Some(CutBy::Time));
        assert_eq!(
            b.judge(8, Some(400 * M), 11 * S).map(|c| c.by),
            Some(CutBy::Memory)
        );
        // Memory not measured (no /proc): only time can end the window.
        assert_eq!(b.judge(9, None, S), None);
        assert_eq!(b.judge(9, None, 11 * S).map(|c| c.by), Some(CutBy::Time));
    }

    #[test]
    fn the_writers_expansion_is_counted_against_the_limit() {
        let b = budget(300, 0, 80);
        assert_eq!(b.judge(1, Some(3 * M), S), None, "3 MB x 80 = 240 MB");
        let cut = b.judge(2, Some(4 * M), S).expect("4 MB x 80 = 320 MB");
        assert_eq!((cut.expansion, cut.projected_mb), (80, Some(320.0)));
        assert_eq!(b.projected(4 * M), 320 * M);
        let zero = Budget { expansion: 0, ..b };
        assert_eq!(zero.projected(M), M, "an expansion below 1 counts as 1");
    }

    #[test]
    fn zero_turns_a_limit_off() {
        let off = Budget::default();
        assert!(!off.is_on());
        assert_eq!(off.judge(1, Some(u64::MAX), u64::MAX), None);
        let time_only = budget(0, 1, 1);
        assert_eq!(time_only.judge(1, Some(u64::MAX), S / 2), None);
        assert_eq!(
            time_only.judge(1, None, 2 * S).map(|c| c.by),
            Some(CutBy::Time)
        );
    }

    #[test]
    fn the_record_serializes_with_the_config_keys() {
        let cut = budget(1, 0, 2).judge(3, Some(M), S / 2).unwrap();
        assert_eq!(
            cut.to_string(),
            "the process grew 1.0 MB since the window began, which torch needs 2x of to write \
             (2 MB), over stepscope.max_capture_mb = 1"
        );
        let json = serde_json::to_value(cut).unwrap();
        assert_eq!(json["by"], "max_capture_mb");
        assert_eq!(json["step"], 3);
        assert_eq!(json["grew_mb"], 1.0);
        assert_eq!(json["projected_mb"], 2.0);
        assert_eq!(json["limit_s"], 0.0);
    }
}
