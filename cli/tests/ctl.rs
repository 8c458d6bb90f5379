//! `stepscope ctl` against real HTTP on loopback: a test router and test workers (healthy,
//! hanging past the timeout, down, 404, 500, transient 503) served by this test.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::server::{Reply, Server};
use serde_json::{json, Value};

/// A URL where nothing listens.
fn down_url() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

fn router(workers: Value) -> Server {
    Server::new(move |req, _| match req.path.as_str() {
        "/workers" => Reply::Json(200, workers.clone()),
        _ => Reply::Json(404, json!({"detail": "Not Found"})),
    })
}

fn ctl(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_stepscope"))
        .arg("ctl")
        .args(args)
        .output()
        .expect("run stepscope");
    (out, start.elapsed())
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn by_url<'a>(doc: &'a Value, url: &str) -> &'a Value {
    doc["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == url)
        .unwrap_or_else(|| panic!("{url} missing from {doc}"))
}

#[test]
fn start_through_a_vllm_router_reports_every_worker() {
    let ok1 = Server::ok();
    let ok2 = Server::ok();
    let hung = Server::new(|_, _| Reply::Hang);
    let missing = Server::new(|_, _| Reply::Json(404, json!({"detail": "Not Found"})));
    let broken = Server::new(|_, _| Reply::Text(500, "Internal Server Error: boom"));
    let unhealthy = Server::ok();
    let down = down_url();
    let r = router(json!({"workers": [
        {"url": ok1.url, "is_healthy": true},
        {"url": hung.url, "is_healthy": true},
        {"url": down, "is_healthy": true},
        {"url": missing.url, "is_healthy": true},
        {"url": broken.url, "is_healthy": true},
        {"url": unhealthy.url, "is_healthy": false},
        {"url": ok2.url, "is_healthy": true},
    ], "total": 7}));

    let (out, _) = ctl(&[
        "start",
        "--router-url",
        &r.url,
        "--delay-iterations",
        "5",
        "--max-iterations",
        "3",
        "--profile-prefix",
        "run1",
        "--timeout",
        "1",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "a failure anywhere exits 1");
    let doc = json_of(&out);
    let urls: Vec<&str> = doc["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap())
        .collect();
    assert_eq!(
        urls,
        [
            &ok1.url,
            &hung.url,
            &down,
            &missing.url,
            &broken.url,
            &unhealthy.url,
            &ok2.url
        ],
        "discovery order"
    );
    for ok in [&ok1, &ok2] {
        let w = by_url(&doc, &ok.url);
        assert_eq!(
            (w["ok"].clone(), w["status"].clone()),
            (json!(true), json!(200))
        );
        assert_eq!(w["error"], Value::Null);
        let reqs = ok.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(
            (reqs[0].method.as_str(), reqs[0].path.as_str()),
            ("POST", "/start_profile")
        );
        let body: Value = serde_json::from_str(&reqs[0].body).unwrap();
        assert_eq!(
            body,
            json!({"profile_prefix": "run1", "delay_iterations": 5, "max_iterations": 3})
        );
    }
    let err = |url: &str| by_url(&doc, url)["error"].as_str().unwrap().to_string();
    assert_eq!(by_url(&doc, &hung.url)["status"], Value::Null);
    assert!(
        err(&hung.url).contains("no answer within the timeout"),
        "{}",
        err(&hung.url)
    );
    assert!(err(&down).contains("connection refused"), "{}", err(&down));
    assert_eq!(by_url(&doc, &missing.url)["status"], json!(404));
    assert!(
        err(&missing.url).contains("--profiler-config"),
        "{}",
        err(&missing.url)
    );
    assert_eq!(by_url(&doc, &broken.url)["status"], json!(500));
    assert!(
        err(&broken.url).contains("Internal Server Error: boom"),
        "{}",
        err(&broken.url)
    );
    assert!(
        err(&unhealthy.url).starts_with("skipped"),
        "{}",
        err(&unhealthy.url)
    );
    assert!(
        unhealthy.requests().is_empty(),
        "an unhealthy worker is not contacted"
    );
}

/// Six workers that each answer only once all six requests have arrived: contacted one after
/// another, the first would wait for the others until its timeout, and fail. All six succeed
/// only if the requests are in flight together, so a hung worker costs one timeout, not one
/// each. No clock is read: the timeout is only a bound for a broken run.
#[test]
fn workers_are_contacted_at_once_not_one_after_another() {
    let arrived = Arc::new((Mutex::new(0usize), Condvar::new()));
    let servers: Vec<Server> = (0..6)
        .map(|_| {
            let arrived = arrived.clone();
            Server::new(move |_, _| {
                let (count, cv) = &*arrived;
                let mut n = count.lock().unwrap();
                *n += 1;
                cv.notify_all();
                while *n < 6 {
                    n = cv.wait(n).unwrap();
                }
                Reply::Json(200, json!({"status": "ok"}))
            })
        })
        .collect();
    let mut args = vec!["stop", "--timeout", "120", "--json"];
    for s in &servers {
        args.extend(["--worker", s.url.as_str()]);
    }
    let (out, _) = ctl(&args);
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert!(doc["workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["ok"] == true));
    assert!(servers.iter().all(|s| s.requests().len() == 1));
}

#[test]
fn all_workers_ok_exits_0_with_a_table() {
    let a = Server::ok();
    let b = Server::ok();
    let (out, _) = ctl(&["stop", "--worker", &a.url, "--worker", &b.url]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(table.starts_with("WORKER"), "{table}");
    assert!(
        table.contains("2 of 2 workers stopped, 0 failed"),
        "{table}"
    );
    for s in [&a, &b] {
        let r = s.requests();
        assert_eq!(
            (r[0].method.as_str(), r[0].path.as_str()),
            ("POST", "/stop_profile")
        );
        assert_eq!(r[0].body, "", "stop sends no body");
    }
}

#[test]
fn sglang_dialect_through_a_list_workers_router() {
    let a = Server::ok();
    let b = Server::ok();
    let urls = json!({"urls": [a.url, b.url]});
    let r = Server::new(move |req, _| match req.path.as_str() {
        "/list_workers" => Reply::Json(200, urls.clone()),
        _ => Reply::Json(404, json!({"detail": "Not Found"})),
    });
    let (out, _) = ctl(&[
        "start",
        "--engine",
        "sglang",
        "--router-url",
        &r.url,
        "--num-steps",
        "5",
        "--activities",
        "CPU,GPU",
        "--profile-by-stage",
        "--output-dir",
        "/tmp/traces",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let paths: Vec<String> = r.requests().iter().map(|q| q.path.clone()).collect();
    assert_eq!(paths, ["/workers", "/list_workers"]);
    for s in [&a, &b] {
        let body: Value = serde_json::from_str(&s.requests()[0].body).unwrap();
        assert_eq!(
            body,
            json!({"output_dir": "/tmp/traces", "num_steps": 5, "activities": ["CPU", "GPU"],
                   "profile_by_stage": true})
        );
    }
    // A 404 from an SGLang worker points at the dialect, not at vLLM's flag.
    let missing = Server::new(|_, _| Reply::Json(404, json!({})));
    let (out, _) = ctl(&[
        "start",
        "--engine",
        "sglang",
        "--worker",
        &missing.url,
        "--json",
    ]);
    let doc = json_of(&out);
    let e = doc["workers"][0]["error"].as_str().unwrap();
    assert!(e.contains("is this an SGLang server"), "{e}");
}

#[test]
fn discovery_and_usage_errors_exit_2_and_say_why() {
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    let (out, _) = ctl(&["start", "--router-url", &down_url(), "--timeout", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot list workers"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("connection refused"),
        "{}",
        stderr(&out)
    );

    let empty = router(json!({"workers": [], "total": 0}));
    let (out, _) = ctl(&["start", "--router-url", &empty.url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("lists no workers"),
        "{}",
        stderr(&out)
    );

    let not_json = Server::new(|_, _| Reply::Text(200, "<html>hello</html>"));
    let (out, _) = ctl(&["stop", "--router-url", &not_json.url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("did not return JSON"),
        "{}",
        stderr(&out)
    );

    let no_list = Server::new(|_, _| Reply::Json(404, json!({})));
    let (out, _) = ctl(&["stop", "--router-url", &no_list.url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("has no worker list"),
        "{}",
        stderr(&out)
    );

    let (out, _) = ctl(&[
        "start",
        "--worker",
        "http://127.0.0.1:1",
        "--num-steps",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--num-steps is an SGLang field"),
        "{}",
        stderr(&out)
    );

    let (out, _) = ctl(&["start"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "neither --router-url nor --worker"
    );
    let (out, _) = ctl(&["stop", "--worker", "https://w:8000"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("https is not supported"),
        "{}",
        stderr(&out)
    );
    let (out, _) = ctl(&["stop", "--worker", "w:1", "--timeout", "0"]);
    assert_eq!(out.status.code(), Some(2), "a zero timeout is refused");
}

#[test]
fn retries_recover_a_transient_503() {
    let flaky = || {
        Server::new(|_, n| {
            if n == 0 {
                Reply::Json(503, json!({"error": "warming up"}))
            } else {
                Reply::Json(200, json!({}))
            }
        })
    };
    let once = flaky();
    let (out, _) = ctl(&["start", "--worker", &once.url, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_of(&out)["workers"][0]["status"], json!(503));
    assert_eq!(once.requests().len(), 1);

    let retried = flaky();
    let (out, _) = ctl(&[
        "start",
        "--worker",
        &retried.url,
        "--retries",
        "2",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_of(&out)["workers"][0]["status"], json!(200));
    assert_eq!(retried.requests().len(), 2);
}

#[test]
fn workers_lists_what_discovery_found_with_health() {
    let up = Server::ok();
    let r = router(json!({"workers": [
        {"url": up.url, "is_healthy": true},
        {"url": down_url(), "is_healthy": false},
    ]}));
    let (out, _) = ctl(&["workers", "--router-url", &r.url]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("healthy"), "{table}");
    assert!(table.contains("skipped"), "{table}");
    assert_eq!(up.requests()[0].path, "/health");
    assert!(
        table.contains("1 of 2 workers healthy, 1 failed"),
        "{table}"
    );
}

#[test]
fn status_shows_every_engine_workers_state_under_its_server() {
    // What stepscope's vLLM endpoint plugin answers (tests/python/test_vllm_plugin.py checks
    // the endpoint produces this shape from real WorkerProfiler.status() dicts).
    let server = Server::new(|req, _| {
        assert_eq!(req.path, "/stepscope/status");
        Reply::Json(
            200,
            json!({"workers": [
                {"rank": 0, "backend": "torch", "phase": "running", "active": true,
                 "step_index": 1207, "window_first_step": 1200, "iterations_captured": 7,
                 "max_iterations": 10, "windows": 3, "windows_done": 1, "pending_writes": 1,
                 "selected": true, "last_error": null},
                {"rank": 1, "backend": "torch", "phase": "idle", "active": false,
                 "step_index": 1207, "selected": false, "windows": 1},
                {"rank": 2, "backend": "cuda", "phase": "not_created",
                 "note": "no /start_profile has reached this worker yet"}
            ]}),
        )
    });
    let no_plugin = Server::new(|_, _| Reply::Json(404, json!({"detail": "Not Found"})));
    let (out, _) = ctl(&[
        "status",
        "--worker",
        &server.url,
        "--worker",
        &no_plugin.url,
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let lines: Vec<&str> = table.lines().collect();
    let row = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in\n{table}"))
            .to_string()
    };
    let r0 = row("rank 0");
    for part in [
        "running",
        "step 1207",
        "window from step 1200",
        "captured 7/10",
        "windows 1/3",
        "1 trace(s) being written",
    ] {
        assert!(r0.contains(part), "{part:?} missing in {r0:?}");
    }
    assert!(row("rank 1").contains("(not in stepscope.ranks)"));
    assert!(row("rank 2").contains("not_created"));
    assert!(row(&no_plugin.url).contains("VLLM_PLUGINS"), "{table}");

    let (out, _) = ctl(&["status", "--worker", &server.url, "--json"]);
    let doc = json_of(&out);
    assert_eq!(doc["workers"][0]["engine_workers"][0]["phase"], "running");
}

/// A server's `/stepscope/timeline` answer (the vLLM plugin's form: tests/python's live test
/// reads a real one): one worker per entry, named `rank{r}`, steps of the given durations 10 ms
/// apart ending now, each serving `reqs` decode requests.
fn timeline_answer(workers: &[(i64, &[u64], u32)]) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let workers: Vec<Value> = workers
        .iter()
        .map(|(rank, ms, reqs)| {
            let n = ms.len() as u64;
            let steps: Vec<Value> = ms
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let i = i as u64;
                    json!([
                        100 + i,
                        now - (n - i) * 10_000_000,
                        d * 1_000_000,
                        0,
                        0,
                        reqs,
                        reqs,
                        "idle"
                    ])
                })
                .collect();
            json!({"worker_name": format!("rank{rank}"), "rank": rank, "phase": "idle",
                   "step_index": 99 + n, "now_unix_ns": now,
                   "timeline": {"capacity": 4096, "recorded": 99 + n, "clock": "tsc"},
                   "fields": ["step", "start_unix_ns", "duration_ns", "num_ctx_reqs",
                              "num_ctx_tokens", "num_gen_reqs", "num_gen_tokens", "phase"],
                   "steps": steps})
        })
        .collect();
    json!({ "workers": workers })
}

fn timeline_server(answer: Value) -> Server {
    Server::new(move |req, _| {
        if req.path.starts_with("/stepscope/timeline") {
            Reply::Json(200, answer.clone())
        } else {
            Reply::Json(404, json!({"detail": "Not Found"}))
        }
    })
}

#[test]
fn top_once_json_gives_each_workers_percentiles_and_marks_the_straggler() {
    let a = timeline_server(timeline_answer(&[
        (0, &[5, 5, 5, 5, 30], 4),
        (1, &[5, 6, 5, 6, 5], 4),
    ]));
    let b = timeline_server(timeline_answer(&[(2, &[9, 9, 9, 9, 9], 2)]));
    let (out, _) = ctl(&[
        "top", "--worker", &a.url, "--worker", &b.url, "--once", "--json", "--window", "60",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json_of(&out);
    let rows = doc["workers"].as_array().unwrap();
    let row = |rank: i64| rows.iter().find(|r| r["rank"] == rank).unwrap();
    assert_eq!(row(0)["steps"], 5);
    assert_eq!(row(0)["p50_ms"], 5.0);
    assert_eq!(
        (row(0)["max_ms"].as_f64(), row(0)["max_step"].as_u64()),
        (Some(30.0), Some(104))
    );
    assert_eq!(row(2)["mean_requests"], 2.0);
    assert_eq!(row(2)["mean_tokens"], 2.0);
    // The p50s are 5, 5 and 9: rank 2 is the straggler, not rank 0 with one slow step.
    let stragglers: Vec<i64> = rows
        .iter()
        .filter(|r| r["straggler"] == true)
        .map(|r| r["rank"].as_i64().unwrap())
        .collect();
    assert_eq!(stragglers, [2]);
    // Since step 102: steps 103 and 104 of each worker.
    let (out, _) = ctl(&[
        "top",
        "--worker",
        &a.url,
        "--once",
        "--json",
        "--since-step",
        "102",
    ]);
    let doc = json_of(&out);
    assert_eq!(doc["workers"][0]["steps"], 2);
    assert_eq!(doc["workers"][0]["first_step"], 103);
    // Each poll asks only for what it has not seen.
    assert!(a
        .requests()
        .iter()
        .all(|r| r.path == "/stepscope/timeline?since=0"));

    // The table marks the straggler.
    let (out, _) = ctl(&["top", "--worker", &a.url, "--worker", &b.url, "--once"]);
    let table = String::from_utf8_lossy(&out.stdout);
    let line = table.lines().find(|l| l.contains("rank2")).unwrap();
    assert!(line.starts_with('*'), "{table}");
}

#[test]
fn top_honours_retries_and_concurrency_as_every_ctl_command_does() {
    // A timeline server that answers 503 once: --retries 1 gets its steps.
    let answer = timeline_answer(&[(0, &[5, 5], 1)]);
    let flaky = || {
        let answer = answer.clone();
        Server::new(move |_, n| {
            if n == 0 {
                Reply::Json(503, json!({"error": "warming up"}))
            } else {
                Reply::Json(200, answer.clone())
            }
        })
    };
    let once = flaky();
    let (out, _) = ctl(&["top", "--worker", &once.url, "--once", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(json_of(&out)["errors"][0]["error"]
        .as_str()
        .unwrap()
        .contains("HTTP 503"));
    let retried = flaky();
    let (out, _) = ctl(&[
        "top",
        "--worker",
        &retried.url,
        "--once",
        "--json",
        "--retries",
        "1",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(json_of(&out)["workers"][0]["steps"], 2);
    assert_eq!(retried.requests().len(), 2);

    // The first server answers only once the second has been asked: with every server at
    // once both answer; one at a time, the first waits out its timeout and the second answers.
    let asked = Arc::new((Mutex::new(false), Condvar::new()));
    let first = {
        let (asked, answer) = (asked.clone(), answer.clone());
        Server::new(move |_, _| {
            let (lock, cv) = &*asked;
            let mut done = lock.lock().unwrap();
            while !*done {
                done = cv.wait(done).unwrap();
            }
            Reply::Json(200, answer.clone())
        })
    };
    let second = {
        let (asked, answer) = (asked.clone(), answer.clone());
        Server::new(move |_, _| {
            let (lock, cv) = &*asked;
            *lock.lock().unwrap() = true;
            cv.notify_all();
            Reply::Json(200, answer.clone())
        })
    };
    let both = |extra: &[&str]| {
        let args = [
            "top",
            "--worker",
            &first.url,
            "--worker",
            &second.url,
            "--once",
            "--json",
        ];
        ctl(&[&args[..], extra].concat())
    };
    let (out, _) = both(&[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    *asked.0.lock().unwrap() = false;
    let (out, _) = both(&["--concurrency", "1", "--timeout", "1"]);
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{doc}");
    let errors = doc["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{doc}");
    assert_eq!(errors[0]["url"], json!(first.url));
    assert!(
        errors[0]["error"].as_str().unwrap().contains("timeout"),
        "{doc}"
    );
}

#[test]
fn top_says_what_is_missing_where_a_server_has_no_timeline() {
    let without = Server::new(|_, _| Reply::Json(404, json!({"detail": "Not Found"})));
    let off = timeline_server(json!({"workers": [{"rank": 0, "steps": null, "fields": []}]}));
    let (out, _) = ctl(&[
        "top",
        "--worker",
        &without.url,
        "--worker",
        &off.url,
        "--once",
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("VLLM_PLUGINS"), "{table}");
    assert!(table.contains("timeline off"), "{table}");
}

#[test]
fn the_timeline_page_renders_in_headless_chromium() {
    let a = timeline_server(timeline_answer(&[
        (0, &[5, 5, 5, 5, 30, 5, 5, 5], 4),
        (1, &[12, 12, 12, 12, 12, 12, 12, 12], 4),
    ]));
    let dir = stepscope_test_doubles::Scratch::empty("ctl-timeline");
    let page = dir.join("timeline.html");
    let (out, _) = ctl(&[
        "timeline",
        "--worker",
        &a.url,
        "--output",
        page.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 workers, 16 steps"));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("src=") && !html.contains("<link"),
        "self-contained"
    );
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new("which")
                .arg(c)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("no Chromium: `make test` installs Debian's chromium");
    let run = |extra: &[String]| {
        Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .args([
                "--disable-background-networking",
                "--disable-component-update",
            ])
            .args([
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=2000",
            ])
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .arg("--window-size=1200,900")
            .args(extra)
            .arg(format!("file://{}", page.display()))
            .output()
            .expect("run chromium")
    };
    let dumped = run(&["--dump-dom".to_string()]);
    let dom = String::from_utf8_lossy(&dumped.stdout);
    let errors: Vec<_> = String::from_utf8_lossy(&dumped.stderr)
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    for attr in [
        r#"data-ready="1""#,
        r#"data-workers="2""#,
        r#"data-steps="16""#,
    ] {
        assert!(dom.contains(attr), "{attr} missing");
    }
    // Rank 1 (median 12 ms against 5) is marked a straggler in the table.
    assert!(dom.contains(r#"<tr class="straggler"><td>"#) && dom.contains("rank1"));
    // The slowest step of rank 0 heads its list.
    assert!(dom.contains("<tr><td>104</td>"));
    let shot = dir.join("timeline.png");
    let out = run(&[format!("--screenshot={}", shot.display())]);
    assert!(out.status.success());
    assert!(std::fs::metadata(&shot).unwrap().len() > 0);
}

/// A vLLM server with the plugin whose worker writes one trace per stop: `/stepscope/status`
/// says the trace is being written for the first `writing_polls` status calls after the stop,
/// then `outcome` (`complete`, or `failed` with an error).
fn writing_server(writing_polls: usize, outcome: &'static str) -> Server {
    let stopped = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicUsize::new(0));
    Server::new(move |req, _| {
        let old = json!({"seq": 1, "status": "complete", "trace_file": "/t/rank0.1.pt.trace.json.gz",
                         "error": null});
        match req.path.as_str() {
            "/stop_profile" => {
                stopped.store(true, Ordering::SeqCst);
                Reply::Json(200, json!({}))
            }
            "/stepscope/status" if !stopped.load(Ordering::SeqCst) => Reply::Json(
                200,
                json!({"workers": [{"worker_name": "rank0", "running": true, "pending_writes": 0,
                                    "traces": [old]}]}),
            ),
            "/stepscope/status" => {
                let n = polls.fetch_add(1, Ordering::SeqCst);
                let (status, pending) = if n < writing_polls {
                    ("writing", 1)
                } else {
                    (outcome, 0)
                };
                let error = (status == "failed").then_some("No space left on device");
                Reply::Json(
                    200,
                    json!({"workers": [{"worker_name": "rank0", "running": false,
                        "pending_writes": pending, "traces": [old, {"seq": 2, "status": status,
                        "trace_file": "/t/rank0.2.pt.trace.json.gz", "error": error}]}]}),
                )
            }
            _ => Reply::Json(404, json!({"detail": "Not Found"})),
        }
    })
}

#[test]
fn stop_wait_returns_once_every_workers_trace_is_written_and_lists_it() {
    let server = writing_server(3, "complete");
    let (out, _) = ctl(&["stop", "--wait", "--worker", &server.url]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    // Only this stop's trace, once complete; the earlier one is not listed.
    assert!(
        table.contains("complete") && table.contains("/t/rank0.2.pt.trace.json.gz"),
        "{table}"
    );
    assert!(!table.contains("rank0.1.pt"), "{table}");
    let polls_after_stop = server
        .requests()
        .iter()
        .skip_while(|r| r.path != "/stop_profile")
        .filter(|r| r.path == "/stepscope/status")
        .count();
    assert_eq!(
        polls_after_stop, 4,
        "three answers said writing, the fourth complete"
    );

    let server = writing_server(1, "complete");
    let (out, _) = ctl(&["stop", "--wait", "--json", "--worker", &server.url]);
    let doc = json_of(&out);
    assert_eq!(doc["traces"][0]["status"], "complete");
    assert_eq!(doc["workers"][0]["ok"], true);
}

#[test]
fn stop_wait_exits_1_naming_a_trace_that_failed() {
    let server = writing_server(1, "failed");
    let (out, _) = ctl(&["stop", "--wait", "--worker", &server.url]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("failed"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("rank0.2.pt.trace.json.gz") && row.contains("No space left on device"),
        "{row}"
    );
    // A server without the status endpoint cannot be said to have written its traces; its
    // 404 is its last word: asked before the stop and once after, not every 200 ms until the
    // wait runs out (600 s by default; 30 here bounds how long a regression takes to fail).
    let bare = Server::new(|req, _| match req.path.as_str() {
        "/stop_profile" => Reply::Json(200, json!({})),
        _ => Reply::Json(404, json!({"detail": "Not Found"})),
    });
    let (out, _) = ctl(&[
        "stop",
        "--wait",
        "--wait-timeout",
        "30",
        "--worker",
        &bare.url,
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("could not be read"), "{table}");
    let asked: Vec<String> = bare.requests().into_iter().map(|r| r.path).collect();
    let statuses = asked.iter().filter(|p| *p != "/stop_profile").count();
    assert_eq!(statuses, 2, "{asked:?}");
}

/// `stepscope wait DIR`: returns once no manifest under DIR is `writing`, 0 when all are
/// complete, 1 naming the others; a writer still at work is waited for.
#[test]
fn wait_returns_when_the_directorys_traces_are_written() {
    let dir = std::env::temp_dir().join(format!("stepscope-wait-{}", std::process::id()));
    let sub = dir.join("agent_loop_rollout_replica_0");
    std::fs::create_dir_all(&sub).unwrap();
    let manifest = sub.join("rank0.5.stepscope.json");
    let write = |status: &str| {
        std::fs::write(
            &manifest,
            json!({"status": status, "pid": 1, "trace_file": "rank0.5.pt.trace.json.gz",
                   "error": (status == "failed").then_some("disk full")})
            .to_string(),
        )
        .unwrap()
    };
    write("writing");
    std::fs::write(sub.join("rank0.5.pt.trace.json.gz"), b"x").unwrap();
    let wait = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_stepscope"))
            .arg("wait")
            .arg(&dir)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = wait(&["--timeout", "120"]);
    // Its first line says it waits for the one being written; then the writer finishes.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("1 still being written"), "{line}");
    write("complete");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(out.starts_with("complete"), "{out}");
    assert!(out.contains("rank0.5.pt.trace.json.gz"), "{out}");

    write("failed");
    let o = wait(&[]).wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.starts_with("failed") && text.contains("disk full"),
        "{text}"
    );

    // Still writing at the timeout: 1, saying so.
    write("writing");
    let o = wait(&["--timeout", "0.2"]).wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("still being written after"));

    // Fewer manifests than expected; no directory at all.
    write("complete");
    let o = wait(&["--expect", "2", "--timeout", "0.2"])
        .wait_with_output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("fewer than the 2 expected"));
    std::fs::remove_dir_all(&dir).unwrap();
    let o = wait(&[]).wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a directory"));
}

/// A start a worker refuses (the vLLM plugin's 503 naming the key) is a failed row saying why.
#[test]
fn a_refused_start_is_a_failed_row_naming_the_key() {
    let refusing = Server::new(|_, _| {
        Reply::Json(
            503,
            json!({"error": "a worker refused the start: start refused by \
                   `stepscope.min_free_disk_mb`: /traces has 3 MB free (worker rank0)",
                   "key": "stepscope.min_free_disk_mb"}),
        )
    });
    let ok = Server::ok();
    let (out, _) = ctl(&["start", "--worker", &refusing.url, "--worker", &ok.url]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains(&refusing.url))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("FAILED") && row.contains("503") && row.contains("stepscope.min_free_disk_mb"),
        "{row}"
    );
}

#[test]
fn the_api_key_goes_with_every_request_by_flag_or_environment() {
    let key = "sk-test-123";
    let workers: Vec<Server> = (0..2)
        .map(|_| {
            Server::new(move |req, _| match req.authorization.as_deref() {
                Some("Bearer sk-test-123") => Reply::Json(200, json!({"status": "ok"})),
                _ => Reply::Json(401, json!({"error": "Unauthorized"})),
            })
        })
        .collect();
    let r = router(json!({"workers": [{"url": workers[0].url}, {"url": workers[1].url}]}));
    let run = |extra: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stepscope"));
        cmd.args(["ctl", "start", "--router-url", &r.url, "--json"])
            .args(extra)
            .env_remove("STEPSCOPE_API_KEY");
        if let Some(k) = env {
            cmd.env("STEPSCOPE_API_KEY", k);
        }
        cmd.output().expect("run stepscope")
    };
    // By flag, then by environment: every request carries it, the router's listing included.
    for (extra, env) in [(&["--api-key", key][..], None), (&[][..], Some(key))] {
        let out = run(extra, env);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for server in workers.iter().chain([&r]) {
            let reqs = server.requests();
            let last = reqs.last().expect("a request");
            assert_eq!(last.authorization.as_deref(), Some("Bearer sk-test-123"));
        }
    }
    // Without it: no header, and what a 401 means.
    let out = run(&[], None);
    assert_eq!(out.status.code(), Some(1));
    let doc = json_of(&out);
    let w = by_url(&doc, &workers[0].url);
    assert_eq!(w["status"], 401);
    assert!(w["error"].as_str().unwrap().contains("--api-key"), "{w}");
    assert_eq!(workers[0].requests().last().unwrap().authorization, None);
    // The key is not shown by --help.
    let help = Command::new(env!("CARGO_BIN_EXE_stepscope"))
        .args(["ctl", "start", "--help"])
        .env("STEPSCOPE_API_KEY", key)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("--api-key") && !text.contains(key), "{text}");
}

/// One engine's request log as the vLLM plugin serves it: a long prompt's two chunks (steps 1
/// and 2, 100 ms each) and a short request that waited through them (step 3, 10 ms).
fn requests_answer() -> Value {
    let ms = 1_000_000u64;
    let step = |n: u64, start: u64, dur: u64, prefill: Option<(u32, &str)>, decode: u32| {
        json!({
            "step": n, "start_unix_ns": start * ms, "duration_ns": dur * ms,
            "prefill_reqs": u32::from(prefill.is_some()),
            "prefill_tokens": prefill.map_or(0, |p| p.0),
            "decode_reqs": decode, "decode_tokens": decode, "preempted": 0, "waiting": 0,
            "largest_prefill_tokens": prefill.map_or(0, |p| p.0),
            "largest_prefill_request": prefill.map(|p| p.1),
        })
    };
    let request = |id: &str, prompt: u32, arrival: u64, first: u64, token_step: u64, token: u64| {
        json!({
            "id": id, "prompt_tokens": prompt, "cached_tokens": 0, "output_tokens": 2,
            "arrival_unix_ns": arrival * ms, "queued_unix_ns": arrival * ms,
            "queued_after_step": 0, "first_scheduled_step": first,
            "first_scheduled_unix_ns": (first - 1) * 100 * ms, "prefill_steps": 1,
            "prefill_tokens": prompt, "first_token_step": token_step,
            "first_token_unix_ns": token * ms, "decode_steps": 1,
            "last_token_unix_ns": 230 * ms, "last_step": 4, "preempted_at": [],
            "resumed_at": [], "finished_step": 4, "finished_unix_ns": 230 * ms,
            "finish": "length",
        })
    };
    json!({"engines": [{
        "pid": 7, "step_index": 4, "now_unix_ns": 300 * ms, "clock": "tsc",
        "capacity": {"requests": 4096, "steps": 4096}, "recorded": {"requests": 2, "steps": 4},
        "evicted_running": 0,
        "steps": [
            step(1, 0, 100, Some((128, "long-1")), 0),
            step(2, 100, 100, Some((72, "long-1")), 0),
            step(3, 200, 10, Some((8, "short-2")), 1),
            step(4, 210, 20, None, 2),
        ],
        "requests": [
            request("long-1", 200, 0, 1, 2, 200),
            request("short-2", 8, 1, 3, 3, 210),
        ],
    }]})
}

#[test]
fn requests_ranks_each_engines_requests_and_says_why_a_server_gave_none() {
    let with_log = Server::new(|req, _| {
        if req.path.starts_with("/stepscope/requests?since=0") {
            Reply::Json(200, requests_answer())
        } else {
            Reply::Json(404, json!({"detail": "Not Found"}))
        }
    });
    let keyed = Server::new(|_, _| Reply::Json(401, json!({"error": "Unauthorized"})));
    let old = Server::new(|_, _| Reply::Json(404, json!({"detail": "Not Found"})));
    let off = Server::new(|_, _| {
        Reply::Json(
            200,
            json!({"engines": [{"pid": 9, "requests": null, "steps": null}]}),
        )
    });
    let (out, _) = ctl(&[
        "requests",
        "--worker",
        &with_log.url,
        "--worker",
        &keyed.url,
        "--worker",
        &old.url,
        "--worker",
        &off.url,
        "--by",
        "queue",
        "--json",
    ]);
    // Some servers gave no log: exit 1, with each one's reason; the log read is ranked.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json_of(&out);
    let ids: Vec<&str> = doc["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["short-2", "long-1"]);
    let short = &doc["requests"][0];
    assert_eq!(short["queue"]["steps"], 2);
    assert_eq!(short["costliest"][0]["largest_prefill_request"], "long-1");
    assert_eq!(doc["engines_without_log"], 1);
    let errors: Vec<(String, String)> = doc["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["url"].as_str().unwrap().into(),
                e["error"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors
        .iter()
        .any(|(u, e)| *u == keyed.url && e.contains("--api-key")));
    assert!(errors
        .iter()
        .any(|(u, e)| *u == old.url && e.contains("VLLM_PLUGINS")));

    // The text says how to turn the log on where it is off.
    let (out, _) = ctl(&["requests", "--worker", &off.url]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"requests\": true"), "{text}");

    // One request by the start of its id: every step it lived through.
    let (out, _) = ctl(&[
        "requests",
        "--worker",
        &with_log.url,
        "--request",
        "short",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json_of(&out);
    let steps: Vec<u64> = doc["requests"][0]["costliest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    // An id no log holds: exit 1, saying so.
    let (out, _) = ctl(&["requests", "--worker", &with_log.url, "--request", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"nope\""));
    // As SGLang: the logs are read from /server_info, which this server has not: exit 1,
    // naming it (tests/python/test_sglang.py reads a scheduler's log through it).
    let (out, _) = ctl(&["requests", "--engine", "sglang", "--worker", &with_log.url]);
    assert_eq!(out.status.code(), Some(1));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("/server_info"), "{said}");
}
