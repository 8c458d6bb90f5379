//! The clean-up after processes that died writing into a trace directory (killed, or out of
//! time at exit): their temporaries, their flushing markers, and their manifests still
//! `writing`, marked `unfinished`.

use std::fs;
use std::path::Path;

use crate::files::{process_alive, temp_owner};
use crate::manifest::{is_manifest_name, Manifest, Status};

/// Cleans up after processes that died while writing into `dir`: removes their temporaries
/// (`.{name}.{pid}.partial…`) and their flushing markers, and marks their manifests still
/// `writing` as `unfinished`. Files of live processes, this one included, are left alone.
pub(crate) fn clean_stale(dir: &Path) {
    super::in_flight::clean_stale_markers();
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        if let Some(pid) = temp_owner(name) {
            if !process_alive(pid) {
                match fs::remove_file(&path) {
                    Ok(()) => log::info!(
                        "stepscope: removed {} (left by process {pid}, which has ended)",
                        path.display()
                    ),
                    Err(e) => log::debug!("stepscope: cannot remove {}: {e}", path.display()),
                }
            }
        } else if is_manifest_name(name) {
            mark_if_orphaned(&path);
        }
    }
}

/// Marks a manifest `unfinished` when it is still `writing` and its process has ended.
fn mark_if_orphaned(path: &Path) {
    let mut manifest = match Manifest::read(path) {
        Ok(m) => m,
        Err(e) => {
            log::debug!("stepscope: {e}");
            return;
        }
    };
    let pid = manifest.pid;
    if manifest.status != Status::Writing || process_alive(pid) {
        return;
    }
    manifest.status = Status::Unfinished;
    manifest.error = Some(format!(
        "process {pid} ended before this trace was written (killed, or it ran out of \
         stepscope.flush_timeout_s at exit)"
    ));
    match manifest.write(path) {
        Ok(()) => log::warn!(
            "stepscope: {} was left 'writing' by process {pid}, which has ended; marked \
             unfinished",
            path.display()
        ),
        Err(e) => log::debug!("stepscope: cannot update {}: {e}", path.display()),
    }
}
