//! The one error type of the command, and the exit codes, decided here and nowhere else.
//!
//! - 0: everything asked for was done;
//! - 1: some of it was (a directory's good traces analyzed, some workers answered): the
//!   commands return that as `Ok(ExitCode)`, after reporting each failure;
//! - 2: nothing was done — an [`Error`].

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::trace::TraceError;

/// Why a command did nothing.
#[derive(Debug)]
pub enum Error {
    /// Bad flags or targets (`ctl`: a URL, the router's worker list).
    Usage(String),
    /// An input that could not be read.
    Trace(TraceError),
    /// An output that could not be written.
    Write {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Inputs that all failed: each was reported as it failed.
    NothingRead,
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(2)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) => f.write_str(m),
            Error::Trace(e) => e.fmt(f),
            Error::Write { path, message } => {
                write!(f, "{}: cannot write: {message}", path.display())
            }
            Error::NothingRead => f.write_str("no trace could be read"),
        }
    }
}

impl std::error::Error for Error {}

impl From<TraceError> for Error {
    fn from(e: TraceError) -> Self {
        Error::Trace(e)
    }
}

/// 0 when nothing failed, 1 when some did.
pub fn partial(failed: bool) -> ExitCode {
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
