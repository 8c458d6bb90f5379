//! The CUDA backend and NVTX ranges, seen the way Nsight Systems would see them.
//!
//! Each scenario runs in a child process (this test binary, re-executed) whose environment
//! holds the stub driver on `LD_LIBRARY_PATH` and the NVTX recorder in `NVTX_INJECTION64_PATH`,
//! as nsys launches a program. Both doubles append to one log, so driver calls and NVTX events
//! come back in one total order. A fresh process per scenario also matters because the driver
//! library and NVTX's injection are loaded once per process.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use stepscope::{IterationInfo, ProfilerConfig, StartOptions, StartOutcome, WorkerProfiler};
use stepscope_test_doubles::{read_log, Event, CUDA_STUB_DIR, LOG_ENV, NVTX_RECORDER};

const SCENARIO_ENV: &str = "STEPSCOPE_TEST_SCENARIO";

/// The child's OS thread id (from /proc, to compare with the doubles' gettid()).
fn tid() -> u64 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

/// Counts for iteration `i` of the toy engine: every third a prefill, else decode.
fn iteration(i: u32) -> IterationInfo {
    if i % 3 == 1 {
        IterationInfo::new(1, 100 + i, i, i)
    } else {
        IterationInfo::new(0, 0, i, i)
    }
}

fn engine_loop(p: &WorkerProfiler, n: u32) {
    for i in 1..=n {
        let _iteration = p.step(&iteration(i));
        // the model's forward pass would run here
    }
}

fn profiler(json: &str) -> WorkerProfiler {
    let cfg = ProfilerConfig::from_json_str(json).expect("config");
    WorkerProfiler::new(&cfg, "rank0").expect("profiler")
}

/// Runs in the child: one scenario, reporting with `RESULT key=value` lines on stdout (one
/// pair a line; the value is the rest of the line).
fn child(scenario: &str) {
    println!("RESULT engine_tid={}", tid());
    match scenario {
        "capture" => {
            let p = profiler(r#"{"profiler": "cuda", "delay_iterations": 2, "max_iterations": 3}"#);
            p.start().unwrap();
            engine_loop(&p, 8);
            println!("RESULT active={}", p.is_active());
        }
        "stop_during_delay" => {
            let p = profiler(r#"{"profiler": "cuda", "delay_iterations": 5}"#);
            p.start().unwrap();
            engine_loop(&p, 2);
            p.stop().unwrap();
            engine_loop(&p, 6);
        }
        "start_failure" | "missing_driver" => {
            let p = profiler(r#"{"profiler": "cuda"}"#);
            match p.start() {
                Ok(o) => println!("RESULT start=ok {o:?}"),
                Err(e) => println!("RESULT start_error={e}"),
            }
            engine_loop(&p, 3);
            println!("RESULT active={}", p.is_active());
            println!("RESULT running={}", p.is_running());
            println!("RESULT stop={:?}", p.stop());
        }
        "no_context" => {
            let p = profiler(r#"{"profiler": "cuda", "max_iterations": 1}"#);
            let started = p.start();
            println!("RESULT start={started:?}");
            engine_loop(&p, 3);
        }
        "cross_thread" => {
            let p = Arc::new(profiler(r#"{"profiler": "cuda"}"#));
            engine_loop(&p, 1);
            let q = Arc::clone(&p);
            let outcome = std::thread::spawn(move || {
                println!("RESULT control_tid={}", tid());
                q.start_with(StartOptions::default()).unwrap()
            })
            .join()
            .unwrap();
            assert_eq!(outcome, StartOutcome::Deferred);
            engine_loop(&p, 2);
            let q = Arc::clone(&p);
            std::thread::spawn(move || q.stop().unwrap())
                .join()
                .unwrap();
            engine_loop(&p, 1);
        }
        "nvtx_always" => {
            let p = profiler(r#"{"stepscope": {"nvtx": "always", "nvtx_domain": "engine"}}"#);
            engine_loop(&p, 4);
        }
        "nvtx_off" => {
            let p = profiler(r#"{"profiler": "cuda", "stepscope": {"nvtx": "off"}}"#);
            p.start().unwrap();
            engine_loop(&p, 2);
            p.stop().unwrap();
        }
        "detailed" => {
            let p = profiler(r#"{"profiler": "cuda", "detailed_trace_annotation": true}"#);
            p.start().unwrap();
            let info = IterationInfo::new(1, 4, 2, 2).with_detail(stepscope::IterationDetail {
                ctx: stepscope::PhaseSums {
                    seq_len_sum: 4,
                    qq_compute: 16,
                    qk_compute: 16,
                },
                gen: stepscope::PhaseSums {
                    seq_len_sum: 17,
                    qq_compute: 2,
                    qk_compute: 17,
                },
            });
            drop(p.step(&info));
            p.stop().unwrap();
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
#[ignore = "entry point of the child processes the other tests start"]
fn scenario_child() {
    if let Ok(s) = std::env::var(SCENARIO_ENV) {
        child(&s);
    }
}

struct Run {
    events: Vec<Event>,
    results: Vec<(String, String)>,
}

impl Run {
    fn result(&self, key: &str) -> &str {
        self.results
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no RESULT {key}"))
    }
    fn cuda(&self) -> Vec<&Event> {
        self.events.iter().filter(|e| e.source == "cuda").collect()
    }
    /// The CUDA profiler API calls, in order.
    fn profiler_calls(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter(|e| e.source == "cuda" && e.name().starts_with("cuProfiler"))
            .map(Event::name)
            .collect()
    }
    fn nvtx(&self, name: &str) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| e.source == "nvtx" && e.name() == name)
            .collect()
    }
}

/// Runs `scenario` in a child process; `driver`: put the stub libcuda on the loader path. The
/// NVTX recorder is injected unless `env` sets `NVTX_INJECTION64_PATH` to "".
fn run(scenario: &str, driver: bool, env: &[(&str, &str)]) -> Run {
    let log = stepscope_test_doubles::log_path(scenario);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "scenario_child",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(SCENARIO_ENV, scenario)
    .env(LOG_ENV, &log)
    .env("NVTX_INJECTION64_PATH", NVTX_RECORDER)
    .env_remove("STEPSCOPE_STUB_CUDA_FAIL")
    .env_remove("STEPSCOPE_STUB_CUDA_NO_CONTEXT");
    let mut path = vec![];
    if driver {
        path.push(PathBuf::from(CUDA_STUB_DIR));
    }
    // Only the stub (or nothing) may be found: no system driver from the parent's path.
    cmd.env("LD_LIBRARY_PATH", std::env::join_paths(path).unwrap());
    for (k, v) in env {
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    let out = cmd.output().expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scenario {scenario} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let results = stdout
        .lines()
        // libtest may print "test scenario_child ... " before the child's first line.
        .filter_map(|l| l[l.find("RESULT ")? + 7..].split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let events = read_log(&log);
    let _ = std::fs::remove_file(&log);
    Run { events, results }
}

#[test]
fn delay_2_max_3_captures_iterations_2_to_4_inside_one_profiler_window() {
    let r = run("capture", true, &[]);
    assert_eq!(
        r.result("active"),
        "false",
        "stopped by itself with a full stop"
    );
    let engine: u64 = r.result("engine_tid").parse().unwrap();

    // Exactly one successful cuProfilerStart … cuProfilerStop window.
    let starts: Vec<usize> = positions(&r.events, |e| e.name() == "cuProfilerStart");
    let stops: Vec<usize> = positions(&r.events, |e| e.name() == "cuProfilerStop");
    assert_eq!((starts.len(), stops.len()), (1, 1), "{:#?}", r.events);
    let (start, stop) = (starts[0], stops[0]);
    assert!(start < stop);
    assert_eq!(r.events[start].arg(0), "0");
    assert_eq!(r.events[stop].arg(0), "0");

    // Inside it: exactly the ranges of iterations 2, 3, 4, balanced, with payload = step.
    let inside = &r.events[start..stop];
    let pushes: Vec<&Event> = inside.iter().filter(|e| e.name() == "push").collect();
    let pops = inside.iter().filter(|e| e.name() == "pop").count();
    assert_eq!(pops, pushes.len(), "balanced push/pop");
    let got: Vec<(&str, &str, &str, &str)> = pushes
        .iter()
        .map(|e| (e.arg(0), e.arg(1), e.arg(2), e.arg(3)))
        .collect();
    assert_eq!(
        got,
        [
            (
                "stepscope",
                "execute_context_0(0)_generation_2(2)",
                "2",
                "2"
            ),
            (
                "stepscope",
                "execute_context_0(0)_generation_3(3)",
                "3",
                "2"
            ),
            (
                "stepscope",
                "execute_context_1(104)_generation_4(4)",
                "4",
                "3"
            ),
        ],
        "(domain, message, payload, category)"
    );
    // No range outside the window (nvtx "running" is the default).
    assert_eq!(r.nvtx("push").len(), 3);
    // Categories named once, in the stepscope domain.
    let cats: Vec<(&str, &str)> = r
        .nvtx("name_category")
        .iter()
        .map(|e| (e.arg(1), e.arg(2)))
        .collect();
    assert_eq!(
        cats,
        [
            ("1", "prefill"),
            ("2", "decode"),
            ("3", "mixed"),
            ("4", "idle")
        ]
    );
    assert!(
        r.nvtx("register_string").is_empty(),
        "dynamic names are not registered"
    );
    // Capture marks inside the window, around the ranges.
    let marks: Vec<&str> = inside
        .iter()
        .filter(|e| e.name() == "mark")
        .map(|e| e.arg(1))
        .collect();
    assert_eq!(marks, ["capture start", "capture stop"]);
    let mark_steps: Vec<&str> = inside
        .iter()
        .filter(|e| e.name() == "mark")
        .map(|e| e.arg(2))
        .collect();
    assert_eq!(
        mark_steps,
        ["2", "5"],
        "started in step 2, stopped in step 5"
    );
    assert_eq!(
        inside[1].name(),
        "mark",
        "capture start right after cuProfilerStart"
    );
    let last_nvtx = inside.iter().rev().find(|e| e.source == "nvtx").unwrap();
    assert_eq!(
        last_nvtx.arg(1),
        "capture stop",
        "the last NVTX event of the window"
    );
    // Everything on the engine thread.
    assert!(r
        .events
        .iter()
        .filter(|e| e.name() != "injected")
        .all(|e| e.tid == engine));
}

#[test]
fn without_an_nvtx_tool_nothing_is_annotated_and_capture_still_works() {
    let r = run("capture", true, &[("NVTX_INJECTION64_PATH", "")]);
    assert!(
        r.events.iter().all(|e| e.source == "cuda"),
        "{:#?}",
        r.events
    );
    assert_eq!(r.profiler_calls(), ["cuProfilerStart", "cuProfilerStop"]);
}

#[test]
fn stop_during_delay_makes_no_driver_call() {
    let r = run("stop_during_delay", true, &[]);
    assert!(r.cuda().is_empty(), "{:#?}", r.cuda());
    assert!(r.nvtx("push").is_empty());
}

#[test]
fn start_failure_names_the_driver_error_and_leaves_the_session_active() {
    let r = run(
        "start_failure",
        true,
        &[("STEPSCOPE_STUB_CUDA_FAIL", "cuProfilerStart:5")],
    );
    let err = r.result("start_error");
    assert!(
        err.contains("cuProfilerStart failed: CUDA_ERROR_PROFILER_DISABLED"),
        "{err}"
    );
    assert_eq!(r.result("active"), "true");
    assert_eq!(r.result("running"), "false");
    assert_eq!(r.result("stop"), "Ok(Disarmed)");
    let stops = r
        .cuda()
        .iter()
        .filter(|e| e.name() == "cuProfilerStop")
        .count();
    assert_eq!(stops, 0, "a session that never ran is not stopped");
    assert!(r.nvtx("push").is_empty() && r.nvtx("mark").is_empty());
}

#[test]
fn missing_driver_is_a_clear_error_not_a_panic() {
    let r = run("missing_driver", false, &[]);
    let err = r.result("start_error");
    assert!(err.starts_with("profiler 'cuda'"), "{err}");
    assert!(
        err.contains("needs the NVIDIA driver (libcuda.so)"),
        "{err}"
    );
    assert!(err.contains("LD_LIBRARY_PATH"), "{err}");
    assert_eq!(r.result("active"), "true");
    assert!(r.cuda().is_empty());
}

#[test]
fn without_a_current_context_the_primary_context_is_retained_and_set() {
    let r = run(
        "no_context",
        true,
        &[("STEPSCOPE_STUB_CUDA_NO_CONTEXT", "1")],
    );
    assert_eq!(r.result("start"), "Ok(Started)");
    let calls: Vec<String> = r
        .cuda()
        .iter()
        .map(|e| format!("{} {}", e.name(), e.fields[1..].join(" ")))
        .collect();
    assert_eq!(
        calls[..6],
        [
            "cuInit 0",
            "cuCtxGetCurrent 0 none",
            "cuDeviceGet 0 0",
            "cuDevicePrimaryCtxRetain 0 0",
            "cuCtxSetCurrent 0 primary",
            "cuProfilerStart 0",
        ]
    );
    // The stop finds the context current now and retains nothing more.
    assert_eq!(
        calls[6..],
        ["cuCtxGetCurrent 0 context", "cuProfilerStop 0"]
    );
}

#[test]
fn cross_thread_start_and_stop_call_the_driver_on_the_engine_thread() {
    let r = run("cross_thread", true, &[]);
    let engine: u64 = r.result("engine_tid").parse().unwrap();
    let control: u64 = r.result("control_tid").parse().unwrap();
    assert_ne!(engine, control);
    assert_eq!(r.profiler_calls(), ["cuProfilerStart", "cuProfilerStop"]);
    assert!(r.cuda().iter().all(|e| e.tid == engine), "{:#?}", r.cuda());
    // The two iterations stepped while running are annotated, with steps 2 and 3.
    let payloads: Vec<&str> = r.nvtx("push").iter().map(|e| e.arg(2)).collect();
    assert_eq!(payloads, ["2", "3"]);
}

#[test]
fn nvtx_always_annotates_every_iteration_without_a_backend() {
    let r = run("nvtx_always", true, &[]);
    let pushes = r.nvtx("push");
    let got: Vec<(&str, &str)> = pushes.iter().map(|e| (e.arg(0), e.arg(2))).collect();
    assert_eq!(
        got,
        [
            ("engine", "1"),
            ("engine", "2"),
            ("engine", "3"),
            ("engine", "4")
        ]
    );
    assert_eq!(r.nvtx("pop").len(), 4);
    assert!(r.cuda().is_empty());
    assert!(r.nvtx("mark").is_empty(), "nothing was captured");
}

#[test]
fn nvtx_off_leaves_only_the_profiler_window() {
    let r = run("nvtx_off", true, &[]);
    assert!(r.nvtx("push").is_empty() && r.nvtx("mark").is_empty());
    assert!(
        r.nvtx("domain_create").is_empty(),
        "no domain is even created"
    );
    assert_eq!(r.profiler_calls(), ["cuProfilerStart", "cuProfilerStop"]);
}

#[test]
fn detailed_annotation_names_reach_nsys_byte_for_byte() {
    let r = run("detailed", true, &[]);
    let msgs: Vec<&str> = r.nvtx("push").iter().map(|e| e.arg(1)).collect();
    assert_eq!(
        msgs,
        ["execute_6_context_1(sq4sk4sqsq16sqsk16)_generation_2(sq2sk17sqsq2sqsk17)"]
    );
    // Mixed stage: category 3.
    assert_eq!(r.nvtx("push")[0].arg(3), "3");
}

fn positions(events: &[Event], pred: impl Fn(&Event) -> bool) -> Vec<usize> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| pred(e))
        .map(|(i, _)| i)
        .collect()
}
