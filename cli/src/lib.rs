//! The `stepscope` command-line tool. Kept out of the library that engines load: it carries an
//! HTTP client and argument parsing that a worker process has no use for.

pub mod analyze;
pub mod ctl;
pub mod diff;
pub mod error;
pub mod export;
pub mod flags;
pub mod floor;
pub mod load;
pub mod merge;
pub mod out;
pub mod par;
pub mod report;
pub mod requests;
pub mod stats;
pub mod text;
pub mod trace;
pub mod trace_report;
pub mod wait;

pub use error::Error;

use std::process::ExitCode;

use flags::{Cli, Command};

/// Runs a parsed command line: `Ok` with 0 or 1 (some inputs or workers failed, each
/// reported), `Err` when nothing was done (exit 2: see [`error`]).
pub fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Ctl(c) => ctl::command(&c),
        Command::Analyze(a) => analyze::command(&a),
        Command::Diff(d) => diff::command(&d),
        Command::Export(e) => export::command(&e),
        Command::Merge(m) => merge::command(&m),
        Command::Report(r) => report::command(&r),
        Command::Wait(w) => wait::command(&w),
    }
}
