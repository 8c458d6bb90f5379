//! stepscope's pure core: what an engine iteration scheduled ([`iteration`]), which iterations
//! a session captures with exactly vLLM's `WorkerProfiler` semantics plus stepscope's policy
//! ([`schedule`]: no I/O, clocks or threads; the profiler measures and passes what it measured
//! in), and the profiler config that drives both ([`config`]). [`sys`] is what the OS says of
//! the process's memory and its disk, read by the profiler (and by the config's default
//! memory budget).

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod iteration;
pub mod schedule;
pub mod sys;

pub use stepscope_format::error::{Error, Result};
