//! stepscope's key in a trace's header (`"stepscope": {...}` beside `traceEvents`): one type,
//! written by the torch backend before the session stops and read back by the trace reader
//! (and so by `stepscope analyze` and the manifest's `summary`).

use serde::{Deserialize, Serialize};

use crate::window::{CutShort, SlowStepSeen};

/// What a capture covered: whose steps, and which. The trace header and the manifest both
/// carry it, as keys of their own objects (`#[serde(flatten)]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    /// The worker's name.
    #[serde(default)]
    pub worker_name: String,
    /// The worker's local rank.
    #[serde(default)]
    pub local_rank: u32,
    /// The first captured step.
    #[serde(default)]
    pub first_step: Option<u64>,
    /// The last captured step.
    #[serde(default)]
    pub last_step: Option<u64>,
    /// Iterations captured.
    #[serde(default)]
    pub iterations: u64,
}

impl Captured {
    /// Counts `step` as captured.
    pub fn add(&mut self, step: u64) {
        self.first_step.get_or_insert(step);
        self.last_step = Some(step);
        self.iterations += 1;
    }
}

/// The trace header's `"stepscope"` value. Every field may be absent when reading (a trace
/// of an older stepscope, or one another tool wrote).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// The stepscope that wrote the trace.
    #[serde(default)]
    pub version: String,
    /// The worker and the steps captured.
    #[serde(flatten)]
    pub captured: Captured,
    /// What started the capture, when a trigger did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Each captured iteration's requests (`stepscope.request_ids`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepRequests>,
    /// Why the window ended early, when the capture budget ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<CutShort>,
}

/// One captured iteration's requests, as the trace header and the manifest list them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRequests {
    /// The step index.
    pub step: u64,
    /// The ids of the requests it served.
    #[serde(default)]
    pub requests: Vec<String>,
    /// The tokens scheduled for each request, in the order of `requests`, when the engine
    /// gave them (else empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<u32>,
    /// Whether each request was in prefill (else decode), in the order of `requests`, when
    /// the engine gave it (else empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefill: Vec<bool>,
}

/// What started a capture, as the trace header and the manifest record it:
/// `{"slow_step": {"step", "duration_ns", "median_ns"}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    /// The slow step the capture follows.
    pub slow_step: SlowStepSeen,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written_and_from_a_partial_one() {
        let header = TraceHeader {
            version: "0.1.0".into(),
            captured: Captured {
                worker_name: "w".into(),
                first_step: Some(3),
                last_step: Some(4),
                iterations: 2,
                ..Captured::default()
            },
            trigger: Some(Trigger {
                slow_step: SlowStepSeen {
                    step: 2,
                    duration_ns: 9,
                    median_ns: None,
                },
            }),
            steps: vec![StepRequests {
                step: 3,
                requests: vec!["r".into()],
                tokens: vec![7],
                prefill: vec![true],
            }],
            ..TraceHeader::default()
        };
        let text = serde_json::to_string(&header).unwrap();
        assert_eq!(serde_json::from_str::<TraceHeader>(&text).unwrap(), header);
        let partial: TraceHeader = serde_json::from_str(r#"{"steps": [{"step": 7}]}"#).unwrap();
        assert_eq!(partial.steps[0].step, 7);
    }
}
