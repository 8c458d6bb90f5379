//! Which glue this process uses: the one linked in (the `torch` feature) or the one loaded,
//! once, at the first call; and the directories a loaded one is searched in.

#[cfg(feature = "torch")]
use super::glue::{built_for, has_trace_only, writes_python_parents, ABI, LINKED};
use super::glue::{Api, GlueInfo};
#[cfg(not(feature = "torch"))]
use super::loader;
use crate::error::Result;

/// The glue this process uses, and where it came from.
pub fn glue_info() -> Result<GlueInfo> {
    provider().map(|(_, info)| info.clone())
}

#[cfg(feature = "torch")]
pub(super) fn provider() -> Result<(&'static Api, &'static GlueInfo)> {
    static INFO: std::sync::OnceLock<GlueInfo> = std::sync::OnceLock::new();
    let info = INFO.get_or_init(|| {
        // SAFETY: abi takes no arguments. Compiled from the same header: a mismatch is a bug.
        debug_assert_eq!(unsafe { (LINKED.abi)() }, ABI);
        GlueInfo {
            path: None,
            built_for: built_for(&LINKED),
            has_trace_only: has_trace_only(&LINKED),
            writes_python_parents: writes_python_parents(&LINKED),
        }
    });
    Ok((&LINKED, info))
}

#[cfg(not(feature = "torch"))]
pub(super) fn provider() -> Result<(&'static Api, &'static GlueInfo)> {
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
