"""A repeat series with a batch minimum in a live `vllm serve` (vLLM's CPU build): every window
of the series begins at a decode batch of at least `min_batch_requests` requests, the second
one too when the batch at its due step is smaller. Its own server: the series' keys change how
every start of a server behaves.

The load is shaped by request contents, never by time or by how fast the test itself runs: one
completion request of four prompts (vLLM admits them together), three short prompts whose
generations outlast the test and one prompt so long that vLLM leaves it room for only a few
tokens (its `max_tokens` is cut to what the model length leaves). So decode batches hold four
requests (the first window begins), then three, past the second window's due step (the
worker's status says when it has passed); then four more prompts bring batches of at least
four again, whether the others still run or not.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import pytest

from live_vllm import VllmServer, cpu_build_missing

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

MIN_BATCH = 4
EVERY = 12
MAX_ITERATIONS = 3
# The long generations' tokens (far more steps than the test needs), the model length, and the
# tokens vLLM leaves the prompt that fills the model length but for SHORT.
LONG = 4000
MODEL_LEN = LONG + 16
SHORT = 6
GENERATION = re.compile(r"^execute_context_(\d+)\(\d+\)_generation_(\d+)\(\d+\)$")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm-live-repeat")
    traces = workdir / "traces"
    srv = VllmServer(
        workdir,
        {"profiler": "torch", "torch_profiler_dir": str(traces),
         "torch_profiler_with_stack": False, "max_iterations": MAX_ITERATIONS,
         # The worker's windows only: the API server's CPU profile would run, unstopped,
         # through the long generations and be written at the server's stop.
         "ignore_frontend": True},
        env={
            "VLLM_PLUGINS": "stepscope",
            "STEPSCOPE_CONFIG": json.dumps({"stepscope": {
                "stages": ["decode"], "min_batch_requests": MIN_BATCH, "repeat": 2,
                "repeat_every": EVERY,
            }}),
        },
        model_config={"max_position_embeddings": MODEL_LEN},
        max_model_len=MODEL_LEN,
        # A schedule, compiled or not: test_vllm_live.py's server runs vLLM's default
        # (compiled) model. Eager saves ~38 s of a core (the compile).
        args=["--enforce-eager"],
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


def prompt(length: int, seed: int) -> list[int]:
    return [3 + (seed + k) % 500 for k in range(length)]


def test_every_window_of_a_repeat_series_begins_at_a_batch_of_the_minimum_size(server):
    status, _, _ = server.post("/start_profile")
    assert status == 200, server.log_tail()
    # Three short prompts generating LONG tokens (not waited for: the server's stop abandons
    # the request, as a client that goes away) and one prompt leaving room for SHORT tokens:
    # decode batches of four, then of three.
    long = server.open_completion(
        [prompt(8, i) for i in range(3)] + [prompt(MODEL_LEN - SHORT, 99)], LONG
    )
    first = server.wait_for_worker(lambda w: w["windows_done"] >= 1, "first window")
    due = first["next_window_at"]
    assert first["phase"] == "between" and due is not None, json.dumps(first)
    # The due step passes while the batches hold three requests: the window waits.
    passed = server.wait_for_worker(lambda w: w["step_index"] >= due + 2, "the due step passing")
    assert (passed["phase"], passed["windows_done"]) == ("between", 1), passed
    # Four more requests: batches of at least four again, and the second window.
    more = server.open_completion([prompt(8, 10 + i) for i in range(4)], 200)
    done = server.wait_for_worker(lambda w: w["windows_done"] >= 2, "second window")
    assert done["phase"] == "idle", done
    more.wait()
    assert more.error is None and more.status == 200, (more.status, more.error)
    assert long.error is None, long.error

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
