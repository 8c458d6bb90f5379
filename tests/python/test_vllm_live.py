"""stepscope inside a live `vllm serve` (vLLM's CPU build, a tiny random-weight Llama): what a
user sees through vLLM's own HTTP API with the plugin installed.

One server serves every test here (its start dominates), in eager mode: vLLM's default
profiler config apart from the trace directory (the frontend is profiled, Python stacks are
recorded), NVTX ranges reported to the recorder in tests/doubles (nsys's place), the step
timeline on, and the status endpoint allowed. One test captures every step of its requests and reads them back through
`stepscope ctl top` and `ctl timeline`; the last stops it with SIGTERM right after a
/stop_profile.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import read_log
from live_vllm import VllmServer, cpu_build_missing

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

NAME = re.compile(r"^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$")
# The worker's capture budget: above what the other tests' windows cost (with Python stacks
# a window counts 80x what the worker grows), reached by the budget test's open-ended window
# under load.
BUDGET_MB = 768


@pytest.fixture(scope="module")
def server(tmp_path_factory, doubles):
    workdir = tmp_path_factory.mktemp("vllm-live")
    traces = workdir / "traces"
    log = workdir / "nvtx.log"
    srv = VllmServer(
        workdir,
        {"profiler": "torch", "torch_profiler_dir": str(traces)},
        env={
            "VLLM_PLUGINS": "stepscope",
            "STEPSCOPE_CONFIG": json.dumps(
                {"stepscope": {"nvtx": "running", "max_capture_mb": BUDGET_MB, "timeline": True}}
            ),
            doubles["log_env"]: str(log),
            "NVTX_INJECTION64_PATH": doubles["nvtx_recorder"],
        },
        # Eager, as the other live servers: torch.compile's warm-up is 40 of a start's 87 s
        # alone here, and minutes of make test's run beside its six other pytest processes
        # (this start took 524 s there). The profiler config stays vLLM's default; what it
        # records is the engine's steps, compiled or not (scripts/bench_vllm_live.py keeps
        # vLLM's default compilation).
        args=["--enforce-eager"],
    )
    srv.traces = traces
    srv.nvtx_log = log
    try:
        yield srv.start()
    finally:
        srv.stop()


#: The API server's profile: vLLM names it `{host}_{pid}.async_llm`.
FRONTEND = ".async_llm"


def manifests(traces: Path, worker: str) -> list[dict]:
    """The manifests of `worker` (or of the API server, for FRONTEND), oldest first."""
    found = []
    for path in traces.glob("*.stepscope.json"):
        m = json.loads(path.read_text())
        name = m["worker_name"]
        if name == worker or (worker == FRONTEND and name.endswith(FRONTEND)):
            found.append(m)
    return sorted(found, key=lambda m: m["stop_time_unix_ns"])


def wait_complete(traces: Path, worker: str, count: int, timeout: float = 300) -> list[dict]:
    """The worker's first `count` manifests, once each is no longer `writing`."""
    deadline = time.monotonic() + timeout
    while True:
        found = manifests(traces, worker)
        if len(found) >= count and all(m["status"] != "writing" for m in found[:count]):
            return found[:count]
        assert time.monotonic() < deadline, f"{worker}: {found}"
        time.sleep(0.5)


def trace(traces: Path, manifest: dict) -> dict:
    with gzip.open(traces / manifest["trace_file"], "rt") as f:
        return json.load(f)


def annotations(doc: dict) -> list[str]:
    return [
        e["name"]
        for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("ph") == "X"
    ]


def test_a_delay_max_window_captures_exactly_those_iterations(server):
    status, _, _ = server.post("/start_profile", {"delay_iterations": 3, "max_iterations": 4})
    assert status == 200, server.log_tail()
    server.complete(n=4, max_tokens=24)
    (m,) = wait_complete(server.traces, "rank0", 1)
    assert m["status"] == "complete", m
    assert (m["last_step"] - m["first_step"] + 1, m["iterations"]) == (4, 4)
    assert m["pid"] > 0 and m["writer_seconds"] > 0
    doc = trace(server.traces, m)
    names = annotations(doc)
    assert len(names) == 4 and all(NAME.match(n) for n in names), names

    # The header tools read (HTA, stepscope analyze, Perfetto), as vLLM's own profiler writes it.
    import vllm.version

    assert doc["vllm_version"] == vllm.version.__version__
    assert doc["vllm_version_tuple"] == [str(p) for p in vllm.version.__version_tuple__]
    assert (doc["distributedInfo"]["rank"], doc["distributedInfo"]["world_size"]) == (0, 1)
    assert re.fullmatch(r"[0-9A-F]{32}", doc["trace_id"])
    assert doc["with_stack"] == 1
    assert doc["stepscope"]["iterations"] == 4

    # vLLM's op table next to it, in torch's layout (CPU only: sorted by self CPU time).
    table = (server.traces / "rank0.profiler_out.txt").read_text().splitlines()
    assert table[0].startswith("-" * 12) and table[1].split() == [
        "Name", "Self", "CPU", "%", "Self", "CPU", "CPU", "total", "%", "CPU", "total",
        "CPU", "time", "avg", "#", "of", "Calls",
    ]  # fmt: skip
    assert table[-2].startswith("Self CPU time total: ")

    # The NVTX ranges of the worker's captured iterations, with vLLM's names.
    pushes = [e.arg(1) for e in read_log(server.nvtx_log) if e.name == "push" and e.arg(0) == "stepscope"]
    assert [p for p in pushes if p.startswith("execute_")] == names

    # The window ended by its max: the status says what it captured.
    status, answer, _ = server.get("/stepscope/status")
    assert status == 200, answer
    (worker,) = answer["workers"]
    assert (worker["phase"], worker["windows_done"], worker["iterations_captured"]) == ("idle", 1, 4)

    # The frontend (API server) profile runs until /stop_profile, then writes its own trace.
    assert manifests(server.traces, FRONTEND) == []
    status, _, _ = server.post("/stop_profile")
    assert status == 200
    (front,) = wait_complete(server.traces, FRONTEND, 1)
    assert front["status"] == "complete", front


def test_stop_profile_under_vllms_defaults_leaves_the_writing_to_the_background(server):
    """ignore_frontend false (the default): the API server's profile and the worker's are both
    stepscope's; /stop_profile returns while their traces are written (writer_seconds counts
    from the stop to the trace's rename)."""
    frontend = FRONTEND
    before = len(manifests(server.traces, "rank0")), len(manifests(server.traces, frontend))
    assert server.post("/start_profile")[0] == 200
    server.complete(n=4, max_tokens=16)
    status, _, _ = server.post("/stop_profile")
    assert status == 200
    (worker,) = wait_complete(server.traces, "rank0", before[0] + 1)[before[0] :]
    (front,) = wait_complete(server.traces, frontend, before[1] + 1)[before[1] :]
    for m in (worker, front):
        assert m["status"] == "complete", m
        assert m["writer_seconds"] > 0
    doc = trace(server.traces, front)
    # The frontend records the API server's Python (with_stack) on the CPU, as vLLM's does.
    assert any(e.get("cat") == "python_function" for e in doc["traceEvents"])
    assert doc["vllm_version"] and doc["with_stack"] == 1


def test_an_open_ended_window_under_load_ends_itself_at_its_memory_budget(server):
    """vLLM's default max_iterations (0) and a /stop_profile that never comes: the worker's
    window ends by itself once the process has grown stepscope.max_capture_mb, the server
    keeps serving, and the trace and manifest are complete and say why."""
    before = len(manifests(server.traces, "rank0"))
    assert server.post("/start_profile")[0] == 200
    # Bounded load: each round is a few hundred captured steps' worth of Python stacks.
    for _ in range(100):
        server.complete(n=8, max_tokens=64)
        (worker,) = server.get("/stepscope/status")[1]["workers"]
        if worker["phase"] == "idle":
            break
    cut = worker["last_cut"]
    assert worker["phase"] == "idle" and cut is not None, worker
    assert cut["by"] == "max_capture_mb" and cut["projected_mb"] > BUDGET_MB, cut
    assert worker["max_capture_mb"] == BUDGET_MB
    # The server keeps serving after the cut.
    assert len(server.complete(n=4, max_tokens=8)) == 4
    (m,) = wait_complete(server.traces, "rank0", before + 1)[before:]
    assert m["status"] == "complete", m
    assert m["cut_short"] == cut and m["last_step"] == cut["step"] - 1, m
    doc = trace(server.traces, m)
    assert doc["stepscope"]["cut_short"] == cut
    assert len(annotations(doc)) == m["iterations"] > 0
    # The frontend's profile still runs until /stop_profile (it has no engine steps).
    assert server.post("/stop_profile")[0] == 200


def stepscope_cli() -> str:
    """The `stepscope` command: the installed package's (the wheel `make test` installs), else
    the one cargo built in this tree."""
    from stepscope import _cli

    exe = _cli.executable() or str(Path(__file__).resolve().parents[2] / "target/debug/stepscope")
    assert Path(exe).exists(), f"no stepscope command: {exe} (make test builds it)"
    return exe


def percentile(values: list[float], p: float) -> float:
    """Nearest rank, as `ctl top` computes it."""
    s = sorted(values)
    return s[max(1, math.ceil(p / 100 * len(s))) - 1]


COUNTS = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")


def test_ctl_top_and_the_timeline_page_match_a_trace_of_the_same_steps(server, tmp_path):
    """Every step of this test's requests is captured (the session starts before the first
    request and stops after the last; the engine steps only while it has requests), so the
    timeline's steps after `since` and the trace's iterations are the same steps: their counts
    must agree exactly, their durations as two clocks timing one span."""
    url = f"http://127.0.0.1:{server.port}"
    # The steps before this test's (the engine steps only while it has requests).
    status, answer, _ = server.get("/stepscope/status")
    assert status == 200, answer
    (before,) = answer["workers"]
    # Before the server's first step its profiler is not made yet: no step so far.
    since = before.get("step_index", 0)
    done = len(manifests(server.traces, "rank0"))
    status, _, _ = server.post("/start_profile", {"max_iterations": 0})
    assert status == 200, server.log_tail()
    # Two bounded batches of different sizes, each one request of several prompts (vLLM admits
    # them together, whatever this machine's speed): 3 prompts, then 2.
    server.completion_of([[3 + i + k for k in range(8)] for i in range(3)], 12)
    server.completion_of([[5 + i + k for k in range(20)] for i in range(2)], 6)
    assert server.post("/stop_profile")[0] == 200
    (m,) = wait_complete(server.traces, "rank0", done + 1)[done:]
    assert m["status"] == "complete", m
    doc = trace(server.traces, m)
    iterations = [
        e for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("ph") == "X" and COUNTS.match(e["name"])
    ]  # fmt: skip
    iterations.sort(key=lambda e: e["ts"])
    assert len(iterations) == m["iterations"] > 0

    status, answer, _ = server.get(f"/stepscope/timeline?since={since}")
    assert status == 200, answer
    (w,) = answer["workers"]
    steps = [dict(zip(w["fields"], s, strict=True)) for s in w["steps"]]
    # The same steps: the timeline holds exactly the captured ones, with the trace's counts.
    assert [s["step"] for s in steps] == list(range(m["first_step"], m["last_step"] + 1))
    assert len(steps) == len(iterations)
    for s, e in zip(steps, iterations, strict=True):
        counts = tuple(int(x) for x in COUNTS.match(e["name"]).groups())
        assert (s["num_ctx_reqs"], s["num_ctx_tokens"], s["num_gen_reqs"], s["num_gen_tokens"]) == counts
        assert s["phase"] == "running"
        # The timeline's span (step() to step_end) holds the annotation's, and with it the
        # profiler's own work in the step (the NVTX tool's, Kineto's range): never shorter,
        # within the two clocks' resolution (Kineto's is 1 us).
        assert s["duration_ns"] / 1e3 >= e["dur"] - 50, (s, e)
    assert max(s["num_gen_reqs"] + s["num_ctx_reqs"] for s in steps) == 3

    # ctl top over the same steps: the trace's statistics.
    out = subprocess.run(
        [stepscope_cli(), "ctl", "top", "--worker", url, "--once", "--json", "--since-step", str(since)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    top = json.loads(out.stdout)
    assert top["errors"] == []
    (row,) = top["workers"]
    assert (row["worker_name"], row["rank"], row["steps"], row["timeline"]) == ("rank0", 0, len(steps), True)
    assert (row["first_step"], row["last_step"], row["step_index"]) == (m["first_step"], m["last_step"], m["last_step"])
    timeline_ms = [s["duration_ns"] / 1e6 for s in steps]
    for key, p in (("p50_ms", 50), ("p99_ms", 99), ("max_ms", 100)):
        assert row[key] == pytest.approx(percentile(timeline_ms, p)), key
    # The trace's median step: the same, up to the profiler's own tens of microseconds a step.
    trace_ms = [e["dur"] / 1e3 for e in iterations]
    assert row["p50_ms"] == pytest.approx(percentile(trace_ms, 50), rel=0.1, abs=0.3)
    assert row["max_ms"] >= max(trace_ms) - 0.05
    requests = [sum(int(x) for x in COUNTS.match(e["name"]).groups()[0::2]) for e in iterations]
    tokens = [sum(int(x) for x in COUNTS.match(e["name"]).groups()[1::2]) for e in iterations]
    assert row["mean_requests"] == pytest.approx(sum(requests) / len(requests))
    assert row["mean_tokens"] == pytest.approx(sum(tokens) / len(tokens))
    assert not row["straggler"]
    print(
        f"ctl top: {row['steps']} steps, p50 {row['p50_ms']:.2f} ms (trace "
        f"{percentile(trace_ms, 50):.2f}), p99 {row['p99_ms']:.2f} ({percentile(trace_ms, 99):.2f}), "
        f"max {row['max_ms']:.2f} ms ({max(trace_ms):.2f}), "
        f"{row['mean_requests']:.2f} requests and {row['mean_tokens']:.1f} tokens per step"
    )

    # ctl timeline: the page carries these steps, and renders in headless Chromium.
    page = tmp_path / "timeline.html"
    out = subprocess.run(
        [stepscope_cli(), "ctl", "timeline", "--worker", url, "--output", str(page)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    html = page.read_text()
    assert "http://" not in html.split("<script", 1)[0] or url in html  # no external resource
    assert "<link" not in html and "src=" not in html
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)[1])
    (pw,) = data["workers"]
    # The page holds every step the ring kept, these last.
    assert pw["steps"][-len(steps):] == [[s["start_unix_ns"], s["duration_ns"]] for s in steps]
    shot = tmp_path / "timeline.png"
    dom = render_in_chromium(page, tmp_path / "chromium", shot)
    assert 'data-ready="1"' in dom and 'data-workers="1"' in dom
    assert f'data-steps="{len(pw["steps"])}"' in dom
    assert int(re.search(r'data-cells="(\d+)"', dom)[1]) > 0
    assert shot.stat().st_size > 0
    print(f"ctl timeline: {page} ({len(html)} bytes), screenshot {shot}")


def render_in_chromium(page: Path, profile: Path, screenshot: Path) -> str:
    """Loads `page` in headless Chromium: its DOM once its script ran, and a screenshot of it.
    A script error fails the test."""
    chromium = next(
        (c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None
    )
    assert chromium, "no Chromium: `make test` installs Debian's chromium"
    base = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000",
        f"--user-data-dir={profile}", "--window-size=1200,900",
    ]  # fmt: skip
    dumped = subprocess.run(
        [*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    errors = [l for l in dumped.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert not errors, errors
    shot = subprocess.run(
        [*base, f"--screenshot={screenshot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shot.returncode == 0, shot.stderr[-2000:]
    return dumped.stdout


def test_a_server_stopped_right_after_stop_profile_loses_no_trace(server):
    """SIGTERM one second after /stop_profile, with a capture that takes longer to write than
    vLLM's 5 s grace before it kills its engine and worker processes."""
    before = len(manifests(server.traces, "rank0"))
    assert server.post("/start_profile")[0] == 200
    server.complete(n=16, max_tokens=96)
    assert server.post("/stop_profile")[0] == 200
    time.sleep(1)
    pending = [m for m in manifests(server.traces, "rank0")[before:] if m["status"] == "writing"]
    code = server.stop(signal.SIGTERM)
    assert code is not None
    after = manifests(server.traces, "rank0")[before:]
    assert len(after) == 1 and after[0]["status"] == "complete", (pending, after)
    trace(server.traces, after[0])  # complete gzip, valid JSON
    assert all(m["status"] == "complete" for m in manifests(server.traces, FRONTEND))
    leftovers = [p.name for p in server.traces.iterdir() if p.name.startswith(".")]
    assert leftovers == []
