//! The C ABI (`include/stepscope.h`), for engines written in C and C++ and for any FFI.
//!
//! Every entry point catches panics (`STEPSCOPE_ERR_INTERNAL`): nothing unwinds across the
//! boundary and nothing aborts the host. Errors are a status code plus a thread-local message
//! (`stepscope_last_error`). Semantics are [`WorkerProfiler`]'s, i.e. vLLM's.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::error::{panic_message, Error};
use crate::iteration::IterationInfo;
use crate::profiler::WorkerProfiler;
use crate::schedule::StartOptions;
use crate::ProfilerConfig;

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

/// Counts of one engine iteration (C layout).
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
    body: impl FnOnce(&WorkerProfiler) -> crate::Result<()>,
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

/// Creates a profiler from config JSON (or a path to a JSON file) for the named worker.
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

/// C's "absent" override (`STEPSCOPE_KEEP` in the header): the config's value.
const KEEP: i64 = -1;

/// An override as C passes it: [`KEEP`] is absent; another negative value is the error every
/// surface gives (see [`StartOptions::from_signed`]).
fn override_arg(v: i64) -> Option<i64> {
    (v != KEEP).then_some(v)
}

/// Starts a session; `STEPSCOPE_KEEP` keeps the config's delay or max, another negative value
/// is `STEPSCOPE_ERR_INVALID_ARGUMENT` naming it.
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

/// Sets the worker's global rank, which the config's `stepscope.ranks` selects by.
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
/// each step an array in `fields` order, oldest first; `"steps": null` when
/// `stepscope.timeline` is off. `*needed` and a too small `buf` as
/// [`stepscope_status_json`]; the engine may add steps between two calls, so size the second
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
            let json = serde_json::json!({"fields": crate::timeline::FIELDS, "steps": steps});
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
) -> crate::Result<()> {
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

/// Ends the session (ignored when none is active).
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

/// Request ids as a C caller holds them: `n` pointers to NUL-terminated strings (NULL entries
/// skipped, invalid UTF-8 replaced), read only if the iteration is captured.
struct CRequestIds {
    ids: *const *const c_char,
    n: usize,
}

impl crate::RequestIds for CRequestIds {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The C type of a header parameter or return as the Rust type `type_name` prints, with
    /// this module's path left out.
    fn rust_type_of_c(c: &str) -> String {
        let c = c.split_whitespace().collect::<Vec<_>>().join(" ");
        let c = c.replace(" *", "*").replace("* ", "*");
        // Pointers: innermost type first, `const` binding to what it follows or precedes.
        let mut base = c.trim_end_matches(['*', ' ']).to_string();
        let stars = c.len() - c.trim_end_matches('*').len();
        let mut levels: Vec<bool> = Vec::new(); // const-ness of each pointer level, outer last
        let outer_const = base.starts_with("const ");
        if outer_const {
            base = base["const ".len()..].to_string();
        }
        // `const char *const *`: the inner pointer is const.
        let mut inner_const = false;
        if let Some(b) = base.strip_suffix("*const") {
            inner_const = true;
            base = b.to_string();
        }
        for i in 0..stars + usize::from(inner_const) {
            levels.push(if i == 0 {
                outer_const
            } else {
                inner_const && i == 1
            });
        }
        let scalar = match base.as_str() {
            "int" => "i32",
            "void" => "()",
            "char" => "i8",
            "int64_t" => "i64",
            "uint64_t" => "u64",
            "uint32_t" => "u32",
            "size_t" => "usize",
            other => other,
        };
        let mut out = scalar.to_string();
        for constant in levels {
            out = format!("{}{out}", if constant { "*const " } else { "*mut " });
        }
        out
    }

    /// The header's function declarations: name -> `extern "C" fn(...) -> ...` as Rust's
    /// `type_name` prints the matching function pointer.
    fn header_functions() -> Vec<(String, String)> {
        let text = include_str!("../include/stepscope.h");
        let mut code = String::new();
        let mut rest = text;
        while let Some(at) = rest.find("/*") {
            code.push_str(&rest[..at]);
            rest = rest[at..]
                .find("*/")
                .map_or("", |end| &rest[at + end + 2..]);
        }
        code.push_str(rest);
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.contains("extern \"C\""))
            .collect::<Vec<_>>()
            .join(" ");
        let mut out = Vec::new();
        for decl in code.split(';') {
            let decl = decl.trim();
            let Some(open) = decl.find('(') else { continue };
            let head = &decl[..open];
            let Some(name_at) = head.rfind("stepscope_") else {
                continue;
            };
            if head.contains("typedef") || head.contains('}') || head.contains('{') {
                continue;
            }
            let name = head[name_at..].trim().to_string();
            let ret = rust_type_of_c(&head[..name_at]);
            let params = decl[open + 1..decl.rfind(')').unwrap_or(decl.len())].trim();
            let params: Vec<String> = if params == "void" {
                Vec::new()
            } else {
                params
                    .split(',')
                    .map(|p| {
                        let p = p.trim();
                        // Drop the parameter's name: the identifier after the last `*` or space.
                        let cut = p.rfind(['*', ' ']).map_or(0, |i| i + 1);
                        rust_type_of_c(&p[..cut])
                    })
                    .collect()
            };
            let ret = if ret == "()" {
                String::new()
            } else {
                format!(" -> {ret}")
            };
            out.push((name, format!("extern \"C\" fn({}){ret}", params.join(", "))));
        }
        out.sort();
        out
    }

    /// A function's pointer type as `type_name` prints it, `unsafe` and this module's path left
    /// out.
    fn rust_signature<T>(_: T) -> String {
        std::any::type_name::<T>()
            .replace("unsafe ", "")
            .replace("stepscope::ffi::", "")
    }

    /// The Rust definitions have exactly the signatures `include/stepscope.h` declares, every
    /// function of it and no other; its error codes are the Rust constants.
    #[test]
    fn signatures_match_the_header() {
        type P = stepscope_profiler;
        type I = stepscope_iteration;
        let mut rust = vec![
            (
                "stepscope_profiler_new",
                rust_signature(
                    stepscope_profiler_new
                        as unsafe extern "C" fn(*const c_char, *const c_char, *mut *mut P) -> c_int,
                ),
            ),
            (
                "stepscope_profiler_free",
                rust_signature(stepscope_profiler_free as unsafe extern "C" fn(*mut P)),
            ),
            (
                "stepscope_start",
                rust_signature(stepscope_start as unsafe extern "C" fn(*mut P, i64, i64) -> c_int),
            ),
            (
                "stepscope_start_at",
                rust_signature(
                    stepscope_start_at as unsafe extern "C" fn(*mut P, i64, i64) -> c_int,
                ),
            ),
            (
                "stepscope_set_rank",
                rust_signature(stepscope_set_rank as unsafe extern "C" fn(*mut P, u32) -> c_int),
            ),
            (
                "stepscope_status_json",
                rust_signature(
                    stepscope_status_json
                        as unsafe extern "C" fn(*const P, *mut c_char, usize, *mut usize) -> c_int,
                ),
            ),
            (
                "stepscope_timeline_json",
                rust_signature(
                    stepscope_timeline_json
                        as unsafe extern "C" fn(
                            *const P,
                            u64,
                            *mut c_char,
                            usize,
                            *mut usize,
                        ) -> c_int,
                ),
            ),
            (
                "stepscope_stop",
                rust_signature(stepscope_stop as unsafe extern "C" fn(*mut P) -> c_int),
            ),
            (
                "stepscope_step",
                rust_signature(stepscope_step as unsafe extern "C" fn(*mut P, *const I) -> c_int),
            ),
            (
                "stepscope_step_with_requests",
                rust_signature(
                    stepscope_step_with_requests
                        as unsafe extern "C" fn(
                            *mut P,
                            *const I,
                            *const *const c_char,
                            usize,
                        ) -> c_int,
                ),
            ),
            (
                "stepscope_wants_request_ids",
                rust_signature(
                    stepscope_wants_request_ids as unsafe extern "C" fn(*const P) -> c_int,
                ),
            ),
            (
                "stepscope_step_end",
                rust_signature(stepscope_step_end as unsafe extern "C" fn(*mut P) -> c_int),
            ),
            (
                "stepscope_shutdown",
                rust_signature(stepscope_shutdown as unsafe extern "C" fn(*mut P) -> c_int),
            ),
            (
                "stepscope_is_active",
                rust_signature(stepscope_is_active as unsafe extern "C" fn(*const P) -> c_int),
            ),
            (
                "stepscope_is_running",
                rust_signature(stepscope_is_running as unsafe extern "C" fn(*const P) -> c_int),
            ),
            (
                "stepscope_flush",
                rust_signature(stepscope_flush as unsafe extern "C" fn(*mut P, u32) -> c_int),
            ),
            (
                "stepscope_last_error",
                rust_signature(stepscope_last_error as extern "C" fn() -> *const c_char),
            ),
            (
                "stepscope_version",
                rust_signature(stepscope_version as extern "C" fn() -> *const c_char),
            ),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect::<Vec<_>>();
        rust.sort();
        assert_eq!(header_functions(), rust);

        // The iteration struct: four uint32_t in the header, 16 bytes here.
        let header = include_str!("../include/stepscope.h");
        let fields = header
            .split("typedef struct stepscope_iteration {")
            .nth(1)
            .and_then(|s| s.split('}').next())
            .unwrap_or("");
        let fields: usize = fields
            .lines()
            .filter_map(|l| l.split("/*").next()?.trim().strip_prefix("uint32_t "))
            .map(|l| l.trim_end_matches(';').split(',').count())
            .sum();
        assert_eq!(fields * 4, std::mem::size_of::<stepscope_iteration>());
        let codes = [
            ("STEPSCOPE_OK", STEPSCOPE_OK),
            (
                "STEPSCOPE_ERR_INVALID_ARGUMENT",
                STEPSCOPE_ERR_INVALID_ARGUMENT,
            ),
            ("STEPSCOPE_ERR_CONFIG", STEPSCOPE_ERR_CONFIG),
            ("STEPSCOPE_ERR_BACKEND", STEPSCOPE_ERR_BACKEND),
            ("STEPSCOPE_ERR_IO", STEPSCOPE_ERR_IO),
            ("STEPSCOPE_ERR_TIMEOUT", STEPSCOPE_ERR_TIMEOUT),
            ("STEPSCOPE_ERR_INTERNAL", STEPSCOPE_ERR_INTERNAL),
            ("STEPSCOPE_ERR_REFUSED", STEPSCOPE_ERR_REFUSED),
        ];
        for (name, value) in codes {
            assert!(
                header.contains(&format!("{name} = {value}")),
                "{name} is not {value} in the header"
            );
        }
    }

    /// The reading above catches a changed declaration: one parameter's type changed in the
    /// header's text reads as a different signature.
    #[test]
    fn a_changed_header_declaration_reads_differently() {
        assert_eq!(rust_type_of_c("const char *const *"), "*const *const i8");
        assert_eq!(
            rust_type_of_c("stepscope_profiler **"),
            "*mut *mut stepscope_profiler"
        );
        assert_eq!(
            rust_type_of_c("const stepscope_profiler *"),
            "*const stepscope_profiler"
        );
        assert_ne!(rust_type_of_c("uint32_t"), rust_type_of_c("int64_t"));
    }

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(stepscope_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
