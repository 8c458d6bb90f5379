//! The `stepscope` command-line tool. Kept out of the library that engines load: it carries an
//! HTTP client and argument parsing that a worker process has no use for.

pub mod analyze;
pub mod ctl;
pub mod merge;
pub mod report;
pub mod trace;
