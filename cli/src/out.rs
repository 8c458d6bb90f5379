//! The command's standard output and error: every command writes its results through here.
//! `println!` panics when the output cannot be written; here a reader that stops reading
//! (`stepscope analyze … | head -1`) is no failure of the command's: what is left to print is
//! dropped, and the command finishes and exits with the status of what it did (a `ctl stop
//! --wait` still waits for its traces). Any other failed write is an error naming stdout.
//!
//! Its messages (progress, warnings, errors) go to standard error through [`message`]
//! (`errln!`), which `eprintln!` would make a panic, exit 101, where that reader has gone
//! (`stepscope analyze … 2>&1 | head -1`): a message that cannot be written is dropped, as
//! there is nowhere left to say so, and the exit status still says how the command ended.

use std::fmt;
use std::io::{BufWriter, ErrorKind, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::Error;

/// Standard output's reader has closed it.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether standard output's reader has closed it (a command that would keep printing, as
/// `ctl top` does, stops there).
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Writes what `write` writes to standard output, unless its reader has gone.
fn write_out(
    write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>,
) -> Result<(), Error> {
    if closed() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    match write(&mut out).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => {
            CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(Error::Write {
            path: PathBuf::from("<stdout>"),
            message: e.to_string(),
        }),
    }
}

/// Writes `text` to standard output as it is (no newline added).
pub fn text(text: fmt::Arguments<'_>) -> Result<(), Error> {
    write_out(|out| out.write_fmt(text))
}

/// Writes `text` and a newline to standard output.
pub fn line(text: fmt::Arguments<'_>) -> Result<(), Error> {
    write_out(|out| out.write_fmt(text).and_then(|()| out.write_all(b"\n")))
}

/// Writes `value` as one line of JSON to standard output, or pretty-printed: serialized
/// straight into a 64 KiB buffer, written in few large writes (through `Display` and stdout's
/// line buffer, a formatter call per token and a write per KiB).
pub fn json(value: &impl serde::Serialize, pretty: bool) -> Result<(), Error> {
    write_out(|out| {
        let mut out = BufWriter::with_capacity(64 << 10, out);
        if pretty {
            serde_json::to_writer_pretty(&mut out, value)?;
        } else {
            serde_json::to_writer(&mut out, value)?;
        }
        out.write_all(b"\n")?;
        out.flush()
    })
}

/// Writes `text` and a newline to standard error, dropped where it cannot be written (see the
/// module docs).
pub fn message(text: fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(text).and_then(|()| err.write_all(b"\n"));
}

/// `eprintln!` to standard error, as [`message`]: never fails, never panics.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::message(format_args!($($arg)*))
    };
}

/// `println!` to standard output, as [`line`]: `Err` when it cannot be written.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

/// `print!` to standard output, as [`text`]: `Err` when it cannot be written.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::text(format_args!($($arg)*))
    };
}
