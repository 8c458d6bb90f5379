//! `stepscope analyze`: what a trace's GPU did, per kernel, per iteration, per rank, and with
//! `--requests` per request ([`requests`]).

pub mod explain;
pub mod requests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use stepscope_format::requests::RequestsDocument;

use crate::trace_report::{Source, TraceReport};
use stepscope_format::trace::{graph_ops, CaptureMap, CaptureReader, GraphOps, ReplayReader, Step};

use crate::stats::{median, stragglers};
use crate::text::short;

/// A rank's line in the cross-rank table.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RankRow {
    /// The rank.
    pub rank: Option<i64>,
    /// The file.
    pub file: String,
    /// Steps found.
    pub steps: usize,
    /// Median step wall time, µs.
    pub median_step_us: Option<f64>,
    /// GPU busy time, µs.
    pub gpu_busy_us: f64,
    /// Utilization.
    pub utilization: f64,
    /// Median step time at least 1.2× the median over ranks.
    pub straggler: bool,
}

/// Per-rank rows with stragglers: ranks whose median step time is 20% or more above the median
/// of all traces' medians (only among traces of two or more known ranks).
pub fn ranks(reports: &[TraceReport]) -> Vec<RankRow> {
    let medians: Vec<Option<f64>> = reports
        .iter()
        .map(|r| median(r.steps.iter().map(|s| s.dur_us).collect()))
        .collect();
    // Stragglers are ranks: traces without one (several captures of one unranked worker) are
    // not compared.
    let mut known: Vec<i64> = reports.iter().filter_map(|r| r.rank).collect();
    known.sort_unstable();
    known.dedup();
    let compare = known.len() > 1;
    let slow = stragglers(&medians);
    reports
        .iter()
        .zip(medians)
        .zip(slow)
        .map(|((r, m), slow)| RankRow {
            rank: r.rank,
            file: r.file.clone(),
            steps: r.steps.len(),
            median_step_us: m,
            gpu_busy_us: r.gpu_busy_us,
            utilization: r.utilization,
            straggler: compare && r.rank.is_some() && slow,
        })
        .collect()
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1000.0)
}

/// CPU operators listed in the text report (`--json` has the top N).
const CPU_OPS: usize = 5;

/// Steps listed with their requests in the report.
const SLOWEST_STEPS: usize = 5;

/// The first `n` ids, then how many more.
fn id_list(ids: &[String], n: usize) -> String {
    let mut out = ids.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if ids.len() > n {
        out.push_str(&format!(", … (+{} more)", ids.len() - n));
    }
    out
}

/// The capture regions of the capture traces given (files, or directories of them); `None`
/// when none is given.
fn graph_captures(paths: &[PathBuf]) -> Result<Option<CaptureMap>, crate::Error> {
    if paths.is_empty() {
        return Ok(None);
    }
    let mut map = CaptureMap::default();
    for file in crate::trace::expand(paths)? {
        let mut reader = CaptureReader::default();
        crate::trace::read_events_ahead(&file, &mut reader)?;
        let (regions, skipped) = (map.regions.len(), map.skipped.len());
        map.extend(reader, &file.display().to_string());
        crate::errln!(
            "stepscope: {}: {} CUDA graph capture(s)",
            file.display(),
            map.regions.len() - regions
        );
        for (_, why) in &map.skipped[skipped..] {
            crate::errln!("stepscope: {}: a capture left out: {why}", file.display());
        }
    }
    if map.regions.is_empty() {
        return Err(crate::Error::Usage(format!(
            "--graph-capture: no trace given holds a CUDA graph capture that can be mapped (a \
             cudaStreamBeginCapture ... cudaStreamEndCapture recorded by the profiler){}",
            if map.skipped.is_empty() {
                String::new()
            } else {
                format!("; {} left out (see above)", map.skipped.len())
            }
        )));
    }
    Ok(Some(map))
}

/// The operators inside one trace's graph replays.
fn replay_ops(map: &CaptureMap, file: &Path) -> Result<GraphOps, crate::trace::TraceError> {
    let mut reader = ReplayReader::default();
    crate::trace::read_events_ahead(file, &mut reader)?;
    Ok(graph_ops(map, reader))
}

/// Operators listed in the text report of the time inside graph replays.
const GRAPH_OPS: usize = 10;

/// The time per operator inside a trace's graph replays, as text.
pub fn render_graph_ops(g: &GraphOps) -> String {
    if g.replays == 0 {
        return "inside CUDA graph replays: this trace has no graph replay\n".into();
    }
    let mut o = format!(
        "inside CUDA graph replays: {} of {} replays mapped to their capture",
        g.mapped, g.replays
    );
    if !g.captures.is_empty() {
        let names: Vec<String> = g
            .captures
            .iter()
            .map(|(c, n)| format!("{c} ×{n}"))
            .collect();
        o.push_str(&format!(" ({})", names.join(", ")));
    }
    o.push('\n');
    for u in &g.unmapped {
        o.push_str(&format!(
            "  {} replay(s) not mapped: {}\n",
            u.replays, u.why
        ));
    }
    let total: f64 = g.ops.iter().map(|x| x.total_us).sum();
    if !g.ops.is_empty() {
        o.push_str(&format!(
            "  {:<40} {:>8} {:>12} {:>7}\n",
            "operator at capture", "events", "GPU time", "share"
        ));
    }
    for x in g.ops.iter().take(GRAPH_OPS) {
        o.push_str(&format!(
            "  {:<40} {:>8} {:>12} {:>6.1}%\n",
            short(&x.op, 40),
            x.events,
            ms(x.total_us),
            if total > 0.0 {
                100.0 * x.total_us / total
            } else {
                0.0
            }
        ));
    }
    if g.ops.len() > GRAPH_OPS {
        o.push_str(&format!(
            "  … {} more (--json lists all)\n",
            g.ops.len() - GRAPH_OPS
        ));
    }
    o
}

/// The human-readable report of one trace.
pub fn render(r: &TraceReport) -> String {
    let mut o = String::new();
    let rank = r.rank.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
    o.push_str(&format!("== {}  (rank {rank}", r.file));
    if let Some(w) = r.world_size {
        o.push_str(&format!(" of {w}"));
    }
    o.push(')');
    if r.source == Source::Manifest {
        o.push_str("  [from its manifest]");
    }
    o.push('\n');
    for d in r.devices.iter().take(1) {
        o.push_str(&format!(
            "device: {} (sm_{}{}, {} SMs, {:.0} GiB) ×{}\n",
            d.name.as_deref().unwrap_or("?"),
            d.compute_major.unwrap_or(0),
            d.compute_minor.unwrap_or(0),
            d.num_sms.unwrap_or(0),
            d.total_global_mem.unwrap_or(0) as f64 / (1u64 << 30) as f64,
            r.devices.len()
        ));
    }
    let gpu_total = r.split.computation_us + r.split.communication_us + r.split.memory_us;
    let pct = |x: f64| {
        if gpu_total > 0.0 {
            100.0 * x / gpu_total
        } else {
            0.0
        }
    };
    o.push_str(&format!(
        "span {}   GPU busy {} on {} device(s)   utilization {:.1}%\n",
        ms(r.span_us),
        ms(r.gpu_busy_us),
        r.gpu_devices,
        100.0 * r.utilization
    ));
    if let Some(a) = &r.after_stop {
        o.push_str(&format!(
            "left out: {} device event(s) ({}) of {} runtime call(s) made after the capture stopped (the next step's)\n",
            a.device_events,
            ms(a.device_us),
            a.runtime_calls
        ));
    }
    o.push_str(&format!(
        "kernels {} ({})   memcpy {}   memset {}\n",
        r.kernels.count,
        ms(r.kernels.total_us),
        r.memcpy_count,
        r.memset_count
    ));
    o.push_str(&format!(
        "GPU time: computation {:.1}%  communication {:.1}%  memory {:.1}%\n",
        pct(r.split.computation_us),
        pct(r.split.communication_us),
        pct(r.split.memory_us)
    ));
    o.push_str(&explain::render_trace(&r.gpu));
    if !r.kernels.by_name.is_empty() {
        o.push_str("\n  total       count    mean      max   kind           kernel\n");
        for k in &r.kernels.by_name {
            o.push_str(&format!(
                "  {:>10}  {:>6}  {:>7.1}  {:>7.1}   {:<13}  {}\n",
                ms(k.total_us),
                k.count,
                k.mean_us,
                k.max_us,
                k.kind.as_str(),
                short(&k.name, 90)
            ));
        }
    }
    if !r.cpu_ops.is_empty() {
        o.push_str("\n  total       count    mean      max   CPU operator (inclusive)\n");
        for op in r.cpu_ops.iter().take(CPU_OPS) {
            o.push_str(&format!(
                "  {:>10}  {:>6}  {:>7.1}  {:>7.1}   {}\n",
                ms(op.total_us),
                op.count,
                op.mean_us,
                op.max_us,
                short(&op.name, 90)
            ));
        }
    }
    if !r.steps.is_empty() {
        o.push_str("\n  step                                           start        wall      CPU ops   GPU kernels   count\n");
        for s in &r.steps {
            o.push_str(&format!(
                "  {:<44}  {:>10}  {:>10}  {:>11}  {:>12}  {:>6}\n",
                short(&s.name, 44),
                ms(s.start_us),
                ms(s.dur_us),
                ms(s.cpu_op_us),
                ms(s.kernel_us),
                s.kernel_count
            ));
        }
    }
    let groups = explain::groups(&r.steps);
    o.push_str(&explain::render_steps(&r.steps));
    o.push_str(&explain::render_groups(&groups));
    o.push_str(&explain::render_floors(r, &groups));
    if let Some(slow) = r.trigger.as_ref().map(|t| t.slow_step) {
        o.push_str(&format!(
            "\n  captured after slow step {} ({})\n",
            slow.step,
            ms(slow.duration_ns as f64 / 1e3)
        ));
    }
    if r.steps.iter().any(|s| !s.requests.is_empty()) {
        let mut slowest: Vec<&Step> = r.steps.iter().collect();
        slowest.sort_by(|a, b| b.dur_us.total_cmp(&a.dur_us));
        o.push_str("\n  slowest steps and the requests they served\n");
        for s in slowest.iter().take(SLOWEST_STEPS) {
            let step = s.step.map_or_else(|| "?".into(), |i| i.to_string());
            o.push_str(&format!(
                "  step {step:<8} {:>10}  {} request(s): {}\n",
                ms(s.dur_us),
                s.requests.len(),
                id_list(&s.requests, 8)
            ));
        }
    }
    if !r.idle_gaps.is_empty() {
        o.push_str("\n  largest GPU idle gaps (device, at, length, CPU op running)\n");
        for g in &r.idle_gaps {
            o.push_str(&format!(
                "  gpu {:<3} {:>10}  {:>10}  {}\n",
                g.device,
                ms(g.start_us),
                ms(g.dur_us),
                short(g.cpu_op.as_deref().unwrap_or("-"), 80)
            ));
        }
    }
    o
}

/// The cross-rank table.
pub fn render_ranks(rows: &[RankRow]) -> String {
    let mut o =
        String::from("\n== ranks\n  rank   steps   median step     GPU busy   util  file\n");
    for r in rows {
        o.push_str(&format!(
            "  {:>4}  {:>6}  {:>12}  {:>11}  {:>4.0}%  {}{}\n",
            r.rank.map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
            r.steps,
            r.median_step_us.map(ms).unwrap_or_else(|| "-".into()),
            ms(r.gpu_busy_us),
            100.0 * r.utilization,
            r.file,
            if r.straggler { "   <- straggler" } else { "" }
        ));
    }
    o
}

/// The directory of trace `file` (empty for a bare name: the working directory).
pub(crate) fn trace_dir(file: &str) -> PathBuf {
    Path::new(file)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The request logs (`*.requests.json`, [`RequestsDocument`]) in `dir`, by file name, newest
/// first (a window's log is named by its stop: a request in two windows is found first in
/// the later one, which saw more of it); a file that is not one is reported on stderr and
/// left out.
pub(crate) fn request_logs(dir: &Path) -> Vec<(String, RequestsDocument)> {
    let listed = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(listed) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(stepscope_format::manifest::is_request_log_name)
        })
        .collect();
    paths.sort();
    paths.reverse();
    paths
        .into_iter()
        .filter_map(|p| {
            let read = std::fs::read(&p).map_err(|e| e.to_string()).and_then(|b| {
                serde_json::from_slice::<RequestsDocument>(&b).map_err(|e| e.to_string())
            });
            match read {
                Ok(doc) => Some((p.display().to_string(), doc)),
                Err(e) => {
                    crate::errln!(
                        "stepscope: {}: not a request log, left out: {e}",
                        p.display()
                    );
                    None
                }
            }
        })
        .collect()
}

/// `analyze --json`'s document, written as it is serialized: no value tree built and dropped
/// in between (on HTA's 1.7 MB rank-1 trace that tree cost 0.46-0.66 M of the main thread's
/// ~24 M instructions, callgrind).
#[derive(Serialize)]
struct JsonDoc<'a> {
    traces: Vec<JsonTrace<'a>>,
    ranks: &'a [RankRow],
    errors: Vec<JsonError<'a>>,
    /// Per trace, its requests (`--requests`, `--request`).
    #[serde(skip_serializing_if = "Option::is_none")]
    requests: Option<Vec<JsonRequests<'a>>>,
}

/// A trace's analysis, its groups of like steps beside its steps, and its time inside graph
/// replays (`--graph-capture`).
#[derive(Serialize)]
struct JsonTrace<'a> {
    #[serde(flatten)]
    report: &'a TraceReport,
    groups: Vec<explain::GroupRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    graph_ops: Option<&'a GraphOps>,
}

/// A trace that could not be read.
#[derive(Serialize)]
struct JsonError<'a> {
    file: String,
    error: &'a str,
}

/// A trace's requests.
#[derive(Serialize)]
struct JsonRequests<'a> {
    file: &'a str,
    rank: Option<i64>,
    requests: &'a [requests::TraceRequest],
}

/// `stepscope analyze`.
pub fn command(a: &crate::flags::AnalyzeArgs) -> Result<std::process::ExitCode, crate::Error> {
    let crate::load::Loaded {
        mut reports,
        mut errors,
        ..
    } = crate::load::load(&a.inputs, a.top)?;
    crate::floor::apply(reports.iter_mut().map(|r| &mut r.summary), &a.floor)?;
    if let Some(rank) = a.rank {
        reports.retain(|r| r.rank == Some(rank));
        if reports.is_empty() && errors.is_empty() {
            return Err(crate::Error::Usage(format!(
                "no trace of rank {rank} among the inputs"
            )));
        }
    }
    let rows = ranks(&reports);
    // Per trace, the operators inside its graph replays, from the capture traces given: each
    // trace read again (in parallel), a trace that cannot be read an error of its own.
    let graph_ops: Vec<Option<GraphOps>> = match graph_captures(&a.graph_capture)? {
        Some(map) => {
            let files: Vec<&Path> = reports.iter().map(|r| Path::new(&r.file)).collect();
            crate::load::read_files(&files, crate::load::MEMORY_BUDGET, |f| replay_ops(&map, f))
                .into_iter()
                .map(|read| {
                    read.map_err(|e| {
                        crate::errln!("stepscope: error: {e}");
                        errors.push(e);
                    })
                    .ok()
                })
                .collect()
        }
        None => vec![None; reports.len()],
    };
    // Per trace, its requests: every one (--json), or one by id.
    let wanted = a.requests.is_some() || a.request.is_some();
    let keep = if a.request.is_some() {
        None
    } else {
        Some(requests::COSTLIEST)
    };
    let mut per_trace: Vec<Vec<requests::TraceRequest>> = reports
        .iter()
        .map(|r| {
            if wanted {
                requests::requests(&r.steps, keep)
            } else {
                Vec::new()
            }
        })
        .collect();
    if wanted {
        // The request logs captures wrote beside their traces, read once per directory.
        let mut logs: HashMap<PathBuf, Vec<(String, RequestsDocument)>> = HashMap::new();
        for (r, list) in reports.iter().zip(&mut per_trace) {
            let docs = logs
                .entry(trace_dir(&r.file))
                .or_insert_with_key(|dir| request_logs(dir));
            requests::join_logs(list, docs, keep);
        }
    }
    if let Some(id) = &a.request {
        for list in &mut per_trace {
            list.retain(|r| &r.id == id);
        }
        if per_trace.iter().all(Vec::is_empty) && !reports.is_empty() {
            return Err(crate::Error::Usage(format!(
                "no captured iteration of the traces served request {id:?} (its ids are \
                 recorded with \"stepscope\": {{\"request_ids\": true}})"
            )));
        }
    }
    if a.json {
        let doc = JsonDoc {
            traces: reports
                .iter()
                .zip(&graph_ops)
                .map(|(r, g)| JsonTrace {
                    report: r,
                    groups: explain::groups(&r.steps),
                    graph_ops: g.as_ref(),
                })
                .collect(),
            ranks: &rows,
            errors: errors
                .iter()
                .map(|e| JsonError {
                    file: e.path.display().to_string(),
                    error: &e.message,
                })
                .collect(),
            requests: wanted.then(|| {
                reports
                    .iter()
                    .zip(&per_trace)
                    .map(|(r, reqs)| JsonRequests {
                        file: &r.file,
                        rank: r.rank,
                        requests: reqs,
                    })
                    .collect()
            }),
        };
        crate::out::json(&doc, false)?;
    } else {
        for ((r, reqs), g) in reports.iter().zip(&per_trace).zip(&graph_ops) {
            // After the trace's tables, its time inside graph replays (--graph-capture).
            let graph = g
                .as_ref()
                .map(|g| format!("\n{}", render_graph_ops(g)))
                .unwrap_or_default();
            match (&a.request, a.requests) {
                // One request: its iterations, not the whole trace's tables.
                (Some(_), _) => {
                    if !reqs.is_empty() {
                        crate::outln!("== {}", r.file)?;
                    }
                    for q in reqs {
                        crate::outln!("{}", requests::render_one(q))?;
                    }
                }
                (None, Some(top)) => {
                    crate::outln!("{}{graph}{}", render(r), requests::render(reqs, top))?
                }
                (None, None) => crate::outln!("{}{graph}", render(r))?,
            }
        }
        if reports.len() > 1 {
            crate::outln!("{}", render_ranks(&rows))?;
        }
    }
    if reports.is_empty() && !errors.is_empty() {
        return Err(crate::Error::NothingRead);
    }
    Ok(crate::error::partial(!errors.is_empty()))
}
