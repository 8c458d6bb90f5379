//! A request's story from its engine's request log: where its time went (queue, prefill,
//! decode, preemptions) and the steps that cost it most (the format crate's
//! `requests::breakdown`, no I/O, shared with the OpenTelemetry spans), and its text
//! (`render.rs`). What `stepscope ctl requests` (from live engines) and `stepscope analyze
//! --requests` / `report` (from the log a capture wrote beside its traces) both print; its
//! roles are the log's own (`RequestRecord::role_in`), never derived here.

pub mod render;

pub use stepscope_format::requests::{
    breakdowns, rank, Lived, RankBy, RequestBreakdown, StepCost, Stretch,
};
