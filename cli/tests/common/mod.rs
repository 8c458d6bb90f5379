//! What the CLI's integration tests share: the bundled traces, running the command, reading a
//! trace's raw JSON (independently of the tool).

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hta");

/// A bundled trace.
pub fn data(name: &str) -> PathBuf {
    Path::new(DATA).join(name)
}

/// Runs `stepscope ARGS`.
pub fn stepscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepscope"))
        .args(args)
        .output()
        .expect("run stepscope")
}

/// A trace's JSON, read whole with serde_json (gzip or not).
pub fn raw(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap();
    let mut text = String::new();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .unwrap();
    } else {
        text = String::from_utf8(bytes).unwrap();
    }
    serde_json::from_str(&text).unwrap()
}
