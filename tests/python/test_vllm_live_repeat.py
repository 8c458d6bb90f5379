"""A repeat series with a batch minimum in a live `vllm serve` (vLLM's CPU build): every window
of the series begins at a decode batch of at least `min_batch_requests` requests, the second
one too when the batch at its due step is smaller. Its own server: the series' keys change how
every start of a server behaves.

The load is shaped by request counts and lengths, and by what the server reports, never by
time: three long requests decode (vLLM's `vllm:num_requests_running` says when all three run),
then a short one joins them (the first window begins at a batch of four) and ends early, so
that batches of three pass the second window's due step (the worker's status says when it has
passed); then four more requests bring batches of at least four again, whether the long ones
still run or not (the four alone make one).
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from pathlib import Path

import pytest

from live_vllm import VllmServer, cpu_build_missing

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

MIN_BATCH = 4
EVERY = 12
MAX_ITERATIONS = 3
GENERATION = re.compile(r"^execute_context_(\d+)\(\d+\)_generation_(\d+)\(\d+\)$")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm-live-repeat")
    traces = workdir / "traces"
    srv = VllmServer(
        workdir,
        {"profiler": "torch", "torch_profiler_dir": str(traces),
         "torch_profiler_with_stack": False, "max_iterations": MAX_ITERATIONS},
        env={
            "VLLM_PLUGINS": "stepscope",
            "STEPSCOPE_CONFIG": json.dumps({"stepscope": {
                "stages": ["decode"], "min_batch_requests": MIN_BATCH, "repeat": 2,
                "repeat_every": EVERY,
            }}),
        },
    )  # fmt: skip
    srv.traces = traces
    try:
        yield srv.start()
    finally:
        srv.stop()


def requests_in(trace: Path) -> list[int]:
    """The requests of each captured iteration (context + generation), from its annotation."""
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    found = []
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        m = GENERATION.match(str(e.get("name", "")))
        if m and e.get("cat") == "user_annotation" and e.get("ph") == "X":
            found.append(int(m.group(1)) + int(m.group(2)))
    return found


def wait_running(server, n: int, timeout: float = 600) -> None:
    """Until vLLM's own gauge says `n` requests run (`timeout` only bounds a broken run)."""
    deadline = time.monotonic() + timeout
    while True:
        status, text, _ = server.get("/metrics")
        running = [
            float(line.rsplit(" ", 1)[1])
            for line in str(text).splitlines()
            if line.startswith("vllm:num_requests_running")
        ]
        if status == 200 and running and running[0] >= n:
            return
        assert time.monotonic() < deadline, f"never {n} running: {running}"
        time.sleep(0.05)


def test_every_window_of_a_repeat_series_begins_at_a_batch_of_the_minimum_size(server):
    status, _, _ = server.post("/start_profile")
    assert status == 200, server.log_tail()
    errors: list[BaseException] = []

    def complete(max_tokens: int, seed: int) -> None:
        try:
            server.completion(8, max_tokens, seed=seed)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    # Three long requests; once all three run, a short one: decode batches of four, then of
    # three.
    threads = [threading.Thread(target=complete, args=(480, i)) for i in range(3)]
    for t in threads:
        t.start()
    wait_running(server, 3)
    threads.append(threading.Thread(target=complete, args=(6, 3)))
    threads[-1].start()
    first = server.wait_for_worker(lambda w: w["windows_done"] >= 1, "first window")
    due = first["next_window_at"]
    assert first["phase"] == "between" and due is not None, json.dumps(first)
    # The due step passes while the batches hold three requests: the window waits.
    passed = server.wait_for_worker(lambda w: w["step_index"] >= due + 2, "the due step passing")
    assert (passed["phase"], passed["windows_done"]) == ("between", 1), passed
    # Four more requests: batches of at least four again, and the second window.
    more = [threading.Thread(target=complete, args=(200, 10 + i)) for i in range(4)]
    for t in more:
        t.start()
    done = server.wait_for_worker(lambda w: w["windows_done"] >= 2, "second window")
    assert done["phase"] == "idle", done
    for t in threads + more:
        t.join()
    assert not errors, errors

    deadline = time.monotonic() + 300  # bounds a broken run only
    while True:
        manifests = sorted(
            (json.loads(p.read_text()) for p in server.traces.glob("rank0*.stepscope.json")),
            key=lambda m: m["first_step"] or 0,
        )
        if len(manifests) == 2 and all(m["status"] != "writing" for m in manifests):
            break
        assert time.monotonic() < deadline, manifests
        time.sleep(0.2)
    assert [m["status"] for m in manifests] == ["complete", "complete"], manifests
    first_m, second_m = manifests
    assert second_m["first_step"] > due, (due, second_m["first_step"])
    for m in manifests:
        assert m["iterations"] == MAX_ITERATIONS, m
        sizes = requests_in(server.traces / m["trace_file"])
        assert len(sizes) == MAX_ITERATIONS and sizes[0] >= MIN_BATCH, (m["trace_file"], sizes)
