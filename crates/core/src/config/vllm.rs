//! vLLM's rules: its cross-field checks, its Proton keys (accepted at their defaults only), its
//! URI test and the directory normalization it applies.

use std::path::{Component, PathBuf};

use serde_json::Value;

use super::types::*;
use stepscope_format::error::{Error, Result};

/// vLLM's Proton options and their defaults. stepscope does not drive Proton, so each is
/// accepted only at its default (exactly what vLLM requires when `profiler` is not "proton").
pub(super) const PROTON_KEYS: [&str; 8] = [
    "proton_profiler_dir",
    "proton_context",
    "proton_data",
    "proton_backend",
    "proton_mode",
    "proton_hook",
    "proton_output_format",
    "proton_graph_attribution",
];

pub(super) fn proton_default(key: &str) -> Value {
    match key {
        "proton_profiler_dir" => Value::String(String::new()),
        "proton_context" => Value::String("shadow".into()),
        "proton_data" => Value::String("tree".into()),
        "proton_graph_attribution" => Value::Bool(false),
        _ => Value::Null,
    }
}

impl ProfilerConfig {
    /// vLLM's cross-field rules, then directory normalization.
    pub(super) fn validate(&mut self) -> Result<()> {
        let torch = self.profiler == Some(ProfilerKind::Torch);
        if let Some(acts) = &self.torch_profiler_activities {
            if !torch {
                return Err(Error::config(
                    "torch_profiler_activities",
                    "is only applicable when profiler is set to 'torch'",
                ));
            }
            for (i, a) in acts.iter().enumerate() {
                if acts[..i].contains(a) {
                    return Err(Error::config(
                        "torch_profiler_activities",
                        format!(
                            "must not contain duplicates ({} appears twice)",
                            serde_json::to_string(a).unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        if !self.torch_profiler_dir.is_empty() && !torch {
            return Err(Error::config(
                "torch_profiler_dir",
                "is only applicable when profiler is set to 'torch'",
            ));
        }
        if torch && self.torch_profiler_dir.is_empty() {
            return Err(Error::config(
                "torch_profiler_dir",
                "must be set when profiler is 'torch' (the directory traces are written to)",
            ));
        }
        if !self.torch_profiler_dir.is_empty() && !is_uri_path(&self.torch_profiler_dir) {
            self.torch_profiler_dir = absolute_dir(&self.torch_profiler_dir)?;
        }
        let capture = &self.stepscope.capture;
        if capture.start_at_step.is_some() && self.delay_iterations > 0 {
            return Err(Error::config(
                "stepscope.start_at_step",
                "takes the place of delay_iterations: set one of them",
            ));
        }
        if let Some(key) = capture.slow_step_key().filter(|_| self.max_iterations == 0) {
            return Err(Error::config(
                key,
                "needs max_iterations > 0: the window after a slow step captures \
                 max_iterations iterations",
            ));
        }
        if capture.repeat > 1 && capture.slow_step_trigger().is_none() {
            if self.max_iterations == 0 {
                return Err(Error::config(
                    "stepscope.repeat",
                    "needs max_iterations > 0: each window captures max_iterations iterations",
                ));
            }
            if capture.repeat_every <= self.max_iterations {
                return Err(Error::config(
                    "stepscope.repeat_every",
                    format!(
                        "must be greater than max_iterations ({}): windows {} steps apart \
                         would overlap",
                        self.max_iterations, capture.repeat_every
                    ),
                ));
            }
        }
        if self.capture_torch_profiler && !torch {
            return Err(Error::config(
                "capture_torch_profiler",
                "is only applicable when profiler is set to 'torch'",
            ));
        }
        if torch
            && (self.delay_iterations > 0 || self.max_iterations > 0)
            && !self.ignore_frontend
            && self
                .torch_profiler_activities
                .as_ref()
                .is_none_or(|a| a.contains(&TorchActivity::Cpu))
        {
            log::warn!(
                "Using 'torch' profiler with delay_iterations or max_iterations while \
                 ignore_frontend is False may result in high overhead."
            );
        }
        Ok(())
    }

    /// Running steps after each backend start that do not count toward `max_iterations`:
    /// the wait and warmup steps of vLLM's torch schedule, less the one that the torch
    /// profiler's own start consumes. Zero for the CUDA profiler and without a schedule.
    pub fn uncounted_steps_after_start(&self) -> u64 {
        let uses_schedule = self.warmup_iterations > 0 || self.wait_iterations > 0;
        if self.profiler == Some(ProfilerKind::Torch) && uses_schedule {
            (self.wait_iterations + self.warmup_iterations).saturating_sub(1)
        } else {
            0
        }
    }
}

/// vLLM's `_is_uri_path`: `scheme://…` with a scheme longer than one character (so `C://`
/// stays a Windows drive).
pub fn is_uri_path(path: &str) -> bool {
    match path.split_once("://") {
        Some((scheme, _)) => scheme.chars().count() > 1,
        None => false,
    }
}

/// `os.path.abspath(os.path.expanduser(dir))`: `~` becomes `$HOME`, a relative path is joined
/// to the current directory, and `.`/`..` are resolved lexically (symlinks are not followed).
fn absolute_dir(dir: &str) -> Result<String> {
    let expanded: PathBuf = match dir.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(rest.trim_start_matches('/')),
            None => PathBuf::from(dir),
        },
        _ => PathBuf::from(dir),
    };
    let joined = if expanded.is_absolute() {
        expanded
    } else {
        let cwd = std::env::current_dir().map_err(|e| {
            let message = format!("cannot resolve relative torch_profiler_dir {dir:?}: {e}");
            Error::io(".", message, e)
        })?;
        cwd.join(expanded)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_paths_follow_vllm() {
        assert!(is_uri_path("s3://bucket/traces"));
        assert!(is_uri_path("gs://b"));
        assert!(!is_uri_path("C://traces"));
        assert!(!is_uri_path("/tmp/traces"));
    }

    #[test]
    fn absolute_dir_resolves_dots_lexically() {
        assert_eq!(absolute_dir("/a/b/../c/./d").unwrap(), "/a/c/d");
    }

    #[test]
    fn uncounted_steps_need_a_torch_schedule() {
        let mut c = ProfilerConfig {
            profiler: Some(ProfilerKind::Torch),
            wait_iterations: 1,
            warmup_iterations: 2,
            ..ProfilerConfig::default()
        };
        assert_eq!(c.uncounted_steps_after_start(), 2);
        c.profiler = Some(ProfilerKind::Cuda);
        assert_eq!(c.uncounted_steps_after_start(), 0);
    }
}
