//! The C ABI (`include/stepscope.h`), for engines written in C and C++ and for any FFI.
//!
//! Every entry point catches panics (`STEPSCOPE_ERR_INTERNAL`): nothing unwinds across the
//! boundary and nothing aborts the host. Errors are a status code plus a thread-local message
//! (`stepscope_last_error`). Semantics are [`WorkerProfiler`]'s, i.e. vLLM's.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use profiler::model::ModelShape;
use profiler::{
    Error, IterationDetail, IterationInfo, PhaseSums, ProfilerConfig, StartOptions, WorkerProfiler,
};
use stepscope_format::error::panic_message;

/// Success.
pub const STEPSCOPE_OK: c_int = 0;
/// A NULL pointer, invalid UTF-8, or an out-of-range argument.
pub const STEPSCOPE_ERR_INVALID_ARGUMENT: c_int = 1;
/// Malformed config JSON or a bad config field.
pub const STEPSCOPE_ERR_CONFIG: c_int = 2;
/// The profiling backend failed (driver missing, driver call failed).
pub const STEPSCOPE_ERR_BACKEND: c_int = 3;
/// A file could not be read or written.
pub const STEPSCOPE_ERR_IO: c_int = 4;
/// Waiting for trace writing timed out.
pub const STEPSCOPE_ERR_TIMEOUT: c_int = 5;
/// A bug in stepscope (a caught panic).
pub const STEPSCOPE_ERR_INTERNAL: c_int = 6;
/// A start refused by a capture limit (disk, the captures still being written); nothing armed.
pub const STEPSCOPE_ERR_REFUSED: c_int = 7;

/// What one engine iteration scheduled (C layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct stepscope_iteration {
    /// Requests in prefill.
    pub num_ctx_reqs: u32,
    /// Their scheduled tokens.
    pub num_ctx_tokens: u32,
    /// Requests in decode.
    pub num_gen_reqs: u32,
    /// Their scheduled tokens.
    pub num_gen_tokens: u32,
}

/// One phase's work sums (vLLM's `detailed_trace_annotation` sums), over its requests, `q`
/// a request's scheduled tokens and `seq` its computed plus scheduled tokens.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct stepscope_phase_work {
    /// Σ seq: the KV length the phase attends over.
    pub seq_len_sum: u64,
    /// Σ q².
    pub qq_compute: u64,
    /// Σ q·seq.
    pub qk_compute: u64,
}

/// An iteration's work per phase: recorded in the trace's header for `stepscope analyze`'s
/// floor of the step, and named in the iteration's annotation with
/// `detailed_trace_annotation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct stepscope_iteration_work {
    /// Context (prefill) requests' sums.
    pub ctx: stepscope_phase_work,
    /// Generation (decode) requests' sums.
    pub gen: stepscope_phase_work,
}

/// An opaque profiler handle.
#[allow(non_camel_case_types)]
pub struct stepscope_profiler {
    inner: WorkerProfiler,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

fn code_of(e: &Error) -> c_int {
    match e {
        Error::Config { .. } | Error::Json { .. } => STEPSCOPE_ERR_CONFIG,
        Error::InvalidArgument { .. } => STEPSCOPE_ERR_INVALID_ARGUMENT,
        Error::Backend { .. } => STEPSCOPE_ERR_BACKEND,
        Error::Io { .. } | Error::Format { .. } | Error::Write { .. } => STEPSCOPE_ERR_IO,
        Error::Timeout { .. } => STEPSCOPE_ERR_TIMEOUT,
        Error::Refused { .. } => STEPSCOPE_ERR_REFUSED,
        // A variant added later: still an error, never a success.
        _ => STEPSCOPE_ERR_INTERNAL,
    }
}

fn fail(e: &Error) -> c_int {
    set_last_error(&e.to_string());
    code_of(e)
}

fn invalid(message: &str) -> c_int {
    set_last_error(message);
    STEPSCOPE_ERR_INVALID_ARGUMENT
}

/// Runs an entry point's body: a panic becomes `STEPSCOPE_ERR_INTERNAL`.
fn guard(what: &str, body: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(code) => code,
        Err(payload) => {
            let detail = panic_message(payload.as_ref());
            set_last_error(&format!("internal error in {what}: {detail}"));
            STEPSCOPE_ERR_INTERNAL
        }
    }
}

/// # Safety
/// `ptr` is NULL or a NUL-terminated string valid for the call.
unsafe fn str_arg<'a>(ptr: *const c_char, name: &str) -> Result<&'a str, c_int> {
    if ptr.is_null() {
        return Err(invalid(&format!("`{name}` is NULL")));
    }
    // SAFETY: non-null, and NUL-terminated per the caller's contract.
    let c = unsafe { CStr::from_ptr(ptr) };
    c.to_str()
        .map_err(|e| invalid(&format!("`{name}` is not valid UTF-8: {e}")))
}

/// # Safety
/// `p` is NULL or a handle from `stepscope_profiler_new` not yet freed.
unsafe fn profiler<'a>(p: *const stepscope_profiler) -> Result<&'a WorkerProfiler, c_int> {
    if p.is_null() {
        return Err(invalid("the profiler handle is NULL"));
    }
    // SAFETY: non-null and live per the caller's contract; only shared access is taken.
    Ok(unsafe { &(*p).inner })
}

/// An entry point that needs a live profiler: NULL is `STEPSCOPE_ERR_INVALID_ARGUMENT`, an error
/// its code and message, a panic `STEPSCOPE_ERR_INTERNAL`.
///
/// # Safety
/// `p` is NULL or a live handle.
unsafe fn with_profiler(
    what: &str,
    p: *const stepscope_profiler,
    body: impl FnOnce(&WorkerProfiler) -> profiler::Result<()>,
) -> c_int {
    guard(what, || {
        // SAFETY: per the caller's contract.
        match unsafe { profiler(p) } {
            Ok(p) => match body(p) {
                Ok(()) => STEPSCOPE_OK,
                Err(e) => fail(&e),
            },
            Err(code) => code,
        }
    })
}

/// A 1-or-0 query; 0 for NULL.
///
/// # Safety
/// `p` is NULL or a live handle.
unsafe fn flag(
    what: &str,
    p: *const stepscope_profiler,
    f: impl FnOnce(&WorkerProfiler) -> bool,
) -> c_int {
    guard(what, || {
        // SAFETY: per the caller's contract.
        match unsafe { profiler(p) } {
            Ok(p) => c_int::from(f(p)),
            Err(_) => 0,
        }
    })
}

/// Creates a profiler. `config_json`: vLLM's `--profiler-config` JSON (stepscope's keys under
/// `"stepscope"`), or a path to a JSON file. On success `*out` is the profiler, else NULL.
///
/// # Safety
/// `config_json` and `worker_name` are NUL-terminated strings; `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn stepscope_profiler_new(
    config_json: *const c_char,
    worker_name: *const c_char,
    out: *mut *mut stepscope_profiler,
) -> c_int {
    guard("stepscope_profiler_new", || {
        if out.is_null() {
            return invalid("`out` is NULL");
        }
        // SAFETY: `out` is non-null and valid per the contract.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: per the contract.
        let config = match unsafe { str_arg(config_json, "config_json") } {
            Ok(s) => s,
            Err(code) => return code,
        };
        // SAFETY: per the contract.
        let name = match unsafe { str_arg(worker_name, "worker_name") } {
            Ok(s) => s,
            Err(code) => return code,
        };
        let config = match ProfilerConfig::from_spec(config, "config_json") {
            Ok(c) => c,
            Err(e) => return fail(&e),
        };
        match WorkerProfiler::new(&config, name) {
            Ok(inner) => {
                let handle = Box::into_raw(Box::new(stepscope_profiler { inner }));
                // SAFETY: `out` is non-null and valid per the contract.
                unsafe { *out = handle };
                STEPSCOPE_OK
            }
            Err(e) => fail(&e),
        }
    })
}

/// Stops a running capture, waits for trace writing, and frees the profiler. NULL is a no-op.
///
/// # Safety
/// `p` is NULL or a live handle from `stepscope_profiler_new`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn stepscope_profiler_free(p: *mut stepscope_profiler) {
    guard("stepscope_profiler_free", || {
        if !p.is_null() {
            // SAFETY: the handle came from Box::into_raw and is freed once per the contract.
            drop(unsafe { Box::from_raw(p) });
        }
        STEPSCOPE_OK
    });
}

/// Overrides (`delay_iterations`, `max_iterations`) follow one rule on every surface: an absent
/// override keeps the config's value, and a negative one is an error naming it
/// (`STEPSCOPE_ERR_INVALID_ARGUMENT` here, `ValueError` in Python, `stepscope::Error` in C++,
/// Rust's `StartOptions::from_signed`). C has no "absent", so it is spelled `STEPSCOPE_KEEP`;
/// C++'s `std::nullopt` and Python's `None` map to it.
pub const STEPSCOPE_KEEP: i64 = -1;

/// An override as C passes it: [`STEPSCOPE_KEEP`] is absent; another negative value is the error every
/// surface gives (see [`StartOptions::from_signed`]).
fn override_arg(v: i64) -> Option<i64> {
    (v != STEPSCOPE_KEEP).then_some(v)
}

/// Starts a session; `STEPSCOPE_KEEP` keeps the config's delay or max, another negative value
/// is `STEPSCOPE_ERR_INVALID_ARGUMENT` naming it. Ignored (`STEPSCOPE_OK`) while a session is
/// active. `STEPSCOPE_ERR_BACKEND`: the backend failed to start; the session stays active, not
/// running, until `stepscope_stop` (vLLM's behaviour). `STEPSCOPE_ERR_REFUSED`: a capture limit
/// refused the start (`stepscope.min_free_disk_mb`, `stepscope.max_capture_mb`); no session is
/// active.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_start(
    p: *mut stepscope_profiler,
    delay_iterations: i64,
    max_iterations: i64,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_start", p, |p| {
            let opts = StartOptions::from_signed(
                override_arg(delay_iterations),
                override_arg(max_iterations),
            )?;
            p.start_with(opts).map(drop)
        })
    }
}

/// Starts a session whose window begins in the step with index `start_at_step` (the
/// worker's `stepscope_step` count, from 1) instead of after a delay; `STEPSCOPE_KEEP` keeps
/// the config's max (another negative value is an error). A step that has already passed is
/// `STEPSCOPE_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_start_at(
    p: *mut stepscope_profiler,
    start_at_step: i64,
    max_iterations: i64,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_start_at", p, |p| {
            let opts = StartOptions::from_signed(None, override_arg(max_iterations))?
                .at_step(Some(start_at_step))?;
            p.start_with(opts).map(drop)
        })
    }
}

/// Sets the worker's global rank, which the config's `stepscope.ranks` selects by (default:
/// the `RANK` environment variable).
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_set_rank(p: *mut stepscope_profiler, rank: u32) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_set_rank", p, |p| {
            p.set_rank(rank);
            Ok(())
        })
    }
}

/// Writes the profiler's state as NUL-terminated JSON into `buf` (`len` bytes) and the size
/// it needs, NUL included, into `*needed` (when not NULL). A `buf` too small (or NULL) is
/// `STEPSCOPE_ERR_INVALID_ARGUMENT`: call again with `*needed` bytes.
///
/// # Safety
/// `p` is a live handle; `buf` is NULL or valid for `len` bytes; `needed` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn stepscope_status_json(
    p: *const stepscope_profiler,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_status_json", p, |p| {
            let json = serde_json::to_string(&p.status()).map_err(|e| Error::InvalidArgument {
                name: "status".into(),
                message: e.to_string(),
            })?;
            copy_out(&json, "status", buf, len, needed)
        })
    }
}

/// Writes the step timeline's ended steps above index `since` (0: all it holds) as
/// NUL-terminated JSON into `buf` (`len` bytes): `{"fields": [...], "steps": [[...], ...]}`,
/// each step an array in `fields` order (step, start_unix_ns, duration_ns, num_ctx_reqs,
/// num_ctx_tokens, num_gen_reqs, num_gen_tokens, phase), oldest first; `"steps": null` when
/// `stepscope.timeline` is off (`"stepscope": {"timeline": true}` or `{"steps": N}`). Never
/// blocks the engine thread. `*needed` and a too small `buf` as
/// `stepscope_status_json`; the engine may add steps between two calls, so size the second
/// buffer with room to spare or call again.
///
/// # Safety
/// `p` is a live handle; `buf` is NULL or valid for `len` bytes; `needed` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn stepscope_timeline_json(
    p: *const stepscope_profiler,
    since: u64,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_timeline_json", p, |p| {
            // serde writes a tuple as an array: each step in FIELDS order.
            let steps = p
                .timeline(since)
                .map(|steps| steps.iter().map(|s| s.as_tuple()).collect::<Vec<_>>());
            let json = serde_json::json!({"fields": profiler::timeline::FIELDS, "steps": steps});
            copy_out(&json.to_string(), "timeline", buf, len, needed)
        })
    }
}

/// Copies `json` and a NUL into `buf` when it fits, its size (NUL included) into `*needed`.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes; `needed` is NULL or valid.
unsafe fn copy_out(
    json: &str,
    what: &str,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> profiler::Result<()> {
    let size = json.len() + 1;
    if !needed.is_null() {
        // SAFETY: non-null and valid per the contract.
        unsafe { *needed = size };
    }
    if buf.is_null() || len < size {
        return Err(Error::InvalidArgument {
            name: "len".into(),
            message: format!("the buffer holds {len} bytes; the {what} needs {size}"),
        });
    }
    // SAFETY: `buf` is valid for `len >= size` bytes per the contract; the NUL goes at index
    // `json.len() < len`.
    unsafe {
        std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
        *buf.add(json.len()) = 0;
    }
    Ok(())
}

/// Ends the session (ignored when none is active). A stop during the delay touches no driver.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_stop(p: *mut stepscope_profiler) -> c_int {
    // SAFETY: per the contract.
    unsafe { with_profiler("stepscope_stop", p, |p| p.stop().map(drop)) }
}

/// Marks the start of an iteration (NULL: counts unknown). The iteration's range stays open
/// until `stepscope_step_end` or the next `stepscope_step`. Returns `STEPSCOPE_ERR_BACKEND`
/// when the backend failed in this step (profiling is affected; the engine can go on).
///
/// # Safety
/// `p` is a live handle; `iteration` is NULL or valid for the call.
#[no_mangle]
pub unsafe extern "C" fn stepscope_step(
    p: *mut stepscope_profiler,
    iteration: *const stepscope_iteration,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_step", p, |p| {
            let info = iteration_info(iteration);
            // The range stays open past this call: the C caller closes it with step_end.
            std::mem::forget(p.step(&info));
            p.take_last_error().map_or(Ok(()), Err)
        })
    }
}

/// `stepscope_step` with the iteration's work per phase (NULL: unknown), for engines that
/// know each request's context length: the trace's header records it and `stepscope analyze`
/// holds the step against its floor.
///
/// # Safety
/// `p` is a live handle; `iteration` and `work` are each NULL or valid for the call.
#[no_mangle]
pub unsafe extern "C" fn stepscope_step_with_work(
    p: *mut stepscope_profiler,
    iteration: *const stepscope_iteration,
    work: *const stepscope_iteration_work,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_step_with_work", p, |p| {
            let mut info = iteration_info(iteration);
            if !work.is_null() {
                // SAFETY: non-null and valid per the contract.
                let w = *work;
                let sums = |s: stepscope_phase_work| PhaseSums {
                    seq_len_sum: s.seq_len_sum,
                    qq_compute: s.qq_compute,
                    qk_compute: s.qk_compute,
                };
                info = info.with_detail(IterationDetail {
                    ctx: sums(w.ctx),
                    gen: sums(w.gen),
                });
            }
            std::mem::forget(p.step(&info));
            p.take_last_error().map_or(Ok(()), Err)
        })
    }
}

/// Records the served model's shape, `json` a UTF-8 JSON object of stepscope's model fields
/// (`layers`, `hidden_size`, `heads`, `kv_heads`, `head_dim`, `intermediate_size`,
/// `gated_mlp`, `vocab_size`, `params`, `weight_dtype`, `kv_cache_dtype`, `tensor_parallel`,
/// `experts`, `experts_per_token`, `architecture`, `unknown`; see docs/analyze.md), in the
/// header and manifest of the traces written from now on. An unknown field or a bad value is
/// `STEPSCOPE_ERR_INVALID_ARGUMENT`, naming it.
///
/// # Safety
/// `p` is a live handle; `json` is NULL or a NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn stepscope_set_model_json(
    p: *mut stepscope_profiler,
    json: *const c_char,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_set_model_json", p, |p| {
            if json.is_null() {
                return Err(Error::InvalidArgument {
                    name: "json".into(),
                    message: "NULL".into(),
                });
            }
            // SAFETY: non-null and NUL-terminated per the contract.
            let text = CStr::from_ptr(json).to_string_lossy();
            let shape = ModelShape::from_json(&text).map_err(|message| Error::InvalidArgument {
                name: "json".into(),
                message,
            })?;
            p.set_model(&shape);
            Ok(())
        })
    }
}

/// Request ids as a C caller holds them: `n` pointers to NUL-terminated strings (NULL entries
/// skipped, invalid UTF-8 replaced), read only if the iteration is captured.
struct CRequestIds {
    ids: *const *const c_char,
    n: usize,
}

impl profiler::RequestIds for CRequestIds {
    fn count(&self) -> usize {
        self.n
    }

    fn for_each_id(&self, f: &mut dyn FnMut(&str)) {
        if self.ids.is_null() {
            return;
        }
        for i in 0..self.n {
            // SAFETY: `ids` holds `n` pointers, valid for the call (the caller's contract).
            let ptr = unsafe { *self.ids.add(i) };
            if ptr.is_null() {
                continue;
            }
            // SAFETY: non-null and NUL-terminated per the contract.
            f(&unsafe { CStr::from_ptr(ptr) }.to_string_lossy());
        }
    }
}

/// `stepscope_step` for an iteration serving `n_ids` requests: with `"stepscope":
/// {"request_ids": true}`, a captured iteration records their ids. `ids` may be NULL when
/// `n_ids` is 0.
///
/// # Safety
/// `p` is a live handle; `iteration` is NULL or valid; `ids` is NULL or holds `n_ids` pointers,
/// each NULL or a NUL-terminated string, valid for the call.
#[no_mangle]
pub unsafe extern "C" fn stepscope_step_with_requests(
    p: *mut stepscope_profiler,
    iteration: *const stepscope_iteration,
    ids: *const *const c_char,
    n_ids: usize,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_step_with_requests", p, |p| {
            let info = iteration_info(iteration);
            let requests = CRequestIds { ids, n: n_ids };
            std::mem::forget(p.step_with_requests(&info, &requests));
            p.take_last_error().map_or(Ok(()), Err)
        })
    }
}

/// 1 when the next step can record request ids (`request_ids` on and a session armed): collect
/// them only then. 0 otherwise, and for NULL.
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_wants_request_ids(p: *const stepscope_profiler) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        flag(
            "stepscope_wants_request_ids",
            p,
            WorkerProfiler::wants_request_ids,
        )
    }
}

/// The counts behind a C iteration pointer; NULL: unknown.
///
/// # Safety
/// `iteration` is NULL or valid for the call.
unsafe fn iteration_info(iteration: *const stepscope_iteration) -> IterationInfo {
    if iteration.is_null() {
        return IterationInfo::default();
    }
    // SAFETY: non-null and valid per the contract.
    let it = unsafe { *iteration };
    IterationInfo::new(
        it.num_ctx_reqs,
        it.num_ctx_tokens,
        it.num_gen_reqs,
        it.num_gen_tokens,
    )
}

/// Closes the current iteration's range, if one is open.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_step_end(p: *mut stepscope_profiler) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_step_end", p, |p| {
            p.step_end();
            Ok(())
        })
    }
}

/// Stops a running session on the calling thread (vLLM's `shutdown`).
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_shutdown(p: *mut stepscope_profiler) -> c_int {
    // SAFETY: per the contract.
    unsafe { with_profiler("stepscope_shutdown", p, WorkerProfiler::shutdown) }
}

/// 1 while a session is active, else 0 (also for NULL).
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_is_active(p: *const stepscope_profiler) -> c_int {
    // SAFETY: per the contract.
    unsafe { flag("stepscope_is_active", p, WorkerProfiler::is_active) }
}

/// 1 while the backend captures, else 0 (also for NULL).
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_is_running(p: *const stepscope_profiler) -> c_int {
    // SAFETY: per the contract.
    unsafe { flag("stepscope_is_running", p, WorkerProfiler::is_running) }
}

/// Waits up to `timeout_ms` for trace writing: `STEPSCOPE_OK` when nothing is pending,
/// `STEPSCOPE_ERR_TIMEOUT` otherwise.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn stepscope_flush(p: *mut stepscope_profiler, timeout_ms: u32) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        with_profiler("stepscope_flush", p, |p| {
            if p.flush(Duration::from_millis(timeout_ms.into()))? {
                Ok(())
            } else {
                Err(Error::Timeout {
                    what: format!("trace writing ({timeout_ms} ms)"),
                })
            }
        })
    }
}

/// This thread's last error message ("" when none). Valid until the next failing call on
/// this thread.
#[no_mangle]
pub extern "C" fn stepscope_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library version, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn stepscope_version() -> *const c_char {
    static VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}
