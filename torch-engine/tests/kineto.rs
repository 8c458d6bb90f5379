//! The torch (Kineto) backend against real libtorch, profiling the toy engine's CPU work.
//!
//! Kineto is one profiler per process, so the tests take a lock; scenarios that change the
//! process (a file size limit) run in a child process.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use serde_json::Value;
use stepscope::{Error, ProfilerConfig, StartOptions, WorkerProfiler};
use stepscope_test_doubles::{same_json, Scratch};
use stepscope_torch_engine::ToyEngine;

static KINETO: Mutex<()> = Mutex::new(());

const LAYERS: usize = 3;

fn lock() -> std::sync::MutexGuard<'static, ()> {
    KINETO.lock().unwrap_or_else(|e| e.into_inner())
}

fn fresh_dir(name: &str) -> Scratch {
    Scratch::absent(&format!("kineto-{name}"))
}

fn config(dir: &Path, extra: &str) -> ProfilerConfig {
    let text = format!(
        r#"{{"profiler": "torch", "torch_profiler_dir": {dir:?}, "torch_profiler_with_stack": false{extra}}}"#,
        dir = dir.to_str().unwrap()
    );
    ProfilerConfig::from_json_str(&text).unwrap()
}

fn engine() -> ToyEngine {
    ToyEngine::new(LAYERS, 32)
}

fn flush(p: &WorkerProfiler) {
    assert!(
        p.flush(Duration::from_secs(120)).unwrap(),
        "traces not written in time"
    );
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn with_suffix(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|n| n.ends_with(suffix))
        .map(|n| dir.join(n))
        .collect()
}

fn read_json(path: &Path) -> Value {
    let bytes = fs::read(path).unwrap();
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut s)
            .unwrap_or_else(|e| panic!("{} is not valid gzip: {e}", path.display()));
        s
    } else {
        String::from_utf8(bytes).unwrap()
    };
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The one trace in `dir` and its manifest.
fn only_trace(dir: &Path, suffix: &str) -> (Value, Value) {
    let traces = with_suffix(dir, suffix);
    assert_eq!(traces.len(), 1, "expected one trace in {:?}", files(dir));
    let manifests = with_suffix(dir, ".stepscope.json");
    assert_eq!(
        manifests.len(),
        1,
        "expected one manifest in {:?}",
        files(dir)
    );
    (read_json(&traces[0]), read_json(&manifests[0]))
}

struct Span {
    name: String,
    ts: f64,
    end: f64,
    tid: i64,
}

fn spans(trace: &Value, cat: &str) -> Vec<Span> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == cat)
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            Span {
                name: e["name"].as_str().unwrap().to_string(),
                ts,
                end: ts + e["dur"].as_f64().unwrap_or(0.0),
                tid: e["tid"].as_i64().unwrap_or(-1),
            }
        })
        .collect()
}

/// The iteration annotations in start order.
fn iterations(trace: &Value) -> Vec<Span> {
    let mut v: Vec<Span> = spans(trace, "user_annotation")
        .into_iter()
        .filter(|s| s.name.starts_with("execute_"))
        .collect();
    v.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    v
}

fn mm_inside(trace: &Value, it: &Span) -> usize {
    spans(trace, "cpu_op")
        .iter()
        .filter(|s| s.name == "aten::mm" && s.ts >= it.ts && s.end <= it.end)
        .count()
}

fn expected_name(step: u64) -> String {
    ToyEngine::batch(step).name(false)
}

fn no_temporaries(dir: &Path) {
    let hidden: Vec<String> = files(dir)
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "temporary files left: {hidden:?}");
}

#[test]
fn delay_3_max_2_captures_iterations_3_and_4_with_their_ops() {
    let _k = lock();
    let dir = fresh_dir("delay3");
    let e = engine();
    let p = WorkerProfiler::new(
        &config(&dir, r#", "delay_iterations": 3, "max_iterations": 2"#),
        "w0",
    )
    .unwrap();
    p.start().unwrap();
    for step in 1..=10 {
        e.iteration(&p, step);
    }
    assert!(!p.is_active());
    flush(&p);
    let (trace, manifest) = only_trace(&dir, ".pt.trace.json.gz");
    let its = iterations(&trace);
    let names: Vec<&str> = its.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, [expected_name(3), expected_name(4)]);
    for it in &its {
        assert_eq!(
            mm_inside(&trace, it),
            LAYERS,
            "aten::mm ops inside {}",
            it.name
        );
    }
    // Work outside the captured iterations is not in the trace.
    let all_mm = spans(&trace, "cpu_op")
        .iter()
        .filter(|s| s.name == "aten::mm")
        .count();
    assert_eq!(all_mm, 2 * LAYERS);
    assert_eq!(manifest["status"], "complete");
    assert_eq!(manifest["first_step"], 3);
    assert_eq!(manifest["last_step"], 4);
    assert_eq!(manifest["iterations"], 2);
    // The trace carries the same facts as metadata.
    let meta: Value = match &trace["stepscope"] {
        Value::String(s) => serde_json::from_str(s).unwrap(),
        v => v.clone(),
    };
    assert_eq!(
        meta["first_step"], 3,
        "trace metadata: {}",
        trace["stepscope"]
    );
    assert_eq!(meta["last_step"], 4);
    assert_eq!(meta["worker_name"], "w0");
    assert_eq!(meta["version"], stepscope::VERSION);
    // The manifest's summary, computed as the trace streamed to disk, is what a reading of
    // the finished file gives, and it describes the capture.
    let summary = &manifest["summary"];
    let trace_path = dir.join(manifest["trace_file"].as_str().unwrap());
    let mut sink = stepscope::trace::Summarizer::new();
    let read = stepscope::trace::EventStream::new()
        .read_all(
            flate2::read::GzDecoder::new(fs::File::open(&trace_path).unwrap()),
            &mut sink,
        )
        .unwrap();
    let from_file = serde_json::to_value(sink.finish(read, 20)).unwrap();
    assert!(
        same_json(summary, &from_file),
        "the manifest's summary is the file's:\n{summary}\n{from_file}"
    );
    let steps = summary["steps"].as_array().unwrap();
    let step_names: Vec<&str> = steps.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(step_names, [expected_name(3), expected_name(4)]);
    for s in steps {
        let (cpu, wall) = (
            s["cpu_op_us"].as_f64().unwrap(),
            s["dur_us"].as_f64().unwrap(),
        );
        assert!(
            cpu > 0.0 && cpu <= wall,
            "CPU op time {cpu} within the step's {wall}"
        );
    }
    let mm = summary["cpu_ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "aten::mm")
        .unwrap_or_else(|| panic!("aten::mm among the top ops: {}", summary["cpu_ops"]));
    assert_eq!(mm["count"], 2 * LAYERS);
    assert_eq!(
        summary["kernels"]["count"], 0,
        "a CPU capture has no kernels"
    );
    no_temporaries(&dir);
}

#[test]
fn delay_0_then_immediate_stop_writes_an_empty_session() {
    let _k = lock();
    let dir = fresh_dir("immediate");
    let p = WorkerProfiler::new(&config(&dir, ""), "w0").unwrap();
    p.start().unwrap();
    assert!(p.is_running());
    p.stop().unwrap();
    flush(&p);
    let (trace, manifest) = only_trace(&dir, ".pt.trace.json.gz");
    assert!(iterations(&trace).is_empty());
    assert_eq!(manifest["status"], "complete");
    assert_eq!(manifest["iterations"], 0);
    assert_eq!(manifest["first_step"], Value::Null);
    no_temporaries(&dir);
}

#[test]
fn stop_during_delay_writes_nothing() {
    let _k = lock();
    let dir = fresh_dir("delaystop");
    let e = engine();
    let p = WorkerProfiler::new(&config(&dir, r#", "delay_iterations": 5"#), "w0").unwrap();
    p.start().unwrap();
    for step in 1..=3 {
        e.iteration(&p, step);
    }
    p.stop().unwrap();
    for step in 4..=8 {
        e.iteration(&p, step);
    }
    flush(&p);
    assert_eq!(files(&dir), Vec::<String>::new());
}

#[test]
fn repeated_sessions_write_separate_traces() {
    let _k = lock();
    let dir = fresh_dir("repeat");
    let e = engine();
    let p = WorkerProfiler::new(&config(&dir, r#", "max_iterations": 1"#), "w0").unwrap();
    let mut step = 0;
    for _ in 0..3 {
        p.start().unwrap();
        for _ in 0..3 {
            step += 1;
            e.iteration(&p, step);
        }
        assert!(!p.is_active(), "max_iterations ends each session");
    }
    flush(&p);
    let traces = with_suffix(&dir, ".pt.trace.json.gz");
    let manifests = with_suffix(&dir, ".stepscope.json");
    assert_eq!(traces.len(), 3, "{:?}", files(&dir));
    assert_eq!(manifests.len(), 3);
    let mut firsts: Vec<u64> = manifests
        .iter()
        .map(|m| read_json(m)["first_step"].as_u64().unwrap())
        .collect();
    firsts.sort();
    assert_eq!(firsts, [1, 4, 7]);
    for t in &traces {
        let trace = read_json(t);
        let its = iterations(&trace);
        assert_eq!(its.len(), 1, "{}", t.display());
        assert_eq!(mm_inside(&trace, &its[0]), LAYERS);
    }
    no_temporaries(&dir);
}

#[test]
fn gzip_off_writes_plain_json_and_the_manifest_matches_the_file() {
    let _k = lock();
    let dir = fresh_dir("plain");
    let e = engine();
    let p = WorkerProfiler::with_local_rank(
        &config(
            &dir,
            r#", "torch_profiler_use_gzip": false, "max_iterations": 2"#,
        ),
        "worker-7",
        3,
    )
    .unwrap();
    p.start().unwrap();
    for step in 1..=4 {
        e.iteration(&p, step);
    }
    flush(&p);
    assert!(with_suffix(&dir, ".gz").is_empty());
    let (trace, m) = only_trace(&dir, ".pt.trace.json");
    assert_eq!(iterations(&trace).len(), 2);
    let trace_file = m["trace_file"].as_str().unwrap();
    let path = dir.join(trace_file);
    assert!(trace_file.starts_with("worker-7.") && trace_file.ends_with(".pt.trace.json"));
    let stem = trace_file.trim_end_matches(".pt.trace.json");
    assert!(dir.join(format!("{stem}.stepscope.json")).exists());
    assert_eq!(m["trace_bytes"], fs::metadata(&path).unwrap().len());
    assert_eq!(m["json_bytes"], m["trace_bytes"]);
    assert_eq!(m["status"], "complete");
    assert_eq!(m["error"], Value::Null);
    assert_eq!(m["backend"], "torch");
    assert_eq!(m["worker_name"], "worker-7");
    assert_eq!(m["local_rank"], 3);
    assert_eq!(m["stepscope_version"], stepscope::VERSION);
    assert_eq!(
        (m["first_step"].clone(), m["last_step"].clone()),
        (1.into(), 2.into())
    );
    assert_eq!(m["config"]["profiler"], "torch");
    assert_eq!(m["config"]["max_iterations"], 2);
    assert_eq!(m["config"]["torch_profiler_use_gzip"], false);
    assert!(m["writer_seconds"].as_f64().unwrap() > 0.0);
    let (start, stop) = (
        m["start_time_unix_ns"].as_u64().unwrap(),
        m["stop_time_unix_ns"].as_u64().unwrap(),
    );
    assert!(start > 0 && start <= stop);
    assert!(
        trace_file.contains(&stop.to_string()),
        "named by the stop time"
    );
    // CPU only: the table is sorted by self CPU time, as vLLM does without a device.
    let table = fs::read_to_string(dir.join("worker-7.profiler_out.txt")).unwrap();
    assert_eq!(m["summary_file"], "worker-7.profiler_out.txt");
    assert!(
        table.contains("aten::mm") && table.contains("Self CPU time total"),
        "{table}"
    );
    no_temporaries(&dir);
}

#[test]
fn gzip_level_sets_how_hard_the_trace_is_compressed() {
    let _k = lock();
    let e = engine();
    // JSON bytes per trace byte, at each level, for the same 40 iterations.
    let ratio = |level: u32| {
        let dir = fresh_dir(&format!("gzip-{level}"));
        let extra = format!(r#", "max_iterations": 40, "stepscope": {{"gzip_level": {level}}}"#);
        let p = WorkerProfiler::new(&config(&dir, &extra), "w0").unwrap();
        p.start().unwrap();
        for step in 1..=41 {
            e.iteration(&p, step);
        }
        flush(&p);
        let (trace, m) = only_trace(&dir, ".pt.trace.json.gz");
        assert_eq!(iterations(&trace).len(), 40);
        assert_eq!(m["status"], "complete");
        assert_eq!(m["config"]["stepscope"]["gzip_level"], level);
        no_temporaries(&dir);
        m["json_bytes"].as_f64().unwrap() / m["trace_bytes"].as_f64().unwrap()
    };
    let (fast, small) = (ratio(1), ratio(9));
    assert!(
        small > fast * 1.1,
        "level 9 compressed {small:.1}x, level 1 {fast:.1}x"
    );
}

#[test]
fn warmup_steps_are_discarded_and_not_counted() {
    let _k = lock();
    let dir = fresh_dir("warmup");
    let e = engine();
    let p = WorkerProfiler::new(
        &config(
            &dir,
            r#", "warmup_iterations": 2, "active_iterations": 2, "max_iterations": 2"#,
        ),
        "w0",
    )
    .unwrap();
    p.start().unwrap();
    for step in 1..=6 {
        e.iteration(&p, step);
    }
    flush(&p);
    let (trace, manifest) = only_trace(&dir, ".pt.trace.json.gz");
    let names: Vec<String> = iterations(&trace).into_iter().map(|s| s.name).collect();
    // Start consumes warmup step 0; iteration 1 is the other warmup step; 2 and 3 record.
    assert_eq!(names, [expected_name(2), expected_name(3)]);
    assert_eq!(manifest["first_step"], 2);
    assert_eq!(manifest["iterations"], 2);
}

#[test]
fn a_start_from_another_thread_acts_on_the_engine_thread() {
    let _k = lock();
    let dir = fresh_dir("cross");
    let p = WorkerProfiler::new(&config(&dir, r#", "max_iterations": 3"#), "w0").unwrap();
    let engine_tid = thread::scope(|s| {
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let p = &p;
        let engine = s.spawn(move || {
            let e = engine();
            let tid = os_tid();
            for step in 1..=40 {
                e.iteration(p, step);
                if step == 5 {
                    started_rx.recv().unwrap();
                }
            }
            tid
        });
        // Wait until the engine thread has stepped (and so is known), then start from here.
        while p.step_index() < 5 {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(p.start(), Ok(stepscope::StartOutcome::Deferred));
        started_tx.send(()).unwrap();
        engine.join().unwrap()
    });
    flush(&p);
    let (trace, _) = only_trace(&dir, ".pt.trace.json.gz");
    let its = iterations(&trace);
    assert_eq!(its.len(), 3);
    for it in &its {
        assert_eq!(
            it.tid, engine_tid,
            "annotation recorded on the engine thread"
        );
        assert_eq!(
            mm_inside(&trace, it),
            LAYERS,
            "the engine's ops were recorded"
        );
    }
    assert_ne!(engine_tid, os_tid());
}

fn os_tid() -> i64 {
    // "/proc/thread-self" links to "<pid>/task/<tid>".
    let link = fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

#[test]
fn bad_directories_are_errors_naming_the_path() {
    let _k = lock();
    let base = fresh_dir("baddir");
    fs::create_dir_all(&base).unwrap();
    let file = base.join("a-file");
    fs::write(&file, "x").unwrap();
    let under_file = file.join("traces");
    let err = WorkerProfiler::new(&config(&under_file, ""), "w0").unwrap_err();
    match &err {
        Error::Io { path, .. } => assert_eq!(path, &under_file),
        other => panic!("expected an Io error, got {other:?}"),
    }
    assert!(
        err.to_string().contains(under_file.to_str().unwrap()),
        "{err}"
    );

    let uri = ProfilerConfig::from_json_str(
        r#"{"profiler": "torch", "torch_profiler_dir": "s3://bucket/traces"}"#,
    )
    .unwrap();
    let err = WorkerProfiler::new(&uri, "w0").unwrap_err();
    assert_eq!(err.field(), Some("torch_profiler_dir"), "{err}");
    assert!(err.to_string().contains("s3://bucket/traces"), "{err}");

    // The directory vanishing (replaced by a file) after construction fails the start, and
    // the session stays active and not running, as vLLM leaves a failed start.
    let dir = base.join("gone");
    let p = WorkerProfiler::new(&config(&dir, ""), "w0").unwrap();
    fs::remove_dir_all(&dir).unwrap();
    fs::write(&dir, "not a directory").unwrap();
    let err = p.start().unwrap_err();
    assert!(err.to_string().contains(dir.to_str().unwrap()), "{err}");
    assert!(p.is_active() && !p.is_running());
    p.stop().unwrap();
}

#[test]
fn a_second_profiler_on_the_same_thread_fails_to_start_visibly() {
    let _k = lock();
    let dir = fresh_dir("twice");
    let a = WorkerProfiler::new(&config(&dir, ""), "a").unwrap();
    let b = WorkerProfiler::new(&config(&dir, ""), "b").unwrap();
    a.start().unwrap();
    let err = b.start().unwrap_err();
    assert!(
        matches!(&err, Error::Backend { backend, .. } if backend == "torch"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("already running on this thread"),
        "{err}"
    );
    assert!(b.is_active() && !b.is_running());
    b.stop().unwrap();
    a.stop().unwrap();
    flush(&a);
    assert_eq!(with_suffix(&dir, ".pt.trace.json.gz").len(), 1);
}

#[test]
fn dropping_before_the_write_ends_marks_the_manifest_unfinished() {
    let _k = lock();
    let dir = fresh_dir("unfinished");
    let p = WorkerProfiler::new(
        &config(&dir, r#", "stepscope": {"flush_timeout_s": 0}"#),
        "w0",
    )
    .unwrap();
    p.start().unwrap();
    {
        // Enough ops that writing takes far longer than returning from drop.
        let x = tch::Tensor::ones([4, 4], (tch::Kind::Float, tch::Device::Cpu));
        let _it = p.step(&ToyEngine::batch(1));
        for _ in 0..20_000 {
            let _ = &x + &x;
        }
    }
    p.stop().unwrap();
    drop(p);
    let manifest = with_suffix(&dir, ".stepscope.json");
    assert_eq!(manifest.len(), 1);
    let m = read_json(&manifest[0]);
    assert_eq!(m["status"], "unfinished", "{m}");
    assert!(m["error"].as_str().unwrap().contains("flush_timeout_s"));
    // The writer carries on in the background and completes the record.
    for _ in 0..1200 {
        if read_json(&manifest[0])["status"] == "complete" {
            no_temporaries(&dir);
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "the background write never completed: {}",
        read_json(&manifest[0])
    );
}

/// A write failure (here the file size limit, as a full disk would) fails the trace in its
/// manifest; the engine keeps stepping. Runs in a child process: the limit is per process.
/// Runs `test` again in a child process whose writes fail past 64 KiB (EFBIG): the trace's
/// write fails, the engine goes on. The child leaves its files in the returned directory.
fn in_child_with_a_full_disk(
    test: &str,
    name: &str,
    gzip: bool,
    serializer: &str,
) -> Option<Scratch> {
    const CHILD: &str = "STEPSCOPE_KINETO_CHILD_DIR";
    if let Ok(dir) = std::env::var(CHILD) {
        // SAFETY: plain libc calls on this (child) process: ignore SIGXFSZ so an oversized write
        // fails with EFBIG instead of killing us, cap file sizes at 64 KiB, and take SIGPIPE's
        // default action back (Rust ignores it; a C or C++ engine does not).
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let lim = libc::rlimit {
                rlim_cur: 64 * 1024,
                rlim_max: 64 * 1024,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
        let dir = PathBuf::from(dir);
        let extra = format!(
            r#", "torch_profiler_use_gzip": {gzip}, "stepscope": {{"serializer": "{serializer}"}}"#
        );
        let p = WorkerProfiler::new(&config(&dir, &extra), "w0").unwrap();
        let x = tch::Tensor::ones([4, 4], (tch::Kind::Float, tch::Device::Cpu));
        p.start_with(StartOptions::default()).unwrap();
        {
            let _it = p.step(&ToyEngine::batch(1));
            // Enough ops for a trace well past 64 KiB, compressed or not.
            for _ in 0..60_000 {
                let _ = &x + &x;
            }
        }
        p.stop().unwrap();
        flush(&p);
        let e = engine();
        for step in 2..=5 {
            e.iteration(&p, step);
        }
        assert_eq!(p.step_index(), 5);
        return None;
    }
    let dir = fresh_dir(name);
    run_child(test, CHILD, &dir);
    Some(dir)
}

/// Runs this binary's test `test` in a child process with `var` set to `dir` (the test does
/// its child's part when it finds `var`), and checks that the child passed.
fn run_child(test: &str, var: &str, dir: &Path) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(var, dir.as_os_str())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The one manifest in `dir`, which says `failed` with an error containing `text`.
fn only_manifest_failed_with(dir: &Path, text: &str) -> Value {
    let manifest = with_suffix(dir, ".stepscope.json");
    assert_eq!(manifest.len(), 1, "{:?}", files(dir));
    let m = read_json(&manifest[0]);
    assert_eq!(m["status"], "failed", "{m}");
    assert!(m["error"].as_str().unwrap().contains(text), "{m}");
    m
}

/// `test` (this binary's test of that name) with a full disk and `serializer`: the manifest says
/// `failed` with `message`, no trace has the final name, no temporary is left.
fn a_full_disk_fails_the_trace(test: &str, name: &str, serializer: &str, message: &str) {
    let _k = (std::env::var_os("STEPSCOPE_KINETO_CHILD_DIR").is_none()).then(lock);
    let Some(dir) = in_child_with_a_full_disk(test, name, false, serializer) else {
        return;
    };
    only_manifest_failed_with(&dir, message);
    assert!(
        with_suffix(&dir, ".pt.trace.json").is_empty(),
        "no trace under the final name"
    );
    no_temporaries(&dir);
}

/// stepscope's serializer sees its write fail and says so.
#[test]
fn a_failed_write_is_reported_in_the_manifest_and_the_engine_goes_on() {
    a_full_disk_fails_the_trace(
        "a_failed_write_is_reported_in_the_manifest_and_the_engine_goes_on",
        "efbig",
        "stepscope",
        "File too large",
    );
}

/// Kineto's own writer fails silently (its ofstream): the writer finds the trace incomplete.
#[test]
fn a_failed_write_by_kinetos_own_writer_is_reported_in_the_manifest() {
    a_full_disk_fails_the_trace(
        "a_failed_write_by_kinetos_own_writer_is_reported_in_the_manifest",
        "efbig-kineto",
        "kineto",
        "the disk is full or the write failed",
    );
}

/// The gzip stream fails while Kineto is still writing into the pipe: the pump keeps draining
/// it, so Kineto never writes into a closed pipe (SIGPIPE, whose default action the child
/// takes back, would end it); the manifest says why.
#[test]
fn a_failed_gzip_stream_is_reported_and_kineto_never_writes_into_a_closed_pipe() {
    let test = "a_failed_gzip_stream_is_reported_and_kineto_never_writes_into_a_closed_pipe";
    let _k = (std::env::var_os("STEPSCOPE_KINETO_CHILD_DIR").is_none()).then(lock);
    let Some(dir) = in_child_with_a_full_disk(test, "efbig-gz", true, "stepscope") else {
        return;
    };
    only_manifest_failed_with(&dir, "compressing the trace");
    assert!(with_suffix(&dir, ".gz").is_empty(), "{:?}", files(&dir));
    no_temporaries(&dir);
}

#[test]
fn leftovers_of_a_dead_process_are_cleaned_at_the_next_start() {
    let _k = lock();
    let dir = fresh_dir("stale");
    fs::create_dir_all(&dir).unwrap();
    // A process that has certainly ended: a child we ran and reaped.
    let dead = std::process::Command::new("true")
        .spawn()
        .and_then(|mut c| c.wait().map(|_| c.id()))
        .unwrap();
    let live = std::process::id();
    let stale = [
        format!(".w1.1.pt.trace.json.gz.{dead}.partial"),
        format!(".w1.1.pt.trace.json.gz.{dead}.partial.json"),
        format!(".w1.1.stepscope.json.{dead}.partial"),
        // The start's check that the directory is writable, killed before it removed its file.
        format!(".stepscope-probe.{dead}.partial"),
    ];
    let kept = format!(".w2.1.pt.trace.json.gz.{live}.partial");
    for name in stale.iter().chain([&kept]) {
        fs::write(dir.join(name), "{").unwrap();
    }
    let orphan = dir.join("w1.1.stepscope.json");
    fs::write(
        &orphan,
        format!(
            "{{\n  \"stepscope_version\": \"0.1.0\",\n  \"status\": \"writing\",\n  \
             \"error\": null,\n  \"backend\": \"torch\",\n  \"pid\": {dead}\n}}\n"
        ),
    )
    .unwrap();
    let p = WorkerProfiler::new(&config(&dir, ""), "w0").unwrap();
    p.start().unwrap();
    p.stop().unwrap();
    flush(&p);
    // The clean-up runs on a thread of its own, off the engine thread.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while files(&dir).iter().any(|n| stale.contains(n)) || read_json(&orphan)["status"] == "writing"
    {
        assert!(std::time::Instant::now() < deadline, "{:?}", files(&dir));
        thread::sleep(Duration::from_millis(20));
    }
    let m = read_json(&orphan);
    assert_eq!(m["status"], "unfinished");
    assert!(m["error"]
        .as_str()
        .unwrap()
        .contains(&format!("process {dead} ended")));
    assert!(
        files(&dir).contains(&kept),
        "a live process's file was removed"
    );
}

#[test]
fn the_trace_header_has_torchs_keys_and_the_engines() {
    let _k = lock();
    let dir = fresh_dir("header");
    let e = engine();
    let p = WorkerProfiler::new(
        &config(&dir, r#", "torch_profiler_record_shapes": true"#),
        "w0",
    )
    .unwrap();
    p.set_trace_metadata("engine_version", r#""1.2.3""#)
        .unwrap();
    p.set_trace_metadata("engine_version", r#""1.2.4""#)
        .unwrap();
    let err = p.set_trace_metadata("bad", "{not json").unwrap_err();
    assert!(err.to_string().contains("`bad`"), "{err}");
    p.start().unwrap();
    e.iteration(&p, 1);
    p.stop().unwrap();
    flush(&p);
    let (trace, manifest) = only_trace(&dir, ".pt.trace.json.gz");
    assert_eq!(trace["engine_version"], "1.2.4");
    assert_eq!(trace["record_shapes"], 1);
    assert!(trace.get("with_stack").is_none(), "with_stack was off");
    let id = trace["trace_id"].as_str().unwrap();
    assert!(
        id.len() == 32
            && id
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_lowercase()),
        "{id}"
    );
    // The JSON Kineto streamed through the pipe, all of it.
    let json_len = serde_json::to_vec(&trace).unwrap().len() as u64;
    assert!(
        manifest["json_bytes"].as_u64().unwrap() >= json_len / 2,
        "{manifest}"
    );
    assert_eq!(manifest["pid"], std::process::id());
    no_temporaries(&dir);
}

#[test]
fn a_stage_filter_pauses_kineto_over_the_other_stages() {
    let _k = lock();
    let dir = fresh_dir("stages");
    let e = engine();
    // The toy engine's step 1 and 5 are mixed, the rest decode.
    let p = WorkerProfiler::new(
        &config(
            &dir,
            r#", "max_iterations": 3, "stepscope": {"stages": ["decode"]}"#,
        ),
        "w0",
    )
    .unwrap();
    p.start().unwrap();
    for step in 1..=8 {
        e.iteration(&p, step);
    }
    flush(&p);
    let (trace, manifest) = only_trace(&dir, ".pt.trace.json.gz");
    let its = iterations(&trace);
    let names: Vec<&str> = its.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, [2, 3, 4].map(expected_name));
    let all_mm = spans(&trace, "cpu_op")
        .iter()
        .filter(|s| s.name == "aten::mm")
        .count();
    assert_eq!(all_mm, 3 * LAYERS, "no op of the paused mixed step 5");
    assert_eq!(manifest["first_step"], 2);
    assert_eq!(manifest["last_step"], 4);
    no_temporaries(&dir);
}

#[test]
fn repeated_windows_each_write_their_own_trace_and_manifest() {
    let _k = lock();
    let dir = fresh_dir("repeat");
    let e = engine();
    let p = WorkerProfiler::new(
        &config(
            &dir,
            r#", "delay_iterations": 2, "max_iterations": 1, "torch_profiler_use_gzip": false,
               "stepscope": {"repeat": 3, "repeat_every": 4}"#,
        ),
        "w0",
    )
    .unwrap();
    p.start().unwrap();
    for step in 1..=12 {
        e.iteration(&p, step);
    }
    flush(&p);
    let mut firsts: Vec<u64> = with_suffix(&dir, ".stepscope.json")
        .iter()
        .map(|m| read_json(m)["first_step"].as_u64().unwrap())
        .collect();
    firsts.sort_unstable();
    assert_eq!(firsts, [2, 6, 10]);
    for t in with_suffix(&dir, ".pt.trace.json") {
        assert_eq!(iterations(&read_json(&t)).len(), 1);
    }
    no_temporaries(&dir);
}

#[test]
fn a_stop_while_paused_leaves_the_next_session_recording() {
    let _k = lock();
    let dir = fresh_dir("stop-paused");
    let e = engine();
    let p = WorkerProfiler::new(
        &config(
            &dir,
            r#", "torch_profiler_use_gzip": false, "stepscope": {"stages": ["decode"]}"#,
        ),
        "w0",
    )
    .unwrap();
    // Step 1 mixed (waits), 2 decode (captured), 5 mixed (paused): stop there.
    p.start().unwrap();
    for step in 1..=5 {
        e.iteration(&p, step);
    }
    assert_eq!(p.phase(), stepscope::schedule::Phase::Paused);
    p.stop().unwrap();
    p.start().unwrap();
    for step in 6..=7 {
        e.iteration(&p, step);
    }
    p.stop().unwrap();
    flush(&p);
    let mut traces: Vec<Value> = with_suffix(&dir, ".pt.trace.json")
        .iter()
        .map(|t| read_json(t))
        .collect();
    traces.sort_by_key(|t| iterations(t).first().map(|s| s.ts as i64));
    assert_eq!(traces.len(), 2);
    let second = &traces[1];
    let its = iterations(second);
    assert_eq!(its.len(), 2, "steps 6 and 7 are decode");
    for it in &its {
        assert_eq!(
            mm_inside(second, it),
            LAYERS,
            "ops recorded after a paused stop"
        );
    }
}

/// The threads a task's CPUs list names, by thread name (Linux's /proc).
fn thread_cpus(name: &str) -> Vec<String> {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| {
            let status = fs::read_to_string(t.path().join("status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|l| l.trim().to_string())
        })
        .collect()
}

/// An engine thread pinned to one CPU (vLLM's CPU backend pins its workers) keeps it: the
/// trace writer's threads run on the others.
#[test]
fn the_writer_keeps_off_a_pinned_engine_threads_cpu() {
    let _k = lock();
    // SAFETY: sysconf has no memory effects.
    if unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } < 2 {
        eprintln!("skipped: one CPU");
        return;
    }
    let dir = fresh_dir("affinity");
    thread::spawn(move || {
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU 0 is in range; 0 is this thread.
        unsafe {
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut one);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one),
                0
            );
        }
        let e = engine();
        let p = WorkerProfiler::new(&config(&dir, ""), "w0").unwrap();
        p.start().unwrap();
        e.iteration(&p, 1);
        p.stop().unwrap();
        flush(&p);
        // Thread names as Linux keeps them: 15 bytes.
        for name in ["stepscope-write", "stepscope-final"] {
            let cpus = thread_cpus(name);
            assert!(!cpus.is_empty(), "no {name} thread");
            assert!(
                cpus.iter()
                    .all(|c| c != "0" && !c.starts_with("0-") && !c.starts_with("0,")),
                "{name}: {cpus:?}"
            );
        }
        no_temporaries(&dir);
    })
    .join()
    .unwrap();
}

#[test]
fn a_trace_name_names_the_next_capture_only() {
    let _k = lock();
    let dir = fresh_dir("named");
    let p = WorkerProfiler::new(&config(&dir, r#", "max_iterations": 2"#), "w").unwrap();
    for bad in ["", ".hidden", "a/b", "a\\b", "a\nb"] {
        let e = p.set_trace_name(Some(bad)).unwrap_err();
        assert!(e.to_string().contains("trace_name"), "{bad:?}: {e}");
    }
    assert!(p.set_trace_name(Some("p1-TP-0-DECODE")).unwrap());
    let e = engine();
    p.start().unwrap();
    assert!(
        !p.set_trace_name(Some("ignored")).unwrap(),
        "taken while a session is active"
    );
    for step in 1..=3 {
        e.iteration(&p, step);
    }
    flush(&p);
    p.start().unwrap();
    for step in 4..=6 {
        e.iteration(&p, step);
    }
    flush(&p);
    let named = read_json(&dir.join("p1-TP-0-DECODE.stepscope.json"));
    assert_eq!(named["trace_file"], "p1-TP-0-DECODE.trace.json.gz");
    assert_eq!(named["status"], "complete");
    assert!(dir.join("p1-TP-0-DECODE.trace.json.gz").is_file());
    // The second capture is named as usual; "ignored" was never taken.
    assert_eq!(
        with_suffix(&dir, ".pt.trace.json.gz").len(),
        1,
        "{:?}",
        files(&dir)
    );
    assert!(files(&dir).iter().all(|f| !f.contains("ignored")));
}

/// A tmpfs of `kib` KiB mounted over a fresh directory, unmounted when dropped; `None` (with a
/// note on stderr) where this process may not mount (not root, or no CAP_SYS_ADMIN).
struct Tmpfs(Scratch);

impl Tmpfs {
    fn mount(name: &str, kib: u64) -> Option<Tmpfs> {
        let dir = fresh_dir(name);
        fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&*dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir)),
            Ok(o) => {
                eprintln!(
                    "skipped: cannot mount a tmpfs here ({})",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }
}

impl std::ops::Deref for Tmpfs {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&*self.0).status();
    }
}

/// One captured iteration of `ops` small additions: a trace of about 100 bytes per op.
fn capture_ops(p: &WorkerProfiler, step: u64, ops: usize) {
    let x = tch::Tensor::ones([4, 4], (tch::Kind::Float, tch::Device::Cpu));
    let _it = p.step(&ToyEngine::batch(step));
    for _ in 0..ops {
        let _ = &x + &x;
    }
}

/// A real full disk (a 512 KiB tmpfs): the trace's write fails with the OS's error in the
/// manifest, no temporary is left, the engine goes on, and the next (smaller) window is written.
#[test]
fn a_disk_that_fills_during_the_write_fails_the_trace_and_the_next_window_works() {
    let _k = lock();
    let Some(dir) = Tmpfs::mount("enospc", 512) else {
        return;
    };
    let extra = r#", "stepscope": {"min_free_disk_mb": 0}"#;
    let p = WorkerProfiler::new(&config(&dir, extra), "w0").unwrap();
    p.start().unwrap();
    // About 17 MB of JSON, 600 KB gzipped (the writer bench here: 10,000 of these ops, 2.9 MB of
    // JSON, 0.1 MB gzipped): more than the disk holds.
    capture_ops(&p, 1, 60_000);
    p.stop().unwrap();
    flush(&p);
    only_manifest_failed_with(&dir, "No space left on device");
    no_temporaries(&dir);
    assert!(with_suffix(&dir, ".pt.trace.json.gz").is_empty());
    // The engine goes on; a window small enough for the disk is written.
    let e = engine();
    e.iteration(&p, 2);
    p.start().unwrap();
    capture_ops(&p, 3, 10);
    p.stop().unwrap();
    flush(&p);
    let complete: Vec<Value> = with_suffix(&dir, ".stepscope.json")
        .iter()
        .map(|m| read_json(m))
        .filter(|m| m["status"] == "complete")
        .collect();
    assert_eq!(complete.len(), 1, "{:?}", files(&dir));
    read_json(&dir.join(complete[0]["trace_file"].as_str().unwrap()));
    no_temporaries(&dir);
}

/// `stepscope.min_free_disk_mb`: a start on a disk with less free space fails at once with an
/// error naming the key and the free space, also in status; nothing is written.
#[test]
fn a_start_on_a_disk_short_of_min_free_disk_mb_fails_naming_the_key_and_the_space() {
    let _k = lock();
    let dir = fresh_dir("min-free");
    // More than any disk has: 1 EB.
    let extra = r#", "stepscope": {"min_free_disk_mb": 1099511627776}"#;
    let p = WorkerProfiler::new(&config(&dir, extra), "w0").unwrap();
    let e = p.start().expect_err("a start on a disk short of space");
    assert!(
        matches!(&e, stepscope::Error::Refused { key, .. } if key == "stepscope.min_free_disk_mb"),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("stepscope.min_free_disk_mb") && text.contains("MB free"),
        "{text}"
    );
    assert!(!p.is_active());
    let status = p.status();
    assert!(status
        .last_error
        .is_some_and(|l| l.contains("min_free_disk_mb")));
    engine().iteration(&p, 1);
    assert!(with_suffix(&dir, ".stepscope.json").is_empty());
    // The same directory with the check at its default: the start works.
    let p = WorkerProfiler::new(&config(&dir, ""), "w1").unwrap();
    p.start().unwrap();
    p.stop().unwrap();
    flush(&p);
}

/// The writer's memory is bounded by the budget too: a window is not begun while the
/// captures still being written hold more than `stepscope.max_capture_mb` (each counted as
/// what the process grew over its window); the start fails naming the key and the engine goes
/// on; once they are written, the next start works. In a child process, whose heap holds no
/// memory freed by earlier tests (a window's growth is measured from the resident memory).
/// The start comes right after the stop, before the writer can have finished (it finalizes
/// Kineto's session and writes the manifest with an fsync first).
#[test]
fn a_start_while_the_queued_captures_hold_more_than_max_capture_mb_is_refused() {
    const CHILD: &str = "STEPSCOPE_KINETO_HELD_DIR";
    if let Ok(dir) = std::env::var(CHILD) {
        // Without Python stacks the budget counts 10x a window's growth: Kineto's own start
        // (1.5 MB measured) stays under 40 MB; the capture below goes over (50,000 of these
        // ops grew this process 4 MB when measured, so 200,000 some 16 MB).
        let extra = r#", "stepscope": {"max_capture_mb": 40}"#;
        let p = WorkerProfiler::new(&config(Path::new(&dir), extra), "w0").unwrap();
        p.start().unwrap();
        // Some 16 MB of Kineto events (enabling Kineto alone takes about 1.5 MB).
        capture_ops(&p, 1, 200_000);
        p.stop().unwrap();
        assert_eq!(
            p.status().last_cut,
            None,
            "no step boundary: nothing to cut"
        );
        let e = p
            .start()
            .expect_err("a start while a large capture waits to be written");
        assert!(e.to_string().contains("stepscope.max_capture_mb"), "{e}");
        assert!(!p.is_active());
        engine().iteration(&p, 2);
        flush(&p);
        p.start().unwrap();
        capture_ops(&p, 3, 10);
        p.stop().unwrap();
        flush(&p);
        return;
    }
    let _k = lock();
    let dir = fresh_dir("held");
    run_child(
        "a_start_while_the_queued_captures_hold_more_than_max_capture_mb_is_refused",
        CHILD,
        &dir,
    );
    let complete = with_suffix(&dir, ".stepscope.json")
        .iter()
        .filter(|m| read_json(m)["status"] == "complete")
        .count();
    assert_eq!(complete, 2, "{:?}", files(&dir));
}

/// A process killed with SIGKILL while its writer runs: the next start in the directory marks
/// its manifests still `writing` as `unfinished` and removes its temporaries. The child
/// captures in a loop; the test stops it (SIGSTOP) at a moment its writer is mid-trace, then
/// kills it.
#[test]
fn a_writer_killed_mid_trace_is_cleaned_up_by_the_next_start() {
    const CHILD: &str = "STEPSCOPE_KINETO_KILL_DIR";
    if let Ok(dir) = std::env::var(CHILD) {
        let p = WorkerProfiler::new(&config(Path::new(&dir), ""), "victim").unwrap();
        // Until the parent kills it; the deadline only bounds a parent that never does.
        let deadline = std::time::Instant::now() + Duration::from_secs(600);
        let mut step = 0;
        while std::time::Instant::now() < deadline {
            step += 1;
            if p.start().is_ok() {
                capture_ops(&p, step, 20_000);
                let _ = p.stop();
            } else {
                thread::sleep(Duration::from_millis(5));
            }
        }
        return;
    }
    let _k = lock();
    let dir = fresh_dir("killed");
    fs::create_dir_all(&dir).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_writer_killed_mid_trace_is_cleaned_up_by_the_next_start",
        ])
        .env(CHILD, dir.as_os_str())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let writing = |dir: &Path| {
        with_suffix(dir, ".stepscope.json")
            .iter()
            .any(|m| fs::read_to_string(m).is_ok_and(|t| t.contains(r#""status": "writing""#)))
    };
    // A trace's temporary (not the start's writable-directory probe, also a `.partial`).
    let partial = |dir: &Path| {
        files(dir)
            .iter()
            .any(|n| n.contains(".trace.json") && n.ends_with(".partial"))
    };
    let hidden = |dir: &Path| files(dir).iter().any(|n| n.starts_with('.'));
    // Freeze the child when a trace is mid-write (a manifest says so and its temporary exists);
    // otherwise let it run on and look again. The deadline only bounds a broken run: however
    // slow the machine, the child's captures keep coming.
    let mut caught = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        if writing(&dir) {
            // SAFETY: signals to our own child.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            if writing(&dir) && partial(&dir) {
                caught = true;
                break;
            }
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(caught, "never saw the child mid-write: {:?}", files(&dir));
    let dead = child.id();
    // The next start here cleans up (on a thread of its own, off the engine thread).
    let p = WorkerProfiler::new(&config(&dir, ""), "w0").unwrap();
    p.start().unwrap();
    p.stop().unwrap();
    flush(&p);
    let marker = std::env::temp_dir().join(format!("stepscope-flushing-{dead}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while hidden(&dir) || writing(&dir) || marker.exists() {
        assert!(std::time::Instant::now() < deadline, "{:?}", files(&dir));
        thread::sleep(Duration::from_millis(20));
    }
    let statuses: Vec<(String, String)> = with_suffix(&dir, ".stepscope.json")
        .iter()
        .map(|m| read_json(m))
        .filter(|m| m["worker_name"] == "victim")
        .map(|m| (m["status"].as_str().unwrap().into(), m["error"].to_string()))
        .collect();
    assert!(
        statuses
            .iter()
            .any(|(s, e)| s == "unfinished" && e.contains(&format!("process {dead} ended"))),
        "{statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|(s, _)| s == "complete" || s == "unfinished"),
        "{statuses:?}"
    );
    no_temporaries(&dir);
}
