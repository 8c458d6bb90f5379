//! `stepscope analyze`, `merge` and `report` on real GPU traces (tests/data/hta, MIT, from
//! HolisticTraceAnalysis): every figure is checked against numbers this test computes itself
//! from the raw JSON.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{data, raw, render_in_chromium, stepscope};
use serde_json::Value;
use stepscope_test_doubles::{same_json, Scratch};

fn scratch(name: &str) -> Scratch {
    Scratch::empty(&format!("analyze-{name}"))
}

/// The figures computed directly from the raw events, independently of the tool.
struct Expected {
    kernel_count: u64,
    kernel_total: f64,
    top: Vec<(String, f64)>,
    busy: f64,
    profiler_steps: usize,
    rank: Option<i64>,
}

fn expected(trace: &Value) -> Expected {
    let events = trace["traceEvents"].as_array().unwrap();
    let x = |e: &&Value| e["ph"] == "X";
    let kernels: Vec<&Value> = events
        .iter()
        .filter(x)
        .filter(|e| e["cat"] == "kernel")
        .collect();
    let mut per_name: HashMap<String, f64> = HashMap::new();
    for k in &kernels {
        *per_name
            .entry(k["name"].as_str().unwrap().to_string())
            .or_default() += k["dur"].as_f64().unwrap();
    }
    let mut top: Vec<(String, f64)> = per_name.into_iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(5);
    // Busy: a sweep over start/end points per device, counting time where any is active.
    let mut by_device: HashMap<i64, Vec<(f64, i32)>> = HashMap::new();
    for e in events.iter().filter(x).filter(|e| {
        matches!(
            e["cat"].as_str(),
            Some("kernel" | "gpu_memcpy" | "gpu_memset")
        )
    }) {
        let dev = e["args"]["device"].as_i64().unwrap_or(-1);
        let ts = e["ts"].as_f64().unwrap();
        let dur = e["dur"].as_f64().unwrap_or(0.0);
        let pts = by_device.entry(dev).or_default();
        pts.push((ts, 1));
        pts.push((ts + dur, -1));
    }
    let mut busy = 0.0;
    for pts in by_device.values_mut() {
        // Starts before ends at the same instant, so touching intervals count once.
        pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        let (mut depth, mut since) = (0, 0.0);
        for (t, d) in pts.iter() {
            if depth == 0 && *d == 1 {
                since = *t;
            }
            depth += d;
            if depth == 0 {
                busy += t - since;
            }
        }
    }
    Expected {
        kernel_count: kernels.len() as u64,
        kernel_total: kernels.iter().map(|k| k["dur"].as_f64().unwrap()).sum(),
        top,
        busy,
        profiler_steps: events
            .iter()
            .filter(|e| {
                e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("ProfilerStep#"))
            })
            .count(),
        rank: trace["distributedInfo"]["rank"].as_i64(),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

fn analyze_json(args: &[&str]) -> Value {
    analyze_json_top("0", args)
}

/// `analyze --json --top N` of `args`, which must succeed.
fn analyze_json_top(top: &str, args: &[&str]) -> Value {
    let out = stepscope(&[&["analyze", "--json", "--top", top][..], args].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn figures_match_the_raw_json_on_real_traces() {
    for name in [
        "trace_diff__control__control.json.gz",
        "trace_filter__sampled_rank-0.json.gz",
        "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
        "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    ] {
        let path = data(name);
        let want = expected(&raw(&path));
        let doc = analyze_json(&[path.to_str().unwrap()]);
        let t = &doc["traces"][0];
        assert_eq!(
            t["kernels"]["count"].as_u64().unwrap(),
            want.kernel_count,
            "{name}"
        );
        assert!(
            close(
                t["kernels"]["total_us"].as_f64().unwrap(),
                want.kernel_total
            ),
            "{name}: total {} vs {}",
            t["kernels"]["total_us"],
            want.kernel_total
        );
        let top: Vec<(String, f64)> = t["kernels"]["by_name"]
            .as_array()
            .unwrap()
            .iter()
            .take(5)
            .map(|k| {
                (
                    k["name"].as_str().unwrap().to_string(),
                    k["total_us"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(top.len(), want.top.len(), "{name}");
        for (got, exp) in top.iter().zip(&want.top) {
            assert_eq!(got.0, exp.0, "{name}");
            assert!(
                close(got.1, exp.1),
                "{name}: {} {} vs {}",
                got.0,
                got.1,
                exp.1
            );
        }
        assert!(
            close(t["gpu_busy_us"].as_f64().unwrap(), want.busy),
            "{name}: busy {} vs {}",
            t["gpu_busy_us"],
            want.busy
        );
        assert_eq!(
            t["steps"].as_array().unwrap().len(),
            want.profiler_steps,
            "{name}"
        );
        assert_eq!(t["rank"].as_i64(), want.rank, "{name}");
    }
}

/// A trace of over 4 MB of JSON is scanned on a thread of its own, ahead of the summary
/// (`read_events_ahead`), a plain file's chunks read there too; a smaller one on the summary's
/// thread. Each trace gunzipped to plain JSON reads as its `.gz` does, and the large ones as
/// the library's one-thread stream reads them (the manifests' summaries).
#[test]
fn large_and_small_traces_read_the_same_gzipped_plain_and_on_one_thread() {
    let dir = scratch("plain");
    let names = [
        "trace_diff__control__control",
        "ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace",
        "trace_filter__sampled_rank-1",
    ];
    for name in names {
        let gz = data(&format!("{name}.json.gz"));
        std::fs::copy(&gz, dir.join(format!("{name}.json.gz"))).unwrap();
        let mut json = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&gz).unwrap()),
            &mut json,
        )
        .unwrap();
        std::fs::write(dir.join(format!("{name}.json")), json).unwrap();
    }
    let reports = |args: &[&str]| -> Vec<Value> {
        let doc = analyze_json_top("20", args);
        doc["traces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t.as_object_mut().unwrap().remove("file");
                t
            })
            .collect()
    };
    for name in names {
        let gz = dir.join(format!("{name}.json.gz"));
        let plain = dir.join(format!("{name}.json"));
        let from_gz = reports(&[gz.to_str().unwrap()]);
        assert_eq!(from_gz.len(), 1, "{name}");
        assert_eq!(reports(&[plain.to_str().unwrap()]), from_gz, "{name}");
    }
    write_manifests(&dir);
    for name in &names[..2] {
        let gz = dir.join(format!("{name}.json.gz"));
        let one = Scratch::empty(&format!("analyze-plain-{}", &name[..8]));
        std::fs::copy(&gz, one.join(gz.file_name().unwrap())).unwrap();
        let manifest = format!("{name}.stepscope.json");
        std::fs::copy(dir.join(&manifest), one.join(&manifest)).unwrap();
        let d = one.to_str().unwrap();
        let mut from_manifest = reports(&[d]);
        let mut from_trace = reports(&[d, "--from-traces"]);
        for t in from_manifest.iter_mut().chain(from_trace.iter_mut()) {
            t.as_object_mut().unwrap().remove("source");
        }
        assert_eq!(from_trace, from_manifest, "{name}");
    }
}

#[test]
fn the_big_trace_reads_as_a_person_would_expect() {
    let doc = analyze_json(&[data("trace_diff__control__control.json.gz")
        .to_str()
        .unwrap()]);
    let t = &doc["traces"][0];
    assert_eq!(t["kernels"]["count"], 8568);
    assert_eq!(t["rank"], 3);
    assert_eq!(t["world_size"], 8);
    assert_eq!(t["devices"].as_array().unwrap().len(), 8);
    assert_eq!(t["devices"][0]["numSms"], 108);
    let steps = t["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6);
    assert_eq!(steps[0]["name"], "ProfilerStep#1009");
    for s in steps {
        // Every step launched kernels, and the attributed GPU time is theirs.
        assert!(s["kernel_count"].as_u64().unwrap() > 0);
        assert!(s["kernel_us"].as_f64().unwrap() > 0.0);
    }
    let split = &t["split"];
    assert!(
        split["communication_us"].as_f64().unwrap() > 0.0,
        "NCCL kernels are communication"
    );
    let u = t["utilization"].as_f64().unwrap();
    assert!(u > 0.0 && u <= 1.0);
    assert!(!t["idle_gaps"].as_array().unwrap().is_empty());
    // The table form names the trace and has the kernel table.
    let out = stepscope(&[
        "analyze",
        data("trace_diff__control__control.json.gz")
            .to_str()
            .unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("rank 3 of 8") && text.contains("ncclKernel_SendRecv"),
        "{text}"
    );
}

/// A vLLM-style trace: iterations annotated `execute_…`, kernels linked to launches by
/// correlation id; one launch falls outside every iteration.
fn synthetic_vllm_trace(step_us: f64) -> Value {
    let mut ev = vec![
        serde_json::json!({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}),
    ];
    let names = [
        "execute_context_1(512)_generation_3(3)",
        "execute_context_0(0)_generation_4(4)",
    ];
    let mut corr = 1;
    for (i, n) in names.iter().enumerate() {
        let t0 = 1000.0 + i as f64 * (step_us + 100.0);
        ev.push(serde_json::json!({"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": t0, "dur": step_us}));
        for k in 0..(i + 2) {
            let launch = t0 + 10.0 + k as f64 * 20.0;
            ev.push(serde_json::json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": launch, "dur": 5, "args": {"correlation": corr}}));
            ev.push(serde_json::json!({"ph": "X", "cat": "kernel", "name": format!("gemm_{k}"), "pid": 0, "tid": 7, "ts": launch + 8.0, "dur": 10.0 + k as f64, "args": {"correlation": corr, "device": 0}}));
            corr += 1;
        }
    }
    ev.push(serde_json::json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 50.0, "dur": 5, "args": {"correlation": corr}}));
    ev.push(serde_json::json!({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 8, "ts": 60.0, "dur": 30.0, "args": {"correlation": corr, "device": 0}}));
    serde_json::json!({"traceEvents": ev})
}

#[test]
fn engine_iterations_get_their_kernels_by_correlation_and_stragglers_are_named() {
    let dir = scratch("ranks");
    for (rank, step) in [(0, 400.0), (1, 410.0), (2, 900.0)] {
        let t = synthetic_vllm_trace(step);
        std::fs::write(dir.join(format!("run_rank{rank}.json")), t.to_string()).unwrap();
    }
    let doc = analyze_json(&[dir.to_str().unwrap()]);
    let t0 = &doc["traces"][0];
    let steps = t0["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["name"], "execute_context_1(512)_generation_3(3)");
    assert_eq!(steps[0]["kernel_count"], 2);
    assert_eq!(steps[0]["kernel_us"], 21.0); // 10 + 11
    assert_eq!(steps[1]["kernel_count"], 3);
    assert_eq!(steps[1]["kernel_us"], 33.0); // 10 + 11 + 12
    assert_eq!(
        t0["kernels"]["count"], 6,
        "the NCCL kernel outside every step still counts"
    );
    assert_eq!(t0["split"]["communication_us"], 30.0);
    let ranks = doc["ranks"].as_array().unwrap();
    let stragglers: Vec<i64> = ranks
        .iter()
        .filter(|r| r["straggler"] == true)
        .map(|r| r["rank"].as_i64().unwrap())
        .collect();
    assert_eq!(stragglers, [2]);
    // --rank picks one trace.
    let one = analyze_json(&[dir.to_str().unwrap(), "--rank", "1"]);
    assert_eq!(one["traces"].as_array().unwrap().len(), 1);
    assert_eq!(one["traces"][0]["rank"], 1);
    // Captures of a worker without a rank are not ranks: nothing is called a straggler.
    let unranked = scratch("unranked");
    for (i, step) in [400.0, 900.0].iter().enumerate() {
        let t = synthetic_vllm_trace(*step);
        std::fs::write(unranked.join(format!("capture{i}.json")), t.to_string()).unwrap();
    }
    let doc = analyze_json(&[unranked.to_str().unwrap()]);
    let rows = doc["ranks"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["straggler"] == false), "{rows:?}");
}

#[test]
fn a_stepscope_capture_names_its_trigger_and_the_requests_of_its_slowest_steps() {
    // As the torch backend writes it: each annotation's "Record function id" is its step; the
    // header lists the steps' requests; one annotation carries its own (shapes recorded).
    let mut t = synthetic_vllm_trace(400.0);
    let events = t["traceEvents"].as_array_mut().unwrap();
    let mut steps = events.iter_mut().filter(|e| e["cat"] == "user_annotation");
    let first = steps.next().unwrap();
    first["args"] = serde_json::json!({"External id": 1, "Record function id": 41});
    first["dur"] = serde_json::json!(900.0);
    let second = steps.next().unwrap();
    second["args"] =
        serde_json::json!({"Record function id": 42, "requests": ["own-1"], "Ev Idx": 3});
    t["stepscope"] = serde_json::json!({
        "first_step": 41,
        "trigger": {"slow_step": {"step": 40, "duration_ns": 52_000_000, "median_ns": 9_000_000}},
        "steps": [{"step": 41, "requests": ["cmpl-a-0", "cmpl-b-0"]},
                  {"step": 42, "requests": ["header-ignored"]}],
    });
    let dir = scratch("requests");
    let path = dir.join("rank0.pt.trace.json");
    std::fs::write(&path, t.to_string()).unwrap();
    let doc = analyze_json(&[path.to_str().unwrap()]);
    let steps = doc["traces"][0]["steps"].as_array().unwrap();
    assert_eq!(
        (steps[0]["step"].as_u64(), steps[1]["step"].as_u64()),
        (Some(41), Some(42))
    );
    assert_eq!(
        steps[0]["requests"],
        serde_json::json!(["cmpl-a-0", "cmpl-b-0"])
    );
    assert_eq!(steps[1]["requests"], serde_json::json!(["own-1"]));
    assert_eq!(doc["traces"][0]["trigger"]["slow_step"]["step"], 40);

    let out = stepscope(&["analyze", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("captured after slow step 40 (52.000 ms)"),
        "{text}"
    );
    let listed: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("slowest steps and the requests they served"))
        .skip(1)
        .take(2)
        .collect();
    assert!(
        listed[0].contains("step 41") && listed[0].contains("cmpl-a-0, cmpl-b-0"),
        "{text}"
    );
    assert!(
        listed[1].contains("step 42") && listed[1].contains("own-1"),
        "{text}"
    );
}

#[test]
fn merging_a_rank_pair_keeps_every_event_with_rank_labels() {
    let dir = scratch("merge");
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    for r in [0, 1] {
        let name = format!("trace_filter__sampled_rank-{r}.json.gz");
        std::fs::copy(data(&name), input.join(&name)).unwrap();
    }
    let out = dir.join("merged.json.gz");
    let o = stepscope(&[
        "merge",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let merged = raw(&out);
    let events = merged["traceEvents"].as_array().unwrap();

    let key = |e: &Value| {
        format!(
            "{}|{}|{}|{}|{}",
            e["ph"], e["cat"], e["name"], e["ts"], e["dur"]
        )
    };
    let mut pids_of_rank: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut have: HashMap<String, i64> = HashMap::new();
    for e in events {
        *have.entry(key(e)).or_default() += 1;
    }
    let mut originals = 0;
    for r in [0, 1] {
        let t = raw(&data(&format!("trace_filter__sampled_rank-{r}.json.gz")));
        for e in t["traceEvents"].as_array().unwrap() {
            if e["ph"] == "M" {
                continue; // metadata is rewritten with rank labels
            }
            originals += 1;
            let k = key(e);
            let n = have
                .get_mut(&k)
                .unwrap_or_else(|| panic!("missing event {k}"));
            assert!(*n > 0, "event {k} appears fewer times than in its rank");
            *n -= 1;
        }
    }
    assert!(originals > 5000);
    for e in events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
    {
        let label = e["args"]["name"].as_str().unwrap();
        let rank: i64 = label
            .strip_prefix("rank ")
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("unlabelled process {label}"));
        pids_of_rank
            .entry(rank)
            .or_default()
            .push(e["pid"].as_i64().unwrap());
    }
    assert_eq!(pids_of_rank.len(), 2, "both ranks labelled");
    let (a, b) = (&pids_of_rank[&0], &pids_of_rank[&1]);
    assert!(a.iter().all(|p| !b.contains(p)), "ranks never share a pid");
    // Ordered by rank: every rank-0 process sorts before every rank-1 process.
    let sort_of = |pid: i64| {
        events
            .iter()
            .find(|e| e["name"] == "process_sort_index" && e["pid"] == pid)
            .and_then(|e| e["args"]["sort_index"].as_i64())
            .unwrap()
    };
    let max0 = a.iter().map(|p| sort_of(*p)).max().unwrap();
    let min1 = b.iter().map(|p| sort_of(*p)).min().unwrap();
    assert!(max0 < min1);
    assert_eq!(merged["stepscope_merged"].as_array().unwrap().len(), 2);
}

#[test]
fn the_report_renders_in_headless_chromium_without_console_errors() {
    let dir = scratch("report");
    let html = dir.join("report.html");
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    for r in [0, 1] {
        let name = format!("trace_filter__sampled_rank-{r}.json.gz");
        std::fs::copy(data(&name), input.join(&name)).unwrap();
    }
    let o = stepscope(&[
        "report",
        input.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no network"
    );

    // The check itself works: a page with a script error is caught.
    let broken = dir.join("broken.html");
    std::fs::write(
        &broken,
        "<html><body><script>undefinedFunction();</script></body></html>",
    )
    .unwrap();
    let (_, errors) = render_in_chromium(&broken, &dir.join("profile-a"));
    assert!(
        !errors.is_empty(),
        "the console check must see a script error"
    );

    let (dom, errors) = render_in_chromium(&html, &dir.join("profile-b"));
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page's script ran to the end"
    );
    assert!(
        dom.contains("data-charts=\"6\""),
        "six charts rendered: four, and each rank's step explanation"
    );
    assert!(dom.contains("rank 0") && dom.contains("rank 1"));
    // Each step's bar carries the verdict `analyze` gives it.
    let analyzed = stepscope(&["analyze", "--json", input.to_str().unwrap()]);
    let doc: Value = serde_json::from_slice(&analyzed.stdout).unwrap();
    for t in doc["traces"].as_array().unwrap() {
        for s in t["steps"].as_array().unwrap() {
            let v = &s["gpu"]["verdict"];
            let bound = v["bound"].as_str().unwrap().replace('_', "-");
            let share = 100.0 * v["part_us"].as_f64().unwrap() / v["of_us"].as_f64().unwrap();
            let text = format!("{bound}-bound (");
            let pct = format!(
                " {share:.0}% of {:.3} ms)",
                v["of_us"].as_f64().unwrap() / 1e3
            );
            assert!(
                dom.contains(&text) && dom.contains(&pct),
                "{}: {text}…{pct} on the page",
                s["name"]
            );
        }
    }
}

#[test]
fn bad_input_names_the_file_and_exits_2() {
    let dir = scratch("bad");
    let gz = std::fs::read(data("trace_filter__sampled_rank-0.json.gz")).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated.json.gz",
            gz[..gz.len() / 2].to_vec(),
            "not a valid gzip file",
        ),
        (
            "notjson.json",
            b"hello, not json".to_vec(),
            "not valid trace JSON",
        ),
        (
            "noevents.json",
            br#"{"schemaVersion": 1}"#.to_vec(),
            "traceEvents",
        ),
    ];
    for (name, bytes, text) in &cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let o = stepscope(&["analyze", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(name) && err.contains(text), "{name}: {err}");
    }
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = stepscope(&["analyze", empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds no .json or .json.gz trace"));
    let o = stepscope(&["analyze", dir.join("missing.json").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read"));

    // A directory with good and bad traces: the good ones are analyzed, exit 1.
    let mixed = dir.join("mixed");
    std::fs::create_dir_all(mixed.join("unreadable.json")).unwrap(); // a directory: read fails
    std::fs::copy(
        data("trace_filter__sampled_rank-1.json.gz"),
        mixed.join("rank-1.json.gz"),
    )
    .unwrap();
    std::fs::write(mixed.join("truncated.json.gz"), &gz[..gz.len() / 3]).unwrap();
    let o = stepscope(&["analyze", "--json", mixed.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["traces"].as_array().unwrap().len(), 1);
    assert_eq!(doc["traces"][0]["rank"], 1);
    let errs: Vec<&str> = doc["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    assert!(
        errs.iter().any(|f| f.ends_with("unreadable.json")),
        "{errs:?}"
    );
    assert!(
        errs.iter().any(|f| f.ends_with("truncated.json.gz")),
        "{errs:?}"
    );
    let o = stepscope(&[
        "merge",
        mixed.to_str().unwrap(),
        "-o",
        dir.join("m.json").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "merge refuses an incomplete set");
    assert!(!dir.join("m.json").exists(), "no partial output is left");
}

/// Writes beside each trace in `dir` the manifest a worker writes: its summary computed by the
/// library's streaming summarizer, as the worker's writer computes it.
fn write_manifests(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let Some(stem) = name.strip_suffix(".json.gz") else {
            continue;
        };
        let mut sink = stepscope_format::trace::Summarizer::new();
        let file = std::fs::File::open(&path).unwrap();
        let meta = stepscope_format::trace::EventStream::new()
            .read_all(flate2::read::MultiGzDecoder::new(file), &mut sink)
            .unwrap();
        let manifest = serde_json::json!({
            "status": "complete", "trace_file": name, "summary": sink.finish(meta, 20),
        });
        std::fs::write(
            dir.join(format!("{stem}.stepscope.json")),
            manifest.to_string(),
        )
        .unwrap();
    }
}

#[test]
fn a_directory_with_manifests_is_analyzed_from_them_with_the_same_figures() {
    let dir = scratch("manifests");
    for name in [
        "trace_filter__sampled_rank-0.json.gz",
        "trace_filter__sampled_rank-1.json.gz",
        "trace_diff__control__control.json.gz",
    ] {
        std::fs::copy(data(name), dir.join(name)).unwrap();
    }
    write_manifests(&dir);
    let d = dir.to_str().unwrap();
    // Manifests keep the top 20 kernels and operators: compare those.
    let top20 = |args: &[&str]| analyze_json_top("20", args);
    let from_traces = top20(&[d, "--from-traces"]);
    let from_manifests = top20(&[d]);
    let traces = |doc: &Value| doc["traces"].as_array().unwrap().clone();
    assert_eq!(
        traces(&from_traces).len(),
        3,
        "manifests are not read as traces"
    );
    for (t, m) in traces(&from_traces).iter().zip(traces(&from_manifests)) {
        assert_eq!(t["source"], "trace");
        assert_eq!(m["source"], "manifest");
        assert_eq!(t["file"], m["file"]);
        for key in [
            "rank",
            "kernels",
            "split",
            "steps",
            "gpu_busy_us",
            "utilization",
            "idle_gaps",
            "cpu_ops",
        ] {
            assert!(same_json(&t[key], &m[key]), "{key} of {}", t["file"]);
        }
    }
    assert!(same_json(&from_traces["ranks"], &from_manifests["ranks"]));
    // A manifest without a summary (an older worker) or not complete: its trace is read.
    let older = dir.join("trace_diff__control__control.stepscope.json");
    std::fs::write(
        &older,
        r#"{"status": "complete", "trace_file": "trace_diff__control__control.json.gz"}"#,
    )
    .unwrap();
    let mixed = top20(&[d]);
    let sources: Vec<&str> = mixed["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["trace", "manifest", "manifest"]);
    // Manifests alone (the traces elsewhere): the summaries still make the table.
    for name in [
        "trace_filter__sampled_rank-0.json.gz",
        "trace_filter__sampled_rank-1.json.gz",
    ] {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    std::fs::remove_file(dir.join("trace_diff__control__control.json.gz")).unwrap();
    std::fs::remove_file(&older).unwrap();
    // Their figures are still given, and each missing trace is an error naming the manifest
    // and the trace (exit 1), never a silent "[from its manifest]".
    let out = stepscope(&["analyze", "--json", "--top", "20", d]);
    assert_eq!(out.status.code(), Some(1));
    let only: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut without_first = from_traces["ranks"].clone();
    without_first.as_array_mut().unwrap().remove(0);
    assert!(same_json(&only["ranks"], &without_first));
    let errors = only["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{errors:?}");
    for e in errors {
        let (file, text) = (e["file"].as_str().unwrap(), e["error"].as_str().unwrap());
        assert!(file.ends_with(".stepscope.json"), "{file}");
        assert!(
            text.contains("its trace is missing") && text.contains(".json.gz"),
            "{text}"
        );
    }
}

/// A trace and its manifest renamed together by another tool (verl's relocation adds the
/// same prefix to both) stay a pair: analyzed from the manifest, its trace not read twice.
#[test]
fn a_trace_and_manifest_renamed_together_are_still_a_pair() {
    let dir = scratch("renamed");
    let name = "trace_filter__sampled_rank-1.json.gz";
    std::fs::copy(data(name), dir.join(name)).unwrap();
    write_manifests(&dir);
    for f in [name, "trace_filter__sampled_rank-1.stepscope.json"] {
        std::fs::rename(dir.join(f), dir.join(format!("rollout-replica0_{f}"))).unwrap();
    }
    let doc = analyze_json_top("20", &[dir.to_str().unwrap()]);
    let traces = doc["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 1, "{traces:?}");
    assert_eq!(traces[0]["source"], "manifest");
    assert!(traces[0]["file"]
        .as_str()
        .unwrap()
        .ends_with("rollout-replica0_trace_filter__sampled_rank-1.json.gz"));
}

#[test]
fn mtia_device_and_runtime_events_count_as_kernels_and_launches() {
    let mut t = synthetic_vllm_trace(400.0);
    for e in t["traceEvents"].as_array_mut().unwrap() {
        match e["cat"].as_str() {
            Some("kernel") => e["cat"] = "mtia_ccp_events".into(),
            Some("cuda_runtime") => e["cat"] = "mtia_runtime".into(),
            _ => {}
        }
    }
    let dir = scratch("mtia");
    let p = dir.join("mtia_rank0.json");
    std::fs::write(&p, t.to_string()).unwrap();
    let doc = analyze_json(&[p.to_str().unwrap()]);
    let t0 = &doc["traces"][0];
    assert_eq!(t0["kernels"]["count"], 6);
    assert_eq!(t0["steps"][0]["kernel_count"], 2);
    assert_eq!(t0["steps"][1]["kernel_us"], 33.0);
    assert_eq!(t0["split"]["communication_us"], 30.0);
}

#[test]
fn merge_labels_ranks_that_distributed_info_names_after_the_events() {
    let dir = scratch("late-rank");
    let mut t = synthetic_vllm_trace(400.0);
    t["traceEvents"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"ph": "s", "id": "a", "pid": 1, "tid": 1, "ts": 1.0}));
    // distributedInfo after traceEvents, and a file name without a rank.
    let text = t.to_string();
    let text = format!(
        "{}, \"distributedInfo\": {{\"rank\": 5, \"world_size\": 8}}}}",
        &text[..text.len() - 1]
    );
    std::fs::write(dir.join("worker.json"), text).unwrap();
    let out = dir.join("merged.json");
    let o = stepscope(&[
        "merge",
        dir.join("worker.json").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let merged = raw(&out);
    let events = merged["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with("rank 5 | ")),
        "{names:?}"
    );
    assert!(names.contains(&"rank 5 | python"), "{names:?}");
    assert!(
        events.iter().any(|e| e["id"] == "r5:a"),
        "string flow ids carry the rank"
    );
    assert_eq!(merged["stepscope_merged"][0]["rank"], 5);
}

#[test]
fn requests_of_a_trace_without_request_ids_say_how_to_record_them() {
    let trace = data("trace_filter__sampled_rank-0.json.gz");
    let trace = trace.to_str().unwrap();
    let o = stepscope(&["analyze", "--requests", trace]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("requests: none recorded") && out.contains("request_ids"),
        "{out}"
    );
    // Asked for one by id: a usage error naming it, exit 2.
    let o = stepscope(&["analyze", "--request", "cmpl-1", trace]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("\"cmpl-1\"") && err.contains("request_ids"),
        "{err}"
    );
    // --requests takes its count with '=': a path after it stays a path.
    let o = stepscope(&["analyze", "--json", "--requests=0", trace]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["requests"][0]["requests"], serde_json::json!([]));
}

/// One engine's request log holding request `r`, finished or not.
fn request_log(finished: bool) -> serde_json::Value {
    let at = |s: u64| 1_000_000_000 * s;
    serde_json::json!({
        "pid": 1, "step_index": 3, "now_unix_ns": at(9), "clock": "tsc",
        "capacity": {"requests": 16, "steps": 16}, "recorded": {"requests": 1, "steps": 3},
        "evicted_running": 0,
        "steps": [{"step": 2, "start_unix_ns": at(2), "duration_ns": at(1), "prefill_reqs": 1,
                   "prefill_tokens": 8, "decode_reqs": 0, "decode_tokens": 0, "preempted": 0,
                   "waiting": 0, "largest_prefill_tokens": 8, "largest_prefill_request": "r"}],
        "requests": [{"id": "r", "prompt_tokens": 8, "cached_tokens": 0, "output_tokens": 1,
                      "arrival_unix_ns": at(1), "queued_unix_ns": at(1), "queued_after_step": 1,
                      "first_scheduled_step": 2, "first_scheduled_unix_ns": at(2),
                      "prefill_steps": 1, "prefill_tokens": 8, "first_token_step": 2,
                      "first_token_unix_ns": at(3), "decode_steps": 0,
                      "last_token_unix_ns": at(3), "last_step": 2, "preempted_at": [],
                      "resumed_at": [],
                      "finished_step": if finished { Some(2) } else { None },
                      "finished_unix_ns": if finished { Some(at(3)) } else { None },
                      "finish": if finished { Some("length") } else { None }}]
    })
}

#[test]
fn a_captures_requests_are_joined_to_the_latest_request_log_beside_it() {
    let dir = scratch("request-logs");
    // A capture's trace as the torch backend writes it: an iteration annotated with its step,
    // its requests (with tokens and phases) in the header.
    let trace = dir.join("rank0.1.pt.trace.json");
    std::fs::write(
        &trace,
        r#"{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "execute_context_1(8)_generation_0(0)", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "args": {"Record function id": 1}}],
            "stepscope": {"steps": [{"step": 1, "requests": ["r"], "tokens": [8], "prefill": [true]}]}}"#,
    )
    .unwrap();
    // Two windows' logs: the later one saw the request finish. And one that is not a log.
    std::fs::write(
        dir.join("engine0.100.requests.json"),
        request_log(false).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("engine0.200.requests.json"),
        request_log(true).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("engine1.300.requests.json"), "{\"not\": 1}").unwrap();
    let o = stepscope(&["analyze", "--json", "--requests", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("engine1.300.requests.json: not a request log"),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &doc["requests"][0]["requests"][0];
    assert_eq!(r["id"], "r");
    assert_eq!(r["prefill"]["tokens"], 8);
    let log = &r["log"];
    assert!(
        log["server"]
            .as_str()
            .unwrap()
            .ends_with("engine0.200.requests.json"),
        "{log}"
    );
    assert_eq!(
        (log["finish"].as_str(), log["ttft_ms"].as_f64()),
        (Some("length"), Some(2000.0))
    );
    assert_eq!(log["queue"]["ms"], 1000.0);
}

/// A reader that stops reading (`stepscope analyze … | head -1`) is no failure: the command
/// ends quietly with the status of what it did. `println!` panicked there (exit 101, a
/// backtrace on stderr). The output is a socket whose other end is closed before the command
/// starts, so its first write fails, every time.
#[test]
fn a_closed_output_ends_the_command_quietly() {
    use std::process::{Command, Stdio};
    let trace = data("trace_filter__sampled_rank-0.json.gz");
    for json in [false, true] {
        let out = closed_socket();
        let mut args = vec!["analyze"];
        if json {
            args.push("--json");
        }
        let run = Command::new(env!("CARGO_BIN_EXE_stepscope"))
            .args(&args)
            .arg(&trace)
            .stdout(Stdio::from(out))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            run.status.success(),
            "--json {json}: {:?} {stderr}",
            run.status
        );
        assert!(stderr.is_empty(), "--json {json}: {stderr}");
    }
}

/// The same with the messages too (`stepscope analyze … 2>&1 | head -1`): a message that cannot
/// be written is dropped and the status still says how the command ended. `eprintln!`
/// panicked there, so an unreadable trace exited 101, not 2. Both streams are one socket whose
/// other end is closed before the command starts.
#[test]
fn a_closed_error_output_leaves_the_exit_status_as_it_was() {
    use std::process::{Command, Stdio};
    // Never created: nothing to clean up.
    let missing =
        std::env::temp_dir().join(format!("stepscope-missing-{}.json.gz", std::process::id()));
    let trace = data("trace_filter__sampled_rank-0.json.gz");
    for (input, code) in [(&missing, 2), (&trace, 0)] {
        let out = closed_socket();
        let err = out.try_clone().unwrap();
        let status = Command::new(env!("CARGO_BIN_EXE_stepscope"))
            .arg("analyze")
            .arg(input)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(code), "{}", input.display());
    }
}

/// A socket whose other end is closed: its first write fails with a broken pipe, every time.
fn closed_socket() -> std::os::fd::OwnedFd {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(theirs);
    ours.into()
}
