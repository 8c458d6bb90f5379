//! The flush layer: what gets a stopped capture onto disk, off the engine thread, whatever
//! backend made it.
//!
//! - [`PendingWrites`]: the count of writes in flight that `WorkerProfiler::flush` waits on
//!   without holding a lock the engine thread needs.
//! - `writer` (with the torch backend): the finalizer and saver threads, fed a backend's
//!   `Capture` through a channel from `stop()`.
//! - `pump`: gzip streamed from the FIFO the serializer writes into, feeding `annotate` and
//!   `summarize` on the way.
//! - `annotate`: each captured iteration's requests written into its annotation's args as the
//!   trace streams through.
//! - `summarize`: the manifest's `summary`, read from the JSON as it streams to disk.
//! - `in_flight`: the flushing marker a parent process waits on at shutdown.
//! - `stale`: the clean-up after processes that died writing.
//!
//! The files themselves are `crate::files`' (temporaries, fsync, rename) and the manifest's
//! format is `crate::manifest`'s. Nothing here knows Kineto: a backend implements `Capture` and
//! `Trace`.

mod pending;

pub use pending::{PendingWrites, TraceWrite};

#[cfg(feature = "torch-dynamic")]
mod annotate;
#[cfg(feature = "torch-dynamic")]
mod in_flight;
#[cfg(feature = "torch-dynamic")]
mod pump;
#[cfg(feature = "torch-dynamic")]
mod stale;
#[cfg(feature = "torch-dynamic")]
mod summarize;
#[cfg(feature = "torch-dynamic")]
mod writer;

#[cfg(feature = "torch-dynamic")]
pub use in_flight::{flushing_marker_of, flushing_markers};
#[cfg(feature = "torch-dynamic")]
pub(crate) use stale::clean_stale;
#[cfg(feature = "torch-dynamic")]
pub(crate) use writer::{Capture, HowToWrite, Job, Settings, Trace, Writer};
