//! The C ABI from C and C++: programs under tests/c and tests/cpp are compiled against
//! include/ and the cdylib cargo built for this test run, then run with the stub libcuda on the
//! loader path and the NVTX recorder injected. Their own checks cover return codes and states;
//! here we check what the driver and NVTX saw, case by case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use stepscope_test_doubles::{read_log, Event, Scratch, CUDA_STUB_DIR, LOG_ENV, NVTX_RECORDER};

/// This crate (the test programs are under its tests/).
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The repository (include/, scripts/).
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The directory holding libstepscope.so, brought up to date: `cargo test` does not build this
/// crate's library, so the cdylib the C programs link is built here (a no-op when fresh).
fn lib_dir() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "--lib",
            "--manifest-path",
            &format!("{ROOT}/Cargo.toml"),
        ]);
        if dir.file_name().is_some_and(|d| d == "release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo build --lib");
        assert_success("cargo build --lib", &out);
    });
    assert!(
        dir.join("libstepscope.so").exists(),
        "libstepscope.so not found in {}",
        dir.display()
    );
    dir
}

fn scratch(name: &str) -> Scratch {
    Scratch::empty(&format!("c-abi-{name}"))
}

fn tool(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// Compiles one C (or C++) source against include/ and the cdylib.
fn compile(src: &str, out: &Path, extra: &[String]) {
    let cxx = src.ends_with(".cpp");
    let lib = lib_dir();
    let mut cmd = Command::new(if cxx {
        tool("CXX", "c++")
    } else {
        tool("CC", "cc")
    });
    cmd.arg(if cxx { "-std=c++17" } else { "-std=c11" })
        .args(["-Wall", "-Wextra", "-Werror", "-g", "-O1"])
        .arg(format!("-I{REPO}/include"))
        .arg(format!("{ROOT}/{src}"))
        .arg("-o")
        .arg(out)
        .arg(format!("-L{}", lib.display()))
        .arg("-lstepscope")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lpthread")
        .args(extra);
    let o = cmd.output().expect("run the C compiler");
    assert!(
        o.status.success(),
        "compiling {src} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs `bin` (optionally under `wrapper`, e.g. valgrind) with the doubles; returns its output
/// and the doubles' log.
fn run(bin: &Path, wrapper: &[&str], log: &Path) -> (Output, Vec<Event>) {
    let mut cmd = match wrapper.split_first() {
        Some((w, args)) => {
            let mut c = Command::new(w);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.env("LD_LIBRARY_PATH", CUDA_STUB_DIR)
        .env("NVTX_INJECTION64_PATH", NVTX_RECORDER)
        .env(LOG_ENV, log)
        .env_remove("STEPSCOPE_STUB_CUDA_FAIL")
        .env_remove("STEPSCOPE_STUB_CUDA_NO_CONTEXT");
    let out = cmd.output().expect("run test program");
    let events = read_log(log);
    (out, events)
}

fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Splits the log at the program's "case" markers.
fn by_case(events: Vec<Event>) -> BTreeMap<String, Vec<Event>> {
    let mut cases = BTreeMap::new();
    let mut current = String::from("(before)");
    for e in events {
        if e.source == "case" {
            current = e.name().to_string();
            cases.entry(current.clone()).or_insert_with(Vec::new);
        } else {
            cases
                .entry(current.clone())
                .or_insert_with(Vec::new)
                .push(e);
        }
    }
    cases
}

/// The case's profiler calls and NVTX ranges as short strings: `start`, `stop`, `push N`
/// (N = payload), `failed-start`.
fn summary(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match (e.source.as_str(), e.name()) {
            ("cuda", "cuProfilerStart") if e.arg(0) == "0" => Some("start".to_string()),
            ("cuda", "cuProfilerStart") => Some("failed-start".to_string()),
            ("cuda", "cuProfilerStop") => Some("stop".to_string()),
            ("nvtx", "push") => Some(format!("push {}", e.arg(2))),
            ("nvtx", "mark") if e.arg(1).starts_with("requests:") || e.arg(1) == "slow step" => {
                Some(format!("{} @{}", e.arg(1), e.arg(2)))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn every_worker_profiler_case_through_the_c_abi() {
    let dir = scratch("cases");
    let bin = dir.join("abi_cases");
    compile("tests/c/abi_cases.c", &bin, &[]);
    let (out, events) = run(&bin, &[], &dir.join("log"));
    assert_success("abi_cases", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(", 0 failed"));
    let cases = by_case(events);
    let s = |name: &str| summary(cases.get(name).unwrap_or_else(|| panic!("case {name}")));

    assert_eq!(
        s("immediate"),
        ["start", "push 1", "push 2", "push 3", "stop"]
    );
    assert_eq!(s("delayed"), ["start", "push 3", "push 4", "stop"]);
    assert_eq!(s("max_full_reset"), ["start", "push 1", "push 2", "stop"]);
    assert_eq!(
        s("delay_max"),
        ["start", "push 2", "push 3", "push 4", "stop"]
    );
    assert_eq!(
        s("duplicates"),
        ["start", "push 1", "push 2", "push 3", "stop"]
    );
    assert!(s("inactive").is_empty());
    // The timeline's capture: steps 18 and 19 through the driver as any other window.
    assert_eq!(s("timeline"), ["start", "push 18", "push 19", "stop"]);
    assert_eq!(s("start_failure"), ["failed-start"]);
    assert_eq!(s("delayed_start_failure"), ["failed-start"]);
    assert_eq!(s("shutdown"), ["start", "push 1", "stop"]);
    assert!(s("stop_during_delay").is_empty());
    assert!(
        cases["stop_during_delay"]
            .iter()
            .all(|e| e.source != "cuda"),
        "a stop during the delay makes no driver call"
    );
    assert_eq!(
        s("restart_after_max"),
        ["start", "push 1", "stop", "start", "push 3", "stop"]
    );
    assert_eq!(
        s("overrides"),
        ["start", "push 2", "stop", "start", "push 4", "push 5", "stop"]
    );
    assert_eq!(s("start_at_status"), ["start", "push 3", "push 4", "stop"]);
    assert!(s("rank_not_selected").is_empty());
    assert_eq!(
        s("unknown_counts_and_free_stops"),
        ["start", "push 1", "stop"]
    );
    let unknown = cases["unknown_counts_and_free_stops"]
        .iter()
        .find(|e| e.name() == "push")
        .unwrap();
    assert_eq!(unknown.arg(1), "execute_context_0(0)_generation_0(0)");
    assert_eq!(unknown.arg(3), "4", "unknown counts are the idle stage");
    assert!(s("bad_arguments").is_empty());
    // Only the captured iteration's ids are read and marked; with request_ids off, none.
    assert_eq!(
        s("request_ids"),
        [
            "start",
            "push 2",
            "requests: req-a,req-b @2",
            "stop",
            "start",
            "push 1",
            "stop"
        ]
    );
    // The iteration's work names it in detail, byte for byte as vLLM's detailed annotation.
    let work: Vec<&str> = cases["work"]
        .iter()
        .filter(|e| e.name() == "push")
        .map(|e| e.arg(1))
        .collect();
    assert_eq!(
        work,
        ["execute_6_context_1(sq4sk4sqsq16sqsk16)_generation_2(sq2sk17sqsq2sqsk17)"]
    );
    // The window begins in the step after the slow one, marked with the slow step's index.
    assert_eq!(
        s("slow_step"),
        ["start", "slow step @4", "push 5", "push 6", "stop"]
    );

    // The NVTX window of delay 2 / max 3 names iterations as vLLM does.
    let names: Vec<&str> = cases["delay_max"]
        .iter()
        .filter(|e| e.name() == "push")
        .map(|e| e.arg(1))
        .collect();
    assert_eq!(
        names,
        [
            "execute_context_0(0)_generation_2(2)",
            "execute_context_0(0)_generation_3(3)",
            "execute_context_0(0)_generation_4(4)"
        ]
    );
}

#[test]
fn the_header_declares_exactly_the_exported_functions() {
    let header = std::fs::read_to_string(format!("{REPO}/include/stepscope.h")).unwrap();
    let mut declared: Vec<String> = header
        .lines()
        .filter(|l| !l.trim_start().starts_with("/*") && !l.trim_start().starts_with('*'))
        .filter_map(|l| {
            let open = l.find('(')?;
            let name = l[..open]
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .next_back()?;
            name.starts_with("stepscope_").then(|| name.to_string())
        })
        .collect();
    declared.sort();
    declared.dedup();

    let nm = Command::new(tool("NM", "nm"))
        .args(["-D", "--defined-only"])
        .arg(lib_dir().join("libstepscope.so"))
        .output()
        .expect("run nm");
    assert_success("nm", &nm);
    let mut exported: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T" && name.starts_with("stepscope_")).then(|| name.to_string())
        })
        .collect();
    exported.sort();
    assert_eq!(declared, exported);
    assert_eq!(declared.len(), 20, "the ABI has twenty functions");
}

#[test]
fn two_threads_under_valgrind_have_no_memory_errors() {
    let dir = scratch("threads");
    let bin = dir.join("two_threads");
    compile("tests/c/two_threads.c", &bin, &[]);
    let (out, events) = run(
        &bin,
        &[
            "valgrind",
            "--error-exitcode=99",
            "--quiet",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
        ],
        &dir.join("log"),
    );
    assert_success("two_threads under valgrind", &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("running=0"), "{stdout}");
    let engine: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("engine_tid="))
        .expect("engine_tid")
        .parse()
        .unwrap();
    let calls: Vec<&Event> = events
        .iter()
        .filter(|e| e.source == "cuda" && e.name().starts_with("cuProfiler"))
        .collect();
    assert!(
        calls.len() >= 4,
        "the control thread's captures happened: {calls:?}"
    );
    assert!(
        calls.iter().all(|e| e.tid == engine),
        "driver called off the engine thread"
    );
    for pair in calls.chunks(2) {
        assert_eq!(pair[0].name(), "cuProfilerStart");
        assert_eq!(pair.get(1).map(|e| e.name()), Some("cuProfilerStop"));
    }
}

#[test]
fn the_cpp_wrapper_closes_each_range_with_its_iteration() {
    let dir = scratch("cpp");
    let bin = dir.join("wrapper");
    compile("tests/cpp/wrapper.cpp", &bin, &[]);
    let (out, events) = run(&bin, &[], &dir.join("log"));
    assert_success("wrapper", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(", 0 failed"));
    assert_eq!(
        summary(&events),
        [
            "start",
            "push 2",
            "push 3",
            "push 4",
            "stop",
            "start",
            "push 7",
            "stop",
            // start_at(2): the second step of a new profiler.
            "start",
            "push 2",
            "stop",
            // Request ids: the captured iteration's, marked inside its range.
            "start",
            "push 1",
            "requests: cpp-a,cpp-b @1",
            "stop",
            // The iteration with its work, named in detail.
            "start",
            "push 1",
            "stop"
        ]
    );
    let detailed = events
        .iter()
        .rfind(|e| e.name() == "push")
        .map(|e| e.arg(1));
    assert_eq!(
        detailed,
        Some("execute_6_context_1(sq4sk4sqsq16sqsk16)_generation_2(sq2sk17sqsq2sqsk17)")
    );
    // Each range is popped before the next is pushed: one iteration at a time.
    let mut open = 0;
    for e in events.iter().filter(|e| e.source == "nvtx") {
        match e.name() {
            "push" => {
                assert_eq!(open, 0, "nested range");
                open += 1;
            }
            "pop" => open -= 1,
            _ => {}
        }
    }
    assert_eq!(open, 0);
}

#[test]
fn pkg_config_finds_the_installed_library() {
    let prefix = scratch("prefix");
    let install = Command::new(format!("{REPO}/scripts/install.sh"))
        .arg(prefix.as_os_str())
        .arg(lib_dir())
        .output()
        .expect("run install.sh");
    assert_success("install.sh", &install);
    let pc = Command::new("pkg-config")
        .args(["--cflags", "--libs", "stepscope"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config");
    assert_success("pkg-config", &pc);
    let flags = String::from_utf8_lossy(&pc.stdout).trim().to_string();
    assert!(
        flags.contains(&format!("-I{}/include", prefix.display())),
        "{flags}"
    );

    let src = prefix.join("version.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stepscope.h>\nint main(void) { puts(stepscope_version()); return 0; }\n",
    )
    .unwrap();
    let bin = prefix.join("version");
    let mut cc = Command::new(tool("CC", "cc"));
    cc.arg(&src)
        .arg("-o")
        .arg(&bin)
        .args(flags.split_whitespace());
    cc.arg(format!("-Wl,-rpath,{}/lib", prefix.display()));
    let o = cc.output().unwrap();
    assert_success("compiling with pkg-config flags", &o);
    let o = Command::new(&bin).output().unwrap();
    assert_success("version", &o);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        env!("CARGO_PKG_VERSION")
    );
}
