//! `stepscope diff` on real GPU traces (tests/data/hta) and on generated engine traces: its
//! per-kernel figures checked against totals this test computes itself from the raw JSON, and
//! its verdicts against differences built into the inputs.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{data, raw, render_in_chromium, stepscope};
use serde_json::{json, Value};
use stepscope_test_doubles::Scratch;

/// `diff --json` of `before` and `after` with `flags`, which must succeed.
fn diff_json(before: &Path, after: &Path, flags: &[&str]) -> Value {
    let out = stepscope(
        &[
            &[
                "diff",
                before.to_str().unwrap(),
                after.to_str().unwrap(),
                "--json",
                "--top",
                "0",
            ][..],
            flags,
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Per kernel name, over the kernels launched inside a `ProfilerStep#` range: (launches,
/// device time), and the steps' durations. Computed from the raw events alone.
fn kernels_per_step(trace: &Value) -> (HashMap<String, (u64, f64)>, Vec<f64>) {
    let events = trace["traceEvents"].as_array().unwrap();
    let steps: Vec<(f64, f64)> = events
        .iter()
        .filter(|e| {
            e["ph"] == "X"
                && e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("ProfilerStep#"))
        })
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (ts, ts + e["dur"].as_f64().unwrap())
        })
        .collect();
    let launch_at: HashMap<u64, f64> = events
        .iter()
        .filter(|e| {
            e["ph"] == "X" && matches!(e["cat"].as_str(), Some("cuda_runtime" | "cuda_driver"))
        })
        .filter_map(|e| Some((e["args"]["correlation"].as_u64()?, e["ts"].as_f64()?)))
        .collect();
    let mut totals: HashMap<String, (u64, f64)> = HashMap::new();
    for k in events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "kernel")
    {
        let Some(at) = k["args"]["correlation"]
            .as_u64()
            .and_then(|c| launch_at.get(&c))
        else {
            continue;
        };
        if steps.iter().any(|(s, e)| s <= at && at <= e) {
            let t = totals
                .entry(k["name"].as_str().unwrap().to_string())
                .or_default();
            t.0 += 1;
            t.1 += k["dur"].as_f64().unwrap();
        }
    }
    let mut durations: Vec<f64> = steps.iter().map(|(s, e)| e - s).collect();
    durations.sort_by(f64::total_cmp);
    (totals, durations)
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn per_kernel_figures_of_a_rank_pair_match_the_raw_json() {
    let r0 = data("trace_filter__sampled_rank-0.json.gz");
    let r1 = data("trace_filter__sampled_rank-1.json.gz");
    let (before, b_steps) = kernels_per_step(&raw(&r0));
    let (after, a_steps) = kernels_per_step(&raw(&r1));
    let d = diff_json(&r0, &r1, &["--exact-names", "--min-steps", "2"]);
    let groups = d["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "ProfilerStep#s form one group");
    let g = &groups[0];
    assert_eq!(g["group"], "step");
    assert!(close(
        g["before"]["median_us"].as_f64().unwrap(),
        median(&b_steps)
    ));
    assert!(close(
        g["after"]["median_us"].as_f64().unwrap(),
        median(&a_steps)
    ));
    let (nb, na) = (b_steps.len() as f64, a_steps.len() as f64);
    let rows: Vec<&Value> = g["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["category"] == "kernel")
        .collect();
    let names: std::collections::HashSet<&str> = before
        .keys()
        .chain(after.keys())
        .map(String::as_str)
        .collect();
    assert_eq!(rows.len(), names.len(), "one row per kernel name");
    for r in &rows {
        let name = r["name"].as_str().unwrap();
        let side = |v: &Value, n: f64| -> (f64, f64) {
            if v.is_null() {
                (0.0, 0.0)
            } else {
                (
                    v["count"].as_f64().unwrap() * n,
                    v["us"].as_f64().unwrap() * n,
                )
            }
        };
        let (bc, bt) = side(&r["before"], nb);
        let (ac, at) = side(&r["after"], na);
        let want_b = before.get(name).copied().unwrap_or_default();
        let want_a = after.get(name).copied().unwrap_or_default();
        assert!(
            close(bc, want_b.0 as f64) && close(bt, want_b.1),
            "{name}: before {bc} {bt} vs {want_b:?}"
        );
        assert!(
            close(ac, want_a.0 as f64) && close(at, want_a.1),
            "{name}: after {ac} {at} vs {want_a:?}"
        );
        assert!(close(
            r["delta_us"].as_f64().unwrap(),
            want_a.1 / na - want_b.1 / nb
        ));
        let status = match (want_b.0 > 0, want_a.0 > 0) {
            (true, true) => "same",
            (true, false) => "removed",
            _ => "added",
        };
        assert_eq!(r["status"], status, "{name}");
    }
    // Largest change first.
    let deltas: Vec<f64> = g["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["delta_us"].as_f64().unwrap().abs())
        .collect();
    assert!(deltas.windows(2).all(|w| w[0] >= w[1]));
}

#[test]
fn a_trace_against_itself_changes_nothing() {
    let t = data("trace_diff__control__control.json.gz");
    let d = diff_json(&t, &t, &["--min-steps", "2"]);
    for g in d["groups"].as_array().unwrap() {
        assert_eq!(g["verdict"], "no_change", "{g}");
        assert_eq!(g["shift_us"], 0.0);
        for r in g["names"].as_array().unwrap() {
            assert_eq!(
                (r["status"].as_str(), r["delta_us"].as_f64()),
                (Some("same"), Some(0.0))
            );
        }
    }
    // Six steps a side: too few to judge by default, and said so.
    let d = diff_json(&t, &t, &[]);
    assert_eq!(d["groups"][0]["verdict"], "too_few");
    let text =
        String::from_utf8(stepscope(&["diff", t.to_str().unwrap(), t.to_str().unwrap()]).stdout)
            .unwrap();
    assert!(text.contains("too few steps to judge"), "{text}");
}

/// A deterministic generator (xorshift) for the generated traces.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// An engine trace: `steps` decode steps of 4 requests, then 12 prefill steps; each step
/// launches the `kernels` (name, µs) with ±10% jitter; the step lasts its kernels plus 200 µs.
fn engine_trace(path: &Path, seed: u64, steps: usize, kernels: &[(&str, f64)]) {
    let mut rng = Rng(seed);
    let mut events = Vec::new();
    let mut t = 1000.0;
    let mut corr = 1u64;
    for i in 0..steps + 12 {
        let name = if i < steps {
            "execute_context_0(0)_generation_4(4)"
        } else {
            "execute_context_1(100)_generation_0(0)"
        };
        let start = t;
        let mut at = t + 50.0;
        for (k, us) in kernels {
            let dur = us * (0.9 + 0.2 * rng.unit());
            events.push(
                json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                "ts": at, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": corr}}),
            );
            events.push(
                json!({"ph": "X", "cat": "kernel", "name": k, "ts": at + 10.0,
                "dur": dur, "pid": 0, "tid": 7, "args": {"correlation": corr, "device": 0}}),
            );
            corr += 1;
            at += dur + 10.0;
        }
        t = at + 200.0 * (0.9 + 0.2 * rng.unit());
        events.push(
            json!({"ph": "X", "cat": "user_annotation", "name": name, "ts": start,
            "dur": t - start, "pid": 1, "tid": 1}),
        );
        t += 20.0;
    }
    std::fs::write(path, json!({"traceEvents": events}).to_string()).unwrap();
}

#[test]
fn an_added_kernel_is_found_first_and_the_same_workload_is_unchanged() {
    let dir = Scratch::empty("diff-engine");
    let base = [("gemm_kernel", 400.0), ("triton_poi_fused_add_0", 100.0)];
    let slower = [
        ("gemm_kernel", 400.0),
        ("triton_poi_fused_add_3", 100.0),
        ("extra_kernel", 150.0),
    ];
    let (a, b, c) = (dir.join("a.json"), dir.join("b.json"), dir.join("c.json"));
    engine_trace(&a, 1, 60, &base);
    engine_trace(&b, 2, 60, &base);
    engine_trace(&c, 3, 60, &slower);

    let same = diff_json(&a, &b, &[]);
    for g in same["groups"].as_array().unwrap() {
        assert_eq!(g["verdict"], "no_change", "{g}");
    }
    let d = diff_json(&a, &c, &[]);
    let groups = d["groups"].as_array().unwrap();
    let labels: Vec<&str> = groups
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["decode 3-4 req 3-4 tok", "prefill 1 req 65-128 tok"],
        "most time first"
    );
    for g in groups {
        assert_eq!(g["verdict"], "slower", "{g}");
        let top = &g["names"][0];
        assert_eq!(
            (&top["name"], &top["status"]),
            (&json!("extra_kernel"), &json!("added"))
        );
        // The generated index changed, the kernel did not: one row, matched.
        let matched: Vec<&Value> = g["names"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "matched")
            .collect();
        assert_eq!(matched.len(), 1);
        assert_eq!(
            matched[0]["before_names"],
            json!(["triton_poi_fused_add_0"])
        );
        assert_eq!(matched[0]["after_names"], json!(["triton_poi_fused_add_3"]));
    }
    // With --exact-names, the renamed kernel is one removed and one added.
    let exact = diff_json(&a, &c, &["--exact-names"]);
    // Matching normalized names moves time between rows, never loses it (here a row was
    // matched: see above).
    let total = |d: &Value, side: &str| -> f64 {
        d["groups"][0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["category"] == "kernel" && !r[side].is_null())
            .map(|r| r[side]["us"].as_f64().unwrap())
            .sum()
    };
    assert!(close(total(&d, "before"), total(&exact, "before")));
    assert!(close(total(&d, "after"), total(&exact, "after")));
    let kernel_rows = |d: &Value| {
        d["groups"][0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["category"] == "kernel")
            .count()
    };
    assert!(kernel_rows(&d) <= kernel_rows(&exact));
    let statuses: Vec<&str> = exact["groups"][0]["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert!(
        statuses.contains(&"removed") && !statuses.contains(&"matched"),
        "{statuses:?}"
    );

    // The page: groups as rows, each group's names a click away.
    let page = dir.join("d.html");
    let out = stepscope(&[
        "diff",
        a.to_str().unwrap(),
        c.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("href=\"#g0\"") && html.contains("<section id=\"g0\">"));
    assert!(html.contains("extra_kernel") && html.contains("class=\"slower\""));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no network"
    );
    let (dom, errors) = render_in_chromium(&page, &dir.join("profile"));
    assert!(errors.is_empty(), "{errors:?}");
    assert!(dom.contains("data-ready=\"1\""), "{dom}");
}

#[test]
fn manifests_give_step_times_and_say_names_were_not_compared() {
    let dir = Scratch::empty("diff-manifests");
    let (before, after) = (dir.join("before"), dir.join("after"));
    for (side, seed, us) in [(&before, 5, 400.0), (&after, 6, 800.0)] {
        std::fs::create_dir(side).unwrap();
        let trace = side.join("w.json");
        engine_trace(&trace, seed, 40, &[("gemm_kernel", us)]);
        let mut sink = stepscope_format::trace::Summarizer::new();
        let meta = stepscope_format::trace::EventStream::new()
            .read_all(std::fs::File::open(&trace).unwrap(), &mut sink)
            .unwrap();
        let manifest = json!({"status": "complete", "trace_file": "w.json",
            "summary": sink.finish(meta, 20)});
        std::fs::write(side.join("w.stepscope.json"), manifest.to_string()).unwrap();
    }
    let d = diff_json(&before, &after, &["--steps-only"]);
    assert_eq!(d["before"]["from_manifests"], 1);
    let g = &d["groups"][0];
    assert_eq!(
        (&g["verdict"], &g["names_compared"]),
        (&json!("slower"), &json!(false))
    );
    assert!(
        d["gpu"][1]["computation_us_per_step"].as_f64().unwrap()
            > 1.5 * d["gpu"][0]["computation_us_per_step"].as_f64().unwrap()
    );
    // Without --steps-only the traces beside them are read, names and all.
    let d = diff_json(&before, &after, &[]);
    assert_eq!(
        (
            &d["before"]["from_manifests"],
            &d["groups"][0]["names_compared"]
        ),
        (&json!(0), &json!(true))
    );
    // A manifest whose trace is gone still gives its steps.
    std::fs::remove_file(before.join("w.json")).unwrap();
    let d = diff_json(&before, &after, &[]);
    assert_eq!(d["before"]["from_manifests"], 1);
}

#[test]
fn bad_input_names_the_file_and_exits_2() {
    let dir = Scratch::empty("diff-bad");
    let good = data("trace_filter__sampled_rank-0.json.gz");
    let missing = dir.join("nope.json");
    let out = stepscope(&["diff", missing.to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.json"));
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"traceEvents": [{"ph": "X", "ts": "x"}]}"#).unwrap();
    let out = stepscope(&["diff", good.to_str().unwrap(), bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.json") && err.contains("`ts`"), "{err}");
    let out = stepscope(&[
        "diff",
        good.to_str().unwrap(),
        good.to_str().unwrap(),
        "--alpha",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--alpha"));
}

/// Decode steps of 20 kernels of 20 µs: replayed as one CUDA graph (queued back to back), or
/// launched one by one, each launch 15 µs after the kernel before ended (the GPU waits on
/// the host between them).
fn decode_trace(path: &Path, seed: u64, steps: usize, graphs: bool) {
    let mut rng = Rng(seed);
    let mut events = Vec::new();
    let mut t = 1000.0;
    let mut corr = 1u64;
    for _ in 0..steps {
        let start = t;
        let mut at = t + 50.0 * (0.9 + 0.2 * rng.unit());
        let kernel = |events: &mut Vec<Value>, corr: u64, ts: f64| {
            events.push(
                json!({"ph": "X", "cat": "kernel", "name": "decode_layer", "ts": ts,
                "dur": 20.0, "pid": 0, "tid": 7,
                "args": {"correlation": corr, "device": 0, "stream": 7}}),
            );
        };
        if graphs {
            events.push(
                json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
                "ts": at, "dur": 10, "pid": 1, "tid": 1, "args": {"correlation": corr}}),
            );
            for k in 0..20 {
                kernel(&mut events, corr, at + 20.0 + 20.0 * k as f64);
            }
            at += 20.0 + 400.0;
            corr += 1;
        } else {
            for _ in 0..20 {
                events.push(
                    json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                    "ts": at, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": corr}}),
                );
                kernel(&mut events, corr, at + 10.0);
                corr += 1;
                at += 10.0 + 20.0 + 15.0 * (0.9 + 0.2 * rng.unit());
            }
        }
        t = at + 30.0;
        events.push(json!({"ph": "X", "cat": "user_annotation",
            "name": "execute_context_0(0)_generation_8(8)", "ts": start, "dur": t - start,
            "pid": 1, "tid": 1}));
        t += 10.0;
    }
    std::fs::write(path, json!({"traceEvents": events}).to_string()).unwrap();
}

#[test]
fn a_slower_group_says_which_part_of_its_steps_moved_and_that_graphs_went_off() {
    let dir = Scratch::empty("diff-why");
    let (on, off) = (dir.join("graphs.json"), dir.join("eager.json"));
    decode_trace(&on, 1, 60, true);
    decode_trace(&off, 2, 60, false);
    let d = diff_json(&on, &off, &[]);
    let g = &d["groups"][0];
    assert_eq!(g["group"], "decode 5-8 req 5-8 tok");
    assert_eq!(g["verdict"], "slower", "{g}");
    let gpu = &g["gpu"];
    // Per step, before: 400 µs of computation, no gap inside; after: 400 µs of computation
    // and 19 gaps between its kernels, each the 13.5-16.5 µs before the next launch plus the
    // 10 µs from the launch to its kernel, all host wait (launched after the GPU went idle);
    // the gap between steps is host wait on both sides, and 0-10 µs longer after.
    assert_eq!(gpu["moved"][0]["part"], "host_wait", "{gpu}");
    assert_eq!(gpu["moved"].as_array().unwrap().len(), 1, "{gpu}");
    let host = gpu["moved"][0]["delta_us"].as_f64().unwrap();
    assert!((19.0 * 23.5..=19.0 * 26.5 + 10.0).contains(&host), "{host}");
    assert_eq!(gpu["launches"], json!([1.0, 20.0]));
    assert_eq!(gpu["graphs"], "CUDA graphs off");
    // Each side's steps are judged in `analyze` too: compute-bound before, host-bound after.
    for (path, bound) in [(&on, "compute"), (&off, "host")] {
        let a = stepscope(&["analyze", "--json", path.to_str().unwrap()]);
        let doc: Value = serde_json::from_slice(&a.stdout).unwrap();
        let groups = &doc["traces"][0]["groups"];
        assert_eq!(groups[0]["verdict"]["bound"], bound, "{groups}");
        for s in doc["traces"][0]["steps"].as_array().unwrap() {
            assert_eq!(s["gpu"]["verdict"]["bound"], bound);
        }
    }
    // The text says it in one line.
    let out = stepscope(&["diff", on.to_str().unwrap(), off.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let why = text
        .lines()
        .find(|l| l.trim_start().starts_with("why:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        why.contains(": host wait +")
            && why.contains("launches per step 1 → 20 (graph replays 1 → 0: CUDA graphs off)"),
        "{why}"
    );
}
