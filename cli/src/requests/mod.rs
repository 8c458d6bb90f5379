//! A request's story from its engine's request log: where its time went (queue, prefill,
//! decode, preemptions) and the steps that cost it most (`breakdown.rs`, no I/O), and its text
//! (`render.rs`). What `stepscope ctl requests` (from live engines) and `stepscope analyze
//! --requests` / `report` (from the log a capture wrote beside its traces) both print; its
//! roles are the log's own (`RequestRecord::role_in`), never derived here.

pub mod breakdown;
pub mod render;

pub use breakdown::{breakdowns, rank, Lived, RequestBreakdown, StepCost, Stretch};
