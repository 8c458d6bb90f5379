//! The command line: one `clap` struct per group of flags that commands share (`Targets`,
//! `Common` for every `ctl` command, `StartFields` for the start body), and each command's own.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "stepscope",
    version,
    about = "Profile chosen engine iterations across every worker of an LLM serving fleet",
    long_about = "Profile chosen engine iterations across every worker of an LLM serving fleet.\n\n\
        `stepscope ctl` starts, stops and lists profiling on every worker behind a router \
        (vllm-router, SGLang's router) or on workers given directly, concurrently and with a \
        timeout per worker. `stepscope analyze`, `merge` and `report` read the traces back: \
        Kineto/Chrome traces (.json or .json.gz), one per rank; `stepscope diff` compares two \
        runs. `stepscope wait` waits until the traces under a directory are written."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// `defer`: a subcommand's arguments are built only when it is the one run (or its help is
// shown); building all of them cost an `analyze` of a 2.4 KB trace some 40 of its 222 page
// faults.
#[derive(Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Start, stop, list and watch profiling on every worker behind a router
    #[command(subcommand)]
    Ctl(CtlCommand),
    /// Summarize traces: kernels, GPU busy time and gaps, iterations, stragglers across ranks
    #[command(
        after_help = "Exit status: 0 when every trace was read, 1 when some of a \
        directory's could not be (the others are reported), 2 when none could."
    )]
    Analyze(AnalyzeArgs),
    /// Compare two runs: like steps grouped (stage, requests, tokens), each group's step time
    /// judged against its noise, and what its kernels and CPU operators changed
    #[command(after_help = DIFF_HELP)]
    Diff(DiffArgs),
    /// Send a capture's request logs to an OpenTelemetry collector as spans (or write them as
    /// OTLP JSON)
    #[command(after_help = EXPORT_HELP)]
    Export(ExportArgs),
    /// Merge one trace per rank into one Perfetto/Chrome trace, ranks labelled and ordered
    Merge(MergeArgs),
    /// Write a self-contained HTML report (charts, no network) of one trace or a run's ranks
    Report(ReportArgs),
    /// Wait until every trace under a directory is written (its manifest says complete)
    #[command(
        after_help = "For flows that end a capture by max_iterations or num_steps (no stop \
        request), or a stop that answers at once (stop_returns \"at_once\"), and then list \
        the directory:\n  \
        stepscope wait /traces --timeout 600 && ls /traces\n\n\
        Reads the manifests (*.stepscope.json) under DIR and its subdirectories; prints one \
        line per trace (status, manifest, trace file or why it failed).\n\n\
        Exit status: 0 when every trace is complete, 1 when one failed, is unfinished, is still \
        being written at --timeout, or fewer than --expect manifests appeared, 2 when DIR is \
        not a directory."
    )]
    Wait(WaitArgs),
}

#[derive(Args)]
pub struct WaitArgs {
    /// The directory the traces are written to (torch_profiler_dir, SGLang's output_dir)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Seconds to wait at most
    #[arg(long, value_name = "SECS", default_value_t = 600.0, value_parser = positive_secs)]
    pub timeout: f64,
    /// Wait until at least this many manifests exist (a manifest appears a moment after its
    /// stop, when the worker's writer takes the capture)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub expect: usize,
    /// No progress lines on stderr
    #[arg(long, short)]
    pub quiet: bool,
}

// The traces a reading command takes. A plain comment, as `FloorArgs`'s.
#[derive(Args)]
pub struct Inputs {
    /// Trace files (.json, .json.gz) or directories of them (one per rank). In a directory, a
    /// trace whose manifest (.stepscope.json) holds a summary is read from the manifest
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Read every trace, even where its manifest holds a summary
    #[arg(long)]
    pub from_traces: bool,
}

// What a step's floor is computed with, where the trace does not say (see docs/analyze.md).
// A plain comment: a flattened struct's doc comment would become the help's first line of
// each subcommand it is part of (the subcommands' arguments are deferred, see `Command`).
#[derive(Args, Clone, Default)]
pub struct FloorArgs {
    /// The device's peak compute for the floor, TFLOP/s (dense, for the weights' dtype):
    /// instead of stepscope's table for the trace's device
    #[arg(long, value_name = "TFLOPS", value_parser = positive)]
    pub peak_tflops: Option<f64>,
    /// The device's peak memory bandwidth for the floor, GB/s
    #[arg(long, value_name = "GBS", value_parser = positive)]
    pub peak_gbs: Option<f64>,
    /// The served model's Hugging Face config.json, for traces that do not record the model's
    /// shape (vLLM's own, or an engine without the plugin); replaces a recorded shape
    #[arg(long, value_name = "CONFIG")]
    pub model: Option<PathBuf>,
    /// With --model: tensor-parallel ranks (default 1)
    #[arg(long, value_name = "N", requires = "model")]
    pub tensor_parallel: Option<u32>,
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

#[derive(Args)]
pub struct AnalyzeArgs {
    #[command(flatten)]
    pub inputs: Inputs,
    #[command(flatten)]
    pub floor: FloorArgs,
    /// Print {"traces": [...], "ranks": [...], "errors": [...]} instead of tables
    #[arg(long)]
    pub json: bool,
    /// Kernel and CPU operator names listed per trace (0: all; a manifest keeps its top 20)
    #[arg(long, value_name = "N", default_value_t = 15)]
    pub top: usize,
    /// Only the trace of this rank
    #[arg(long, value_name = "R")]
    pub rank: Option<i64>,
    /// Per trace, its requests (captured with "stepscope": {"request_ids": true}): the N
    /// (--requests=N; default 10, 0: all) that spent longest in captured iterations, each with its prefill
    /// chunks and decode steps, its share of the iterations' CPU and GPU time (by tokens when
    /// the engine gave them), and the iterations that cost it most with what they carried.
    /// With --json, every request, as "requests" per trace
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "10"
    )]
    pub requests: Option<usize>,
    /// One request's captured iterations, in order, each with its role, its share and what it
    /// carried (instead of the traces' tables)
    #[arg(long, value_name = "ID", conflicts_with = "requests")]
    pub request: Option<String>,
    /// A trace of the CUDA graphs' capture (vLLM's capture_traces/ with capture_torch_profiler,
    /// SGLang's --enable-profile-cuda-graph, or torch.profiler around torch.cuda.graph), or a
    /// directory of them: each graph replay's kernels are given the operators that launched
    /// them at capture, and each trace gets its time per operator inside graph replays
    /// (repeatable; give the captures of the graphs the traces replay; every trace analyzed is
    /// then read whole, even where its manifest holds a summary)
    #[arg(long, value_name = "PATH", conflicts_with = "request")]
    pub graph_capture: Vec<PathBuf>,
}

const DIFF_HELP: &str = "\
How it groups: a step's stage (prefill, decode, mixed) and its requests and tokens, each in \
power-of-two buckets (1, 2, 3-4, 5-8, ...), from the iteration names stepscope and vLLM write \
(execute_context_N(T)_generation_N(T)); torch's ProfilerStep#N steps form one group, \"step\".

How it judges: per group, each side's steps (in time order) are cut into 10 blocks of \
consecutive steps, and the blocks' median wall times compared: the Mann-Whitney rank test \
(it assumes the blocks are independent draws, nothing about their distribution; blocks let a \
stretch of slow steps on a busy host count once), Holm's correction over the groups at \
--alpha, and the Hodges-Lehmann shift (the median of after-before differences, with its \
1-alpha interval): a group is SLOWER or FASTER when the test is significant and the shift is \
at least --min-change percent of the median before and beyond the group's noise band (the \
shift two unchanged runs stay within if each run's level wanders as its blocks do: \
z(alpha) x sqrt(s_before^2 + s_after^2), each s from the interquartile range of a side's \
block medians); else \"no change beyond noise\". \
Groups with fewer than --min-steps steps on a side are listed, not judged. Ranks present on \
both sides are judged the same way.

Names: per group, each kernel's device time and each CPU operator's and user annotation's self \
time, per step, ranked by how much they changed. Names found on one side only are then matched \
by a normalized form (template arguments and argument lists removed, generated numeric and \
hexadecimal suffixes dropped); --exact-names turns that off.

Manifests (*.stepscope.json) hold each step's time and the device totals, not the names each \
step ran: --steps-only reads them instead of the traces. A manifest whose trace is gone is \
read for its steps.

On a shared host, captures taken one after another can differ by more than any change: where \
the sides can be switched at will, capture them alternately and give each side as a directory \
of its captures (they are pooled).

Examples:
  stepscope diff before/ after/
  stepscope diff run1/rank0.json.gz run2/rank0.json.gz --json
  stepscope diff before/ after/ --html diff.html --top 20

Exit status: 0 when every trace was read, 1 when some could not be (the others are \
compared), 2 when a side has nothing readable or on bad flags.";

#[derive(Args)]
pub struct DiffArgs {
    /// The run before: a trace (.json, .json.gz), a directory of one run's traces (ranks), or a
    /// manifest (.stepscope.json)
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The run after, the same way
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    /// Print one JSON document ({"before", "after", "settings", "groups", "gpu", "ranks",
    /// "errors"}) instead of tables
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page (side by side; a group's names on click)
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Names listed per group (0: all)
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// The smallest change of a group's step time reported as a change, percent of its median
    #[arg(long, value_name = "PCT", default_value_t = 5.0, value_parser = non_negative)]
    pub min_change: f64,
    /// Family-wise significance level of the tests
    #[arg(long, value_name = "P", default_value_t = 0.01)]
    pub alpha: f64,
    /// Steps a side needs in a group to judge it
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub min_steps: usize,
    /// Match kernel and operator names exactly only
    #[arg(long)]
    pub exact_names: bool,
    /// Compare step times and device totals only, from the manifests where they have a summary
    #[arg(long)]
    pub steps_only: bool,
    #[command(flatten)]
    pub floor: FloorArgs,
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s:?} is not a non-negative number")),
    }
}

const EXPORT_HELP: &str = "Each finished request in the request logs (*.requests.json, written \
beside the traces when \"stepscope\": {\"requests\": true}) becomes a stepscope.request span \
with its engine steps under it: stepscope.engine, stepscope.queue (with the largest prefill that \
held it), one stepscope.prefill per chunk, stepscope.decode, and its costliest steps named; the \
same spans the vLLM and SGLang plugins export live with \"otel\" (docs/otel.md).\n\n\
Examples:\n  \
stepscope export --otlp http://collector:4318/v1/traces /traces\n  \
stepscope export --otlp-json spans.jsonl --steps /traces/engine0.1764140000000000000.requests.json\n\n\
--otlp posts OTLP/HTTP with JSON bodies (an OpenTelemetry Collector's or Jaeger's OTLP \
receiver, port 4318); --otlp-json writes one ExportTraceServiceRequest a line, whole or not at \
all (the Collector's otlpjsonfile receiver reads it). Exporting the same logs again gives the \
same span ids. Exit status: 0 when every span went, 2 when a log could not be read or the \
collector refused (what was sent before stays sent).";

#[derive(Args)]
#[command(group(clap::ArgGroup::new("sink").required(true).args(["otlp", "otlp_json"])))]
pub struct ExportArgs {
    /// Request logs (*.requests.json), or directories holding them
    #[arg(required = true, value_name = "PATH")]
    pub inputs: Vec<PathBuf>,
    /// The collector's OTLP/HTTP traces endpoint (JSON bodies), e.g. http://host:4318/v1/traces
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// Write OTLP JSON lines to FILE instead
    #[arg(long, value_name = "FILE")]
    pub otlp_json: Option<PathBuf>,
    /// One span per engine step too (stepscope.step), linked from the requests' spans
    #[arg(long)]
    pub steps: bool,
    /// A request's costliest steps named on its stepscope.engine span
    #[arg(long, value_name = "N", default_value_t = stepscope_format::requests::COSTLIEST)]
    pub costliest: usize,
    /// Requests per OTLP message
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub batch: u32,
    /// The resource's service.name
    #[arg(long, value_name = "NAME", default_value = "stepscope")]
    pub service: String,
    /// Seconds each POST to the collector may take
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = positive_secs)]
    pub timeout: f64,
}

#[derive(Args)]
pub struct MergeArgs {
    /// A directory of traces (one per rank), or the trace files
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Output file; gzip-compressed when it ends in .gz
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub inputs: Inputs,
    #[command(flatten)]
    pub floor: FloorArgs,
    /// Output HTML file
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(Subcommand)]
#[command(defer = true)]
pub enum CtlCommand {
    /// POST /start_profile to every worker
    #[command(after_help = "Examples:\n  \
        stepscope ctl start --router-url http://router:8000 --delay-iterations 20 --max-iterations 5\n  \
        stepscope ctl start --engine sglang --worker http://w0:30000 --worker http://w1:30000 --num-steps 5")]
    Start(StartArgs),
    /// POST /stop_profile to every worker; with --wait, until every worker's traces are written
    #[command(
        after_help = "With stepscope's vLLM and SGLang plugins, /stop_profile answers once \
        the traces are on disk (unless \"stepscope\": {\"stop_returns\": \"at_once\"}). \
        --wait then polls each server's stepscope status (vLLM: GET /stepscope/status, \
        with VLLM_PLUGINS naming stepscope; SGLang: GET /server_info) until no engine worker \
        still records or writes, and lists each trace the stop ended: worker, status, file.\n\n\
        Exit status: 0 when every worker stopped (and, with --wait, every trace is complete), \
        1 when some did not, 2 on bad flags or targets."
    )]
    Stop(StopArgs),
    /// List the workers discovery finds, and probe their /health
    Workers(Common),
    /// Show every engine worker's stepscope state (vLLM: GET /stepscope/status, with
    /// VLLM_PLUGINS naming stepscope, see docs/vllm.md; SGLang: GET /server_info, whose
    /// internal_states carry each answering scheduler's, see docs/sglang.md)
    #[command(after_help = "Examples:\n  \
        stepscope ctl status --router-url http://router:8000\n  \
        stepscope ctl status --engine sglang --worker http://w0:30000\n\n\
        Each server lists its engine workers: rank, phase (idle, delaying, running, paused, \
        between, start_failed, not_created), step, the current window and what it captured, \
        and traces still being written.")]
    Status(Common),
    /// A live view of every engine worker's steps: steps/s, step p50/p99/max, batch size,
    /// phase, stragglers marked (the workers need "stepscope": {"timeline": true} in
    /// STEPSCOPE_CONFIG; vLLM: GET /stepscope/timeline, SGLang: each scheduler's last 512
    /// steps in /server_info)
    #[command(after_help = "Examples:\n  \
        stepscope ctl top --router-url http://router:8000\n  \
        stepscope ctl top --worker http://w0:8000 --once --json\n\n\
        Refreshes every --interval seconds until interrupted (--once: one table, or with --json \
        one document: {\"window_s\", \"workers\": [{\"worker_name\", \"rank\", \"phase\", \
        \"steps\", \"steps_per_s\", \"p50_ms\", \"p99_ms\", \"max_ms\", \"mean_requests\", \
        \"mean_tokens\", \"straggler\", ...}], \"errors\": [...]}). Statistics cover the \
        steps that began in the last --window seconds of each server's clock. A straggler's p50 \
        is at least 1.2x the median of the workers' p50s (two workers or more).\n\n\
        Exit status (--once): 0 when every server answered with a timeline, 1 when some did not \
        or none keeps one, 2 on bad flags or targets.")]
    Top(TopArgs),
    /// Write a self-contained HTML page of every engine worker's step timeline: a heat map
    /// (workers x time, colour = step duration) and each worker's slowest steps
    #[command(after_help = "Example:\n  \
        stepscope ctl timeline --router-url http://router:8000 --output steps.html")]
    Timeline(TimelineArgs),
    /// The slowest requests of each engine with what cost them: queue wait, prefill chunks,
    /// decode steps, preemptions, and the steps that cost them most with what those carried
    /// (vLLM: GET /stepscope/requests, with "stepscope": {"requests": true} in
    /// STEPSCOPE_CONFIG and VLLM_PLUGINS naming stepscope)
    #[command(after_help = "Examples:\n  \
        stepscope ctl requests --router-url http://router:8000 --by ttft\n  \
        stepscope ctl requests --worker http://w0:8000 --request cmpl-3f2a... --json\n\n\
        Each engine keeps its last requests and steps in a ring (stepscope.requests: 4096 of \
        each by default). A request's times are its engine's: intake is from its arrival at the API server to \
        reaching the scheduler (an engine takes new requests in between steps: one arriving \
        during a step waits for its end), queue from there to the start of the step that \
        first scheduled it, prefill from there to the end of the step that gave its first \
        token, decode from there to its last token; TTFT and e2e begin at its arrival. The \
        steps that cost it most are the longest steps it lived through (waiting, prefill, \
        decode or preempted; for --by itl, its decode steps), with their batch and their \
        largest prefill chunk and its request.\n\n\
        Exit status: 0 when every server answered with a request log, 1 when some did not or \
        none keeps one, 2 on bad flags or targets.")]
    Requests(RequestsArgs),
}

pub use stepscope_format::requests::RankBy;

/// `--by`'s value (the format crate's [`RankBy`]).
fn rank_by(s: &str) -> Result<RankBy, String> {
    match s {
        "ttft" => Ok(RankBy::Ttft),
        "e2e" => Ok(RankBy::E2e),
        "itl" => Ok(RankBy::Itl),
        "queue" => Ok(RankBy::Queue),
        other => Err(format!(
            "{other:?}: ttft (time to first token), e2e (end to end), itl (the longest gap \
             between two tokens) or queue (reaching the scheduler to the first scheduling)"
        )),
    }
}

#[derive(Args)]
pub struct RequestsArgs {
    #[command(flatten)]
    pub common: Common,
    /// What the slowest requests are ranked by: ttft (arrival to the end of the step that gave
    /// the first token), e2e (arrival to the end), itl (the longest gap between two tokens),
    /// queue (reaching the scheduler to the first scheduling: the wait others' steps cause)
    #[arg(long, value_name = "BY", value_parser = rank_by, default_value = "ttft")]
    pub by: RankBy,
    /// Requests listed (0: all)
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// The steps listed per request as what cost it most (0: every one that counts for --by)
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub steps: usize,
    /// Only this request (its id, or the start of it), with every step it lived through
    #[arg(long, value_name = "ID")]
    pub request: Option<String>,
    /// Only requests active after this step index (e.g. the step_index a previous run's JSON
    /// gave)
    #[arg(long, value_name = "N")]
    pub since_step: Option<u64>,
}

#[derive(Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub common: Common,
    /// Print one table (or with --json one document) and exit
    #[arg(long)]
    pub once: bool,
    /// Seconds between refreshes
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = positive_secs)]
    pub interval: f64,
    /// Seconds of steps the statistics cover
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = positive_secs)]
    pub window: f64,
    /// Cover every step after this step index instead of a window (e.g. the step_index
    /// `ctl status` gave before a benchmark)
    #[arg(long, value_name = "N", conflicts_with = "window")]
    pub since_step: Option<u64>,
}

#[derive(Args)]
pub struct TimelineArgs {
    #[command(flatten)]
    pub common: Common,
    /// Output HTML file
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Slowest steps listed per worker
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub slowest: usize,
}

#[derive(Args)]
#[group(id = "targets", required = true, multiple = true)]
pub struct Targets {
    /// Router to ask for its workers (GET /workers, else /list_workers)
    #[arg(
        long,
        value_name = "URL",
        group = "targets",
        conflicts_with = "workers"
    )]
    pub router_url: Option<String>,
    /// A worker's base URL; repeat for several (instead of --router-url)
    #[arg(long = "worker", value_name = "URL", group = "targets")]
    pub workers: Vec<String>,
}

#[derive(Args)]
pub struct Common {
    #[command(flatten)]
    pub targets: Targets,
    /// Request dialect of the workers
    #[arg(long, value_enum, default_value = "vllm")]
    pub engine: Engine,
    /// Seconds each worker request may take (connect, send, answer) [default: 30; `ctl stop`:
    /// 630, since a stop answers once its traces are written, up to the workers'
    /// flush_timeout_s of 600 by default]
    #[arg(long, value_name = "SECS", value_parser = positive_secs)]
    pub timeout: Option<f64>,
    /// Workers contacted at once (default: all)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Option<u32>,
    /// Extra tries for a worker that refused the connection or answered 502/503/504
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub retries: u32,
    /// Also send to workers the router reports unhealthy
    #[arg(long)]
    pub include_unhealthy: bool,
    /// The servers' API key (vllm serve --api-key, SGLang's --api-key), sent as
    /// `Authorization: Bearer KEY` with every request; stepscope's own routes on a vLLM server
    /// started with a key answer 401 without it
    #[arg(
        long,
        value_name = "KEY",
        env = "STEPSCOPE_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Print {"workers":[{"url","ok","status","elapsed_ms","error"}]} instead of a table
    /// (`ctl status` adds each server's "engine_workers")
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct StopArgs {
    #[command(flatten)]
    pub common: Common,
    /// Wait until every engine worker's traces are written, and list them
    #[arg(long)]
    pub wait: bool,
    /// Seconds --wait waits at most
    #[arg(long, value_name = "SECS", default_value_t = 600.0, value_parser = positive_secs,
          requires = "wait")]
    pub wait_timeout: f64,
}

#[derive(Args)]
pub struct StartArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub fields: StartFields,
}

// The `/start_profile` body fields a user gave, per dialect (`ctl start`'s flags). A plain
// comment, as `FloorArgs`'s.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct StartFields {
    /// vLLM: trace file name prefix
    #[arg(long, value_name = "P", help_heading = "vLLM body fields")]
    pub profile_prefix: Option<String>,
    /// vLLM: engine iterations to wait before capturing
    #[arg(long, value_name = "N", help_heading = "vLLM body fields")]
    pub delay_iterations: Option<u64>,
    /// vLLM: engine iterations to capture (0: until stop)
    #[arg(long, value_name = "N", help_heading = "vLLM body fields")]
    pub max_iterations: Option<u64>,
    /// SGLang: directory the traces are written to
    #[arg(long, value_name = "D", help_heading = "SGLang body fields")]
    pub output_dir: Option<String>,
    /// SGLang: steps to capture
    #[arg(long, value_name = "N", help_heading = "SGLang body fields")]
    pub num_steps: Option<u64>,
    /// SGLang: activities to record, comma-separated (e.g. CPU,GPU)
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        help_heading = "SGLang body fields"
    )]
    pub activities: Option<Vec<String>>,
    /// SGLang: separate traces for prefill and decode
    #[arg(long, help_heading = "SGLang body fields")]
    pub profile_by_stage: bool,
    /// SGLang: record Python stacks (true/false)
    #[arg(long, value_name = "BOOL", help_heading = "SGLang body fields")]
    pub with_stack: Option<bool>,
    /// SGLang: record tensor shapes (true/false)
    #[arg(long, value_name = "BOOL", help_heading = "SGLang body fields")]
    pub record_shapes: Option<bool>,
}

impl Common {
    /// A worker request's timeout for `action`: `--timeout`, else the action's default.
    pub fn timeout_for(&self, stop: bool) -> std::time::Duration {
        let default = if stop { STOP_TIMEOUT_S } else { TIMEOUT_S };
        std::time::Duration::from_secs_f64(self.timeout.unwrap_or(default))
    }

    /// How many of `servers` servers are contacted at once (`--concurrency`, default all).
    pub fn concurrency_for(&self, servers: usize) -> usize {
        self.concurrency.map_or(servers, |n| n as usize)
    }
}

/// A worker request's default timeout, s.
pub const TIMEOUT_S: f64 = 30.0;
/// `/stop_profile`'s: the workers' default `stepscope.flush_timeout_s` and some margin.
pub const STOP_TIMEOUT_S: f64 = 630.0;

pub fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

/// The request dialect: which engine's control API the workers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// vLLM's `/start_profile` (body: profile_prefix, delay_iterations, max_iterations).
    Vllm,
    /// SGLang's `/start_profile` (body: output_dir, num_steps, activities, ...).
    Sglang,
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every subcommand's first help line, as `stepscope --help` lists it, and the subcommands
    /// under it, by path (`ctl start`).
    fn abouts(cmd: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
        for sub in cmd.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            out.push((path.clone(), about));
            abouts(sub, &path, out);
        }
    }

    #[test]
    fn each_subcommand_keeps_its_own_about_once_its_deferred_arguments_are_built() {
        let mut cli = Cli::command();
        let mut listed = Vec::new();
        abouts(&cli, "stepscope", &mut listed);
        assert!(listed.iter().any(|(p, _)| p == "stepscope ctl start"));
        // Builds every subcommand, running the deferred `augment_args`: a flattened struct's
        // doc comment would replace the subcommand's about here.
        cli.build();
        let mut built = Vec::new();
        abouts(&cli, "stepscope", &mut built);
        // The build adds the `help` subcommands; the others are as listed.
        built.retain(|(path, _)| !path.contains(" help"));
        assert_eq!(listed, built);
        for (path, about) in &built {
            assert!(!about.is_empty(), "{path} has no about");
        }
    }
}
