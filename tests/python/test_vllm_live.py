"""stepscope inside a live `vllm serve` (vLLM's CPU build, a tiny random-weight Llama): what a
user sees through vLLM's own HTTP API with the plugin installed.

One server serves every test here (its start dominates): vLLM's default profiler config apart
from the trace directory (the frontend is profiled, Python stacks are recorded), NVTX ranges
reported to the recorder in tests/doubles (nsys's place), and the status endpoint allowed. The
last test stops it with SIGTERM right after a /stop_profile.
"""

from __future__ import annotations

import gzip
import json
import re
import signal
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
                {"stepscope": {"nvtx": "running", "max_capture_mb": BUDGET_MB}}
            ),
            doubles["log_env"]: str(log),
            "NVTX_INJECTION64_PATH": doubles["nvtx_recorder"],
        },
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
