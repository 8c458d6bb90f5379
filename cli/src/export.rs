//! `stepscope export`: a capture's request logs (`*.requests.json`) as OpenTelemetry spans,
//! sent to a collector over OTLP/HTTP (JSON) or written as OTLP JSON lines: the spans the
//! engine plugins export live (one builder, `stepscope_format::requests::request_spans`), for
//! runs that were not connected to a collector.
//!
//! With no engine span to hang them under, each request gets a span of its own
//! (`stepscope.request`). Ids are hashes of the engine process, the log's directory and the
//! request (or step): exporting the same logs again gives the same ids, and a request held by
//! two windows' logs is sent once, from the newest.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use stepscope_format::files::AtomicFile;
use stepscope_format::requests::{
    otlp_json, request_spans, step_spans, RequestsDocument, Span, SpanOptions, SpanParent,
};

use crate::flags::ExportArgs;
use crate::Error;

/// Where the spans go.
enum Sink {
    Collector { url: String, agent: ureq::Agent },
    File { path: PathBuf, out: AtomicFile },
}

impl Sink {
    fn send(&mut self, message: &str) -> Result<(), Error> {
        match self {
            Sink::Collector { url, agent } => {
                let answer = agent
                    .post(url.as_str())
                    .header("Content-Type", "application/json")
                    .send(message.as_bytes())
                    .map_err(|e| Error::Usage(format!("{url}: cannot send the spans: {e}")))?;
                let status = answer.status().as_u16();
                if !(200..300).contains(&status) {
                    let text = answer.into_body().read_to_string().unwrap_or_default();
                    return Err(Error::Usage(format!(
                        "{url}: the collector refused the spans (HTTP {status}): {}",
                        text.chars().take(200).collect::<String>()
                    )));
                }
                Ok(())
            }
            Sink::File { path, out } => out
                .write_all(message.as_bytes())
                .and_then(|()| out.write_all(b"\n"))
                .map_err(|e| Error::Write {
                    path: path.clone(),
                    message: e.to_string(),
                }),
        }
    }

    /// The file whole under its name (nothing of it there on an error before).
    fn finish(self) -> Result<(), Error> {
        if let Sink::File { path, out } = self {
            out.commit().map_err(|e| write_error(&path, &e))?;
        }
        Ok(())
    }
}

/// The output file `path` could not be written: the operating system's words.
fn write_error(path: &Path, e: &stepscope_format::Error) -> Error {
    let message = std::error::Error::source(e).map_or_else(|| e.to_string(), ToString::to_string);
    Error::Write {
        path: path.to_path_buf(),
        message,
    }
}

/// The request logs among `inputs`: each file itself, each directory's `*.requests.json`.
fn logs(inputs: &[PathBuf]) -> Result<Vec<(String, RequestsDocument)>, Error> {
    let mut out = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let found = crate::analyze::request_logs(input);
            if found.is_empty() {
                crate::errln!(
                    "stepscope: {}: no request log (*.requests.json) in it",
                    input.display()
                );
            }
            out.extend(found);
        } else {
            let bytes = std::fs::read(input)
                .map_err(|e| Error::Usage(format!("{}: cannot read: {e}", input.display())))?;
            let doc = serde_json::from_slice::<RequestsDocument>(&bytes).map_err(|e| {
                Error::Usage(format!("{}: not a request log: {e}", input.display()))
            })?;
            out.push((input.display().to_string(), doc));
        }
    }
    Ok(out)
}

/// The ids' salt of an engine process's logs in a directory.
fn salt(pid: u32, file: &str) -> u64 {
    let dir = Path::new(file)
        .parent()
        .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_path_buf()));
    let mut h = DefaultHasher::new();
    pid.hash(&mut h);
    dir.hash(&mut h);
    h.finish()
}

/// `stepscope export`.
pub fn command(a: &ExportArgs) -> Result<std::process::ExitCode, Error> {
    let docs = logs(&a.inputs)?;
    if docs.is_empty() {
        return Err(Error::Usage("no request log to export".into()));
    }
    let mut sink = match (&a.otlp, &a.otlp_json) {
        (Some(url), None) => Sink::Collector {
            url: url.clone(),
            agent: crate::ctl::http::agent(Duration::from_secs_f64(a.timeout), None),
        },
        (None, Some(path)) => Sink::File {
            path: path.clone(),
            out: AtomicFile::create(path).map_err(|e| write_error(path, &e))?,
        },
        _ => {
            return Err(Error::Usage(
                "give one of --otlp URL and --otlp-json FILE".into(),
            ))
        }
    };
    let total: usize = docs
        .iter()
        .map(|(_, d)| d.requests.iter().filter(|r| r.finish.is_some()).count())
        .sum();
    let mut seen: HashSet<(u32, String)> = HashSet::new();
    let mut steps_seen: HashSet<(u32, u64)> = HashSet::new();
    let (mut requests, mut spans_sent, mut messages) = (0usize, 0usize, 0usize);
    let sent = |sink: &mut Sink, spans: &[Span], n: &mut usize| -> Result<(), Error> {
        if spans.is_empty() {
            return Ok(());
        }
        sink.send(&otlp_json(spans, &a.service, env!("CARGO_PKG_VERSION")))?;
        *n += 1;
        Ok(())
    };
    for (file, doc) in &docs {
        let opts = SpanOptions {
            salt: salt(doc.pid, file),
            costliest: a.costliest,
            steps: a.steps,
        };
        let wanted: Vec<(String, Option<SpanParent>)> = doc
            .requests
            .iter()
            .filter(|r| r.finish.is_some() && seen.insert((doc.pid, r.id.clone())))
            .map(|r| (r.id.clone(), None))
            .collect();
        for chunk in wanted.chunks(a.batch as usize) {
            let spans = request_spans(doc, chunk, opts);
            spans_sent += spans.len();
            sent(&mut sink, &spans, &mut messages)?;
            requests += chunk.len();
            crate::errln!("stepscope: export: {requests}/{total} requests ({file})");
        }
        if a.steps {
            let steps: Vec<_> = doc
                .steps
                .iter()
                .filter(|s| steps_seen.insert((doc.pid, s.step)))
                .cloned()
                .collect();
            for chunk in steps.chunks(a.batch as usize * 8) {
                let spans = step_spans(doc.pid, chunk, opts.salt);
                spans_sent += spans.len();
                sent(&mut sink, &spans, &mut messages)?;
            }
        }
    }
    sink.finish()?;
    let to = a
        .otlp
        .clone()
        .or_else(|| a.otlp_json.as_ref().map(|p| p.display().to_string()))
        .unwrap_or_default();
    crate::outln!(
        "exported {requests} requests ({spans_sent} spans, {messages} OTLP messages) from {} \
         request log(s) to {to}",
        docs.len()
    )?;
    Ok(std::process::ExitCode::SUCCESS)
}
