//! stepscope: an engine-side profiler for LLM serving and RL rollout engines.
//!
//! An engine calls [`WorkerProfiler::step`] once per engine iteration. From a profiler config
//! (vLLM's `--profiler-config` JSON, accepted verbatim) stepscope decides which iterations are
//! captured, with exactly the semantics of vLLM's `WorkerProfiler` — `delay_iterations`,
//! `max_iterations` with its `> N` cutoff, torch's wait/warmup steps, per-session overrides,
//! the stop by itself — and drives a backend around them.
//!
//! ```
//! use stepscope::{IterationInfo, ProfilerConfig, StartOptions, WorkerProfiler};
//!
//! let config = ProfilerConfig::from_json_str(r#"{"delay_iterations": 4, "max_iterations": 3}"#)?;
//! let profiler = WorkerProfiler::new(&config, "rank0")?;
//!
//! // A control thread (an HTTP handler, an RPC) asks for a capture; here, with overrides.
//! profiler.start_with(StartOptions { delay_iterations: Some(1), max_iterations: Some(2), ..Default::default() })?;
//!
//! for _ in 0..10 {
//!     // The engine loop: one hook per iteration, with what the scheduler chose.
//!     let _iteration = profiler.step(&IterationInfo::new(1, 128, 31, 31));
//!     // ... run the model; the iteration is annotated until `_iteration` drops ...
//! }
//! assert!(!profiler.is_active()); // it stopped by itself after 2 captured iterations
//! # Ok::<(), stepscope::Error>(())
//! ```
//!
//! Layers: [`config`] parses and validates; [`schedule`] is the pure state machine;
//! [`WorkerProfiler`] adds thread rules and a [`backend::Backend`]. With nothing armed, `step()`
//! costs one relaxed atomic load and a counter increment (see `benches/step.rs`).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod backend;
mod clock;
pub mod flush;
mod profiler;
pub mod requests;
pub mod timeline;

// The layers below, in crates of their own: the pure core and the file formats. Re-exported
// under the paths engines already use.
use stepscope_core::sys;
pub use stepscope_core::{config, iteration, schedule};
use stepscope_format::error;
use stepscope_format::files;
pub use stepscope_format::{manifest, model, trace};

pub use config::ProfilerConfig;
pub use error::{Error, IoSource, Result};
pub use flush::TraceWrite;
pub use iteration::{
    IterationDetail, IterationInfo, PhaseSums, RequestIds, RequestShare, ScheduledRequests, Stage,
};
pub use profiler::{
    IterationGuard, StartOutcome, Status, StepTime, StopOutcome, WorkerProfiler, Writes,
};
pub use schedule::{SlowStepSeen, StartOptions};
pub use timeline::{TimelineInfo, TimelineStep};

/// This library's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
