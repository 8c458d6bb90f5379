//! The glue's C ABI as Rust sees it: its raw types, the table of its functions (linked in, or
//! looked up by name in a loaded file), the call convention that turns its error buffer into
//! an [`Error`], and what a glue says of itself ([`GlueInfo`]).

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::error::{Error, Result};

/// The glue's C ABI version this crate speaks (`STEPSCOPE_KINETO_ABI`).
pub(super) const ABI: u32 = 8;

/// `STEPSCOPE_KINETO_SERIALIZER_KINETO`: a save through Kineto's own writer.
pub(super) const SERIALIZER_KINETO: c_int = 0;
/// `STEPSCOPE_KINETO_SERIALIZER_STEPSCOPE`: a save through stepscope's (`cpp/kineto_writer.h`).
pub(super) const SERIALIZER_STEPSCOPE: c_int = 1;

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
    /// torch's `ExperimentalConfig::trace_only` (torch 2.13 and later): the finalize builds
    /// only what a save reads, not the event list the op table reads nor the event tree.
    pub trace_only: bool,
}

/// `stepscope_kineto_event`.
#[repr(C)]
#[derive(Default)]
pub(super) struct RawEvent {
    pub(super) name_len: usize,
    pub(super) thread: u64,
    pub(super) end_thread: u64,
    pub(super) start_ns: u64,
    pub(super) duration_ns: u64,
    pub(super) correlation: u64,
    pub(super) linked_correlation: u64,
    pub(super) device: u8,
    pub(super) is_async: u8,
    pub(super) hidden: u8,
    pub(super) user_annotation: u8,
    pub(super) python_function: u8,
    pub(super) overhead: u8,
}

/// `stepscope_kineto_row`: a CPU event a save kept for the op table.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct RawRow {
    pub(super) name: u32,
    pub(super) user_annotation: u8,
    pub(super) python_function: u8,
    pub(super) thread: i64,
    pub(super) start_ns: i64,
    pub(super) duration_ns: i64,
    pub(super) correlation: i64,
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

pub(super) type Err = *mut c_char;

/// The save's call once the op table's rows are kept (`stepscope_kineto_save`'s `rows_ready`).
pub(super) type RowsReady = unsafe extern "C" fn(user: *mut c_void);

/// Declares the glue's functions once: the table [`Api`], the linked table (`torch`) and the
/// loader (`dlsym` by the same names).
macro_rules! glue {
    ($( $field:ident = $symbol:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)? ;)*) => {
        /// The glue's functions, linked in or loaded.
        pub(crate) struct Api {
            $( pub(super) $field: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        #[cfg(feature = "torch")]
        extern "C" {
            $( fn $symbol($($arg: $ty),*) $(-> $ret)?; )*
        }

        #[cfg(feature = "torch")]
        pub(super) static LINKED: Api = Api { $( $field: $symbol, )* };

        #[cfg(not(feature = "torch"))]
        impl Api {
            /// The table of a `dlopen`ed glue library; names the first symbol missing.
            pub(super) fn from_library(handle: *mut libc::c_void) -> std::result::Result<Api, &'static str> {
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
    has_trace_only = stepscope_kineto_has_trace_only() -> c_int;
    writes_python_parents = stepscope_kineto_writes_python_parents() -> c_int;
    prepare = stepscope_kineto_prepare(o: *const Options, err: Err, err_len: usize) -> c_int;
    enable = stepscope_kineto_enable(o: *const Options, session: *mut usize, err: Err, err_len: usize) -> c_int;
    detach = stepscope_kineto_detach(session: usize, out: *mut *mut RawDetached, err: Err, err_len: usize) -> c_int;
    finalize = stepscope_kineto_finalize(d: *mut RawDetached, out: *mut *mut RawResult, err: Err, err_len: usize) -> c_int;
    detached_free = stepscope_kineto_detached_free(d: *mut RawDetached);
    toggle = stepscope_kineto_toggle(enable: c_int, o: *const Options, err: Err, err_len: usize) -> c_int;
    add_metadata = stepscope_kineto_add_metadata(key: *const c_char, key_len: usize, json: *const c_char, json_len: usize, err: Err, err_len: usize) -> c_int;
    save = stepscope_kineto_save(r: *mut RawResult, path: *const c_char, path_len: usize, serializer: c_int, reference: *const c_char, reference_len: usize, rows_ready: Option<RowsReady>, user: *mut c_void, err: Err, err_len: usize) -> c_int;
    rows = stepscope_kineto_rows(r: *const RawResult, count: *mut usize) -> *const RawRow;
    row_name_count = stepscope_kineto_row_name_count(r: *const RawResult) -> usize;
    row_name = stepscope_kineto_row_name(r: *const RawResult, name: usize, len: *mut usize) -> *const c_char;
    event_count = stepscope_kineto_event_count(r: *const RawResult) -> usize;
    event_at = stepscope_kineto_event_at(r: *const RawResult, index: usize, out: *mut RawEvent, name: *mut c_char, name_cap: usize, err: Err, err_len: usize) -> c_int;
    release_events = stepscope_kineto_result_release_events(r: *mut RawResult);
    result_free = stepscope_kineto_result_free(r: *mut RawResult);
    range_new = stepscope_kineto_range_new(out: *mut *mut RawRange, err: Err, err_len: usize) -> c_int;
    range_begin = stepscope_kineto_range_begin(r: *mut RawRange, name: *const c_char, name_len: usize, step: u64, ids: *const *const c_char, id_lens: *const usize, n_ids: usize, err: Err, err_len: usize) -> c_int;
    range_end = stepscope_kineto_range_end(r: *mut RawRange, err: Err, err_len: usize) -> c_int;
    range_free = stepscope_kineto_range_free(r: *mut RawRange);
}

/// A torch backend error: `what` failed, with the glue's message.
pub(super) fn failed(what: &str, message: &str) -> Error {
    Error::backend("torch", format!("{what} failed: {message}"))
}

/// Calls a fallible glue function with an error buffer; on failure, `what` failed with the
/// message's first line (c10 errors carry a C++ backtrace after it).
pub(super) fn call(what: &str, f: impl FnOnce(Err, usize) -> c_int) -> Result<()> {
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
    /// Whether that torch has `ExperimentalConfig::trace_only` (the glue says; 2.13 and later):
    /// where it has not, every capture takes torch's full finalize.
    pub has_trace_only: bool,
    /// Whether stepscope's serializer writes the `"Python parent id"` a `trace_only` capture
    /// leaves out of its Python frames (the glue says; torch 2.13): where it does, a capture
    /// with Python stacks that serializer saves is finalized `trace_only` too.
    pub writes_python_parents: bool,
}

/// The glue's answer (`stepscope_kineto_has_trace_only`), decided where it is compiled.
pub(super) fn has_trace_only(api: &Api) -> bool {
    // SAFETY: a glue function without arguments that returns a constant.
    unsafe { (api.has_trace_only)() != 0 }
}

/// The glue's answer (`stepscope_kineto_writes_python_parents`), decided where it is compiled.
pub(super) fn writes_python_parents(api: &Api) -> bool {
    // SAFETY: a glue function without arguments that returns a constant.
    unsafe { (api.writes_python_parents)() != 0 }
}

pub(super) fn built_for(api: &Api) -> String {
    // SAFETY: the glue returns a pointer to a static NUL-terminated string.
    let p = unsafe { (api.torch_version)() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, static, NUL terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
