//! Numbers from Python checked as the library takes them: ranks, counts and sums, each error
//! naming its argument.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A rank from Python: a non-negative integer, or `ValueError` naming it.
pub(crate) fn rank_arg(name: &str, value: i64) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be greater than or equal to 0 (got {value})"
        ))
    })
}

/// A count from Python: a non-negative integer that fits `u32`, or `ValueError` naming it.
pub(crate) fn count(name: &str, value: i64) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be between 0 and {} (got {value})",
            u32::MAX
        ))
    })
}

pub(crate) fn sum(name: &str, value: Option<i64>) -> PyResult<u64> {
    value.map_or(Ok(0), |v| {
        u64::try_from(v).map_err(|_| {
            PyValueError::new_err(format!(
                "{name} must be greater than or equal to 0 (got {v})"
            ))
        })
    })
}
