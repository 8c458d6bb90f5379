//! `stepscope merge`: one Perfetto/Chrome-loadable trace of all ranks.
//!
//! Ranks are read one at a time and their events written out as they are parsed, so memory
//! stays bounded by one rank's trace. Each rank's processes get fresh pids (ranks reuse pids:
//! GPU 0 is pid 0 everywhere), a `rank R | …` process name and a sort index that orders them by
//! rank; flow ids are made unique per rank so arrows never join two ranks.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::trace::{self, TraceError};

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
    let mut first = true;
    let mut written = 0u64;
    let mut ranks = Vec::new();
    let mut emit = |w: &mut dyn Write, v: &Value| -> Result<(), TraceError> {
        if !first {
            w.write_all(b",\n").map_err(|e| io_err(out, e))?;
        }
        first = false;
        serde_json::to_writer(&mut *w, v).map_err(|e| io_err(out, e.into()))?;
        written += 1;
        Ok(())
    };

    for (index, (name_rank, path)) in files.iter().enumerate() {
        let bytes = trace::read(path)?;
        // The rank: distributedInfo (which may follow traceEvents) needs a first pass over
        // the metadata only; the file name is the fallback, then the input's position.
        let meta = trace::for_each_event(path, &bytes, |_: serde::de::IgnoredAny| ())?;
        let rank = meta.rank.or(*name_rank).unwrap_or(index as i64);
        let base = (index as i64 + 1) * 100_000;
        let flow_offset = (index as u64 + 1) << 40;
        let mut pids: HashMap<String, i64> = HashMap::new();
        let mut named: Vec<i64> = Vec::new();
        let mut sorted: Vec<i64> = Vec::new();
        let mut count = 0u64;
        let mut failure: Option<TraceError> = None;
        trace::for_each_event(path, &bytes, |raw: &RawValue| {
            if failure.is_some() {
                return;
            }
            count += 1;
            let mut ev: Map<String, Value> = match serde_json::from_str(raw.get()) {
                Ok(Value::Object(m)) => m,
                _ => return, // not an object: nothing a viewer could show
            };
            if ev.contains_key("pid") {
                let n = pids.len() as i64;
                let new_pid = *pids.entry(pid_key(ev.get("pid"))).or_insert(base + n);
                ev.insert("pid".into(), json!(new_pid));
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
                            named.push(new_pid);
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
                            sorted.push(new_pid);
                        }
                        _ => {}
                    }
                }
            }
            if matches!(ev.get("ph").and_then(Value::as_str), Some("s" | "f" | "t")) {
                match ev.get("id") {
                    Some(Value::Number(n)) if n.is_u64() => {
                        let id = n.as_u64().unwrap_or(0);
                        ev.insert("id".into(), json!(id.wrapping_add(flow_offset)));
                    }
                    Some(Value::Number(n)) => {
                        ev.insert("id".into(), json!(format!("r{rank}:{n}")));
                    }
                    Some(Value::String(s)) => {
                        let s = format!("r{rank}:{s}");
                        ev.insert("id".into(), json!(s));
                    }
                    _ => {}
                }
            }
            if let Err(e) = emit(&mut w, &Value::Object(ev)) {
                failure = Some(e);
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        // Label and order the processes that the rank's own metadata left out.
        let mut own: Vec<(&String, &i64)> = pids.iter().collect();
        own.sort_by_key(|(_, p)| **p);
        for (orig, pid) in own {
            if !named.contains(pid) {
                emit(
                    &mut w,
                    &json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": format!("rank {rank} | pid {orig}")}}),
                )?;
            }
            if !sorted.contains(pid) {
                emit(
                    &mut w,
                    &json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                            "args": {"sort_index": rank * 1000 + (pid - base).min(999)}}),
                )?;
            }
        }
        progress(path, rank, count);
        ranks.push((rank, path.clone(), count));
    }
    let summary: Vec<Value> = ranks
        .iter()
        .map(|(r, f, n)| json!({"rank": r, "file": f.display().to_string(), "events": n}))
        .collect();
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
