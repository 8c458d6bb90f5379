//! What a trace's header and its manifest record about how a window ended and what fired it:
//! written by the profiler (the schedule decides them), read back by every reader.

/// Which limit ended a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CutBy {
    /// The capture's projected peak went over `stepscope.max_capture_mb`.
    #[serde(rename = "max_capture_mb")]
    Memory,
    /// The window ran longer than `stepscope.max_capture_s`.
    #[serde(rename = "max_capture_s")]
    Time,
}

impl CutBy {
    /// The config key of the limit.
    pub fn key(self) -> &'static str {
        match self {
            CutBy::Memory => "stepscope.max_capture_mb",
            CutBy::Time => "stepscope.max_capture_s",
        }
    }
}

/// A window the budget ended, as the manifest and the trace header record it:
/// `"cut_short": {"by": "max_capture_mb", "step", "grew_mb", "expansion", "projected_mb",
/// "limit_mb", "seconds", "limit_s"}`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CutShort {
    /// The limit that ended it.
    pub by: CutBy,
    /// The step in which the window ended (not captured).
    pub step: u64,
    /// How much the process had grown since the window began, MB (when it was measured).
    pub grew_mb: Option<f64>,
    /// The writer's expansion the budget assumes (the schedule's `Budget::expansion`).
    pub expansion: u64,
    /// What the capture is projected to cost at its peak: `grew_mb` × `expansion`, MB.
    pub projected_mb: Option<f64>,
    /// `stepscope.max_capture_mb` (0: off).
    pub limit_mb: u64,
    /// How long the window had run, s.
    pub seconds: f64,
    /// `stepscope.max_capture_s` (0: off).
    pub limit_s: f64,
}

impl std::fmt::Display for CutShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.by {
            CutBy::Memory => write!(
                f,
                "the process grew {:.1} MB since the window began, which torch needs {}x of \
                 to write ({:.0} MB), over {} = {}",
                self.grew_mb.unwrap_or_default(),
                self.expansion,
                self.projected_mb.unwrap_or_default(),
                self.by.key(),
                self.limit_mb
            ),
            CutBy::Time => write!(
                f,
                "the window ran {:.1} s, over {} = {}",
                self.seconds,
                self.by.key(),
                self.limit_s
            ),
        }
    }
}

/// The step that fired a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlowStepSeen {
    /// The slow step's index.
    pub step: u64,
    /// Its duration, ns.
    pub duration_ns: u64,
    /// The running median when it was judged, ns (with a relative threshold).
    pub median_ns: Option<u64>,
}
