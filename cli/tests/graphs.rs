//! CUDA graph replays on a real GPU (tests/data/gpu, captured on an H100 by
//! scripts/gpu_check.py; README.md there): each replay's kernels in the step that launched it,
//! each step against the floor computed from the model's own tensors, and each replay kernel
//! given the operator that launched it at capture — each against what the raw JSON says,
//! read here without the tool.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{raw, stepscope};
use serde_json::Value;

fn gpu(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpu")
        .join(name)
}

const TRACE: &str = "graphs_rank0.pt.trace.json.gz";

fn analyze(args: &[&str]) -> Value {
    let out = stepscope(&[&["analyze", "--json"], args].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

fn events(path: &Path) -> Vec<Value> {
    raw(path)["traceEvents"].as_array().unwrap().clone()
}

fn cat(e: &Value) -> &str {
    e["cat"].as_str().unwrap_or("")
}

fn is_device(e: &Value) -> bool {
    matches!(cat(e), "kernel" | "gpu_memcpy" | "gpu_memset")
}

/// Each runtime call by correlation id.
fn launches(ev: &[Value]) -> HashMap<u64, &Value> {
    ev.iter()
        .filter(|e| matches!(cat(e), "cuda_runtime" | "cuda_driver"))
        .filter_map(|e| Some((e["args"]["correlation"].as_u64()?, e)))
        .collect()
}

fn within(e: &Value, span: &Value) -> bool {
    let (t, s) = (f(&e["ts"]), f(&span["ts"]));
    s <= t && t <= s + f(&span["dur"])
}

/// The step annotations, in time order.
fn steps(ev: &[Value]) -> Vec<&Value> {
    let mut s: Vec<&Value> = ev
        .iter()
        .filter(|e| cat(e) == "user_annotation")
        .filter(|e| e["name"].as_str().unwrap().starts_with("execute_"))
        .collect();
    s.sort_by(|a, b| f(&a["ts"]).total_cmp(&f(&b["ts"])));
    s
}

/// What scripts/gpu_check.py recorded of a run beside its traces (`dir/gpu_check.json`).
fn provenance(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("gpu_check.json")).unwrap()).unwrap()
}

/// The device events whose runtime call satisfies `launch`.
fn launched<'a>(
    ev: &'a [Value],
    by_corr: &HashMap<u64, &Value>,
    launch: impl Fn(&Value) -> bool,
) -> Vec<&'a Value> {
    ev.iter()
        .filter(|e| is_device(e))
        .filter(|e| {
            by_corr
                .get(&e["args"]["correlation"].as_u64().unwrap_or(u64::MAX))
                .is_some_and(|l| launch(l))
        })
        .collect()
}

/// Adds a replay's device events (in time order) to the operators an eager run gives the same
/// kernels (`eager`: each one's name and operator), as (events, µs) per operator.
fn add_ops(want: &mut HashMap<String, (u64, f64)>, replay: &[&Value], eager: &[(String, String)]) {
    for (d, (_, op)) in replay.iter().zip(eager) {
        let w = want.entry(op.clone()).or_default();
        w.0 += 1;
        w.1 += f(&d["dur"]);
    }
}

/// `analyze`'s time per operator inside the replays equals `want`.
fn assert_ops(graph_ops: &Value, want: &HashMap<String, (u64, f64)>) {
    let ours = graph_ops["ops"].as_array().unwrap();
    assert_eq!(ours.len(), want.len());
    for o in ours {
        let (events, total) = want[o["op"].as_str().unwrap()];
        assert_eq!(o["events"].as_u64(), Some(events), "{o}");
        assert!((f(&o["total_us"]) - total).abs() <= 1e-6 * total, "{o}");
    }
}

#[test]
fn each_graph_replay_is_in_the_step_that_launched_it_with_all_of_the_graphs_nodes() {
    let provenance = provenance(&gpu(""));
    // The graph's nodes, from the CUDA runtime (cudaGraphGetNodes) on the GPU machine.
    let nodes = &provenance["graph_nodes"];
    let graph_events = nodes["kernel"].as_u64().unwrap() + nodes["memcpy"].as_u64().unwrap_or(0);
    assert_eq!(graph_events, 37);

    let ev = events(&gpu(TRACE));
    let by_corr = launches(&ev);
    let steps_raw = steps(&ev);
    let doc = analyze(&[gpu(TRACE).to_str().unwrap()]);
    let ours = doc["traces"][0]["steps"].as_array().unwrap();
    assert_eq!(ours.len(), 10);
    assert_eq!(steps_raw.len(), 10);
    let mut in_steps = 0;
    for (s, raw_step) in ours.iter().zip(&steps_raw) {
        assert_eq!(s["name"], raw_step["name"]);
        // What the raw JSON says this step launched: device events whose runtime call began
        // inside the step's annotation.
        let launched = launched(&ev, &by_corr, |l| within(l, raw_step));
        in_steps += launched.len();
        let replays: Vec<&&Value> = by_corr
            .values()
            .filter(|l| l["name"] == "cudaGraphLaunch" && within(l, raw_step))
            .collect();
        let la = &s["gpu"]["launches"];
        let kernels = launched.iter().filter(|e| cat(e) == "kernel").count() as u64;
        assert_eq!(s["kernel_count"].as_u64(), Some(kernels));
        if s["name"]
            .as_str()
            .unwrap()
            .starts_with("execute_context_1(")
        {
            assert_eq!(la["graph_launches"], 0);
            assert!(replays.is_empty());
            assert_eq!(la["kernel_launches"].as_u64(), Some(kernels));
        } else {
            assert_eq!(la["graph_launches"], 1, "{}", s["name"]);
            assert_eq!(replays.len(), 1);
            assert_eq!(la["graph_kernels"].as_u64(), Some(graph_events));
            let corr = replays[0]["args"]["correlation"].clone();
            let replayed = launched
                .iter()
                .filter(|e| e["args"]["correlation"] == corr)
                .count();
            assert_eq!(replayed as u64, graph_events);
            // Beside the replay, the sampled tokens' copy to the host.
            assert_eq!(launched.len() - replayed, 1);
            assert_eq!(la["copy_launches"], 1);
            assert_eq!(la["kernel_launches"], 0);
        }
    }
    // The trace also holds device work launched after the window's last step (the next
    // step's replay, recorded until the writer stopped CUPTI): it belongs to no step.
    let all = ev.iter().filter(|e| is_device(e)).count();
    let last_end = f(&steps_raw[9]["ts"]) + f(&steps_raw[9]["dur"]);
    let after = launched(&ev, &by_corr, |l| f(&l["ts"]) > last_end);
    assert_eq!(all, in_steps + after.len());
    assert_eq!(after.len(), 6);
}

#[test]
fn the_next_steps_work_after_the_stop_is_left_out_of_the_trace_figures() {
    // The same trace with its header's stop time (newer stepscopes write it; this one's is its
    // manifest's, from the same run): what was launched after it is left out and counted.
    use std::io::{Read, Write};
    let stop = provenance(&gpu(""))["stop_unix_ns"].as_u64().unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(gpu(TRACE)).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let with_stop = text.replacen(
        "\"iterations\":10,",
        &format!("\"iterations\":10,\"stop_unix_ns\":{stop},"),
        1,
    );
    assert_ne!(with_stop, text);
    /// Removed when the test ends, passing or not.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir =
        Scratch(std::env::temp_dir().join(format!("stepscope-after-stop-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("stopped.pt.trace.json.gz");
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::fast(),
    );
    gz.write_all(with_stop.as_bytes()).unwrap();
    gz.finish().unwrap();
    let before = analyze(&[gpu(TRACE).to_str().unwrap()]);
    let after = analyze(&[path.to_str().unwrap()]);

    // Read here: the runtime calls begun after the stop, on the trace's clock, and the device
    // events they launched.
    let doc = raw(&gpu(TRACE));
    let base = doc["baseTimeNanoseconds"].as_u64().unwrap();
    let stop_us = (stop - base) as f64 / 1000.0;
    let ev = events(&gpu(TRACE));
    let late: Vec<u64> = launches(&ev)
        .into_iter()
        .filter(|(_, l)| f(&l["ts"]) > stop_us)
        .map(|(c, _)| c)
        .collect();
    let late_device = launched(&ev, &launches(&ev), |l| f(&l["ts"]) > stop_us);
    assert_eq!(late_device.len(), 6);
    let kernels = |d: &Value| d["traces"][0]["kernels"]["count"].as_u64().unwrap();
    assert_eq!(before["traces"][0]["after_stop"], Value::Null);
    let a = &after["traces"][0]["after_stop"];
    assert_eq!(a["runtime_calls"].as_u64(), Some(late.len() as u64));
    assert_eq!(a["device_events"].as_u64(), Some(6));
    let late_kernels = late_device.iter().filter(|e| cat(e) == "kernel").count() as u64;
    assert_eq!(kernels(&after), kernels(&before) - late_kernels);
    // What is left is the window's: 9 replays of 36 kernels and the prefill's 30.
    assert_eq!(kernels(&after), 9 * 36 + 30);
    // The steps are the same.
    assert_eq!(after["traces"][0]["steps"], before["traces"][0]["steps"]);
}

#[test]
fn each_real_step_is_held_against_the_floor_computed_from_the_models_tensors() {
    // scripts/gpu_check.py computed each step's FLOPs and bytes from the model's own weight
    // tensors and shapes (not analyze's closed form), and its % of floor from the step's
    // kernels alone.
    let provenance = provenance(&gpu(""));
    let doc = analyze(&[gpu(TRACE).to_str().unwrap()]);
    let t = &doc["traces"][0];
    assert_eq!(t["peaks"]["tflops"], 989.4); // H100 SXM, from the trace's deviceProperties
    let ours = t["steps"].as_array().unwrap();
    let theirs = provenance["steps"].as_array().unwrap();
    assert_eq!(ours.len(), theirs.len());
    for (s, p) in ours.iter().zip(theirs) {
        let (fl, want) = (&s["floor"], &p["floor_from_tensors"]);
        assert_eq!(f(&fl["flops"]), f(&want["flops"]), "{}", s["name"]);
        assert_eq!(f(&fl["bytes"]), f(&want["bytes"]), "{}", s["name"]);
        assert!((f(&fl["floor_us"]) - f(&want["floor_us"])).abs() < 1e-6);
        let bound = if p["kind"] == "decode" {
            "memory"
        } else {
            "compute"
        };
        assert_eq!(fl["bound"], bound);
        assert_eq!(want["bound"], bound);
        let of_busy = f(&p["of_busy_from_kernels"]);
        assert!(
            (f(&fl["of_busy"]) - of_busy).abs() < 1e-5 * of_busy,
            "{s} {p}"
        );
    }
}

#[test]
fn each_replay_kernel_is_given_the_operator_that_launched_it_at_capture() {
    let eager = eager_by_annotation(&gpu("eager_decode.pt.trace.json.gz"))["eager_decode"].clone();
    assert_eq!(eager.len(), 37);
    // The replays, read here: each one's device events in time order.
    let ev = events(&gpu(TRACE));
    let by_corr = launches(&ev);
    let mut replays: HashMap<u64, Vec<&Value>> = HashMap::new();
    for e in ev.iter().filter(|e| is_device(e)) {
        let c = e["args"]["correlation"].as_u64().unwrap();
        if by_corr
            .get(&c)
            .is_some_and(|l| l["name"] == "cudaGraphLaunch")
        {
            replays.entry(c).or_default().push(e);
        }
    }
    // The same kernels an eager run of the same code launched from each operator, in order:
    // what makes a replay's order a map to its operators.
    let mut want: HashMap<String, (u64, f64)> = HashMap::new();
    let mut whole = 0;
    for r in replays.values_mut() {
        r.sort_by(|a, b| f(&a["ts"]).total_cmp(&f(&b["ts"])));
        if r.len() != eager.len() {
            continue; // the replay launched after the window, partly recorded
        }
        whole += 1;
        for (d, (name, _)) in r.iter().zip(&eager) {
            assert_eq!(d["name"].as_str().unwrap(), name);
        }
        add_ops(&mut want, r, &eager);
    }
    assert_eq!(whole, 9);

    let doc = analyze(&[
        "--graph-capture",
        gpu("capture_traces").to_str().unwrap(),
        gpu(TRACE).to_str().unwrap(),
    ]);
    let g = &doc["traces"][0]["graph_ops"];
    assert_eq!(g["replays"], 10);
    assert_eq!(g["mapped"], 9);
    // The next step's replay, launched after the window and recorded in part.
    let why = g["unmapped"][0]["why"].as_str().unwrap();
    assert!(
        why.starts_with("launched outside the trace's steps"),
        "{why}"
    );
    assert_eq!(g["captures"][0][0], "capture_32_FULL");
    assert_ops(g, &want);
    assert_eq!(g["ops"][0]["op"], "aten::copy_"); // the GQA heads' repeat_interleave, 47%

    let out = stepscope(&[
        "analyze",
        "--graph-capture",
        gpu("capture_traces").to_str().unwrap(),
        gpu(TRACE).to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("inside CUDA graph replays: 9 of 10 replays mapped to their capture (capture_32_FULL ×9)"),
        "{text}"
    );
}

/// Per annotation of an eager run's trace (`eager_decode`, `eager_{batch}`): the device events
/// launched inside it in time order, each with its name and the innermost CPU operator around
/// its launch.
fn eager_by_annotation(path: &Path) -> HashMap<String, Vec<(String, String)>> {
    let ev = events(path);
    let by_corr = launches(&ev);
    let ops: Vec<&Value> = ev.iter().filter(|e| cat(e) == "cpu_op").collect();
    let mut out = HashMap::new();
    for a in ev.iter().filter(|e| cat(e) == "user_annotation") {
        let mut device = launched(&ev, &by_corr, |l| within(l, a));
        device.sort_by(|x, y| f(&x["ts"]).total_cmp(&f(&y["ts"])));
        let list = device
            .iter()
            .map(|d| {
                let launch = by_corr[&d["args"]["correlation"].as_u64().unwrap()];
                let op = ops
                    .iter()
                    .filter(|o| o["tid"] == launch["tid"] && within(launch, o))
                    .min_by(|x, y| f(&x["dur"]).total_cmp(&f(&y["dur"])))
                    .map_or("?", |o| o["name"].as_str().unwrap());
                (d["name"].as_str().unwrap().to_string(), op.to_string())
            })
            .collect();
        out.insert(a["name"].as_str().unwrap().to_string(), list);
    }
    out
}

#[test]
fn one_graph_per_batch_size_in_one_capture_trace_maps_each_replay_as_vllm_captures_them() {
    // vLLM's layout: one graph per decode batch size (32, 16, 8), all captured in one trace,
    // the decode steps cycling through them. The sizes launch different kernels (cuBLAS splits
    // the smaller products: 39 nodes against 37), from the same operators.
    let dir = gpu("batches");
    let provenance = provenance(&dir);
    let eager = eager_by_annotation(&dir.join("eager_batches.pt.trace.json.gz"));
    let trace = dir.join("batches_rank0.pt.trace.json.gz");
    let ev = events(&trace);
    let by_corr = launches(&ev);
    let mut want: HashMap<String, (u64, f64)> = HashMap::new();
    let mut replays = 0;
    for step in steps(&ev) {
        let name = step["name"].as_str().unwrap();
        let batch = name
            .split("_generation_")
            .nth(1)
            .unwrap()
            .split('(')
            .next()
            .unwrap();
        let nodes = &provenance["graph_nodes"][batch];
        let expected = eager[&format!("eager_{batch}")].clone();
        assert_eq!(
            expected.len() as u64,
            nodes["kernel"].as_u64().unwrap() + nodes["memcpy"].as_u64().unwrap()
        );
        let mut replay = launched(&ev, &by_corr, |l| {
            l["name"] == "cudaGraphLaunch" && within(l, step)
        });
        replay.sort_by(|a, b| f(&a["ts"]).total_cmp(&f(&b["ts"])));
        let names: Vec<&str> = replay.iter().map(|e| e["name"].as_str().unwrap()).collect();
        let eager_names: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, eager_names, "{name}");
        add_ops(&mut want, &replay, &expected);
        replays += 1;
    }
    assert_eq!(replays, 9);

    let doc = analyze(&[
        "--graph-capture",
        dir.join("capture_traces").to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    let g = &doc["traces"][0]["graph_ops"];
    assert_eq!(
        (g["replays"].as_u64(), g["mapped"].as_u64()),
        (Some(10), Some(9))
    );
    // 16 and 8 launch the same node kinds from the same operators: named together.
    assert_eq!(
        g["captures"],
        serde_json::json!([
            ["capture_16_FULL | capture_8_FULL", 6],
            ["capture_32_FULL", 3]
        ])
    );
    assert_ops(g, &want);
}

#[test]
fn a_graph_capture_that_holds_no_capture_is_an_error_naming_what_is_missing() {
    let not_a_capture = gpu("eager_decode.pt.trace.json.gz");
    let out = stepscope(&[
        "analyze",
        "--graph-capture",
        not_a_capture.to_str().unwrap(),
        gpu(TRACE).to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--graph-capture: no trace given holds a CUDA graph capture"),
        "{err}"
    );
    let out = stepscope(&[
        "analyze",
        "--graph-capture",
        "/nonexistent/capture.json",
        gpu(TRACE).to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/capture.json"));
}
