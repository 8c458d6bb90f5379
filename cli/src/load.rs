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

use stepscope_format::manifest::{is_manifest_name, Manifest, Status};

use crate::error::Error;
use crate::flags::Inputs;
use crate::par::par_map;
use crate::trace::{self, TraceError};
use crate::trace_report::{analyze_file, TraceReport};

/// What was loaded: reports in the inputs' order (a directory's by file name), and the
/// traces that could not be read.
pub struct Loaded {
    /// One per trace.
    pub reports: Vec<TraceReport>,
    /// Each trace that could not be read, with why.
    pub errors: Vec<TraceError>,
}

/// A trace in the output's order: summarized from its manifest, or to read.
enum Slot {
    Summarized(Box<TraceReport>),
    Unread(PathBuf),
    /// A complete manifest whose trace is not beside it.
    Missing(TraceError),
}

impl Slot {
    fn file(&self) -> &Path {
        match self {
            Slot::Summarized(r) => Path::new(&r.file),
            Slot::Unread(f) => f,
            Slot::Missing(e) => &e.path,
        }
    }
}

/// Memory the traces being read at once may take together.
pub(crate) const MEMORY_BUDGET: u64 = 192 << 20;

/// Memory one trace's reading takes, estimated: buffers (under 3 MiB: the gunzipped chunks of
/// 144 KiB in flight, a dozen where a large trace is scanned ahead of its summary, with the
/// events scanned from them; the parser's window when an event outgrows a chunk's room; 8 MiB
/// allowed), plus what the summary keeps, which grows with the events. On the 35 MB bench
/// trace (1.8 MB of gzip) the whole process peaked at 8.7 MB of RSS (`scripts/bench_read.py`),
/// 10.8 MB scanned ahead (`/usr/bin/time`): the allowance of 4 bytes per byte of gzip is above
/// that.
fn reading_cost(path: &Path) -> u64 {
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let gz = path.extension().is_some_and(|e| e == "gz");
    (8 << 20) + if gz { size * 4 } else { size / 2 }
}

/// What a directory's manifests give: the reports of those that hold a summary of a complete
/// trace, and an error for each complete one whose trace is not beside it.
#[derive(Default)]
struct FromManifests {
    reports: Vec<TraceReport>,
    missing: Vec<TraceError>,
}

/// Reads a directory's manifests. A trace and manifest another tool renamed together stay a
/// pair ([`Manifest::trace_path`]).
fn from_manifests(dir: &Path, top: usize) -> FromManifests {
    let mut found = FromManifests::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_manifest_name(name) {
            continue;
        }
        // A manifest that cannot be read or of a trace not complete is passed over (its trace,
        // if any, is read as a trace).
        let Ok(manifest) = Manifest::read(&path) else {
            continue;
        };
        if manifest.status != Status::Complete {
            continue;
        }
        // A trace not beside its manifest is an error naming both; the summary the manifest
        // holds is still reported, under the name the trace was written with.
        let file = match manifest.trace_path(&path) {
            Ok(file) => file,
            Err(e) => {
                found.missing.push(TraceError {
                    path: path.clone(),
                    message: e.to_string(),
                });
                dir.join(&manifest.trace_file)
            }
        };
        // Without a summary its trace is read.
        if let Some(mut summary) = manifest.summary {
            summary.keep_top(top);
            found
                .reports
                .push(TraceReport::from_manifest(&file, summary));
        }
    }
    found
}

/// The inputs' traces in the output's order. An input that names nothing readable (a missing
/// file, an empty directory) is an error.
fn slots(inputs: &Inputs, top: usize) -> Result<Vec<Slot>, Error> {
    let mut slots = Vec::new();
    for path in &inputs.paths {
        if !path.is_dir() || inputs.from_traces {
            let found = trace::expand(std::slice::from_ref(path))?;
            slots.extend(found.into_iter().map(Slot::Unread));
            continue;
        }
        let FromManifests { reports, missing } = from_manifests(path, top);
        let summarized: HashSet<PathBuf> = reports.iter().map(|r| PathBuf::from(&r.file)).collect();
        let nothing_found = reports.is_empty() && missing.is_empty();
        let mut here: Vec<Slot> = reports
            .into_iter()
            .map(|r| Slot::Summarized(Box::new(r)))
            .chain(missing.into_iter().map(Slot::Missing))
            .collect();
        match trace::expand(std::slice::from_ref(path)) {
            Ok(found) => here.extend(
                found
                    .into_iter()
                    .filter(|f| !summarized.contains(f))
                    .map(Slot::Unread),
            ),
            Err(e) if nothing_found => return Err(e.into()),
            Err(_) => {}
        }
        here.sort_by(|a, b| a.file().cmp(b.file()));
        slots.extend(here);
    }
    Ok(slots)
}

/// Reads `files` with `read`, in their order, on as many threads as the cores and `budget`
/// (bytes for the traces read at once, each costing [`reading_cost`]) allow; on a terminal,
/// says so when they are large. A read that panics ends the command, as on one thread
/// ([`par_map`] re-raises it); the error naming the file for an empty slot is a guard only.
pub(crate) fn read_files<P: AsRef<Path> + Sync, R: Send>(
    files: &[P],
    budget: u64,
    read: impl Fn(&Path) -> Result<R, TraceError> + Sync,
) -> Vec<Result<R, TraceError>> {
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let show_progress = std::io::stderr().is_terminal() && bytes > 20 << 20;
    if show_progress {
        crate::errln!(
            "stepscope: reading {} trace(s), {:.0} MB on disk…",
            files.len(),
            bytes as f64 / 1e6
        );
    }
    let started = Instant::now();
    // One file is read on this thread: no cores to count (a dozen system calls reading
    // cgroup files).
    let threads = if files.len() > 1 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let widest = files
            .iter()
            .map(|f| reading_cost(f.as_ref()))
            .max()
            .unwrap_or(1);
        cores.min((budget / widest.max(1)).max(1) as usize)
    } else {
        1
    };
    let out: Vec<Result<R, TraceError>> = par_map(files, threads, |f| read(f.as_ref()))
        .into_iter()
        .zip(files)
        .map(|(r, f)| {
            r.unwrap_or_else(|| {
                Err(TraceError {
                    path: f.as_ref().to_path_buf(),
                    message: "internal error: its reading stopped (a thread panicked)".into(),
                })
            })
        })
        .collect();
    if show_progress {
        crate::errln!(
            "stepscope: done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    out
}

/// Loads the inputs; errors are kept per file so a directory's good traces still count.
pub fn load(inputs: &Inputs, top: usize) -> Result<Loaded, Error> {
    let slots = slots(inputs, top)?;
    let files: Vec<PathBuf> = slots
        .iter()
        .filter_map(|s| match s {
            Slot::Unread(f) => Some(f.clone()),
            Slot::Summarized(_) | Slot::Missing(_) => None,
        })
        .collect();
    let from_manifests = slots
        .iter()
        .filter(|s| matches!(s, Slot::Summarized(_)))
        .count();
    if from_manifests > 0 {
        crate::errln!(
            "stepscope: {from_manifests} trace(s) summarized from their manifests \
             (--from-traces reads the traces)"
        );
    }

    let mut read = read_files(&files, MEMORY_BUDGET, |f| analyze_file(f, top)).into_iter();
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    for slot in slots {
        let report = match slot {
            Slot::Summarized(r) => Ok(*r),
            Slot::Missing(e) => Err(e),
            Slot::Unread(f) => read.next().unwrap_or_else(|| {
                Err(TraceError {
                    path: f,
                    message: "internal error: not analyzed".into(),
                })
            }),
        };
        match report {
            Ok(r) => reports.push(r),
            Err(e) => {
                crate::errln!("stepscope: error: {e}");
                errors.push(e);
            }
        }
    }
    Ok(Loaded { reports, errors })
}
