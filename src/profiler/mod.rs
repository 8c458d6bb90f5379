//! `WorkerProfiler`: the schedule, a backend, and the thread rules between them.
//!
//! # Thread rules
//! `step()` is called by the engine thread, once per engine iteration. `start()` and `stop()`
//! may come from any thread. Backends with thread affinity (a CUDA context, Kineto's
//! thread-local state) must start and stop on the engine thread, so:
//!
//! - before the first `step()`, no engine thread is known and every call acts at once on the
//!   calling thread;
//! - afterwards, a call from the engine thread acts at once (vLLM's behaviour, where
//!   `start_profile` runs on the worker's own thread), while a backend start or stop requested
//!   from another thread is recorded and carried out by the engine thread at its next `step()`,
//!   before that step is counted. The schedule's own state (active, counters) changes at once.
//!
//! `shutdown()` acts on the calling thread: the engine loop has ended by then.
//!
//! # Cost
//! With nothing armed, `step()` is one relaxed load of the gate plus the engine-owned step
//! counter's increment (a relaxed load and store, no read-modify-write): no lock, no allocation,
//! no formatting. Everything else lives in `#[cold]` functions. `benches/step.rs` measures it.
//!
//! Layout: the handle, its gate and the public calls in `handle.rs`; the engine-thread fast
//! path (`step()`, `step_end()`) and the per-iteration guard that closes what `step()` opens in
//! `step.rs`; what the slow paths do to the schedule and the backend in `driver.rs`; the start
//! overrides and outcomes in `options.rs`; the state it reports in `status.rs`.

mod driver;
mod handle;
mod options;
mod status;
mod step;

pub use handle::WorkerProfiler;
pub use options::{StartOutcome, StopOutcome};
pub use status::{Status, StepTime, Writes};
pub use step::IterationGuard;
