//! What each step of a summary ran, per name ([`Breakdown`]): the per-name rows `stepscope
//! diff` compares, computed on request by the summarizer's pass
//! ([`Summarizer::finish_with_breakdown`](super::Summarizer::finish_with_breakdown)).

use serde::{Deserialize, Serialize};

/// What each step of a summary ran, per name: its kernels' device time, its CPU operators' and
/// user annotations' self time (their time less that of the operators and annotations they
/// enclose on their thread), each counted in the step its start falls in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakdown {
    /// The names [`NameTime::name`] indexes.
    pub names: Vec<Box<str>>,
    /// Per step of [`Summary::steps`](super::Summary::steps), in its order: what it ran, by name id.
    pub steps: Vec<Vec<NameTime>>,
}

impl Breakdown {
    /// The name of an id.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", |n| n)
    }
}

/// What a [`Breakdown`]'s name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NameCategory {
    /// A GPU kernel (`cat: kernel`), timed on the device.
    Kernel,
    /// A CPU operator (`cat: cpu_op`), self time.
    CpuOp,
    /// A user annotation (`record_function`, `cat: user_annotation`) other than the steps'
    /// own, self time.
    Annotation,
}

impl NameCategory {
    /// `kernel`, `cpu_op` or `annotation`.
    pub fn as_str(self) -> &'static str {
        match self {
            NameCategory::Kernel => "kernel",
            NameCategory::CpuOp => "cpu_op",
            NameCategory::Annotation => "annotation",
        }
    }
}

/// One name's part of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NameTime {
    /// Into [`Breakdown::names`].
    pub name: u32,
    /// What it is.
    pub category: NameCategory,
    /// Kernels launched or operator calls begun in the step.
    pub count: u32,
    /// Device time (kernels) or self time (operators, annotations), µs.
    pub us: f64,
}
