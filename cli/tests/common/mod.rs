//! What the CLI's integration tests share: the bundled traces, running the command, reading a
//! trace's raw JSON (independently of the tool).

#![allow(dead_code)]

pub mod server;

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

pub fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new("which")
            .arg(c)
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c.to_string();
        }
    }
    panic!("no Chromium found: `make test` installs Debian's chromium");
}

/// Loads a page in headless Chromium; returns (DOM after scripts ran, console errors).
pub fn render_in_chromium(page: &Path, profile: &Path) -> (String, Vec<String>) {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let console: Vec<String> = stderr
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}
