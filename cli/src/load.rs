//! The traces a reading command (`analyze`, `report`) takes: files and directories, each trace
//! summarized from its manifest when a worker wrote one with a summary, else read.
//!
//! A directory of a fleet's capture holds, per worker and capture, the trace and its manifest
//! (`{stem}.stepscope.json`), whose `summary` the worker computed as it wrote the trace. Reading
//! those kilobytes instead of the traces' gigabytes is the default; `--from-traces` reads the
//! traces. Traces are read several at a time, as many as the cores and a memory budget allow.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Deserialize;

use crate::analyze::{self, Summary, TraceReport};
use crate::error::Error;
use crate::flags::Inputs;
use crate::trace::{self, TraceError, MANIFEST_SUFFIX};

/// What was loaded: reports in file order, and the inputs that could not be read.
pub struct Loaded {
    /// One per trace.
    pub reports: Vec<TraceReport>,
    /// Each trace that could not be read, with why.
    pub errors: Vec<TraceError>,
    /// How many reports came from manifests.
    pub from_manifests: usize,
}

/// Memory the traces being read at once may take together.
const MEMORY_BUDGET: u64 = 192 << 20;

/// Memory one trace's reading takes: buffers (about 6 MiB: the gunzip thread's chunks and the
/// parser's window), plus what the summary keeps, which grows with the events: measured at
/// under 4 bytes per byte of gzip input on the bench traces (`scripts/bench_read.py`).
fn reading_cost(path: &Path) -> u64 {
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let gz = path.extension().is_some_and(|e| e == "gz");
    (8 << 20) + if gz { size * 4 } else { size / 2 }
}

/// The fields of a manifest that a report needs.
#[derive(Deserialize)]
struct ManifestHead {
    status: String,
    trace_file: String,
    #[serde(default)]
    summary: Option<Summary>,
}

/// The reports of a directory's manifests that hold a summary of a complete trace; the trace
/// files they cover.
fn from_manifests(dir: &Path, top: usize) -> (Vec<TraceReport>, HashSet<PathBuf>) {
    let mut reports = Vec::new();
    let mut covered = HashSet::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (reports, covered);
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || !name.ends_with(MANIFEST_SUFFIX) {
            continue;
        }
        // A manifest that cannot be read or has no summary is passed over: its trace is read.
        let head: Option<ManifestHead> = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        let Some(ManifestHead {
            status,
            trace_file,
            summary: Some(mut summary),
        }) = head
        else {
            continue;
        };
        if status != "complete" {
            continue;
        }
        if top > 0 {
            summary.kernels.by_name.truncate(top);
            summary.cpu_ops.truncate(top);
        }
        let file = dir.join(&trace_file);
        reports.push(TraceReport::from_manifest(&file, summary));
        covered.insert(file);
    }
    (reports, covered)
}

/// Loads the inputs; errors are kept per file so a directory's good traces still count. An
/// input that names nothing readable (a missing file, an empty directory) is an error.
pub fn load(inputs: &Inputs, top: usize) -> Result<Loaded, Error> {
    let mut reports = Vec::new();
    let mut files = Vec::new();
    // The order of the output: the inputs' order, a directory's traces by name.
    let mut order: Vec<String> = Vec::new();
    for path in &inputs.paths {
        if !path.is_dir() || inputs.from_traces {
            let found = trace::expand(std::slice::from_ref(path))?;
            order.extend(found.iter().map(|f| f.display().to_string()));
            files.extend(found);
            continue;
        }
        let (summarized, covered) = from_manifests(path, top);
        let mut here: Vec<String> = summarized.iter().map(|r| r.file.clone()).collect();
        match trace::expand(std::slice::from_ref(path)) {
            Ok(found) => {
                let unread = found.into_iter().filter(|f| !covered.contains(f));
                for f in unread {
                    here.push(f.display().to_string());
                    files.push(f);
                }
            }
            Err(e) if summarized.is_empty() => return Err(e.into()),
            Err(_) => {}
        }
        here.sort();
        order.extend(here);
        reports.extend(summarized);
    }
    let from_manifests = reports.len();
    if from_manifests > 0 {
        eprintln!(
            "stepscope: {from_manifests} trace(s) summarized from their manifests \
             (--from-traces reads the traces)"
        );
    }

    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let show_progress = std::io::stderr().is_terminal() && bytes > 20 << 20;
    if show_progress {
        eprintln!(
            "stepscope: reading {} trace(s), {:.0} MB on disk…",
            files.len(),
            bytes as f64 / 1e6
        );
    }
    let started = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let widest = files.iter().map(|f| reading_cost(f)).max().unwrap_or(1);
    let threads = cores.min((MEMORY_BUDGET / widest.max(1)).max(1) as usize);
    let mut errors = Vec::new();
    for r in analyze::analyze_all(&files, top, threads) {
        match r {
            Ok(r) => reports.push(r),
            Err(e) => {
                eprintln!("stepscope: error: {e}");
                errors.push(e);
            }
        }
    }
    if show_progress {
        eprintln!(
            "stepscope: done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let position: std::collections::HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, f)| (f.as_str(), i))
        .collect();
    reports.sort_by_key(|r| position.get(r.file.as_str()).copied().unwrap_or(usize::MAX));
    Ok(Loaded {
        reports,
        errors,
        from_manifests,
    })
}
