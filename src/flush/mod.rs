//! The flush layer: what gets a stopped capture onto disk, off the engine thread, whatever
//! backend made it.
//!
//! - [`PendingWrites`]: the count of writes in flight that `WorkerProfiler::flush` waits on
//!   without holding a lock the engine thread needs.
//! - `writer` (with the torch backend): the finalizer and saver threads, fed a backend's
//!   `Capture` through a channel from `stop()`.
//! - `files`: temporaries that name their process, fsync and rename, gzip streamed from a FIFO.
//! - `annotate`: each captured iteration's requests written into its annotation's args as the
//!   trace streams through.
//! - `manifest`: `{stem}.stepscope.json` beside each trace, and the clean-up after processes
//!   that died writing.
//! - `summarize`: the manifest's `summary`, read from the JSON as it streams to disk.
//! - `in_flight`: the flushing marker a parent process waits on at shutdown.
//!
//! Nothing here knows Kineto: a backend implements `Capture` and `Trace`.

mod pending;

pub use pending::PendingWrites;

#[cfg(feature = "torch-dynamic")]
mod annotate;
#[cfg(feature = "torch-dynamic")]
mod files;
#[cfg(feature = "torch-dynamic")]
mod in_flight;
#[cfg(feature = "torch-dynamic")]
mod manifest;
#[cfg(feature = "torch-dynamic")]
mod summarize;
#[cfg(feature = "torch-dynamic")]
mod writer;

#[cfg(feature = "torch-dynamic")]
pub(crate) use files::write_atomic;
#[cfg(feature = "torch-dynamic")]
pub(crate) use manifest::{clean_stale, Manifest, StepRequests, Trigger};
#[cfg(feature = "torch-dynamic")]
pub(crate) use writer::{Capture, Job, Settings, Trace, Writer};
