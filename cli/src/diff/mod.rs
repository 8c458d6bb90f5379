//! `stepscope diff BEFORE AFTER`: what changed between two runs, group of like steps by group
//! (stage, requests, tokens), down to the kernels and CPU operators of each group's steps.
//!
//! Each side is a trace, a directory of one run's traces (its ranks or captures), or a
//! manifest. Traces are streamed as `analyze` streams them, both sides at once, keeping per
//! trace its summary and, per step, a row per name that step ran ([`Breakdown`]): memory grows
//! with steps × names, not with events' bytes. A manifest's summary holds each step's time and
//! the capture's device totals but not what each step ran: with `--steps-only`, manifests are
//! read instead of traces where they have a summary, and names are not compared.
//!
//! [`Breakdown`]: stepscope_format::trace::Breakdown

pub mod compare;
pub mod html;
pub mod names;
pub mod noise;
pub mod render;
pub mod shape;
pub mod why;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use stepscope_format::manifest::{is_manifest_name, Manifest, Status};
use stepscope_format::trace::Summarizer;

use crate::error::Error;
use crate::flags::DiffArgs;
use crate::trace::{self, TraceError};
use compare::{Capture, Settings};

/// Where a capture is read from.
enum Source {
    Trace(PathBuf),
    /// A manifest's summary (of the trace it names).
    Manifest(PathBuf, Box<Capture>),
}

/// The captures one side's input names, in file order.
fn sources(input: &Path, steps_only: bool) -> Result<Vec<Source>, Error> {
    let manifest_of = |path: &Path| -> Result<Option<Source>, TraceError> {
        let manifest = Manifest::read(path).map_err(|e| TraceError {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if manifest.status != Status::Complete {
            return Ok(None);
        }
        let trace = manifest.trace_path(path).ok();
        match (manifest.summary, trace) {
            (Some(summary), t) if steps_only || t.is_none() => {
                let file = t.unwrap_or_else(|| path.with_file_name(&manifest.trace_file));
                let rank = summary.rank.or_else(|| trace::rank_from_name(&file));
                Ok(Some(Source::Manifest(
                    file,
                    Box::new(Capture {
                        rank,
                        summary,
                        breakdown: None,
                    }),
                )))
            }
            (_, Some(t)) => Ok(Some(Source::Trace(t))),
            (_, None) => Err(TraceError {
                path: path.to_path_buf(),
                message: format!(
                    "its trace {} is not beside it, and it holds no summary",
                    manifest.trace_file
                ),
            }),
        }
    };
    let name = input.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !input.is_dir() {
        if is_manifest_name(name) {
            return Ok(manifest_of(input)?.into_iter().collect());
        }
        if !input.exists() {
            return Err(TraceError {
                path: input.to_path_buf(),
                message: "no such file or directory".into(),
            }
            .into());
        }
        return Ok(vec![Source::Trace(input.to_path_buf())]);
    }
    let mut out: Vec<Source> = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(input)
        .map_err(|e| TraceError {
            path: input.to_path_buf(),
            message: format!("cannot list directory: {e}"),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    // Manifests first: the traces they stand for are then not read twice.
    let mut described: HashSet<PathBuf> = HashSet::new();
    for path in &entries {
        let n = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !is_manifest_name(n) {
            continue;
        }
        match manifest_of(path) {
            Ok(Some(source)) => {
                described.insert(source_file(&source).to_path_buf());
                out.push(source);
            }
            Ok(None) => {}
            Err(e) => crate::errln!("stepscope: warning: {e} (skipped)"),
        }
    }
    for path in entries {
        if trace::is_trace_file(&path) && !described.contains(&path) {
            out.push(Source::Trace(path));
        }
    }
    if out.is_empty() {
        return Err(TraceError {
            path: input.to_path_buf(),
            message: "directory holds no .json or .json.gz trace, nor a manifest with a summary"
                .into(),
        }
        .into());
    }
    out.sort_by(|a, b| source_file(a).cmp(source_file(b)));
    Ok(out)
}

fn source_file(s: &Source) -> &Path {
    match s {
        Source::Trace(f) | Source::Manifest(f, _) => f,
    }
}

/// Reads a trace with its per-step breakdown.
fn read_capture(path: &Path) -> Result<Capture, TraceError> {
    let mut sink = Summarizer::with_breakdown();
    let meta = trace::read_events_ahead(path, &mut sink)?;
    let (summary, breakdown) = sink.finish_with_breakdown(meta, 0);
    Ok(Capture {
        rank: summary.rank.or_else(|| trace::rank_from_name(path)),
        summary,
        breakdown: Some(breakdown),
    })
}

/// Memory the traces read at once may take together.
const MEMORY_BUDGET: u64 = 160 << 20;

/// The captures of both sides, reading their traces together on as many threads as the cores
/// and the memory budget allow. Errors are per trace.
fn load(before: Vec<Source>, after: Vec<Source>) -> (Vec<Capture>, Vec<Capture>, Vec<TraceError>) {
    let split = before.len();
    let all: Vec<Source> = before.into_iter().chain(after).collect();
    let files: Vec<&Path> = all
        .iter()
        .filter_map(|s| match s {
            Source::Trace(f) => Some(f.as_path()),
            Source::Manifest(..) => None,
        })
        .collect();
    let mut read = crate::load::read_files(&files, MEMORY_BUDGET, read_capture).into_iter();
    let (mut b, mut a, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for (i, source) in all.into_iter().enumerate() {
        let capture = match source {
            Source::Manifest(_, c) => Ok(*c),
            Source::Trace(f) => read.next().unwrap_or_else(|| {
                Err(TraceError {
                    path: f,
                    message: "internal error: not read".into(),
                })
            }),
        };
        match capture {
            Ok(c) if i < split => b.push(c),
            Ok(c) => a.push(c),
            Err(e) => {
                crate::errln!("stepscope: error: {e}");
                errors.push(e);
            }
        }
    }
    (b, a, errors)
}

/// `stepscope diff`.
pub fn command(d: &DiffArgs) -> Result<std::process::ExitCode, Error> {
    if !(0.0..1.0).contains(&d.alpha) || d.alpha == 0.0 {
        return Err(Error::Usage(format!(
            "--alpha {} is not a level between 0 and 1",
            d.alpha
        )));
    }
    let settings = Settings {
        alpha: d.alpha,
        min_change: d.min_change / 100.0,
        min_steps: d.min_steps.max(2),
        normalize_names: !d.exact_names,
    };
    let before = sources(&d.before, d.steps_only)?;
    let after = sources(&d.after, d.steps_only)?;
    let (mut before, mut after, errors) = load(before, after);
    crate::floor::apply(
        before
            .iter_mut()
            .chain(after.iter_mut())
            .map(|c| &mut c.summary),
        &d.floor,
    )?;
    for (side, captures, input) in [("BEFORE", &before, &d.before), ("AFTER", &after, &d.after)] {
        if captures.is_empty() {
            crate::errln!(
                "stepscope: error: nothing could be read for {side} ({})",
                input.display()
            );
            return Err(Error::NothingRead);
        }
    }
    let report = compare::compare(
        (&d.before.display().to_string(), &before),
        (&d.after.display().to_string(), &after),
        settings,
        d.top,
    );
    if let Some(path) = &d.html {
        let page = html::render(&report, &errors);
        std::fs::write(path, page).map_err(|e| Error::Write {
            path: path.clone(),
            message: e.to_string(),
        })?;
        crate::errln!("stepscope: wrote {}", path.display());
    }
    if d.json {
        let errs: Vec<serde_json::Value> = errors
            .iter()
            .map(|e| serde_json::json!({"file": e.path.display().to_string(), "error": e.message}))
            .collect();
        let mut doc = serde_json::to_value(&report).unwrap_or_default();
        if let Some(o) = doc.as_object_mut() {
            o.insert("errors".into(), errs.into());
        }
        crate::out::json(&doc, false)?;
    } else {
        crate::out!("{}", render::render(&report))?;
    }
    Ok(crate::error::partial(!errors.is_empty()))
}
