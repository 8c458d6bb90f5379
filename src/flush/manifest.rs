//! The manifest beside each trace (`{stem}.stepscope.json`): what was captured, where the
//! trace is, and whether it is complete; and the clean-up after processes that died writing.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use super::files::{process_alive, temp_owner, temp_path};
use crate::schedule::{CutShort, SlowStepSeen};
use crate::trace::Summary;

/// One captured iteration's requests, as the manifest and the trace header list them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct StepRequests {
    pub step: u64,
    pub requests: Vec<String>,
}

/// What started a capture, as the manifest and the trace header record it:
/// `{"slow_step": {"step", "duration_ns", "median_ns"}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Trigger {
    pub slow_step: SlowStepSeen,
}

/// The manifest written next to each trace.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Manifest {
    pub stepscope_version: &'static str,
    /// `writing`, `complete`, `failed` or `unfinished`.
    pub status: &'static str,
    pub error: Option<String>,
    pub backend: &'static str,
    /// The writing process: the next start in the directory marks a `writing` manifest of a
    /// process no longer alive `unfinished`.
    pub pid: u32,
    pub worker_name: String,
    pub local_rank: u32,
    pub first_step: Option<u64>,
    pub last_step: Option<u64>,
    pub iterations: u64,
    pub start_time_unix_ns: u128,
    pub stop_time_unix_ns: u128,
    pub trace_file: String,
    pub trace_bytes: Option<u64>,
    pub json_bytes: Option<u64>,
    pub summary_file: Option<String>,
    /// Seconds from the stop to the trace's rename into place.
    pub writer_seconds: Option<f64>,
    /// Of which finalizing the session in Kineto (the second half of `disableProfiler`).
    pub finalize_seconds: Option<f64>,
    /// Of which serializing, compressing and renaming the trace.
    pub write_seconds: Option<f64>,
    /// The slow step the capture follows, when a slow-step trigger started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Why the window ended early, when the capture budget ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<CutShort>,
    /// Each captured iteration's requests (`stepscope.request_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepRequests>>,
    /// The keys the engine added to the trace's header (`set_trace_metadata`), e.g. the SGLang
    /// plugin's `sglang_first_forward_pass`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// What the trace holds, per captured iteration and per kernel and operator, read from
    /// its JSON as it was written (`stepscope analyze DIR` uses it instead of the trace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    /// Write `steps`' requests into the annotations' args as the trace streams through (the
    /// serializer leaves them out: Kineto without shapes recorded).
    #[serde(skip)]
    pub requests_into_args: bool,
    /// The session's config, written after the fields (shared with the backend, serialized
    /// on the writer threads, never copied on the engine thread).
    #[serde(skip)]
    pub config: Arc<serde_json::Value>,
    /// The exact file stem the engine asked for (`set_trace_name`), in place of
    /// `{worker}.{time_ns}.pt`.
    #[serde(skip)]
    pub trace_name: Option<String>,
}

/// The manifest file: the manifest's fields, then the config.
#[derive(Serialize)]
struct ManifestFile<'a> {
    #[serde(flatten)]
    manifest: &'a Manifest,
    config: &'a serde_json::Value,
}

/// Cleans up after processes that died while writing into `dir` (killed, or out of time at
/// exit): removes their temporaries (`.{name}.{pid}.partial…`) and their flushing markers, and
/// marks their manifests still `writing` as `unfinished`. Files of live processes, this one
/// included, are left alone.
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
        } else if name.ends_with(".stepscope.json") && !name.starts_with('.') {
            mark_if_orphaned(&path);
        }
    }
}

/// Marks a manifest `unfinished` when it is still `writing` and its process has ended. Reads
/// only the manifest's head: `status` and `pid` come first.
fn mark_if_orphaned(path: &Path) {
    use std::io::Read;
    let mut head = [0u8; 512];
    let Ok(n) = File::open(path).and_then(|mut f| f.read(&mut head)) else {
        return;
    };
    let head = String::from_utf8_lossy(&head[..n]);
    if !head.contains(r#""status": "writing""#) {
        return;
    }
    let Ok(text) = fs::read_to_string(path) else {
        return;
    };
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let pid = value.get("pid").and_then(serde_json::Value::as_u64);
    let Some(pid) = pid.and_then(|p| u32::try_from(p).ok()) else {
        return;
    };
    if process_alive(pid) {
        return;
    }
    value["status"] = "unfinished".into();
    value["error"] = format!(
        "process {pid} ended before this trace was written (killed, or it ran out of \
         stepscope.flush_timeout_s at exit)"
    )
    .into();
    let tmp = temp_path(path.parent().unwrap_or(Path::new(".")), "manifest", "");
    let written = serde_json::to_vec_pretty(&value)
        .map_err(io::Error::other)
        .and_then(|mut bytes| {
            bytes.push(b'\n');
            fs::write(&tmp, bytes)?;
            fs::rename(&tmp, path)
        });
    match written {
        Ok(()) => log::warn!(
            "stepscope: {} was left 'writing' by process {pid}, which has ended; marked \
             unfinished",
            path.display()
        ),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            log::debug!("stepscope: cannot update {}: {e}", path.display());
        }
    }
}

/// Writes a manifest atomically (temporary name, then rename); failures are logged, since the
/// manifest is what would have reported them.
pub(super) fn write_manifest(path: &Path, manifest: &Manifest) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = temp_path(path.parent().unwrap_or(Path::new(".")), &name, "");
    let result = serde_json::to_vec_pretty(&ManifestFile {
        manifest,
        config: &manifest.config,
    })
    .map_err(io::Error::other)
    .and_then(|mut bytes| {
        bytes.push(b'\n');
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        drop(f);
        fs::rename(&tmp, path)
    });
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        log::error!(
            "stepscope: cannot write the manifest {}: {e}",
            path.display()
        );
    }
}
