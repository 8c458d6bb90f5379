//! The field walker: takes each key of a JSON object once, checking its type and range, and
//! names whatever is left over as unknown.

use std::time::Duration;

use serde_json::{Map, Value};

use super::types::TorchActivity;
use stepscope_format::error::{Error, Result};

pub(super) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Takes typed fields out of a JSON object; whatever is left at the end is an unknown key.
pub(super) struct Fields {
    map: Map<String, Value>,
    prefix: &'static str,
}

impl Fields {
    pub(super) fn new(map: Map<String, Value>, prefix: &'static str) -> Self {
        Fields { map, prefix }
    }

    pub(super) fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(super) fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key)
    }

    pub(super) fn bool(&mut self, key: &str, default: bool) -> Result<bool> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(v) => Err(Error::config(
                self.name(key),
                format!("must be true or false, not {}", kind_of(&v)),
            )),
        }
    }

    pub(super) fn string(&mut self, key: &str, default: &str) -> Result<String> {
        match self.take(key) {
            None => Ok(default.to_string()),
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(Error::config(
                self.name(key),
                format!("must be a string, not {}", kind_of(&v)),
            )),
        }
    }

    /// One of a few strings, each standing for a value (`choices`, in the order the error
    /// names them); `default` when the key is absent. Anything else is an error naming the key:
    /// "must be "a", "b" or "c", not {value}".
    pub(super) fn choice<T: Copy>(
        &mut self,
        key: &str,
        default: T,
        choices: &[(&str, T)],
    ) -> Result<T> {
        let v = match self.take(key) {
            None => return Ok(default),
            Some(v) => v,
        };
        if let Value::String(s) = &v {
            if let Some((_, t)) = choices.iter().find(|(name, _)| name == s) {
                return Ok(*t);
            }
        }
        let quoted: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        let must_be = match quoted.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => quoted.join(""),
        };
        Err(Error::config(
            self.name(key),
            format!("must be {must_be}, not {v}"),
        ))
    }

    /// An optional value: `None` when the key is absent or null, else what `read` makes of it;
    /// a value `read` refuses is an error naming the key: "must be {must_be}, not {value}".
    pub(super) fn optional<T>(
        &mut self,
        key: &str,
        must_be: &str,
        read: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.take(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match read(&v) {
                Some(t) => Ok(Some(t)),
                None => Err(Error::config(
                    self.name(key),
                    format!("must be {must_be}, not {v}"),
                )),
            },
        }
    }

    /// A number of seconds >= 0 (fractions allowed); `hint` says what 0 means, if anything.
    pub(super) fn seconds(&mut self, key: &str, default: Duration, hint: &str) -> Result<Duration> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| {
                    Error::config(
                        self.name(key),
                        format!("must be a number of seconds >= 0{hint}, not {v}"),
                    )
                }),
        }
    }

    /// A non-negative integer count, at least `min`.
    pub(super) fn count(&mut self, key: &str, default: u64, min: u64) -> Result<u64> {
        let v = match self.take(key) {
            None => return Ok(default),
            Some(v) => v,
        };
        let n = match &v {
            Value::Number(n) => n,
            other => {
                return Err(Error::config(
                    self.name(key),
                    format!("must be an integer >= {min}, not {}", kind_of(other)),
                ))
            }
        };
        match (n.as_u64(), n.as_i64()) {
            (Some(u), _) if u >= min => Ok(u),
            (Some(_), _) | (None, Some(_)) => Err(Error::config(
                self.name(key),
                format!("must be greater than or equal to {min} (got {n})"),
            )),
            (None, None) => Err(Error::config(
                self.name(key),
                format!("must be an integer >= {min} (got {n})"),
            )),
        }
    }

    pub(super) fn activities(&mut self, key: &str) -> Result<Option<Vec<TorchActivity>>> {
        let allowed = "\"CPU\", \"CUDA\", \"PrivateUse1\" or \"XPU\"";
        let items = match self.take(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(items)) => items,
            Some(v) => {
                return Err(Error::config(
                    self.name(key),
                    format!("must be a list of {allowed}, not {}", kind_of(&v)),
                ))
            }
        };
        if items.is_empty() {
            return Err(Error::config(
                self.name(key),
                format!("must not be empty: list at least one of {allowed}"),
            ));
        }
        items
            .iter()
            .map(|item| {
                let found = item
                    .as_str()
                    .and_then(|s| TorchActivity::ALL.iter().find(|(n, _)| *n == s));
                match found {
                    Some((_, a)) => Ok(*a),
                    None => Err(Error::config(
                        self.name(key),
                        format!("entries must be {allowed}, not {item}"),
                    )),
                }
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    pub(super) fn finish(self) -> Result<()> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => Err(Error::unknown_key(
                self.name(key),
                if self.prefix.is_empty() {
                    "is not a profiler config key (vLLM 0.32's ProfilerConfig fields and the \
                     \"stepscope\" object are accepted; see docs/config.md)"
                        .to_string()
                } else {
                    "is not a stepscope key (see docs/config.md for the \
                     keys the \"stepscope\" object accepts)"
                        .to_string()
                },
            )),
        }
    }
}
