//! `stepscope`: control profiling across a fleet of engine workers.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use stepscope_cli::analyze::{self, TraceReport};
use stepscope_cli::ctl::{self, Action, Engine, Outcome, StartFields};
use stepscope_cli::trace::{self, TraceError};

#[derive(Parser)]
#[command(
    name = "stepscope",
    version,
    about = "Profile chosen engine iterations across every worker of an LLM serving fleet",
    long_about = "Profile chosen engine iterations across every worker of an LLM serving fleet.\n\n\
        `stepscope ctl` starts, stops and lists profiling on every worker behind a router \
        (vllm-router, SGLang's router) or on workers given directly, concurrently and with a \
        timeout per worker. `stepscope analyze`, `merge` and `report` read the traces back: \
        Kineto/Chrome traces (.json or .json.gz), one per rank."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start, stop or list profiling on every worker behind a router
    #[command(subcommand)]
    Ctl(CtlCommand),
    /// Summarize traces: kernels, GPU busy time and gaps, iterations, stragglers across ranks
    #[command(
        after_help = "Exit status: 0 when every trace was read, 1 when some of a \
        directory's could not be (the others are reported), 2 when none could."
    )]
    Analyze(AnalyzeArgs),
    /// Merge one trace per rank into one Perfetto/Chrome trace, ranks labelled and ordered
    Merge(MergeArgs),
    /// Write a self-contained HTML report (charts, no network) of one trace or a run's ranks
    Report(ReportArgs),
}

#[derive(Args)]
struct AnalyzeArgs {
    /// Trace files (.json, .json.gz) or directories of them (one per rank)
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Print {"traces": [...], "ranks": [...], "errors": [...]} instead of tables
    #[arg(long)]
    json: bool,
    /// Kernel names listed per trace (0: all)
    #[arg(long, value_name = "N", default_value_t = 15)]
    top: usize,
    /// Only the trace of this rank
    #[arg(long, value_name = "R")]
    rank: Option<i64>,
}

#[derive(Args)]
struct MergeArgs {
    /// A directory of traces (one per rank), or the trace files
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Output file; gzip-compressed when it ends in .gz
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
}

#[derive(Args)]
struct ReportArgs {
    /// A trace, or a directory of traces (one per rank)
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Output HTML file
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// POST /start_profile to every worker
    #[command(after_help = "Examples:\n  \
        stepscope ctl start --router-url http://router:8000 --delay-iterations 20 --max-iterations 5\n  \
        stepscope ctl start --engine sglang --worker http://w0:30000 --worker http://w1:30000 --num-steps 5")]
    Start(StartArgs),
    /// POST /stop_profile to every worker
    Stop(Common),
    /// List the workers discovery finds, and probe their /health
    Workers(Common),
    /// Show every engine worker's stepscope state (GET /stepscope/status; vLLM with
    /// VLLM_PLUGINS naming stepscope, see docs/vllm.md)
    #[command(after_help = "Example:\n  \
        stepscope ctl status --router-url http://router:8000\n\n\
        Each server lists its engine workers: rank, phase (idle, delaying, running, paused, \
        between, start_failed, not_created), step, the current window and what it captured, \
        and traces still being written.")]
    Status(Common),
}

#[derive(Args)]
#[group(id = "targets", required = true, multiple = true)]
struct Targets {
    /// Router to ask for its workers (GET /workers, else /list_workers)
    #[arg(
        long,
        value_name = "URL",
        group = "targets",
        conflicts_with = "workers"
    )]
    router_url: Option<String>,
    /// A worker's base URL; repeat for several (instead of --router-url)
    #[arg(long = "worker", value_name = "URL", group = "targets")]
    workers: Vec<String>,
}

#[derive(Args)]
struct Common {
    #[command(flatten)]
    targets: Targets,
    /// Request dialect of the workers
    #[arg(long, value_enum, default_value = "vllm")]
    engine: Engine,
    /// Seconds each worker request may take (connect, send, answer)
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = positive_secs)]
    timeout: f64,
    /// Workers contacted at once (default: all)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: Option<u32>,
    /// Extra tries for a worker that refused the connection or answered 502/503/504
    #[arg(long, value_name = "N", default_value_t = 0)]
    retries: u32,
    /// Also send to workers the router reports unhealthy
    #[arg(long)]
    include_unhealthy: bool,
    /// Print {"workers":[{"url","ok","status","elapsed_ms","error"}]} instead of a table
    /// (`ctl status` adds each server's "engine_workers")
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StartArgs {
    #[command(flatten)]
    common: Common,
    /// vLLM: trace file name prefix
    #[arg(long, value_name = "P", help_heading = "vLLM body fields")]
    profile_prefix: Option<String>,
    /// vLLM: engine iterations to wait before capturing
    #[arg(long, value_name = "N", help_heading = "vLLM body fields")]
    delay_iterations: Option<u64>,
    /// vLLM: engine iterations to capture (0: until stop)
    #[arg(long, value_name = "N", help_heading = "vLLM body fields")]
    max_iterations: Option<u64>,
    /// SGLang: directory the traces are written to
    #[arg(long, value_name = "D", help_heading = "SGLang body fields")]
    output_dir: Option<String>,
    /// SGLang: steps to capture
    #[arg(long, value_name = "N", help_heading = "SGLang body fields")]
    num_steps: Option<u64>,
    /// SGLang: activities to record, comma-separated (e.g. CPU,GPU)
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        help_heading = "SGLang body fields"
    )]
    activities: Option<Vec<String>>,
    /// SGLang: separate traces for prefill and decode
    #[arg(long, help_heading = "SGLang body fields")]
    profile_by_stage: bool,
    /// SGLang: record Python stacks (true/false)
    #[arg(long, value_name = "BOOL", help_heading = "SGLang body fields")]
    with_stack: Option<bool>,
    /// SGLang: record tensor shapes (true/false)
    #[arg(long, value_name = "BOOL", help_heading = "SGLang body fields")]
    record_shapes: Option<bool>,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Ctl(CtlCommand::Start(a)) => {
            let fields = StartFields {
                profile_prefix: a.profile_prefix,
                delay_iterations: a.delay_iterations,
                max_iterations: a.max_iterations,
                output_dir: a.output_dir,
                num_steps: a.num_steps,
                activities: a.activities,
                profile_by_stage: a.profile_by_stage,
                with_stack: a.with_stack,
                record_shapes: a.record_shapes,
            };
            match ctl::start_body(a.common.engine, &fields) {
                Ok(body) => run(Action::Start, &a.common, Some(body)),
                Err(e) => usage_error(&e),
            }
        }
        Command::Ctl(CtlCommand::Stop(c)) => run(Action::Stop, &c, None),
        Command::Ctl(CtlCommand::Workers(c)) => run(Action::Workers, &c, None),
        Command::Ctl(CtlCommand::Status(c)) => run(Action::Status, &c, None),
        Command::Analyze(a) => analyze_cmd(&a),
        Command::Merge(m) => merge_cmd(&m),
        Command::Report(r) => report_cmd(&r),
    }
}

/// Analyzes the inputs; errors are kept per file so a directory's good traces still count.
fn load(paths: &[PathBuf], top: usize) -> Result<(Vec<TraceReport>, Vec<TraceError>), ExitCode> {
    let files = match trace::expand(paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("stepscope: error: {e}");
            return Err(ExitCode::from(2));
        }
    };
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let show_progress = std::io::stderr().is_terminal() && bytes > 20 << 20;
    if show_progress {
        eprintln!(
            "stepscope: reading {} trace(s), {:.0} MB on disk…",
            files.len(),
            bytes as f64 / 1e6
        );
    }
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    for r in analyze::analyze_all(&files, top) {
        match r {
            Ok(r) => reports.push(r),
            Err(e) => {
                eprintln!("stepscope: error: {e}");
                errors.push(e);
            }
        }
    }
    if show_progress {
        eprintln!(
            "stepscope: done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok((reports, errors))
}

fn outcome_code(reports: &[TraceReport], errors: &[TraceError]) -> ExitCode {
    match (reports.is_empty(), errors.is_empty()) {
        (_, true) => ExitCode::SUCCESS,
        (false, false) => ExitCode::from(1),
        (true, false) => ExitCode::from(2),
    }
}

fn analyze_cmd(a: &AnalyzeArgs) -> ExitCode {
    let (mut reports, errors) = match load(&a.paths, a.top) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let Some(rank) = a.rank {
        reports.retain(|r| r.rank == Some(rank));
        if reports.is_empty() && errors.is_empty() {
            eprintln!("stepscope: error: no trace of rank {rank} among the inputs");
            return ExitCode::from(2);
        }
    }
    let rows = analyze::ranks(&reports);
    if a.json {
        let errs: Vec<serde_json::Value> = errors
            .iter()
            .map(|e| serde_json::json!({"file": e.path.display().to_string(), "error": e.message}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"traces": reports, "ranks": rows, "errors": errs})
        );
    } else {
        for r in &reports {
            println!("{}", analyze::render(r));
        }
        if reports.len() > 1 {
            println!("{}", analyze::render_ranks(&rows));
        }
    }
    outcome_code(&reports, &errors)
}

fn merge_cmd(m: &MergeArgs) -> ExitCode {
    let verbose = std::io::stderr().is_terminal();
    let result = stepscope_cli::merge::merge(&m.paths, &m.output, |path: &Path, rank, n| {
        if verbose {
            eprintln!(
                "stepscope: merged rank {rank} ({n} events) from {}",
                path.display()
            );
        }
    });
    match result {
        Ok(done) => {
            println!(
                "merged {} trace(s), {} events, into {}",
                done.ranks.len(),
                done.events_written,
                m.output.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stepscope: error: {e}");
            let _ = std::fs::remove_file(&m.output);
            ExitCode::from(2)
        }
    }
}

fn report_cmd(r: &ReportArgs) -> ExitCode {
    let (reports, errors) = match load(&r.paths, 50) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if reports.is_empty() {
        return ExitCode::from(2);
    }
    let html = stepscope_cli::report::render(&reports, &errors);
    if let Err(e) = std::fs::write(&r.output, html) {
        eprintln!(
            "stepscope: error: {}: cannot write: {e}",
            r.output.display()
        );
        return ExitCode::from(2);
    }
    println!("wrote {} ({} trace(s))", r.output.display(), reports.len());
    outcome_code(&reports, &errors)
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("stepscope ctl: error: {message}");
    ExitCode::from(2)
}

fn run(action: Action, c: &Common, body: Option<serde_json::Value>) -> ExitCode {
    let started = Instant::now();
    let agent = ctl::agent(Duration::from_secs_f64(c.timeout));
    let workers = match &c.targets.router_url {
        Some(router) => ctl::normalize_url(router).and_then(|r| ctl::discover(&agent, &r)),
        None => c
            .targets
            .workers
            .iter()
            .map(|w| ctl::normalize_url(w).map(|url| ctl::Worker { url, healthy: None }))
            .collect(),
    };
    let workers = match workers {
        Ok(w) => w,
        Err(e) => return usage_error(&e.0),
    };

    let (to_call, skipped): (Vec<_>, Vec<_>) = workers
        .iter()
        .partition(|w| c.include_unhealthy || w.healthy != Some(false));
    let urls: Vec<String> = to_call.iter().map(|w| w.url.clone()).collect();
    let concurrency = c.concurrency.map_or(urls.len(), |n| n as usize);
    let mut outcomes = ctl::fan_out(
        &agent,
        c.engine,
        action,
        &urls,
        body.as_ref(),
        concurrency,
        c.retries,
    );
    outcomes.extend(skipped.iter().map(|w| {
        Outcome {
            url: w.url.clone(),
            ok: false,
            status: None,
            engine_workers: None,
            elapsed_ms: 0,
            error: Some(
                "skipped: the router reports this worker unhealthy (--include-unhealthy tries it \
             anyway)"
                    .into(),
            ),
        }
    }));
    // Report in discovery order.
    outcomes.sort_by_key(|o| workers.iter().position(|w| w.url == o.url));

    if c.json {
        println!("{}", ctl::render_json(&outcomes));
    } else {
        print!(
            "{}",
            ctl::render_table(action, &outcomes, started.elapsed())
        );
    }
    if outcomes.iter().all(|o| o.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
