//! vLLM's `--profiler-config` JSON, parsed verbatim, plus stepscope's own keys.
//!
//! Every field of vLLM 0.32's `vllm.config.ProfilerConfig` is accepted with vLLM's default and
//! vLLM's validation, so the JSON a user already passes to `vllm serve --profiler-config` works
//! unchanged. stepscope's own settings live under one optional object, `"stepscope": {...}`.
//! Unknown keys are an error that names the key: a typo must not silently profile the wrong
//! thing. docs/config.md has the reference of every key.
//!
//! ```
//! use stepscope_core::config::{ProfilerConfig, ProfilerKind};
//! let cfg = ProfilerConfig::from_json_str(r#"{"profiler": "cuda", "delay_iterations": 10, "max_iterations": 3}"#)?;
//! assert_eq!(cfg.profiler, Some(ProfilerKind::Cuda));
//! assert_eq!((cfg.delay_iterations, cfg.max_iterations), (10, 3));
//!
//! let err = ProfilerConfig::from_json_str(r#"{"max_iterations": -1}"#).unwrap_err();
//! assert_eq!(err.field(), Some("max_iterations"));
//! # Ok::<(), stepscope_core::Error>(())
//! ```

//!
//! Layout: the types (`types.rs`), reading them from JSON (`parse.rs`, over the field walker in
//! `fields.rs` that names every bad key), and vLLM's own rules (`vllm.rs`).

mod fields;
mod parse;
mod types;
mod vllm;

pub use types::*;
pub use vllm::is_uri_path;
