//! `stepscope merge`: one Perfetto/Chrome-loadable trace of all ranks.
//!
//! Ranks are read one at a time, each file once, and their events written out as they are
//! parsed, so memory stays bounded whatever the traces' sizes. Each rank's processes get fresh pids (ranks reuse pids:
//! GPU 0 is pid 0 everywhere), a `rank R | …` process name and a sort index that orders them by
//! rank; flow ids are made unique per rank so arrows never join two ranks.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::trace::{self, EventSink, Meta, RawEvent, TraceError};

/// What was merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// (rank, file, events) per input, in output order.
    pub ranks: Vec<(i64, PathBuf, u64)>,
    /// Events written, metadata added by the merge included.
    pub events_written: u64,
}

fn io_err(path: &Path, e: std::io::Error) -> TraceError {
    TraceError {
        path: path.to_path_buf(),
        message: format!("cannot write: {e}"),
    }
}

/// The output: gzip-compressed or plain.
enum Out {
    Gz(Box<BufWriter<flate2::write::GzEncoder<File>>>),
    Plain(BufWriter<File>),
}

impl Out {
    /// Flushes everything, and writes the gzip trailer.
    fn finish(self) -> std::io::Result<()> {
        match self {
            Out::Gz(w) => w
                .into_inner()
                .map_err(|e| e.into_error())?
                .finish()?
                .sync_all(),
            Out::Plain(w) => w.into_inner().map_err(|e| e.into_error())?.sync_all(),
        }
    }
}

impl Write for Out {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Out::Gz(w) => w.write(buf),
            Out::Plain(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Out::Gz(w) => w.flush(),
            Out::Plain(w) => w.flush(),
        }
    }
}

fn pid_key(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// The output's `traceEvents`, written one event at a time.
struct EventWriter<'p> {
    out: Out,
    path: &'p Path,
    written: u64,
}

impl EventWriter<'_> {
    fn emit(&mut self, v: &Value) -> Result<(), TraceError> {
        if self.written > 0 {
            self.out
                .write_all(b",\n")
                .map_err(|e| io_err(self.path, e))?;
        }
        serde_json::to_writer(&mut self.out, v).map_err(|e| io_err(self.path, e.into()))?;
        self.written += 1;
        Ok(())
    }
}

/// One rank's events on their way out: fresh pids, flow ids made unique, process names and
/// sort indices that carry the rank. Each event is written as it is read, except those that
/// carry the rank while it is not known yet (`distributedInfo` may follow `traceEvents`): they
/// wait in `spooled` (process metadata, string flow ids: a handful) until the file ends.
struct RankSink<'a, 'p> {
    events: &'a mut EventWriter<'p>,
    base: i64,
    flow_offset: u64,
    pids: HashMap<String, i64>,
    /// Processes the rank named (`process_name`) and ordered (`process_sort_index`).
    named: Vec<i64>,
    sorted: Vec<i64>,
    spooled: Vec<Map<String, Value>>,
    count: u64,
    failure: Option<TraceError>,
}

/// An event's rewrite that needs the rank.
fn needs_rank(ev: &Map<String, Value>) -> bool {
    let ph = ev.get("ph").and_then(Value::as_str);
    match ph {
        Some("M") => {
            ev.contains_key("pid")
                && matches!(
                    ev.get("name").and_then(Value::as_str),
                    Some("process_name" | "process_sort_index")
                )
        }
        Some("s" | "f" | "t") => !matches!(ev.get("id"), Some(Value::Number(n)) if n.is_u64()),
        _ => false,
    }
}

impl RankSink<'_, '_> {
    fn write(&mut self, ev: Map<String, Value>) {
        if self.failure.is_none() {
            if let Err(e) = self.events.emit(&Value::Object(ev)) {
                self.failure = Some(e);
            }
        }
    }

    /// The rewrites that need the rank.
    fn with_rank(&mut self, mut ev: Map<String, Value>, rank: i64) -> Map<String, Value> {
        let pid = ev.get("pid").and_then(Value::as_i64).unwrap_or(0);
        if ev.get("ph").and_then(Value::as_str) == Some("M") {
            match ev.get("name").and_then(Value::as_str) {
                Some("process_name") => {
                    let orig = ev
                        .get("args")
                        .and_then(|a| a.get("name"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    ev.insert(
                        "args".into(),
                        json!({"name": format!("rank {rank} | {orig}")}),
                    );
                    self.named.push(pid);
                }
                Some("process_sort_index") => {
                    let orig = ev
                        .get("args")
                        .and_then(|a| a.get("sort_index"))
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    ev.insert(
                        "args".into(),
                        json!({"sort_index": rank * 1000 + orig.clamp(0, 999)}),
                    );
                    self.sorted.push(pid);
                }
                _ => {}
            }
        } else {
            match ev.get("id") {
                Some(Value::Number(n)) if !n.is_u64() => {
                    let id = format!("r{rank}:{n}");
                    ev.insert("id".into(), json!(id));
                }
                Some(Value::String(s)) => {
                    let s = format!("r{rank}:{s}");
                    ev.insert("id".into(), json!(s));
                }
                _ => {}
            }
        }
        ev
    }

    /// Writes what waited for the rank, then names and orders the processes that the rank's
    /// own metadata left out.
    fn finish(&mut self, rank: i64) -> Result<(), TraceError> {
        for ev in std::mem::take(&mut self.spooled) {
            let ev = self.with_rank(ev, rank);
            self.write(ev);
        }
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        let mut own: Vec<(String, i64)> = self.pids.iter().map(|(k, v)| (k.clone(), *v)).collect();
        own.sort_by_key(|(_, p)| *p);
        for (orig, pid) in own {
            if !self.named.contains(&pid) {
                self.events.emit(
                    &json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": format!("rank {rank} | pid {orig}")}}),
                )?;
            }
            if !self.sorted.contains(&pid) {
                self.events.emit(
                    &json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                            "args": {"sort_index": rank * 1000 + (pid - self.base).min(999)}}),
                )?;
            }
        }
        Ok(())
    }
}

impl EventSink for RankSink<'_, '_> {
    type Event<'de> = RawEvent<'de>;

    fn event(&mut self, raw: RawEvent<'_>, meta: &Meta) {
        if self.failure.is_some() {
            return;
        }
        self.count += 1;
        let mut ev: Map<String, Value> = match serde_json::from_str(raw.text()) {
            Ok(Value::Object(m)) => m,
            _ => return, // not an object: nothing a viewer could show
        };
        if ev.contains_key("pid") {
            let n = self.pids.len() as i64;
            let new_pid = *self
                .pids
                .entry(pid_key(ev.get("pid")))
                .or_insert(self.base + n);
            ev.insert("pid".into(), json!(new_pid));
        }
        if matches!(ev.get("ph").and_then(Value::as_str), Some("s" | "f" | "t")) {
            if let Some(id) = ev.get("id").and_then(Value::as_u64) {
                ev.insert("id".into(), json!(id.wrapping_add(self.flow_offset)));
            }
        }
        if needs_rank(&ev) {
            match meta.rank {
                Some(rank) => {
                    let ev = self.with_rank(ev, rank);
                    self.write(ev);
                }
                None => self.spooled.push(ev),
            }
        } else {
            self.write(ev);
        }
    }
}

/// Merges the traces (files or directories of them) into `out` (`.gz`: gzip-compressed).
/// `progress` is told about each rank as it is written.
pub fn merge(
    inputs: &[PathBuf],
    out: &Path,
    mut progress: impl FnMut(&Path, i64, u64),
) -> Result<Merged, TraceError> {
    let files = trace::expand(inputs)?;
    // Order by the rank in the file name where there is one; the sort index orders the rest.
    let mut files: Vec<(Option<i64>, PathBuf)> = files
        .into_iter()
        .map(|f| (trace::rank_from_name(&f), f))
        .collect();
    files.sort_by(|a, b| {
        a.0.unwrap_or(i64::MAX)
            .cmp(&b.0.unwrap_or(i64::MAX))
            .then(a.1.cmp(&b.1))
    });

    let file = File::create(out).map_err(|e| io_err(out, e))?;
    let mut w = if out.extension().is_some_and(|e| e == "gz") {
        Out::Gz(Box::new(BufWriter::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::fast(),
        ))))
    } else {
        Out::Plain(BufWriter::new(file))
    };
    w.write_all(b"{\"traceEvents\":[\n")
        .map_err(|e| io_err(out, e))?;
    let mut events = EventWriter {
        out: w,
        path: out,
        written: 0,
    };
    let mut ranks = Vec::new();

    for (index, (name_rank, path)) in files.iter().enumerate() {
        let mut sink = RankSink {
            events: &mut events,
            base: (index as i64 + 1) * 100_000,
            flow_offset: (index as u64 + 1) << 40,
            pids: HashMap::new(),
            named: Vec::new(),
            sorted: Vec::new(),
            spooled: Vec::new(),
            count: 0,
            failure: None,
        };
        let meta = trace::read_events(path, &mut sink)?;
        if let Some(e) = sink.failure.take() {
            return Err(e);
        }
        let rank = meta.rank.or(*name_rank).unwrap_or(index as i64);
        sink.finish(rank)?;
        progress(path, rank, sink.count);
        ranks.push((rank, path.clone(), sink.count));
    }
    let summary: Vec<Value> = ranks
        .iter()
        .map(|(r, f, n)| json!({"rank": r, "file": f.display().to_string(), "events": n}))
        .collect();
    let EventWriter {
        out: mut w,
        written,
        ..
    } = events;
    write!(
        w,
        "\n],\"displayTimeUnit\":\"ms\",\"stepscope_merged\":{}}}\n",
        Value::Array(summary)
    )
    .map_err(|e| io_err(out, e))?;
    w.finish().map_err(|e| io_err(out, e))?;
    Ok(Merged {
        ranks,
        events_written: written,
    })
}

/// `stepscope merge`: no partial output is left when it fails.
pub fn command(m: &crate::flags::MergeArgs) -> Result<std::process::ExitCode, crate::Error> {
    use std::io::IsTerminal;
    let verbose = std::io::stderr().is_terminal();
    let result = merge(&m.paths, &m.output, |path: &Path, rank, n| {
        if verbose {
            crate::errln!(
                "stepscope: merged rank {rank} ({n} events) from {}",
                path.display()
            );
        }
    });
    match result {
        Ok(done) => {
            crate::outln!(
                "merged {} trace(s), {} events, into {}",
                done.ranks.len(),
                done.events_written,
                m.output.display()
            )?;
            Ok(crate::error::partial(false))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&m.output);
            Err(e.into())
        }
    }
}
