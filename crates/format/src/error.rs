//! The library's one error type.
//!
//! Every failure is a value: a profiler must never take its host engine down. Each variant's
//! `Display` says what went wrong and where (the config field, the file, the backend call), so
//! the text can be shown to a user unchanged — through the C ABI's `stepscope_last_error()`,
//! a Python exception, or a log line.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong in stepscope.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A profiler config field is missing, of the wrong type, or out of range.
    Config {
        /// Dotted path of the offending key, e.g. `delay_iterations` or `stepscope.nvtx`.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
        /// The key is not one stepscope knows (as opposed to a known key with a bad value):
        /// an engine newer than stepscope may pass it (the vLLM plugin drops one at its
        /// default).
        unknown_key: bool,
    },
    /// The config text is not valid JSON, or not a JSON object.
    Json {
        /// Where the text came from: `STEPSCOPE_CONFIG`, a file path, or `config`.
        source: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A file could not be read or written.
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What was being done, with the operating system's message.
        message: String,
        /// The operating system's error ([`std::error::Error::source`]).
        source: IoSource,
    },
    /// A file stepscope reads back (a manifest) is not in its format.
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it, with the parser's line and column.
        message: String,
    },
    /// A trace was not written whole: its serializer wrote a truncated file (a full disk), a
    /// writer thread failed, or no trace came out.
    Write {
        /// The trace file (or the temporary it was being written to).
        path: PathBuf,
        /// What went wrong, with the bytes written and the disk's free space where known.
        message: String,
    },
    /// An argument passed to an API call is invalid (e.g. a negative override).
    InvalidArgument {
        /// The argument's name as the caller wrote it, e.g. `delay_iterations`.
        name: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A profiling backend failed (driver missing, driver call failed, Kineto error).
    Backend {
        /// The backend: `cuda`, `torch`, `nvtx`, or a user backend's name.
        backend: String,
        /// What failed, e.g. `cuProfilerStart failed: CUDA_ERROR_NOT_INITIALIZED (...)`.
        message: String,
    },
    /// A start was refused before any capture began: the disk is short of
    /// `stepscope.min_free_disk_mb`, or the captures still being written hold more than
    /// `stepscope.max_capture_mb`. Nothing was armed; the engine goes on.
    Refused {
        /// The config key whose limit refused it, e.g. `stepscope.min_free_disk_mb`.
        key: String,
        /// Why, with the figures, and what to do.
        message: String,
    },
    /// Waiting for trace writing ran out of time; the writes go on in the background.
    Timeout {
        /// What was being waited for.
        what: String,
    },
}

impl Error {
    /// A config error for `field`.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            message: message.into(),
            unknown_key: false,
        }
    }

    /// A config error for a key stepscope does not know.
    pub fn unknown_key(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            message: message.into(),
            unknown_key: true,
        }
    }

    /// An I/O error on `path` while doing what `message` says (it includes `source`'s text).
    pub fn io(path: impl Into<PathBuf>, message: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            message: message.into(),
            source: IoSource(Arc::new(source)),
        }
    }

    /// A trace at `path` not written whole.
    pub fn write(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Write {
            path: path.into(),
            message: message.into(),
        }
    }

    /// A backend error for `backend`.
    pub fn backend(backend: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Backend {
            backend: backend.into(),
            message: message.into(),
        }
    }

    /// A start refused by the limit `key`.
    pub fn refused(key: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Refused {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The config field this error is about: a config error's, a bad argument's, or the key
    /// whose limit refused a start.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::Config { field, .. } => Some(field),
            Error::InvalidArgument { name, .. } => Some(name),
            Error::Refused { key, .. } => Some(key),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config { field, message, .. } => {
                write!(f, "profiler config: `{field}` {message}")
            }
            Error::Json { source, message } => {
                write!(f, "profiler config from {source} is not valid: {message}")
            }
            Error::Io { path, message, .. } => write!(f, "{}: {message}", path.display()),
            Error::Format { path, message } | Error::Write { path, message } => {
                write!(f, "{}: {message}", path.display())
            }
            Error::InvalidArgument { name, message } => write!(f, "`{name}` {message}"),
            Error::Backend { backend, message } => write!(f, "profiler '{backend}': {message}"),
            Error::Refused { key, message } => write!(f, "start refused by `{key}`: {message}"),
            Error::Timeout { what } => write!(f, "timed out waiting for {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source.0.as_ref()),
            _ => None,
        }
    }
}

/// The operating system's error behind an [`Error::Io`]: shared, so the error stays `Clone`;
/// equal when the kind and OS error code are.
#[derive(Debug, Clone)]
pub struct IoSource(Arc<io::Error>);

impl IoSource {
    /// The I/O error.
    pub fn get(&self) -> &io::Error {
        &self.0
    }
}

impl PartialEq for IoSource {
    fn eq(&self, other: &Self) -> bool {
        self.0.kind() == other.0.kind() && self.0.raw_os_error() == other.0.raw_os_error()
    }
}

impl Eq for IoSource {}

/// The text of a caught panic's payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
