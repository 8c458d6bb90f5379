//! Profiling backends: what starts and stops capture, and annotates each captured iteration.
//!
//! A backend is a value implementing [`Backend`]; the [`crate::WorkerProfiler`] owns one and
//! calls it only from the places its thread rules allow: `start`, `stop`, `advance`,
//! `begin_iteration` and `end_iteration` run on the engine thread once one is known (see the
//! profiler's docs).

mod api;
mod cuda;
pub(crate) mod nvtx;
#[cfg(feature = "torch-dynamic")]
mod torch;

pub use api::{Backend, CaptureStart, NoBackend, WindowEnd};
pub use cuda::CudaBackend;
#[cfg(feature = "torch-dynamic")]
pub use torch::{add_glue_dir, glue_info, op_table, GlueInfo, TorchBackend};

use crate::config::{ProfilerConfig, ProfilerKind};
#[cfg(not(feature = "torch-dynamic"))]
use crate::error::Error;
use crate::error::Result;

/// The backend that `config.profiler` names, for a worker with local rank `local_rank` (the
/// CUDA device it uses unless `stepscope.cuda_device` says otherwise).
pub fn for_config(config: &ProfilerConfig, local_rank: u32) -> Result<Box<dyn Backend>> {
    match config.profiler {
        None => Ok(Box::new(NoBackend)),
        Some(ProfilerKind::Cuda) => Ok(Box::new(CudaBackend::new(
            config.stepscope.cuda_device.unwrap_or(local_rank),
        ))),
        #[cfg(feature = "torch-dynamic")]
        Some(ProfilerKind::Torch) => Ok(Box::new(TorchBackend::new(config, local_rank)?)),
        #[cfg(not(feature = "torch-dynamic"))]
        Some(ProfilerKind::Torch) => Err(Error::backend(
            "torch",
            "this build of stepscope has no torch (Kineto) backend: build it with the `torch` \
             or `torch-dynamic` feature (see docs/engines.md), or use \"cuda\"",
        )),
    }
}
