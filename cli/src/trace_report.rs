//! One trace's analysis ([`TraceReport`]): its summary, read from the trace now or taken from
//! the manifest its worker wrote, with where it came from. What `analyze`, `report` and the
//! loader share.

use std::path::Path;

use serde::Serialize;

use crate::trace::{self, TraceError};

pub use stepscope_format::trace::{
    Gap, KernelKind, KernelStat, Kernels, OpStat, Split, Step, Summarizer, Summary,
};

/// Where a trace's summary came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Read from the trace now.
    Trace,
    /// The worker's, from the manifest written beside the trace.
    Manifest,
}

/// The analysis of one trace: its file and its summary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceReport {
    /// The file.
    pub file: String,
    /// Where the summary came from.
    pub source: Source,
    /// What it holds (`rank`: `distributedInfo.rank`, else from the file name).
    #[serde(flatten)]
    pub summary: Summary,
}

impl std::ops::Deref for TraceReport {
    type Target = Summary;
    fn deref(&self) -> &Summary {
        &self.summary
    }
}

impl TraceReport {
    /// The report of `file` from its summary; the rank falls back to the file name's.
    pub fn new(file: &Path, summary: Summary) -> Self {
        Self::with_source(file, summary, Source::Trace)
    }

    /// The report of `file` from the summary its manifest holds.
    pub fn from_manifest(file: &Path, summary: Summary) -> Self {
        Self::with_source(file, summary, Source::Manifest)
    }

    fn with_source(file: &Path, mut summary: Summary, source: Source) -> Self {
        summary.rank = summary.rank.or_else(|| trace::rank_from_name(file));
        TraceReport {
            file: file.display().to_string(),
            source,
            summary,
        }
    }
}

/// Reads and analyzes one trace, streaming it. `top`: kernel and operator names kept (0: all).
pub fn analyze_file(path: &Path, top: usize) -> Result<TraceReport, TraceError> {
    let mut summarizer = Summarizer::new();
    let meta = trace::read_events_ahead(path, &mut summarizer)?;
    Ok(TraceReport::new(path, summarizer.finish(meta, top)))
}
