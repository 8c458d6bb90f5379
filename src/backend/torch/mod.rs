//! PyTorch's Kineto profiler (`"profiler": "torch"`), through libtorch's C++ API.
//!
//! The engine thread does only what Kineto requires of it: prepare and enable the profiler at
//! the start, open one `USER_SCOPE` `RecordFunction` per captured iteration (named as vLLM
//! names it), and disable the profiler at the stop (its cheap half). The detached session goes
//! over a channel to the flush layer's two writer threads (`crate::flush`): the finalizer runs
//! the expensive half of the disable, the saver serializes, compresses and renames the trace,
//! then writes the op table and the manifest. `stop()` therefore costs the cheap half of the
//! disable, never the finalizing or the serialization.
//!
//! vLLM's torch schedule (`wait_iterations`, `warmup_iterations`, `active_iterations`, one
//! repeat) is followed step by step: nothing runs during wait, Kineto is prepared but not
//! collecting during warmup (warmup data is discarded), and the trace is finished as soon as
//! the active steps are over, as `torch.profiler.schedule(..., repeat=1)` does.
//!
//! Layout: the backend and what it does at each call in `backend.rs`; what a session records
//! and carries in `session.rs`; torch's schedule in `schedule.rs`; where traces go and what
//! names them in `paths.rs`; Kineto itself in `kineto/`; what the writer does with a stopped
//! capture in `flushed.rs`, and the op table in `op_table.rs`.

mod backend;
mod flushed;
mod kineto;
pub mod op_table;
mod paths;
mod schedule;
mod session;

pub use backend::TorchBackend;
pub use kineto::{add_glue_dir, glue_info, GlueInfo};

// Nothing here calls torch-sys; naming it keeps it linked, and with it libtorch, which the
// linked glue needs.
#[cfg(feature = "torch")]
use torch_sys as _;
