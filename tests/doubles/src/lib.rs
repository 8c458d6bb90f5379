//! Paths of the C test doubles this crate builds (see build.rs), a reader for their log, and the
//! scratch directories the workspace's tests write into, and a JSON comparison for figures read
//! back from files.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// Directory holding the stub `libcuda.so` and `libcuda.so.1`: put it on `LD_LIBRARY_PATH`.
pub const CUDA_STUB_DIR: &str = concat!(env!("OUT_DIR"), "/cuda");

/// The NVTX injection library: set `NVTX_INJECTION64_PATH` to it.
pub const NVTX_RECORDER: &str = concat!(env!("OUT_DIR"), "/libnvtx_recorder.so");

/// The environment variable naming the log file both doubles append to.
pub const LOG_ENV: &str = "STEPSCOPE_DOUBLES_LOG";

/// One line of the doubles' log: `source`, thread id, then the event's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `cuda` or `nvtx`.
    pub source: String,
    /// The OS thread id of the caller.
    pub tid: u64,
    /// The event's fields: the call or event name first.
    pub fields: Vec<String>,
}

impl Event {
    /// The call or event name (`cuProfilerStart`, `push`, …).
    pub fn name(&self) -> &str {
        self.fields.first().map(String::as_str).unwrap_or("")
    }

    /// Field `i` after the name, or "" when absent.
    pub fn arg(&self, i: usize) -> &str {
        self.fields.get(i + 1).map(String::as_str).unwrap_or("")
    }
}

/// Reads the log; a missing file is an empty log.
pub fn read_log(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split('\t');
            let source = parts.next()?.to_string();
            let tid = parts.next()?.parse().ok()?;
            Some(Event {
                source,
                tid,
                fields: parts.map(str::to_string).collect(),
            })
        })
        .collect()
}

/// A fresh log path under the system temp dir, unique to this process and `tag`.
pub fn log_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "stepscope-doubles-{}-{tag}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

/// A directory under the system temp dir, unique to this process and `tag`, removed when
/// dropped; kept when the test panics, so a failure can be looked at.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// The path, emptied, not created (for tests where the backend creates it).
    pub fn absent(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("stepscope-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Scratch(p)
    }

    /// The path, created empty.
    pub fn empty(tag: &str) -> Scratch {
        let s = Scratch::absent(tag);
        std::fs::create_dir_all(&s.0).expect("create a scratch directory");
        s
    }
}

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Whether two JSON documents are equal, numbers to 1e-12 relative: a reader of JSON may round
/// the last bit of a float (serde_json's default parser does).
pub fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}
