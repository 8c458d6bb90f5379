//! The Kineto glue (`cpp/kineto.cc`, C ABI in `cpp/stepscope_kineto.h`): how the torch backend
//! reaches libtorch's profiler.
//!
//! libtorch's C++ ABI changes between torch minor versions, so the glue is the only part of
//! stepscope built against one torch. It is provided two ways:
//! - **linked** (the `torch` feature): compiled into this library by `build.rs` against the
//!   libtorch that torch-sys links, for Rust engines that link libtorch themselves;
//! - **loaded** (`torch-dynamic` alone, the Python package): a shared library per torch minor
//!   version, `libstepscope_kineto-torch{X}.{Y}.so`, chosen at the first torch capture by the
//!   version of the libtorch already loaded in the process, and `dlopen`ed then.
//!
//! Either way the rest of the backend sees [`Kineto`] and the owned handles below; every C++
//! exception arrives as an error message.

use std::ffi::{c_char, c_int, CStr};
use std::ptr::{self, NonNull};

use crate::error::{Error, Result};

/// The glue's C ABI version this crate speaks (`STEPSCOPE_KINETO_ABI`).
const ABI: u32 = 2;

/// What Kineto records (`stepscope_kineto_options`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Options {
    pub cpu: bool,
    pub cuda: bool,
    pub xpu: bool,
    pub privateuse1: bool,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub with_stack: bool,
    pub with_flops: bool,
    pub with_modules: bool,
}

/// `stepscope_kineto_event`.
#[repr(C)]
#[derive(Default)]
struct RawEvent {
    name_len: usize,
    thread: u64,
    start_ns: u64,
    duration_ns: u64,
    device: u8,
    is_async: u8,
}

/// One event of a finished session, as the op table needs it.
pub(crate) struct EventRow {
    pub name: String,
    pub thread: u64,
    pub start_ns: u64,
    pub duration_ns: u64,
    /// Recorded on a device (a kernel, memcpy, memset), not on the CPU.
    pub device: bool,
    pub is_async: bool,
}

#[repr(C)]
pub(crate) struct RawDetached {
    _opaque: [u8; 0],
}
#[repr(C)]
pub(crate) struct RawResult {
    _opaque: [u8; 0],
}
#[repr(C)]
pub(crate) struct RawRange {
    _opaque: [u8; 0],
}

type Err = *mut c_char;

/// Declares the glue's functions once: the table [`Api`], the linked table (`torch`) and the
/// loader (`dlsym` by the same names).
macro_rules! glue {
    ($( $field:ident = $symbol:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)? ;)*) => {
        /// The glue's functions, linked in or loaded.
        pub(crate) struct Api {
            $( $field: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        #[cfg(feature = "torch")]
        extern "C" {
            $( fn $symbol($($arg: $ty),*) $(-> $ret)?; )*
        }

        #[cfg(feature = "torch")]
        static LINKED: Api = Api { $( $field: $symbol, )* };

        #[cfg(not(feature = "torch"))]
        impl Api {
            /// The table of a `dlopen`ed glue library; names the first symbol missing.
            fn from_library(handle: *mut libc::c_void) -> std::result::Result<Api, &'static str> {
                Ok(Api { $(
                    $field: {
                        let name = concat!(stringify!($symbol), "\0");
                        // SAFETY: handle is a live dlopen handle; the name is NUL terminated.
                        let sym = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
                        if sym.is_null() {
                            return Err(concat!("it has no symbol ", stringify!($symbol)));
                        }
                        // SAFETY: the glue exports this symbol with exactly this signature
                        // (cpp/stepscope_kineto.h, checked by the ABI version below).
                        unsafe {
                            std::mem::transmute::<*mut libc::c_void,
                                unsafe extern "C" fn($($ty),*) $(-> $ret)?>(sym)
                        }
                    },
                )* })
            }
        }
    };
}

glue! {
    abi = stepscope_kineto_abi() -> u32;
    torch_version = stepscope_kineto_torch_version() -> *const c_char;
    cuda_available = stepscope_kineto_cuda_available() -> c_int;
    prepare = stepscope_kineto_prepare(o: *const Options, err: Err, err_len: usize) -> c_int;
    enable = stepscope_kineto_enable(o: *const Options, session: *mut usize, err: Err, err_len: usize) -> c_int;
    detach = stepscope_kineto_detach(session: usize, out: *mut *mut RawDetached, err: Err, err_len: usize) -> c_int;
    finalize = stepscope_kineto_finalize(d: *mut RawDetached, out: *mut *mut RawResult, err: Err, err_len: usize) -> c_int;
    detached_free = stepscope_kineto_detached_free(d: *mut RawDetached);
    toggle = stepscope_kineto_toggle(enable: c_int, o: *const Options, err: Err, err_len: usize) -> c_int;
    add_metadata = stepscope_kineto_add_metadata(key: *const c_char, key_len: usize, json: *const c_char, json_len: usize, err: Err, err_len: usize) -> c_int;
    save = stepscope_kineto_save(r: *mut RawResult, path: *const c_char, path_len: usize, err: Err, err_len: usize) -> c_int;
    event_count = stepscope_kineto_event_count(r: *const RawResult) -> usize;
    event_at = stepscope_kineto_event_at(r: *const RawResult, index: usize, out: *mut RawEvent, name: *mut c_char, name_cap: usize, err: Err, err_len: usize) -> c_int;
    result_free = stepscope_kineto_result_free(r: *mut RawResult);
    range_new = stepscope_kineto_range_new(out: *mut *mut RawRange, err: Err, err_len: usize) -> c_int;
    range_begin = stepscope_kineto_range_begin(r: *mut RawRange, name: *const c_char, name_len: usize, step: u64, ids: *const *const c_char, id_lens: *const usize, n_ids: usize, err: Err, err_len: usize) -> c_int;
    range_end = stepscope_kineto_range_end(r: *mut RawRange, err: Err, err_len: usize) -> c_int;
    range_free = stepscope_kineto_range_free(r: *mut RawRange);
}

/// A torch backend error: `what` failed, with the glue's message.
fn failed(what: &str, message: &str) -> Error {
    Error::backend("torch", format!("{what} failed: {message}"))
}

/// Calls a fallible glue function with an error buffer; on failure, `what` failed with the
/// message's first line (c10 errors carry a C++ backtrace after it).
fn call(what: &str, f: impl FnOnce(Err, usize) -> c_int) -> Result<()> {
    let mut buf = [0u8; 1024];
    if f(buf.as_mut_ptr().cast(), buf.len()) == 0 {
        return Ok(());
    }
    let text = CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    let first = text.lines().next().unwrap_or_default().trim();
    Err(failed(
        what,
        if first.is_empty() {
            "no message"
        } else {
            first
        },
    ))
}

/// Where the glue came from: linked in, or the file loaded, and the torch it was built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlueInfo {
    /// The glue file, or `None` when linked into this library (the `torch` feature).
    pub path: Option<std::path::PathBuf>,
    /// The torch version the glue was compiled against (`"2.13.0"`).
    pub built_for: String,
}

/// The glue, ready: the only way to the functions above.
#[derive(Clone, Copy)]
pub(crate) struct Kineto {
    api: &'static Api,
}

impl Kineto {
    /// The glue, linked or loaded (loading happens once per process, at the first call).
    pub(crate) fn get() -> Result<Kineto> {
        provider().map(|(api, _)| Kineto { api })
    }

    pub(crate) fn cuda_available(self) -> bool {
        // SAFETY: a glue function without arguments; it catches every exception.
        unsafe { (self.api.cuda_available)() != 0 }
    }

    pub(crate) fn prepare(self, o: &Options) -> Result<()> {
        // SAFETY: o outlives the call; the buffer is call()'s.
        call("prepareProfiler", |err, len| unsafe {
            (self.api.prepare)(o, err, len)
        })
    }

    pub(crate) fn enable(self, o: &Options) -> Result<usize> {
        let mut session = 0usize;
        // SAFETY: o and session outlive the call.
        call("enableProfiler", |err, len| unsafe {
            (self.api.enable)(o, &mut session, err, len)
        })?;
        Ok(session)
    }

    pub(crate) fn detach(self, session: usize) -> Result<Detached> {
        let mut out = ptr::null_mut();
        // SAFETY: out outlives the call; the glue checks the session against this thread's.
        call("disableProfiler", |err, len| unsafe {
            (self.api.detach)(session, &mut out, err, len)
        })?;
        NonNull::new(out)
            .map(|ptr| Detached { api: self.api, ptr })
            .ok_or_else(|| failed("disableProfiler", "the glue returned no session"))
    }

    pub(crate) fn toggle(self, enable: bool, o: &Options) -> Result<()> {
        // SAFETY: o outlives the call.
        call("toggleCollectionDynamic", |err, len| unsafe {
            (self.api.toggle)(c_int::from(enable), o, err, len)
        })
    }

    pub(crate) fn add_metadata(self, key: &str, json: &str) -> Result<()> {
        // SAFETY: (pointer, length) pairs of live strings.
        call("addMetadataJson", |err, len| unsafe {
            (self.api.add_metadata)(
                key.as_ptr().cast(),
                key.len(),
                json.as_ptr().cast(),
                json.len(),
                err,
                len,
            )
        })
    }

    pub(crate) fn new_range(self) -> Result<Range> {
        let mut out = ptr::null_mut();
        // SAFETY: out outlives the call.
        call("RecordFunction", |err, len| unsafe {
            (self.api.range_new)(&mut out, err, len)
        })?;
        NonNull::new(out)
            .map(|ptr| Range {
                api: self.api,
                ptr,
                id_ptrs: Vec::new(),
                id_lens: Vec::new(),
            })
            .ok_or_else(|| failed("RecordFunction", "the glue returned no range"))
    }
}

/// A profiling session taken off the engine thread: no longer recording, not yet finalized.
pub(crate) struct Detached {
    api: &'static Api,
    ptr: NonNull<RawDetached>,
}

// SAFETY: a detached session is no longer reachable from the engine thread (its state was
// popped from that thread and its callback removed); the finalizer thread owns it alone.
unsafe impl Send for Detached {}

impl Detached {
    /// The expensive half of disableProfiler (Kineto's stopTrace), on the calling thread.
    pub(crate) fn finalize(&mut self) -> Result<TraceResult> {
        const WHAT: &str = "finalizing the session (disableProfiler)";
        let mut out = ptr::null_mut();
        // SAFETY: ptr is live until drop; the glue refuses a session finalized before.
        call(WHAT, |err, len| unsafe {
            (self.api.finalize)(self.ptr.as_ptr(), &mut out, err, len)
        })?;
        NonNull::new(out)
            .map(|ptr| TraceResult { api: self.api, ptr })
            .ok_or_else(|| failed(WHAT, "the glue returned no result"))
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        // SAFETY: ptr came from detach and is freed once, here.
        unsafe { (self.api.detached_free)(self.ptr.as_ptr()) }
    }
}

/// A finished session's events and trace, owned until saved.
pub(crate) struct TraceResult {
    api: &'static Api,
    ptr: NonNull<RawResult>,
}

// SAFETY: a result is plain data once the session is disabled (Kineto's events and activity
// buffers, owned by it alone); the writer thread is its only user, and it is dropped there.
unsafe impl Send for TraceResult {}

impl TraceResult {
    /// Kineto writes the trace JSON (to `{path}.tmp`, then renamed to `path`).
    pub(crate) fn save(&mut self, path: &str) -> Result<()> {
        // SAFETY: ptr is live; path is a live (pointer, length) pair.
        call(&format!("saving the trace to {path}"), |err, len| unsafe {
            (self.api.save)(
                self.ptr.as_ptr(),
                path.as_ptr().cast(),
                path.len(),
                err,
                len,
            )
        })
    }

    pub(crate) fn events(&self) -> Result<Vec<EventRow>> {
        // SAFETY: ptr is live.
        let n = unsafe { (self.api.event_count)(self.ptr.as_ptr()) };
        let mut rows = Vec::with_capacity(n);
        let mut name = vec![0u8; 256];
        for i in 0..n {
            let mut raw = RawEvent::default();
            loop {
                // SAFETY: raw and name outlive the call; name's capacity is passed.
                call("reading the session's events", |err, len| unsafe {
                    (self.api.event_at)(
                        self.ptr.as_ptr(),
                        i,
                        &mut raw,
                        name.as_mut_ptr().cast(),
                        name.len(),
                        err,
                        len,
                    )
                })?;
                if raw.name_len <= name.len() {
                    break;
                }
                name.resize(raw.name_len, 0);
            }
            rows.push(EventRow {
                name: String::from_utf8_lossy(&name[..raw.name_len]).into_owned(),
                thread: raw.thread,
                start_ns: raw.start_ns,
                duration_ns: raw.duration_ns,
                device: raw.device != 0,
                is_async: raw.is_async != 0,
            });
        }
        Ok(rows)
    }
}

impl Drop for TraceResult {
    fn drop(&mut self) {
        // SAFETY: ptr came from finalize and is freed once, here.
        unsafe { (self.api.result_free)(self.ptr.as_ptr()) }
    }
}

/// A reusable `USER_SCOPE` `RecordFunction` range: one iteration's annotation at a time.
pub(crate) struct Range {
    api: &'static Api,
    ptr: NonNull<RawRange>,
    /// The (pointer, length) pairs of the request ids passed to the glue, reused so that
    /// captured iterations allocate no new arrays for them; empty between calls.
    id_ptrs: Vec<*const c_char>,
    id_lens: Vec<usize>,
}

// SAFETY: the range is only begun and ended on the engine thread (the profiler's thread rules);
// the backend that owns it may be moved between threads only while no range is open.
unsafe impl Send for Range {}

impl Range {
    /// Opens the annotation `name` of step `step`, with the ids of the requests it serves.
    pub(crate) fn begin(&mut self, name: &str, step: u64, requests: &[String]) -> Result<()> {
        self.id_ptrs
            .extend(requests.iter().map(|r| r.as_ptr().cast::<c_char>()));
        self.id_lens.extend(requests.iter().map(String::len));
        let (ptrs, lens) = (&self.id_ptrs, &self.id_lens);
        // SAFETY: ptr is live; name is a live (pointer, length) pair; `ptrs` and `lens` hold
        // `requests.len()` (pointer, length) pairs of strings alive for the call.
        let result = call("RecordFunction begin", |err, len| unsafe {
            (self.api.range_begin)(
                self.ptr.as_ptr(),
                name.as_ptr().cast(),
                name.len(),
                step,
                ptrs.as_ptr(),
                lens.as_ptr(),
                requests.len(),
                err,
                len,
            )
        });
        // No pointer outlives the call.
        self.id_ptrs.clear();
        self.id_lens.clear();
        result
    }

    pub(crate) fn end(&mut self) -> Result<()> {
        // SAFETY: ptr is live.
        call("RecordFunction end", |err, len| unsafe {
            (self.api.range_end)(self.ptr.as_ptr(), err, len)
        })
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        // SAFETY: ptr came from range_new and is freed once, here.
        unsafe { (self.api.range_free)(self.ptr.as_ptr()) }
    }
}

/// The glue this process uses, and where it came from.
pub fn glue_info() -> Result<GlueInfo> {
    provider().map(|(_, info)| info.clone())
}

fn built_for(api: &Api) -> String {
    // SAFETY: the glue returns a pointer to a static NUL-terminated string.
    let p = unsafe { (api.torch_version)() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, static, NUL terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(feature = "torch")]
fn provider() -> Result<(&'static Api, &'static GlueInfo)> {
    static INFO: std::sync::OnceLock<GlueInfo> = std::sync::OnceLock::new();
    let info = INFO.get_or_init(|| {
        // SAFETY: abi takes no arguments. Compiled from the same header: a mismatch is a bug.
        debug_assert_eq!(unsafe { (LINKED.abi)() }, ABI);
        GlueInfo {
            path: None,
            built_for: built_for(&LINKED),
        }
    });
    Ok((&LINKED, info))
}

#[cfg(not(feature = "torch"))]
fn provider() -> Result<(&'static Api, &'static GlueInfo)> {
    static LOADED: std::sync::OnceLock<Result<(Api, GlueInfo)>> = std::sync::OnceLock::new();
    match LOADED.get_or_init(loader::load) {
        Ok((api, info)) => Ok((api, info)),
        Err(e) => Err(e.clone()),
    }
}

/// Adds a directory searched for glue files, after those in `STEPSCOPE_KINETO_GLUE_DIR`
/// (`:`-separated). The Python package adds its own `_glue/` and the user cache at import,
/// unless that variable is set. `STEPSCOPE_KINETO_GLUE` names one glue file instead. Without effect once the glue
/// is loaded, and in builds that link it (the `torch` feature).
pub fn add_glue_dir(dir: impl Into<std::path::PathBuf>) {
    #[cfg(not(feature = "torch"))]
    {
        let dir = dir.into();
        let mut dirs = loader::DIRS.lock();
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    #[cfg(feature = "torch")]
    let _ = dir.into();
}

#[cfg(not(feature = "torch"))]
mod loader {
    //! Finding and loading the glue that matches the process's torch.

    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};

    use parking_lot::Mutex;

    use super::{built_for, Api, GlueInfo, ABI};
    use crate::error::{Error, Result};

    /// The torch backend's error for a glue that cannot be found or loaded.
    fn glue(message: impl Into<String>) -> Error {
        Error::backend("torch", message)
    }

    pub(super) static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    /// `libstepscope_kineto-torch{X}.{Y}.so`.
    pub(super) fn file_name(major: u32, minor: u32) -> String {
        format!("libstepscope_kineto-torch{major}.{minor}.so")
    }

    pub(super) fn load() -> Result<(Api, GlueInfo)> {
        let torch = loaded_torch()?;
        let (major, minor) = torch.minor.ok_or_else(|| {
            glue(format!(
                "cannot tell the version of the libtorch loaded from {} (no torch/version.py or \
                 build-version beside it)",
                torch.lib.display()
            ))
        })?;
        let version = torch.version.clone().unwrap_or_default();
        let path = match std::env::var_os("STEPSCOPE_KINETO_GLUE") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => {
                let dirs = search_dirs();
                let name = file_name(major, minor);
                match dirs.iter().map(|d| d.join(&name)).find(|p| p.is_file()) {
                    Some(p) => p,
                    None => return Err(glue(no_glue_message(&version, &torch.lib, &dirs))),
                }
            }
        };
        let api = open(&path)?;
        // SAFETY: abi takes no arguments.
        let abi = unsafe { (api.abi)() };
        if abi != ABI {
            return Err(glue(format!(
                "the Kineto glue {} speaks C ABI {abi}, this stepscope {ABI}: rebuild it with \
                 `python -m stepscope.glue build --force`",
                path.display()
            )));
        }
        let built = built_for(&api);
        if parse_minor(&built) != Some((major, minor)) {
            return Err(glue(format!(
                "the Kineto glue {} was built for torch {built}, but this process runs torch \
                 {version}: build the glue for it with `python -m stepscope.glue build`",
                path.display()
            )));
        }
        log::info!(
            "stepscope: torch backend: Kineto glue {} (built for torch {built}; torch {version} \
             loaded)",
            path.display()
        );
        Ok((
            api,
            GlueInfo {
                path: Some(path),
                built_for: built,
            },
        ))
    }

    fn search_dirs() -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::env::var_os("STEPSCOPE_KINETO_GLUE_DIR")
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        dirs.extend(DIRS.lock().iter().cloned());
        dirs
    }

    fn no_glue_message(version: &str, lib: &Path, dirs: &[PathBuf]) -> String {
        let mut have: Vec<String> = dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| {
                let name = e.ok()?.file_name();
                let name = name.to_str()?;
                let v = name
                    .strip_prefix("libstepscope_kineto-torch")?
                    .strip_suffix(".so")?;
                parse_minor(v).map(|_| v.to_string())
            })
            .collect();
        have.sort();
        have.dedup();
        let supported = if have.is_empty() {
            "none".to_string()
        } else {
            have.join(", ")
        };
        let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        format!(
            "no Kineto glue for torch {version} (libtorch loaded from {}); this stepscope has \
             glue for torch: {supported} (searched: {}). Build it for this torch with \
             `python -m stepscope.glue build`, or use \"cuda\"",
            lib.display(),
            if searched.is_empty() {
                "no directories".to_string()
            } else {
                searched.join(", ")
            }
        )
    }

    /// The torch libraries whose symbols the glue uses; it is linked without them (the wheel
    /// carries no libtorch), so they are made visible to it before it loads.
    const TORCH_LIBRARIES: [&str; 2] = ["libc10.so", "libtorch_cpu.so"];

    /// Adds the loaded torch libraries to the process's global symbol scope (`RTLD_NOLOAD`:
    /// the very objects torch loaded, never a second copy), where the glue's undefined symbols
    /// are resolved when it loads. What `TORCH_USE_RTLD_GLOBAL` does at torch's import, done
    /// only at the first torch capture.
    fn expose_torch() -> Result<()> {
        for name in TORCH_LIBRARIES {
            let path = loaded_object(name).ok_or_else(|| {
                glue(format!(
                    "{name} is not loaded in this process: import torch before a torch capture"
                ))
            })?;
            let c = CString::new(path.as_os_str().as_bytes())
                .map_err(|_| glue(format!("{} has a NUL byte", path.display())))?;
            // SAFETY: c is a NUL-terminated path; RTLD_NOLOAD returns the loaded object (or
            // NULL) and changes only its scope. The handle's reference is kept for the process.
            let handle = unsafe {
                libc::dlopen(
                    c.as_ptr(),
                    libc::RTLD_LAZY | libc::RTLD_NOLOAD | libc::RTLD_GLOBAL,
                )
            };
            if handle.is_null() {
                return Err(glue(format!(
                    "cannot reach {} for the Kineto glue: {}",
                    path.display(),
                    dl_error()
                )));
            }
        }
        Ok(())
    }

    fn open(path: &Path) -> Result<Api> {
        expose_torch()?;
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| glue(format!("{} has a NUL byte", path.display())))?;
        // SAFETY: c is a NUL-terminated path; RTLD_LOCAL keeps the glue's symbols to itself.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(glue(format!(
                "cannot load the Kineto glue {}: {}",
                path.display(),
                dl_error()
            )));
        }
        // The handle is never closed: the glue's functions stay in use for the process's life.
        Api::from_library(handle).map_err(|e| {
            glue(format!(
                "{} is not a stepscope Kineto glue: {e}",
                path.display()
            ))
        })
    }

    fn dl_error() -> String {
        // SAFETY: dlerror returns NULL or a NUL-terminated message valid until the next dl call
        // on this thread.
        let e = unsafe { libc::dlerror() };
        if e.is_null() {
            return "unknown error".into();
        }
        // SAFETY: non-null (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }

    pub(super) fn parse_minor(version: &str) -> Option<(u32, u32)> {
        let mut parts = version.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor: String = parts
            .next()?
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        Some((major, minor.parse().ok()?))
    }

    /// The libtorch in this process: its directory and version.
    pub(super) struct LoadedTorch {
        pub lib: PathBuf,
        pub version: Option<String>,
        pub minor: Option<(u32, u32)>,
    }

    /// Finds `libtorch_cpu.so` among the loaded objects; its version from the torch package's
    /// `version.py` (a wheel) or libtorch's `build-version` (a C++ distribution).
    pub(super) fn loaded_torch() -> Result<LoadedTorch> {
        let lib = loaded_object("libtorch_cpu.so").ok_or_else(|| {
            glue(
                "libtorch is not loaded in this process: import torch (or link libtorch) before \
                 a torch capture starts",
            )
        })?;
        let dir = lib.parent().unwrap_or(Path::new("/")).to_path_buf();
        let root = dir.parent().unwrap_or(Path::new("/"));
        let version = std::fs::read_to_string(root.join("version.py"))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let v = l.strip_prefix("__version__")?.trim_start();
                    let v = v.strip_prefix('=')?.trim();
                    Some(v.trim_matches(|c| c == '\'' || c == '"').to_string())
                })
            })
            .or_else(|| {
                std::fs::read_to_string(root.join("build-version"))
                    .ok()
                    .map(|s| s.trim().to_string())
            });
        let minor = version.as_deref().and_then(parse_minor);
        Ok(LoadedTorch {
            lib: dir,
            version,
            minor,
        })
    }

    /// The path of a loaded shared object whose file name is `name`.
    fn loaded_object(name: &str) -> Option<PathBuf> {
        struct Search<'a> {
            name: &'a [u8],
            found: Option<PathBuf>,
        }
        unsafe extern "C" fn each(
            info: *mut libc::dl_phdr_info,
            _size: libc::size_t,
            data: *mut libc::c_void,
        ) -> libc::c_int {
            // SAFETY: data is the &mut Search passed below; info is valid during the callback.
            let search = unsafe { &mut *data.cast::<Search<'_>>() };
            // SAFETY: as above.
            let p = unsafe { (*info).dlpi_name };
            if p.is_null() {
                return 0;
            }
            // SAFETY: dlpi_name is a NUL-terminated path.
            let path = unsafe { CStr::from_ptr(p) }.to_bytes();
            let file = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
            if file == search.name {
                search.found = Some(PathBuf::from(std::ffi::OsStr::from_bytes(path)));
                return 1;
            }
            0
        }
        let mut search = Search {
            name: name.as_bytes(),
            found: None,
        };
        // SAFETY: the callback only reads info and writes search, which outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(each), (&mut search as *mut Search<'_>).cast()) };
        search.found.map(|p| std::fs::canonicalize(&p).unwrap_or(p))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn versions_by_minor() {
            assert_eq!(parse_minor("2.13.0+cu130"), Some((2, 13)));
            assert_eq!(parse_minor("2.14"), Some((2, 14)));
            assert_eq!(parse_minor("2.15.0a0+git1234"), Some((2, 15)));
            assert_eq!(parse_minor("torch"), None);
            assert_eq!(file_name(2, 14), "libstepscope_kineto-torch2.14.so");
        }

        #[test]
        fn no_libtorch_in_this_test_process() {
            let err = load().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("libtorch is not loaded"), "{err}");
        }
    }
}
