//! The manifest: the file stepscope writes beside each trace (`{stem}.stepscope.json`), saying
//! what was captured, where the trace is and whether it is whole. This module owns the format:
//! its one type ([`Manifest`], `Serialize + Deserialize`), its states ([`Status`]), its version
//! ([`MANIFEST_VERSION`]) and the names of the files it sits among. The trace writer writes it,
//! `stepscope analyze` reads its `summary`, the Python package reads it through the extension
//! (`stepscope.read_manifest`); nobody matches on its text.
//!
//! # The format
//!
//! A JSON object, pretty printed, written whole (a temporary, fsync, rename):
//!
//! | key | since | meaning |
//! |---|---|---|
//! | `manifest_version` | 1 | this format's version; absent in manifests written before it had one (read as 0) |
//! | `stepscope_version` | 0 | the stepscope that wrote it |
//! | `status` | 0 | `writing` (the job began), `complete`, `failed` (see `error`), `unfinished` (the process ended or the profiler was dropped before the trace was written) |
//! | `error` | 0 | why a trace is `failed` or `unfinished` |
//! | `backend` | 0 | `torch` |
//! | `pid` | 0 | the writing process: a `writing` manifest whose process has ended is marked `unfinished` by the next start in the directory |
//! | `worker_name`, `local_rank` | 0 | the worker |
//! | `first_step`, `last_step`, `iterations` | 0 | the captured steps |
//! | `start_time_unix_ns`, `stop_time_unix_ns` | 0 | the session's start and stop |
//! | `trace_file` | 0 | the trace, relative to the manifest's directory |
//! | `trace_bytes`, `json_bytes` | 0 | its size on disk and as JSON |
//! | `summary_file` | 0 | the op table written beside it (`{stem}.profiler_out.txt`), if any |
//! | `writer_seconds`, `finalize_seconds`, `write_seconds` | 0 | the stop to the rename; of which finalizing in Kineto; of which serializing, compressing and renaming |
//! | `op_table_seconds` | 1 | the seconds the op table took (torch's event list read and then freed with torch's event tree, or the events the trace's save kept read once it had kept them all; its rows summed, the file written and fsynced), on a thread of its own while the trace was serialized, when one was written |
//! | `op_table_wait_seconds` | 1 | what the writer waited for the op table once the trace was in place (its own rename included) |
//! | `free_seconds` | 1 | after the rename and the op table, the CPU time the writer's thread spent freeing what was left of the capture (Kineto's buffers; torch's event list and tree where the op table's thread had not freed them), before this manifest; torch's cost, counted apart as `finalize_seconds` is |
//! | `trigger` | 0 | `{"slow_step": {...}}` when the slow-step trigger started the capture |
//! | `cut_short` | 0 | why the capture budget ended the window early |
//! | `steps` | 0 | each captured iteration's requests (`stepscope.request_ids`) |
//! | `metadata` | 0 | the keys the engine added to the trace's header (`set_trace_metadata`) |
//! | `summary` | 0 | what the trace holds ([`crate::trace::Summary`]), read from its JSON as it was written |
//! | `config` | 0 | the session's profiler config |
//!
//! A reader needs `status`; it takes any other absent key as absent (empty, zero) and ignores
//! keys it does not know (a newer writer's): a manifest of any earlier version reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::files::write_atomic;
use crate::model::ModelShape;
use crate::trace::{Captured, StepRequests, Summary, Trigger};
use crate::window::CutShort;

/// The version this stepscope writes (`manifest_version`). Manifests written before the field
/// existed read as 0; their keys are a subset of version 1's.
pub const MANIFEST_VERSION: u32 = 1;

/// The manifest's file name ends so: `{stem}.stepscope.json`.
pub const MANIFEST_SUFFIX: &str = ".stepscope.json";

/// The manifest file's name for a trace's stem.
pub fn manifest_name(stem: &str) -> String {
    format!("{stem}{MANIFEST_SUFFIX}")
}

/// The op table beside a torch trace (vLLM's `profiler_out` table) ends so:
/// `{worker}.profiler_out.txt`.
pub const OP_TABLE_SUFFIX: &str = ".profiler_out.txt";

/// The op table's file name for a worker (or trace name) `stem`, as vLLM names it.
pub fn op_table_name(stem: &str) -> String {
    format!("{stem}{OP_TABLE_SUFFIX}")
}

/// A capture window's request log beside its traces ends so: `{stem}.requests.json`.
pub const REQUEST_LOG_SUFFIX: &str = ".requests.json";

/// The file name of a window's request log with stem `stem`: the stem of the trace it goes
/// with (SGLang's schedulers), or [`engine_log_stem`] (vLLM's engine cores, which write no
/// trace of their own).
pub fn request_log_name(stem: &str) -> String {
    format!("{stem}{REQUEST_LOG_SUFFIX}")
}

/// The stem of engine core `engine`'s request log of the window that stopped at `stop_ns`
/// (ns since the Unix epoch): `engine{N}.{stop ns}`; the later stop sorts later.
pub fn engine_log_stem(engine: u32, stop_ns: u128) -> String {
    format!("engine{engine}.{stop_ns}")
}

/// Whether a file name is a window's request log's (not a temporary still being written).
pub fn is_request_log_name(name: &str) -> bool {
    name.ends_with(REQUEST_LOG_SUFFIX) && !name.starts_with('.')
}

/// Whether a file name is a manifest's (a hidden name is a temporary still being written).
pub fn is_manifest_name(name: &str) -> bool {
    name.ends_with(MANIFEST_SUFFIX) && !name.starts_with('.')
}

/// The stem and trace file name of a capture: `{name}` and `{name}.trace.json[.gz]` for a
/// capture the engine named (`set_trace_name`), else `{worker}.{time_ns}` and
/// `{worker}.{time_ns}.pt.trace.json[.gz]` (torch's tensorboard naming).
pub fn trace_names(
    worker_name: &str,
    time_ns: u128,
    trace_name: Option<&str>,
    gzip: bool,
) -> (String, String) {
    let gz = if gzip { ".gz" } else { "" };
    match trace_name {
        Some(name) => (name.to_string(), format!("{name}.trace.json{gz}")),
        None => {
            let stem = format!("{worker_name}.{time_ns}");
            let file = format!("{stem}.pt.trace.json{gz}");
            (stem, file)
        }
    }
}

/// Where a trace stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Status {
    /// Its job has begun; the trace is not in place yet.
    #[default]
    Writing,
    /// The trace is in place, whole.
    Complete,
    /// It could not be written (`error` says why).
    Failed,
    /// Its process ended, or its profiler was dropped, before it was written.
    Unfinished,
}

impl Status {
    /// The word the manifest holds.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Writing => "writing",
            Status::Complete => "complete",
            Status::Failed => "failed",
            Status::Unfinished => "unfinished",
        }
    }
}

/// A manifest: the file beside each trace. See the module docs for each key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format's version ([`MANIFEST_VERSION`] when written; 0 when absent).
    #[serde(default)]
    pub manifest_version: u32,
    /// The stepscope that wrote it.
    #[serde(default)]
    pub stepscope_version: String,
    /// Where the trace stands.
    pub status: Status,
    /// Why it is `failed` or `unfinished`.
    #[serde(default)]
    pub error: Option<String>,
    /// The backend that made the capture (`torch`).
    #[serde(default)]
    pub backend: String,
    /// The writing process.
    #[serde(default)]
    pub pid: u32,
    /// The worker and the steps captured (`worker_name`, `local_rank`, `first_step`,
    /// `last_step`, `iterations`), as in the trace header.
    #[serde(flatten)]
    pub captured: Captured,
    /// The session's start, ns since the Unix epoch.
    #[serde(default)]
    pub start_time_unix_ns: u128,
    /// The session's stop, ns since the Unix epoch (in the trace's file name).
    #[serde(default)]
    pub stop_time_unix_ns: u128,
    /// The trace's file name, in the manifest's directory.
    #[serde(default)]
    pub trace_file: String,
    /// The trace's size on disk.
    #[serde(default)]
    pub trace_bytes: Option<u64>,
    /// The trace's size as JSON.
    #[serde(default)]
    pub json_bytes: Option<u64>,
    /// The op table written beside the trace (`{stem}.profiler_out.txt`). Its key keeps the
    /// name of the format's first version.
    #[serde(default, rename = "summary_file")]
    pub op_table_file: Option<String>,
    /// Seconds from the stop to the trace's rename into place.
    #[serde(default)]
    pub writer_seconds: Option<f64>,
    /// Of which finalizing the session in Kineto (the second half of `disableProfiler`).
    #[serde(default)]
    pub finalize_seconds: Option<f64>,
    /// Of which serializing, compressing and renaming the trace.
    #[serde(default)]
    pub write_seconds: Option<f64>,
    /// The seconds the op table took (torch's event list read and then freed with torch's
    /// event tree, its rows summed, the file written and fsynced), on a thread of its own while
    /// the trace was serialized, when one was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_table_seconds: Option<f64>,
    /// What the writer waited for the op table once the trace was in place (the table's own
    /// rename included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_table_wait_seconds: Option<f64>,
    /// After the rename and the op table, the CPU seconds the writer's thread spent freeing what
    /// was left of the capture (Kineto's buffers; torch's event list and tree where the op
    /// table's thread had not freed them) before this manifest was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_seconds: Option<f64>,
    /// The slow step the capture follows, when a slow-step trigger started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Why the window ended early, when the capture budget ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<CutShort>,
    /// Each captured iteration's requests (`stepscope.request_ids`) and work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepRequests>>,
    /// The served model's shape, when the engine gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelShape>,
    /// The keys the engine added to the trace's header (`set_trace_metadata`), e.g. the SGLang
    /// plugin's `sglang_first_forward_pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// What the trace holds, per captured iteration and per kernel and operator, read from
    /// its JSON as it was written (`stepscope analyze DIR` uses it instead of the trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    /// The session's profiler config (shared with the backend: never copied on the engine
    /// thread).
    #[serde(default)]
    pub config: Arc<serde_json::Value>,
}

/// The name the trace `trace_file` has when its manifest is now named `{stem}.stepscope.json`:
/// with a prefix added to both (`{prefix}{original stem}`, the prefix ending in a separator:
/// the original stem is the longest end of `stem` that begins `trace_file`),
/// `{prefix}{trace_file}`; else, for stepscope's own
/// names, `{stem}` with the trace's ending. `None` when neither rule applies.
fn renamed_trace(stem: &str, trace_file: &str) -> Option<String> {
    let prefixed = stem
        .char_indices()
        .map(|(i, _)| i)
        // A prefix ends at a separator (`rollout-replica0_`), not inside a word.
        .find(|&i| {
            i > 0
                && !stem[..i].ends_with(|c: char| c.is_alphanumeric())
                && trace_file.starts_with(&stem[i..])
        })
        .map(|i| format!("{}{trace_file}", &stem[..i]));
    prefixed.or_else(|| {
        TRACE_ENDINGS
            .iter()
            .find(|e| trace_file.ends_with(*e))
            .map(|ending| format!("{stem}{ending}"))
    })
}

/// The endings a trace's file name has after its stem ([`trace_names`]), longest first.
const TRACE_ENDINGS: [&str; 4] = [
    ".pt.trace.json.gz",
    ".pt.trace.json",
    ".trace.json.gz",
    ".trace.json",
];

impl Manifest {
    /// The trace this manifest (at `manifest_path`) describes, beside it: `trace_file` in the
    /// manifest's directory when it is there; else the file named as the manifest is now, with
    /// the trace's ending: a trace and manifest renamed together by another tool (verl's
    /// relocation adds the same prefix to both) stay a pair. A manifest without a trace file,
    /// or whose trace is in neither place, is an error naming the manifest and both names.
    pub fn trace_path(&self, manifest_path: &Path) -> Result<PathBuf> {
        let dir = manifest_path.parent().unwrap_or(Path::new(""));
        let missing = |message: String| {
            Error::io(
                manifest_path,
                message,
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        };
        if self.trace_file.is_empty() {
            return Err(missing(format!(
                "the manifest names no trace (status {})",
                self.status.as_str()
            )));
        }
        let named = dir.join(&self.trace_file);
        if named.is_file() {
            return Ok(named);
        }
        let renamed = manifest_path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(MANIFEST_SUFFIX))
            .and_then(|stem| renamed_trace(stem, &self.trace_file))
            .map(|name| dir.join(name))
            .filter(|p| *p != named);
        match renamed {
            Some(r) if r.is_file() => Ok(r),
            Some(r) => Err(missing(format!(
                "its trace is missing: neither {} (the name it was written under) nor {} (the \
                 manifest's own name) is there",
                named.display(),
                r.display()
            ))),
            None => Err(missing(format!(
                "its trace is missing: {} (the name it was written under) is not there",
                named.display()
            ))),
        }
    }

    /// Parses a manifest's text; `path` names it in the error.
    pub fn from_slice(bytes: &[u8], path: &Path) -> Result<Manifest> {
        serde_json::from_slice(bytes).map_err(|e| Error::Format {
            path: path.to_path_buf(),
            message: format!("not a stepscope manifest: {e}"),
        })
    }

    /// Reads the manifest at `path`.
    pub fn read(path: &Path) -> Result<Manifest> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(path, format!("cannot read the manifest: {e}"), e))?;
        Manifest::from_slice(&bytes, path)
    }

    /// The manifest as written: pretty JSON and a newline.
    pub fn to_vec(&self) -> Vec<u8> {
        // A manifest holds no map with non-string keys and no non-finite float that
        // serde_json refuses: this cannot fail; if it ever did, the error is the text.
        let mut bytes = serde_json::to_vec_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}").into_bytes());
        bytes.push(b'\n');
        bytes
    }

    /// Writes the manifest to `path` whole (a temporary, fsync, rename), as version
    /// [`MANIFEST_VERSION`].
    pub fn write(&self, path: &Path) -> Result<()> {
        if self.manifest_version == MANIFEST_VERSION {
            write_atomic(path, &self.to_vec())
        } else {
            let current = Manifest {
                manifest_version: MANIFEST_VERSION,
                ..self.clone()
            };
            write_atomic(path, &current.to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real manifest of stepscope 0.1.0 before `manifest_version` (a torch capture on CPU
    /// with `request_ids`): it reads, as version 0.
    const BEFORE_VERSIONS: &str =
        include_str!("../tests/data/manifest-before-versions.stepscope.json");

    #[test]
    fn a_manifest_written_before_versions_reads() {
        let m = Manifest::from_slice(BEFORE_VERSIONS.as_bytes(), Path::new("old")).unwrap();
        assert_eq!(m.manifest_version, 0);
        assert_eq!(m.status, Status::Complete);
        assert_eq!(m.backend, "torch");
        assert_eq!(m.captured.worker_name, "rank0");
        let c = &m.captured;
        assert_eq!(
            (c.first_step, c.last_step, c.iterations),
            (Some(1), Some(2), 2)
        );
        assert!(m.trace_file.ends_with(".pt.trace.json.gz"));
        assert_eq!(m.op_table_file.as_deref(), Some("rank0.profiler_out.txt"));
        let steps = m.steps.as_deref().unwrap();
        assert_eq!(steps[1].requests, ["r1a", "r1b"]);
        let summary = m.summary.as_ref().unwrap();
        assert_eq!(summary.steps.len(), 2);
        assert_eq!(m.config["profiler"], "torch");
    }

    #[test]
    fn a_manifest_reads_back_as_written_with_its_version() {
        let old = Manifest::from_slice(BEFORE_VERSIONS.as_bytes(), Path::new("old")).unwrap();
        let dir = std::env::temp_dir().join(format!("stepscope-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(manifest_name("w.1"));
        old.write(&path).unwrap();
        let back = Manifest::read(&path).unwrap();
        assert_eq!(back.manifest_version, MANIFEST_VERSION);
        assert_eq!(
            Manifest {
                manifest_version: 0,
                ..back
            },
            old
        );
        // The version leads the file; the keys of version 0 keep their names.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\n  \"manifest_version\": 1,"), "{text}");
        assert!(text.contains("\"summary_file\": \"rank0.profiler_out.txt\""));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_newer_manifest_reads_and_a_bad_one_names_its_file() {
        let newer = r#"{"manifest_version": 9, "stepscope_version": "9.0.0", "status": "complete",
            "pid": 1, "worker_name": "w", "trace_file": "w.trace.json.gz", "new_key": [1]}"#;
        let m = Manifest::from_slice(newer.as_bytes(), Path::new("n")).unwrap();
        assert_eq!((m.manifest_version, m.status), (9, Status::Complete));
        let minimal = r#"{"status": "writing", "pid": 7}"#;
        let m = Manifest::from_slice(minimal.as_bytes(), Path::new("m")).unwrap();
        assert_eq!(
            (m.status, m.pid, m.trace_file.as_str()),
            (Status::Writing, 7, "")
        );
        let e = Manifest::from_slice(b"{\"status\": \"done\"}", Path::new("/d/x.stepscope.json"))
            .unwrap_err();
        assert!(e.to_string().contains("/d/x.stepscope.json"), "{e}");
        assert!(e.to_string().contains("not a stepscope manifest"), "{e}");
    }

    #[test]
    fn a_trace_and_manifest_renamed_together_stay_a_pair() {
        let dir = std::env::temp_dir().join(format!("stepscope-pair-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = Manifest {
            status: Status::Complete,
            trace_file: "rank0.17.pt.trace.json.gz".into(),
            ..Manifest::default()
        };
        // In place.
        let at = dir.join("rank0.17.stepscope.json");
        std::fs::write(dir.join(&m.trace_file), b"x").unwrap();
        assert_eq!(m.trace_path(&at).unwrap(), dir.join(&m.trace_file));
        // Both renamed with a prefix, as verl's relocation does.
        std::fs::rename(
            dir.join(&m.trace_file),
            dir.join("replica0_rank0.17.pt.trace.json.gz"),
        )
        .unwrap();
        let moved = dir.join("replica0_rank0.17.stepscope.json");
        assert_eq!(
            m.trace_path(&moved).unwrap(),
            dir.join("replica0_rank0.17.pt.trace.json.gz")
        );
        // The manifest alone: an error naming it and both names the trace could have.
        assert_eq!(
            renamed_trace("a_b_run.1", "run.1.json.gz").as_deref(),
            Some("a_b_run.1.json.gz")
        );
        assert_eq!(
            renamed_trace("new", "w.5.trace.json.gz").as_deref(),
            Some("new.trace.json.gz")
        );
        assert_eq!(renamed_trace("new", "w.5.json.gz"), None);
        let e = m
            .trace_path(&dir.join("other_rank0.17.stepscope.json"))
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("other_rank0.17.stepscope.json")
                && text.contains("rank0.17.pt.trace.json.gz")
                && text.contains("other_rank0.17.pt.trace.json.gz"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_names() {
        assert_eq!(manifest_name("w.5"), "w.5.stepscope.json");
        assert!(is_manifest_name("w.5.stepscope.json"));
        assert!(!is_manifest_name(".w.5.stepscope.json.7.partial"));
        assert!(!is_manifest_name(".w.5.stepscope.json"));
        assert!(!is_manifest_name("w.5.pt.trace.json.gz"));
        assert_eq!(
            trace_names("w", 5, None, true),
            ("w.5".into(), "w.5.pt.trace.json.gz".into())
        );
        assert_eq!(
            trace_names("w", 5, Some("p-TP-0"), false),
            ("p-TP-0".into(), "p-TP-0.trace.json".into())
        );
    }
}
