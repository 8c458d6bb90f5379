//! `stepscope wait DIR`: waits until every trace under a directory is written, for flows that
//! end a capture by `max_iterations` (or an engine whose stop answers before the write, such as
//! SGLang's) and then list the directory.
//!
//! It reads the manifests (`{stem}.stepscope.json`) under the directory and its
//! subdirectories: `writing` means a worker is still writing that trace; `complete`, `failed`
//! and `unfinished` are final. It returns once none is `writing` and at least `--expect` of
//! them exist (a manifest appears when its worker's writer takes the capture, a moment after
//! the stop).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use stepscope_format::manifest::{is_manifest_name, Manifest, Status};

use crate::error::{partial, Error};
use crate::flags::WaitArgs;

/// How deep under DIR manifests are looked for (verl writes one directory per replica).
const MAX_DEPTH: usize = 4;

/// One manifest and what it says.
struct Seen {
    manifest: PathBuf,
    status: Result<Status, String>,
    trace: Result<PathBuf, String>,
    error: Option<String>,
}

fn manifests_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && !name.starts_with('.') && depth < MAX_DEPTH {
            manifests_under(&path, depth + 1, out);
        } else if !is_dir && is_manifest_name(name) {
            out.push(path);
        }
    }
}

fn look(dir: &Path) -> Vec<Seen> {
    let mut paths = Vec::new();
    manifests_under(dir, 0, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|manifest| match Manifest::read(&manifest) {
            Ok(m) => Seen {
                trace: m.trace_path(&manifest).map_err(|e| e.to_string()),
                status: Ok(m.status),
                error: m.error.clone(),
                manifest,
            },
            // Unreadable: not final (a manifest is written whole, so this is another file
            // with the suffix, or a disk error): reported as it stands at the end.
            Err(e) => Seen {
                status: Err(e.to_string()),
                trace: Err(String::new()),
                error: None,
                manifest,
            },
        })
        .collect()
}

fn writing(seen: &[Seen]) -> usize {
    seen.iter()
        .filter(|s| matches!(s.status, Ok(Status::Writing)))
        .count()
}

/// `stepscope wait`.
pub fn command(a: &WaitArgs) -> Result<ExitCode, Error> {
    if !a.dir.is_dir() {
        return Err(Error::Usage(format!(
            "{}: not a directory (the torch_profiler_dir or output_dir the traces are written to)",
            a.dir.display()
        )));
    }
    let began = Instant::now();
    let limit = Duration::from_secs_f64(a.timeout);
    let mut last_said = None::<(usize, usize)>;
    let seen = loop {
        let seen = look(&a.dir);
        let pending = writing(&seen);
        let ready = pending == 0 && seen.len() >= a.expect;
        if ready || began.elapsed() >= limit {
            break seen;
        }
        // A line when what is awaited changes (never one per poll).
        if last_said != Some((seen.len(), pending)) && !a.quiet {
            crate::errln!(
                "stepscope: waiting: {} trace(s) under {}, {pending} still being written{}",
                seen.len(),
                a.dir.display(),
                if seen.len() < a.expect {
                    format!(" (expecting {})", a.expect)
                } else {
                    String::new()
                }
            );
            last_said = Some((seen.len(), pending));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut failed = 0;
    for s in &seen {
        let (word, detail) = match (&s.status, &s.trace) {
            (Ok(Status::Complete), Ok(t)) => ("complete", t.display().to_string()),
            (Ok(Status::Complete), Err(e)) => ("missing", e.clone()),
            (Ok(Status::Writing), _) => (
                "writing",
                format!("still being written after {:.0} s (--timeout)", a.timeout),
            ),
            (Ok(status), _) => (
                status.as_str(),
                s.error.clone().unwrap_or_else(|| "no reason given".into()),
            ),
            (Err(e), _) => ("unreadable", e.clone()),
        };
        if word != "complete" {
            failed += 1;
        }
        crate::outln!("{word:<10} {}  {detail}", s.manifest.display())?;
    }
    if seen.len() < a.expect {
        crate::errln!(
            "stepscope: {} manifest(s) under {} after {:.0} s, fewer than the {} expected",
            seen.len(),
            a.dir.display(),
            began.elapsed().as_secs_f64(),
            a.expect
        );
        return Ok(partial(true));
    }
    if failed > 0 {
        crate::errln!(
            "stepscope: {failed} of {} trace(s) under {} are not complete",
            seen.len(),
            a.dir.display()
        );
    } else {
        crate::errln!(
            "stepscope: {} trace(s) under {} complete ({:.2} s)",
            seen.len(),
            a.dir.display(),
            began.elapsed().as_secs_f64()
        );
    }
    Ok(partial(failed > 0))
}
