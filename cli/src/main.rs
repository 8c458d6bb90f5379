//! `stepscope`: control profiling across a fleet of engine workers, and read its traces.
//!
//! Parses the command line and maps the outcome to the exit status; everything else is in the
//! library (`stepscope_cli::run`).

use std::process::ExitCode;

use clap::Parser;
use stepscope_cli::flags::Cli;
use stepscope_cli::Error;

fn main() -> ExitCode {
    match stepscope_cli::run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            match &e {
                // Each input's failure was reported as it happened.
                Error::NothingRead => {}
                e => stepscope_cli::errln!("stepscope: error: {e}"),
            }
            e.exit_code()
        }
    }
}
