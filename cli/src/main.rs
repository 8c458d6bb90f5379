//! `stepscope`: control profiling across a fleet of engine workers.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use stepscope_cli::ctl::{self, Action, Engine, Outcome, StartFields};

#[derive(Parser)]
#[command(
    name = "stepscope",
    version,
    about = "Profile chosen engine iterations across every worker of an LLM serving fleet",
    long_about = "Profile chosen engine iterations across every worker of an LLM serving fleet.\n\n\
        `stepscope ctl` starts, stops and lists profiling on every worker behind a router \
        (vllm-router, SGLang's router) or on workers given directly, concurrently and with a \
        timeout per worker."
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
    }
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
