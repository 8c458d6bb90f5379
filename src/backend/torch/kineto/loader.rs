//! Finding and loading the glue that matches the process's torch.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::glue::{built_for, has_trace_only, writes_python_parents, Api, GlueInfo, ABI};
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
        return Err(other_abi(&path, abi));
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
    let info = GlueInfo {
        path: Some(path),
        built_for: built,
        has_trace_only: has_trace_only(&api),
        writes_python_parents: writes_python_parents(&api),
    };
    Ok((api, info))
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
    Api::from_library(handle).map_err(|e| match abi_of(handle) {
        // A glue of another ABI may lack a function of this one's table: it is to be rebuilt.
        Some(abi) if abi != ABI => other_abi(path, abi),
        _ => glue(format!(
            "{} is not a stepscope Kineto glue: {e}",
            path.display()
        )),
    })
}

/// The C ABI a loaded library says it speaks, if it has `stepscope_kineto_abi`.
fn abi_of(handle: *mut libc::c_void) -> Option<u32> {
    // SAFETY: handle is a live dlopen handle; the name is NUL terminated.
    let sym = unsafe { libc::dlsym(handle, c"stepscope_kineto_abi".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: every glue ABI exports stepscope_kineto_abi as `uint32_t (void)`.
    let abi =
        unsafe { std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn() -> u32>(sym) };
    // SAFETY: no arguments.
    Some(unsafe { abi() })
}

fn other_abi(path: &Path, abi: u32) -> Error {
    glue(format!(
        "the Kineto glue {} speaks C ABI {abi}, this stepscope {ABI}: rebuild it with \
         `python -m stepscope.glue build --force`",
        path.display()
    ))
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
