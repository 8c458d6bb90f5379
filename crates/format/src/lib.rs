//! stepscope's file formats, shared by the profiler that writes them and the tools that read
//! them back (the `stepscope` command reads traces through this crate alone: it never links
//! NVTX, CUDA or torch).
//!
//! - [`trace`]: Kineto/Chrome trace JSON read as it streams, in bounded memory; the fields an
//!   analysis reads; stepscope's key in a trace's header; the summary of a trace.
//! - [`manifest`]: the file beside each trace, its states and its version, and the names of
//!   a capture's files (the trace's, the manifest's, a window's request log's).
//! - [`model`]: the served model's shape, as a trace's header and manifest record it.
//! - [`timeline`]: the step timeline's document (a step's fields, their order, a row read
//!   back).
//! - [`window`]: what a header and a manifest record of how a window ended and what fired it.
//! - [`hash`]: the hash of the per-event tables (the summarizer's, the op table's).
//! - [`files`]: files only ever whole under their final names (temporaries named after their
//!   process, write + fsync + rename).
//! - [`requests`]: the request log's document, and the one rule of a request's role in a
//!   step (`in_prefill`).
//! - [`error`]: the one error type of the library crates (the `stepscope` command keeps its
//!   own, which wraps it with exit codes).

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod error;
pub mod files;
pub mod hash;
pub mod manifest;
pub mod model;
pub mod requests;
pub mod timeline;
pub mod trace;
pub mod window;

pub use error::{Error, IoSource, Result};
