//! stepscope's key in a trace's header (`"stepscope": {...}` beside `traceEvents`): one type,
//! written by the torch backend before the session stops and read back by the trace reader
//! (and so by `stepscope analyze` and the manifest's `summary`).

use serde::{Deserialize, Serialize};

use crate::model::ModelShape;
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
    /// The served model's shape, when the engine gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelShape>,
    /// When the capture stopped (Unix ns): what the profiler records after it (the CUDA work
    /// the next step launches before the writer thread stops CUPTI) is left out of the
    /// analysis (`Summary::after_stop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_unix_ns: Option<u64>,
}

/// One captured iteration's requests and work, as the trace header and the manifest list
/// them.
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
    /// The iteration's work, per phase, when the engine gave each request's context length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<StepWork>,
}

/// One iteration's work, per phase, summed over its requests as vLLM's detailed annotation
/// sums it (`detailed_trace_annotation`), with `q` a request's scheduled tokens and `kv` its
/// context after the step (tokens already computed plus `q`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepWork {
    /// Requests in prefill (context).
    pub context: PhaseWork,
    /// Requests in decode (generation).
    pub generation: PhaseWork,
}

/// One phase's sums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseWork {
    /// Requests.
    pub requests: u64,
    /// Σ q: tokens scheduled.
    pub sq: u64,
    /// Σ kv: the KV length attended over.
    pub sk: u64,
    /// Σ q².
    pub sqsq: u64,
    /// Σ q·kv.
    pub sqsk: u64,
}

impl PhaseWork {
    /// Query-key pairs a causal attention computes: Σ over requests of q·(kv − q) + q(q+1)/2,
    /// i.e. `sqsk − (sqsq − sq) / 2` (each new token attends over the context before it and
    /// the new tokens up to itself).
    pub fn causal_pairs(&self) -> f64 {
        self.sqsk as f64 - (self.sqsq as f64 - self.sq as f64) / 2.0
    }
}

impl StepWork {
    /// Tokens scheduled in both phases.
    pub fn tokens(&self) -> u64 {
        self.context.sq + self.generation.sq
    }

    /// Requests in both phases.
    pub fn requests(&self) -> u64 {
        self.context.requests + self.generation.requests
    }

    /// The work vLLM's detailed annotation name carries
    /// (`execute_{total}_context_{n}(sq{q}sk{kv}sqsq{qq}sqsk{qk})_generation_{n}(…)`, as
    /// stepscope and vLLM write it with `detailed_trace_annotation`); `None` for any other
    /// name.
    pub fn from_annotation(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("execute_")?;
        let ctx = rest.find("_context_")? + "_context_".len();
        let gen = rest.find(")_generation_")? + ")_generation_".len();
        Some(StepWork {
            context: phase_of(&rest[ctx..])?,
            generation: phase_of(&rest[gen..])?,
        })
    }
}

/// `{n}(sq{q}sk{kv}sqsq{qq}sqsk{qk})`.
fn phase_of(s: &str) -> Option<PhaseWork> {
    let (requests, s) = number(s)?;
    let s = s.strip_prefix("(sq")?;
    let (sq, s) = number(s)?;
    let (sk, s) = number(s.strip_prefix("sk")?)?;
    let (sqsq, s) = number(s.strip_prefix("sqsq")?)?;
    let (sqsk, s) = number(s.strip_prefix("sqsk")?)?;
    s.starts_with(')').then_some(PhaseWork {
        requests,
        sq,
        sk,
        sqsq,
        sqsk,
    })
}

/// The decimal number at the start of `s`, and what follows it.
fn number(s: &str) -> Option<(u64, &str)> {
    let end = s.bytes().take_while(u8::is_ascii_digit).count();
    Some((s[..end].parse().ok()?, &s[end..]))
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
                work: Some(StepWork::default()),
            }],
            model: Some(ModelShape {
                layers: Some(2),
                ..ModelShape::default()
            }),
            ..TraceHeader::default()
        };
        let text = serde_json::to_string(&header).unwrap();
        assert_eq!(serde_json::from_str::<TraceHeader>(&text).unwrap(), header);
        let partial: TraceHeader = serde_json::from_str(r#"{"steps": [{"step": 7}]}"#).unwrap();
        assert_eq!(partial.steps[0].step, 7);
    }

    #[test]
    fn the_work_of_a_detailed_name_is_read_back_and_other_names_have_none() {
        let w = StepWork::from_annotation(
            "execute_130_context_1(sq128sk128sqsq16384sqsk16384)_generation_2(sq2sk40sqsq2sqsk40)",
        )
        .unwrap();
        assert_eq!(
            (w.context, w.generation),
            (
                PhaseWork {
                    requests: 1,
                    sq: 128,
                    sk: 128,
                    sqsq: 16384,
                    sqsk: 16384
                },
                PhaseWork {
                    requests: 2,
                    sq: 2,
                    sk: 40,
                    sqsq: 2,
                    sqsk: 40
                }
            )
        );
        assert_eq!((w.tokens(), w.requests()), (130, 3));
        // A 128-token prefill from nothing: 128·129/2 pairs; two decodes over 20 each: 40.
        assert_eq!(w.context.causal_pairs(), 8256.0);
        assert_eq!(w.generation.causal_pairs(), 40.0);
        for name in [
            "execute_context_1(8)_generation_0(0)",
            "ProfilerStep#3",
            "execute_",
        ] {
            assert_eq!(StepWork::from_annotation(name), None, "{name}");
        }
    }
}
