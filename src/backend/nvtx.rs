//! NVTX iteration ranges and capture marks, over NVIDIA's `nvtx-sys` bindings (the layer under
//! the `nvtx` 2.x crate, whose safe wrappers allocate a `CString` per message; the range pushed
//! each captured iteration must not).
//!
//! - One domain per profiler (`"stepscope"` unless configured), created once. NVTX returns a
//!   null domain when no tool (nsys, Nsight Compute, an injection library) is attached: then
//!   this layer switches itself off and costs nothing more.
//! - Four categories, named once: 1 prefill, 2 decode, 3 mixed, 4 idle.
//! - Each range's message is a non-registered ASCII string written into one reused buffer, so
//!   dynamic names never grow NVTX's registered-string table; the payload is the step index.
//!
//! Every `unsafe` NVTX call of the crate is in this file.

use std::ffi::{c_char, CString};

use nvtx_sys::ffi;

use crate::iteration::{IterationInfo, Stage};

/// ARGB colour per stage, in [`Stage::ALL`] order: prefill orange, decode blue, mixed purple,
/// idle grey.
const STAGE_COLORS: [u32; 4] = [0xFFF5_8518, 0xFF1F_77B4, 0xFF94_67BD, 0xFF9E_9E9E];
const MARK_COLOR: u32 = 0xFF2C_A02C;

fn category(stage: Stage) -> u32 {
    match stage {
        Stage::Prefill => 1,
        Stage::Decode => 2,
        Stage::Mixed => 3,
        Stage::Idle => 4,
    }
}

/// The NVTX domain of one profiler, present only while a tool listens.
pub(crate) struct Nvtx {
    domain: ffi::nvtxDomainHandle_t,
    /// The message of the range being pushed, NUL-terminated; reused every iteration.
    message: Vec<u8>,
    /// Ranges pushed and not yet popped (at most one: one iteration at a time).
    open: bool,
}

// SAFETY: an NVTX domain handle is a process-wide token that NVTX allows any thread to use;
// the message buffer is owned. Push/pop pairing per thread is the caller's rule (the profiler
// pushes and pops on the engine thread).
unsafe impl Send for Nvtx {}

impl Nvtx {
    /// Creates the domain and names the stage categories. `None` when no NVTX tool is attached
    /// to this process (NVTX hands out a null domain then).
    pub(crate) fn attach(domain_name: &str) -> Option<Self> {
        let name = CString::new(domain_name).ok()?;
        // SAFETY: `name` is a valid NUL-terminated string for the call; NVTX copies it.
        let domain = unsafe { ffi::nvtxDomainCreateA(name.as_ptr()) };
        if domain.is_null() {
            return None;
        }
        for stage in Stage::ALL {
            let label = CString::new(stage.as_str()).ok()?;
            // SAFETY: `domain` came from nvtxDomainCreateA; `label` outlives the call.
            unsafe { ffi::nvtxDomainNameCategoryA(domain, category(stage), label.as_ptr()) };
        }
        Some(Nvtx {
            domain,
            message: Vec::with_capacity(128),
            open: false,
        })
    }

    /// Pushes the iteration's range: message `name`, payload the step index, the stage's
    /// category and colour.
    pub(crate) fn push_iteration(&mut self, step: u64, info: &IterationInfo, name: &str) {
        self.pop_iteration();
        self.message.clear();
        self.message.extend(name.bytes().filter(|b| *b != 0));
        self.message.push(0);
        let stage = info.stage();
        let color = STAGE_COLORS[category(stage) as usize - 1];
        let attributes = attributes(
            self.message.as_ptr().cast(),
            category(stage),
            color,
            Some(step),
        );
        // SAFETY: `domain` is live; `attributes` points at `self.message`, which stays
        // unchanged and alive for the call (NVTX reads the message during the call only).
        unsafe { ffi::nvtxDomainRangePushEx(self.domain, &attributes) };
        self.open = true;
    }

    /// Pops the range `push_iteration` pushed, if one is open.
    pub(crate) fn pop_iteration(&mut self) {
        if self.open {
            self.open = false;
            // SAFETY: `domain` is live, and a range of this domain was pushed on this thread.
            unsafe { ffi::nvtxDomainRangePop(self.domain) };
        }
    }

    /// A range is pushed and not popped.
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    /// An instant marker in the domain (`capture start`, `capture stop`), with the step index.
    pub(crate) fn mark(&self, text: &std::ffi::CStr, step: u64) {
        let attributes = attributes(text.as_ptr(), 0, MARK_COLOR, Some(step));
        // SAFETY: `domain` is live; `text` outlives the call.
        unsafe { ffi::nvtxDomainMarkEx(self.domain, &attributes) };
    }

    /// An instant marker whose text is built by `write` into the reused message buffer
    /// (`requests: …` inside a captured iteration's range), with the step index.
    pub(crate) fn mark_with(&mut self, step: u64, write: impl FnOnce(&mut Vec<u8>)) {
        self.message.clear();
        write(&mut self.message);
        self.message.retain(|b| *b != 0);
        self.message.push(0);
        let attributes = attributes(self.message.as_ptr().cast(), 0, MARK_COLOR, Some(step));
        // SAFETY: `domain` is live; the message stays unchanged for the call.
        unsafe { ffi::nvtxDomainMarkEx(self.domain, &attributes) };
    }
}

impl Drop for Nvtx {
    fn drop(&mut self) {
        self.pop_iteration();
        // SAFETY: `domain` came from nvtxDomainCreateA, no range of it is open any more, and
        // nothing uses it after this (the profiler that owned it is being dropped).
        unsafe { ffi::nvtxDomainDestroy(self.domain) };
    }
}

fn attributes(
    message: *const c_char,
    category: u32,
    color: u32,
    payload: Option<u64>,
) -> nvtx_sys::EventAttributes {
    nvtx_sys::EventAttributes {
        version: nvtx_sys::NVTX_VERSION as u16,
        size: std::mem::size_of::<nvtx_sys::EventAttributes>() as u16,
        category,
        colorType: nvtx_sys::ColorType::NVTX_COLOR_ARGB as i32,
        color,
        payloadType: if payload.is_some() {
            nvtx_sys::PayloadType::NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 as i32
        } else {
            nvtx_sys::PayloadType::NVTX_PAYLOAD_UNKNOWN as i32
        },
        reserved0: 0,
        payload: nvtx_sys::PayloadValue {
            ullValue: payload.unwrap_or(0),
        },
        messageType: nvtx_sys::MessageType::NVTX_MESSAGE_TYPE_ASCII as i32,
        message: nvtx_sys::MessageValue { ascii: message },
    }
}
