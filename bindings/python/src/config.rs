//! A profiler config from Python (a mapping, JSON text or a path), parsed by the library: the
//! one parser of a config on the Python side.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use stepscope::ProfilerConfig;

use crate::errors::{to_py, ConfigError};

/// Parses `config`: a mapping (JSON-serializable), JSON text, or a path (str or `os.PathLike`)
/// to a JSON file.
pub(crate) fn parse_config(config: &Bound<'_, PyAny>) -> PyResult<ProfilerConfig> {
    let py = config.py();
    let parsed = if let Ok(text) = config.cast::<PyString>() {
        let text = text.to_str()?.to_owned();
        py.detach(|| ProfilerConfig::from_spec(&text, "config"))
    } else if config.cast::<PyDict>().is_ok() || config.hasattr("keys")? {
        let text: String = py
            .import("json")?
            .call_method1("dumps", (config,))
            .map_err(|e| {
                ConfigError::new_err(format!("config: the mapping is not JSON-serializable: {e}"))
            })?
            .extract()?;
        ProfilerConfig::from_json_str(&text)
    } else if config.hasattr("__fspath__")? {
        let path: std::path::PathBuf = py
            .import("os")?
            .call_method1("fspath", (config,))?
            .extract()?;
        py.detach(|| ProfilerConfig::from_path(&path))
    } else {
        return Err(PyTypeError::new_err(format!(
            "config must be a dict, JSON text or a path to a JSON file, not {}",
            config.get_type().name()?
        )));
    };
    parsed.map_err(|e| to_py(&e))
}
