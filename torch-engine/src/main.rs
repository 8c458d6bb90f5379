//! `make demo`'s torch part: the toy engine runs 12 iterations; stepscope's torch backend
//! captures iterations 4 to 6 (delay 4, max 3, as `/start_profile` would ask), the trace is
//! written in the background, and we print what was captured.
//!
//! Usage: stepscope-torch-engine [OUT_DIR]   (default out/torch)

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::Value;
use stepscope::{ProfilerConfig, StartOptions, WorkerProfiler};
use stepscope_torch_engine::ToyEngine;

const ITERATIONS: u64 = 12;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "out/torch".into()),
    );
    let config = ProfilerConfig::from_value(&serde_json::json!({
        "profiler": "torch",
        "torch_profiler_dir": dir,
        "torch_profiler_with_stack": false,
    }))?;
    let profiler = WorkerProfiler::new(&config, "toy-engine")?;
    let engine = ToyEngine::new(4, 256);

    profiler.start_with(StartOptions {
        delay_iterations: Some(4),
        max_iterations: Some(3),
        ..StartOptions::default()
    })?;
    println!("toy engine: {ITERATIONS} iterations, capturing 4-6 (delay 4, max 3)");
    let mut stop_call = None;
    for step in 1..=ITERATIONS {
        let was_running = profiler.is_running();
        let t = Instant::now();
        engine.iteration(&profiler, step);
        if was_running && !profiler.is_running() {
            // The automatic stop happened inside this step() (with the model's work after it).
            stop_call = Some(t.elapsed());
        }
        let info = ToyEngine::batch(step);
        println!(
            "  iteration {step:>2}  {:<36} {}",
            info.name(false),
            if profiler.is_running() {
                "captured"
            } else {
                ""
            }
        );
    }
    if let Some(e) = profiler.take_last_error() {
        return Err(e.into());
    }
    let t = Instant::now();
    let done = profiler.flush(Duration::from_secs(120))?;
    println!(
        "\nstop step incl. model work: {:.1} ms; background write finished {:.1} ms later",
        stop_call.unwrap_or_default().as_secs_f64() * 1e3,
        t.elapsed().as_secs_f64() * 1e3
    );
    if !done {
        return Err("the trace was not written within 120 s".into());
    }

    let mut manifests: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".stepscope.json"))
        .collect();
    manifests.sort();
    let latest = manifests.last().ok_or("no manifest was written")?;
    let m: Value = serde_json::from_slice(&std::fs::read(latest)?)?;
    println!(
        "\ntrace:    {}",
        dir.join(m["trace_file"].as_str().unwrap_or("?")).display()
    );
    println!("manifest: {}", latest.display());
    println!(
        "  status {}, steps {}..{} ({} iterations), {} bytes gzipped from {} bytes of JSON, \
         written {:.0} ms after the stop",
        m["status"],
        m["first_step"],
        m["last_step"],
        m["iterations"],
        m["trace_bytes"],
        m["json_bytes"],
        m["writer_seconds"].as_f64().unwrap_or(0.0) * 1e3
    );
    if let Some(summary) = m["summary_file"].as_str() {
        let table = std::fs::read_to_string(dir.join(summary))?;
        println!("\ntop ops ({}):", dir.join(summary).display());
        for line in table.lines().take(9) {
            println!("  {line}");
        }
    }
    Ok(())
}
