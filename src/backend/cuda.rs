//! The CUDA profiler API backend (`profiler: "cuda"`): `cuProfilerStart`/`cuProfilerStop`
//! around the captured iterations, for `nsys profile --capture-range=cudaProfilerApi`.
//!
//! The driver is loaded through the normal dynamic-loader search for `libcuda.so` (cudarc's
//! dynamic loading), so `LD_LIBRARY_PATH` decides which driver is used. cudarc panics when the
//! library or a symbol is missing; a profiler must never panic into its host, so presence is
//! checked first and every driver call runs under `catch_unwind`.
//!
//! Driver calls used, and nothing else: cuInit, cuCtxGetCurrent, cuDeviceGet,
//! cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuProfilerStart, cuProfilerStop,
//! cuGetErrorName, cuGetErrorString. Every `unsafe` driver call of the crate is in this file.

use std::ffi::{c_char, CStr};
use std::panic::{self, AssertUnwindSafe};
use std::sync::OnceLock;

use cudarc::driver::sys as cu;

use super::api::{Backend, CaptureStart};
use crate::error::{panic_message, Error, Result};

const NAME: &str = "cuda";

/// Calls the CUDA profiler API on the engine thread.
#[derive(Debug)]
pub struct CudaBackend {
    device: i32,
    initialized: bool,
    primary: Option<Context>,
    /// Paused over a stage not chosen: the driver is already stopped.
    paused: bool,
}

/// A retained primary context (an opaque driver handle).
#[derive(Debug, Clone, Copy)]
struct Context(cu::CUcontext);

// SAFETY: a CUcontext is a driver handle that the driver lets any thread make current; we only
// pass it back to the driver.
unsafe impl Send for Context {}

impl CudaBackend {
    /// A backend for CUDA device `device` (the worker's device: its primary context is made
    /// current when the calling thread has none). Touches no driver until the first start.
    pub fn new(device: u32) -> Self {
        CudaBackend {
            device: i32::try_from(device).unwrap_or(i32::MAX),
            initialized: false,
            primary: None,
            paused: false,
        }
    }

    /// Loads and initializes the driver once; a clear error when there is none.
    fn ensure_driver(&mut self) -> Result<()> {
        static PRESENT: OnceLock<bool> = OnceLock::new();
        let present = *PRESENT.get_or_init(|| {
            // SAFETY: only probes whether the shared library can be opened.
            panic::catch_unwind(|| unsafe { cu::is_culib_present() }).unwrap_or(false)
        });
        if !present {
            return Err(Error::backend(
                NAME,
                "needs the NVIDIA driver (libcuda.so), which the dynamic loader did not find: \
                 install the driver, or add the directory holding libcuda.so to \
                 LD_LIBRARY_PATH",
            ));
        }
        if !self.initialized {
            // SAFETY: cuInit takes flags by value; 0 is the only valid value.
            call("cuInit", || unsafe { cu::cuInit(0) })?;
            self.initialized = true;
        }
        Ok(())
    }

    /// Makes a context current on this thread if none is: the device's primary context,
    /// retained once.
    fn ensure_context(&mut self) -> Result<()> {
        let mut current: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer for the call.
        call("cuCtxGetCurrent", || unsafe {
            cu::cuCtxGetCurrent(&mut current)
        })?;
        if !current.is_null() {
            return Ok(());
        }
        let ctx = match self.primary {
            Some(ctx) => ctx,
            None => {
                let mut dev: cu::CUdevice = 0;
                let ordinal = self.device;
                // SAFETY: `dev` is a valid out-pointer; the ordinal is checked by the driver.
                call("cuDeviceGet", || unsafe {
                    cu::cuDeviceGet(&mut dev, ordinal)
                })?;
                let mut ctx: cu::CUcontext = std::ptr::null_mut();
                // SAFETY: `ctx` is a valid out-pointer; `dev` came from cuDeviceGet.
                call("cuDevicePrimaryCtxRetain", || unsafe {
                    cu::cuDevicePrimaryCtxRetain(&mut ctx, dev)
                })?;
                let ctx = Context(ctx);
                self.primary = Some(ctx);
                ctx
            }
        };
        // SAFETY: `ctx` is a primary context retained above and never released while we live.
        call("cuCtxSetCurrent", || unsafe { cu::cuCtxSetCurrent(ctx.0) })
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        NAME
    }

    // The capture range is the whole window; iterations are named by the NVTX ranges.
    fn uses_names(&self) -> bool {
        false
    }

    fn has_iteration_range(&self) -> bool {
        false
    }

    fn start(&mut self, _capture: &CaptureStart<'_>) -> Result<()> {
        self.paused = false;
        self.profiler_start()
    }

    fn stop(&mut self) -> Result<()> {
        if std::mem::take(&mut self.paused) {
            // Stopped when the pause began.
            return Ok(());
        }
        self.profiler_stop()
    }

    // The profiler API has no pause: a stop and a start, which nsys records as separate
    // capture ranges (`--capture-range-end=repeat:N`).
    fn pause(&mut self) -> Result<()> {
        self.profiler_stop()?;
        self.paused = true;
        Ok(())
    }

    fn resume(&mut self) -> Result<()> {
        self.profiler_start()?;
        self.paused = false;
        Ok(())
    }
}

impl CudaBackend {
    fn profiler_start(&mut self) -> Result<()> {
        self.ensure_driver()?;
        self.ensure_context()?;
        // SAFETY: no arguments; a context is current on this thread.
        call("cuProfilerStart", || unsafe { cu::cuProfilerStart() })
    }

    fn profiler_stop(&mut self) -> Result<()> {
        self.ensure_driver()?;
        self.ensure_context()?;
        // SAFETY: no arguments; a context is current on this thread.
        call("cuProfilerStop", || unsafe { cu::cuProfilerStop() })
    }
}

/// Runs one driver call: a panic (cudarc's for a missing symbol) or a non-success result
/// becomes a backend error naming the call and the driver's error name.
fn call(what: &str, f: impl FnOnce() -> cu::CUresult) -> Result<()> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(cu::CUresult::CUDA_SUCCESS) => Ok(()),
        Ok(code) => Err(Error::backend(
            NAME,
            format!("{what} failed: {}", describe(code)),
        )),
        Err(payload) => {
            let detail = panic_message(payload.as_ref());
            Err(Error::backend(
                NAME,
                format!("{what} could not be called: {detail}"),
            ))
        }
    }
}

/// `CUDA_ERROR_X (text)` from the driver's own tables, or the numeric code.
fn describe(code: cu::CUresult) -> String {
    let text = |f: unsafe fn(cu::CUresult, *mut *const c_char) -> cu::CUresult| {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: `s` is a valid out-pointer; on success the driver points it at a static
        // NUL-terminated string.
        let r = panic::catch_unwind(AssertUnwindSafe(|| unsafe { f(code, &mut s) }));
        match r {
            Ok(cu::CUresult::CUDA_SUCCESS) if !s.is_null() => {
                // SAFETY: checked non-null; the driver's error strings are static and
                // NUL-terminated.
                let text = unsafe { CStr::from_ptr(s) };
                Some(text.to_string_lossy().into_owned())
            }
            _ => None,
        }
    };
    let name = text(cu::cuGetErrorName).unwrap_or_else(|| format!("CUresult {}", code as u32));
    match text(cu::cuGetErrorString) {
        Some(s) if s != name => format!("{name} ({s})"),
        _ => name,
    }
}
