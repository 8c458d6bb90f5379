//! The Kineto glue (`cpp/kineto.cc`, C ABI in `cpp/stepscope_kineto.h`): how the torch backend
//! reaches libtorch's profiler.
//!
//! libtorch's C++ ABI changes between torch minor versions, so the glue is the only part of
//! stepscope built against one torch. It is provided two ways:
//! - **linked** (the `torch` feature): compiled into this library by `build.rs` against the
//!   libtorch that torch-sys links, for Rust engines that link libtorch themselves;
//! - **loaded** (`torch-dynamic` alone, the Python package): a shared library per torch minor
//!   version, `libstepscope_kineto-torch{X}.{Y}.so`, chosen at the first torch capture by the
//!   version of the libtorch already loaded in the process, and `dlopen`ed then.
//!
//! Either way the rest of the backend sees [`Kineto`] and the owned handles of `handles.rs`;
//! every C++ exception arrives as an error message.
//!
//! Layout: the glue's C ABI, its function table and call convention in `glue.rs`; the safe
//! wrappers over them in `handles.rs`; which glue this process uses in `provider.rs`, and
//! finding and loading a glue file in `loader.rs`.

mod glue;
mod handles;
#[cfg(not(feature = "torch"))]
mod loader;
mod provider;

pub use glue::GlueInfo;
pub(crate) use glue::Options;
pub(crate) use handles::{Detached, EventRows, Kineto, Range, TraceResult};
pub use provider::{add_glue_dir, glue_info};
