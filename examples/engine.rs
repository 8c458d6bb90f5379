//! A toy inference engine: a scheduler that admits requests, prefills them and decodes them,
//! one `step()` per engine iteration, with a control thread that asks for a capture while the
//! engine runs — the way `/start_profile` reaches a real server.
//!
//! Usage: `cargo run --example engine -- [ITERATIONS] [CONFIG_JSON_OR_PATH]`
//! (defaults: 16 iterations, `{"delay_iterations": 3, "max_iterations": 4}`; the config may
//! also come from `STEPSCOPE_CONFIG`).

use std::process::ExitCode;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use parking_lot::Mutex;
use stepscope::backend::{Backend, CaptureStart};
use stepscope::{IterationInfo, ProfilerConfig, Result, WorkerProfiler};

/// A backend that records what a real one would capture, so the demo can print it.
#[derive(Clone, Default)]
struct Recorder {
    events: Arc<Mutex<Vec<String>>>,
    captured: Arc<Mutex<Vec<(u64, String)>>>,
}

impl Backend for Recorder {
    fn name(&self) -> &str {
        "demo"
    }
    fn start(&mut self, capture: &CaptureStart<'_>) -> Result<()> {
        self.events.lock().push(format!(
            "capture start (worker {}, first step {})",
            capture.worker_name, capture.first_step
        ));
        Ok(())
    }
    fn stop(&mut self) -> Result<()> {
        self.events.lock().push("capture stop".into());
        Ok(())
    }
    fn begin_iteration(&mut self, step: u64, _info: &IterationInfo, name: &str) {
        self.captured.lock().push((step, name.to_string()));
    }
}

/// A scheduler: a new request every third iteration, prefilled in one iteration (chunk of up
/// to 512 tokens), then decoded one token per iteration for 6 iterations.
struct Scheduler {
    decoding: Vec<u32>,
    next_prompt: u32,
}

impl Scheduler {
    fn schedule(&mut self, iteration: u32) -> IterationInfo {
        self.decoding.retain(|left| *left > 0);
        let gen_reqs = self.decoding.len() as u32;
        for left in &mut self.decoding {
            *left -= 1;
        }
        let (ctx_reqs, ctx_tokens) = if iteration % 3 == 1 {
            self.next_prompt = (self.next_prompt * 7 + 100) % 512 + 1;
            self.decoding.push(6);
            (1, self.next_prompt)
        } else {
            (0, 0)
        };
        IterationInfo::new(ctx_reqs, ctx_tokens, gen_reqs, gen_reqs)
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let iterations: u32 = match args.next().map(|a| a.parse()) {
        None => 16,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("engine: ITERATIONS must be a number: {e}");
            return ExitCode::from(2);
        }
    };
    let config = match args.next() {
        Some(spec) => ProfilerConfig::from_spec(&spec, "the command line"),
        None => ProfilerConfig::from_env().and_then(|c| match c {
            Some(c) => Ok(c),
            None => {
                ProfilerConfig::from_json_str(r#"{"delay_iterations": 3, "max_iterations": 4}"#)
            }
        }),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("engine: {e}");
            return ExitCode::from(2);
        }
    };

    let recorder = Recorder::default();
    let profiler = Arc::new(WorkerProfiler::with_backend(
        &config,
        "engine-rank0",
        Box::new(recorder.clone()),
    ));
    println!(
        "toy engine: {iterations} iterations, delay_iterations={} max_iterations={}",
        config.delay_iterations, config.max_iterations
    );

    // The control thread sends the start request once the engine has run two iterations.
    let (tick_tx, tick_rx) = mpsc::channel::<u32>();
    let control = {
        let profiler = Arc::clone(&profiler);
        std::thread::spawn(move || {
            while let Ok(i) = tick_rx.recv() {
                if i == 2 {
                    match profiler.start() {
                        Ok(outcome) => println!("  [control] start_profile -> {outcome:?}"),
                        Err(e) => println!("  [control] start_profile failed: {e}"),
                    }
                }
            }
        })
    };

    let mut scheduler = Scheduler {
        decoding: Vec::new(),
        next_prompt: 37,
    };
    println!("  step  stage    ctx_reqs(tokens)  gen_reqs(tokens)  captured");
    for i in 1..=iterations {
        let info = scheduler.schedule(i);
        let iteration = profiler.step(&info);
        println!(
            "  {:>4}  {:<7}  {:>8}({:>4})     {:>8}({:>4})     {}",
            profiler.step_index(),
            info.stage().as_str(),
            info.num_ctx_reqs,
            info.num_ctx_tokens,
            info.num_gen_reqs,
            info.num_gen_tokens,
            if iteration.is_captured() { "yes" } else { "" }
        );
        std::thread::sleep(Duration::from_millis(2)); // the model's forward pass
        drop(iteration);
        // Wait for the control thread to act on this tick, so the demo prints the same
        // output on every run.
        let _ = tick_tx.send(i);
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(tick_tx);
    let _ = control.join();
    if let Err(e) = profiler.shutdown() {
        eprintln!("engine: {e}");
    }

    println!();
    for event in recorder.events.lock().iter() {
        println!("{event}");
    }
    let captured = recorder.captured.lock();
    println!("captured {} iterations:", captured.len());
    for (step, name) in captured.iter() {
        println!("  step {step:>3}  {name}");
    }
    ExitCode::SUCCESS
}
