//! The Python exceptions of `stepscope._native` and the one mapping of a library error to
//! them.

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use stepscope::Error;

pyo3::create_exception!(
    stepscope,
    ConfigError,
    PyValueError,
    "A profiler config is invalid: malformed JSON, an unknown key, or a bad value. The message \
     names the field."
);
pyo3::create_exception!(
    stepscope,
    BackendError,
    PyRuntimeError,
    "A profiling backend failed (driver missing, driver call failed, Kineto error)."
);

pyo3::create_exception!(
    stepscope,
    StartRefused,
    PyRuntimeError,
    "A start was refused by a capture limit (the disk short of stepscope.min_free_disk_mb, or \
     the captures still being written over stepscope.max_capture_mb): nothing was armed and the \
     engine goes on. `key` names the limit."
);

/// The Python exception for a library error. A `ConfigError` carries the offending field as
/// its `field` attribute (`None` for malformed JSON), so callers need not parse the message.
pub(crate) fn to_py(e: &Error) -> PyErr {
    let text = e.to_string();
    match e {
        Error::Config {
            field, unknown_key, ..
        } => {
            let err = ConfigError::new_err(text);
            Python::attach(|py| {
                // Setting an attribute on a fresh exception instance cannot fail in practice;
                // were it to, the message still names the field.
                let _ = err.value(py).setattr("field", field.as_str());
                let _ = err.value(py).setattr("unknown_key", *unknown_key);
            });
            err
        }
        Error::Json { .. } => {
            let err = ConfigError::new_err(text);
            Python::attach(|py| {
                let _ = err.value(py).setattr("field", py.None());
                let _ = err.value(py).setattr("unknown_key", false);
            });
            err
        }
        Error::InvalidArgument { .. } | Error::Format { .. } => PyValueError::new_err(text),
        Error::Io { .. } | Error::Write { .. } => PyOSError::new_err(text),
        Error::Timeout { .. } => PyTimeoutError::new_err(text),
        Error::Refused { key, .. } => {
            let err = StartRefused::new_err(text);
            Python::attach(|py| {
                let _ = err.value(py).setattr("key", key.as_str());
            });
            err
        }
        _ => BackendError::new_err(text),
    }
}
