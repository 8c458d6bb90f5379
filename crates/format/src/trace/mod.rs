//! Reading Kineto / Chrome trace JSON as it streams, and summarizing it.
//!
//! [`EventStream`] takes a trace's bytes in pieces of any size (a gunzip stream, the FIFO a
//! serializer writes into) and hands each event to an [`EventSink`] as soon as its bytes are
//! in, holding only the event it is in the middle of: memory does not grow with the trace.
//! [`Summarizer`] is the sink behind each capture's manifest `summary` and behind
//! `stepscope analyze`: per-kernel and per-operator totals, device busy time and idle gaps,
//! and each iteration's wall, CPU operator and kernel time.
//!
//! ```
//! use stepscope_format::trace::{EventStream, Summarizer};
//!
//! let json = br#"{"traceEvents": [
//!   {"ph": "X", "cat": "user_annotation", "name": "execute_context_1(8)_generation_0(0)",
//!    "ts": 0, "dur": 100, "pid": 1, "tid": 1},
//!   {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5,
//!    "pid": 1, "tid": 1, "args": {"correlation": 7}},
//!   {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 20, "dur": 30, "pid": 0, "tid": 7,
//!    "args": {"correlation": 7, "device": 0}}]}"#;
//! let mut summary = Summarizer::new();
//! let mut stream = EventStream::new();
//! for piece in json.chunks(16) {
//!     stream.feed(piece, &mut summary)?;
//! }
//! let meta = stream.finish(&mut summary)?;
//! let s = summary.finish(meta, 10);
//! assert_eq!((s.kernels.count, s.steps[0].kernel_us), (1, 30.0));
//! # Ok::<(), stepscope_format::trace::StreamError>(())
//! ```

mod ahead;
mod breakdown;
mod event;
mod explain;
mod floor;
mod gpu_time;
mod graph_ops;
mod header;
mod scan;
mod stream;
mod summarizer;
mod summary;

pub use ahead::{ScanAhead, Scanned};
pub use breakdown::{Breakdown, NameCategory, NameTime};
pub use event::{Args, DeviceProperties, Event, Id, Meta, NodeKind, RawArgs};
pub use explain::KERNEL_WAIT_US;
pub use floor::{peaks, Cost, DevicePeaks, Floor, PeakOverride, Peaks, Roof, DEVICES};
pub use gpu_time::{
    Bound, BusySplit, GpuMean, GpuTime, IdleSplit, KernelKind, LaunchStats, StreamIdle, Verdict,
};
pub use graph_ops::{
    graph_ops, CaptureMap, CaptureReader, CaptureRegion, GraphOp, GraphOps, ReplayReader, Unmapped,
};
pub use header::{Captured, PhaseWork, StepRequests, StepWork, TraceHeader, Trigger};
pub use scan::{FromTrace, RawEvent, Serde, Skip};
pub use stream::{EventSink, EventStream, ReadError, StreamError, StreamErrorKind, CHUNK_HEADROOM};
pub use summarizer::Summarizer;
pub use summary::{AfterStop, Gap, KernelStat, Kernels, OpStat, Split, Step, Summary};
