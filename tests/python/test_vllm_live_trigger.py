"""The slow-step trigger and request attribution in a live `vllm serve` (vLLM's CPU build):
one request's prefill is made slow among short decodes, and the iterations after it are
captured, each naming the requests it served.

The slow step is made by the model, deterministically and in proportion to this machine's own
speed: the server runs `SlowStepLlama` (tests/python/vllm_slow_step, a vLLM general plugin
registering vLLM's Llama with a forward pass that sleeps 400x its median period when a prompt
begins with the marker token). The trigger is relative only (100x the running median), so the
test holds on a CPU 100x faster or slower; nothing waits for a fixed time. At 25x, a step of a
fresh `make test` slowed by the load alone (38x the median, nine test processes at once on two
cores) triggered the capture before the marked prompt came. The server is
shared with the request-log ring's test only (`shared_server`), which starts no profile: the
trigger changes how every start of a profile behaves.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path

import pytest

from live_vllm import VllmServer, cpu_build_missing, iteration_name, slow_step_env

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

# The plugin's marker token: a prompt beginning with it makes its prefill step slow.
from vllm_slow_step.stepscope_slow_step import MARK, SLOW_FACTOR  # noqa: E402

# The trigger: a quarter of the marked prefill's sleep (the plugin's factor).
FACTOR = SLOW_FACTOR // 4
MAX_ITERATIONS = 3


def shared_server(workdir: Path) -> VllmServer:
    """The one server this module's test and the request-log ring's share (conftest's
    `slow_step_live`; the ring's own server's start was 153 s of its 188 s in a warm make
    test): the slow-step trigger armed by a /start_profile, and a request log smaller than the
    requests the ring's test admits at once (test_vllm_live_ring.py, which starts no profile:
    the trigger, armed only by a start, leaves it alone)."""
    from test_vllm_live_ring import AT_ONCE, RING

    traces = workdir / "traces"
    srv = VllmServer(
        workdir,
        {"profiler": "torch", "torch_profiler_dir": str(traces), "max_iterations": MAX_ITERATIONS},
        env=slow_step_env(
            STEPSCOPE_CONFIG=json.dumps(
                {"stepscope": {"slow_step_factor": FACTOR, "request_ids": True,
                               "requests": {"requests": RING, "steps": RING}}}
            )
        ),  # fmt: skip
        model_config={"architectures": ["SlowStepLlama"]},
        # The trigger reads step times, compiled or not; test_vllm_live.py's server runs
        # vLLM's default (compiled) model. Eager saves ~38 s of a core (the compile).
        args=["--enforce-eager", "--max-num-seqs", str(AT_ONCE)],
    )
    srv.traces = traces
    return srv


@pytest.fixture(scope="module")
def server(slow_step_live):
    return slow_step_live


def worker_manifests(traces: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in traces.glob("rank0*.stepscope.json")]
    return sorted(found, key=lambda m: m["stop_time_unix_ns"])


def test_a_long_prompt_among_decodes_triggers_a_capture_naming_its_requests(server):
    status, _, _ = server.post("/start_profile")
    assert status == 200, server.log_tail()
    status, answer, _ = server.get("/stepscope/status")
    (worker,) = answer["workers"]
    assert (worker["phase"], worker["slow_step_factor"], worker["request_ids"]) == (
        "watching",
        float(FACTOR),
        True,
    ), worker

    # Four short requests decode (the median's steps); once the worker has timed enough steps
    # for a median, the marked request arrives among them and its prefill is the slow step.
    ids: dict[str, str] = {}
    errors: list[BaseException] = []

    def send(name: str, prompt: list[int], max_tokens: int) -> None:
        try:
            ids[name] = server.completion_of(prompt, max_tokens)[0]
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    threads = [
        threading.Thread(target=send, args=(f"short{i}", [3 + i + k for k in range(8)], 200))
        for i in range(4)
    ]
    for t in threads:
        t.start()
    watching = server.wait_for_worker(lambda w: w["median_step_ms"] is not None, "a median")
    assert watching["phase"] == "watching", watching
    long = threading.Thread(target=send, args=("long", [MARK] + [7] * 63, 8))
    long.start()
    for t in (*threads, long):
        t.join()
    assert not errors, errors

    # The window ended by itself: the worker is idle again, its trace written or being written.
    server.wait_for_worker(lambda w: w["phase"] == "idle", "the window's end")
    deadline = time.monotonic() + 600
    while not (found := [m for m in worker_manifests(server.traces) if m["status"] != "writing"]):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.5)
    (m,) = found
    assert m["status"] == "complete", m
    slow = m["trigger"]["slow_step"]
    # The window begins in the iteration right after the slow one, and captures max_iterations.
    assert m["first_step"] == slow["step"] + 1, m
    assert (m["iterations"], m["last_step"] - m["first_step"] + 1) == (MAX_ITERATIONS,) * 2
    assert slow["duration_ns"] > FACTOR * slow["median_ns"], slow
    print(
        f"slow step {slow['step']}: {slow['duration_ns'] / 1e6:.1f} ms, median "
        f"{slow['median_ns'] / 1e6:.1f} ms; captured {m['first_step']}..{m['last_step']}"
    )

    # Every captured iteration names its requests: ids of the requests sent (vLLM's internal
    # id begins with the response's), the long one among them once its prefill is done.
    steps = m["steps"]
    assert [s["step"] for s in steps] == list(range(m["first_step"], m["last_step"] + 1))
    sent = set(ids.values())
    for s in steps:
        assert s["requests"], s
        for r in s["requests"]:
            assert any(r.startswith(i) for i in sent), (r, sent)
    assert any(r.startswith(ids["long"]) for r in steps[0]["requests"]), (steps, ids)

    # The trace says the same: its header lists the steps' requests, and each iteration's
    # annotation carries its step index and its requests in its args.
    with gzip.open(server.traces / m["trace_file"], "rt") as f:
        doc = json.load(f)
    assert doc["stepscope"]["steps"] == steps
    assert doc["stepscope"]["trigger"] == m["trigger"]
    annotated = [
        {"step": e["args"]["Record function id"], "requests": e["args"]["requests"]}
        for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("execute_")
    ]
    assert annotated == [{"step": s["step"], "requests": s["requests"]} for s in steps]
    # With each request's tokens and phase (the header's only), summing to vLLM's own counts
    # in the iteration's name.
    names = {
        e["args"]["Record function id"]: e["name"]
        for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("execute_")
    }
    for s in steps:
        assert len(s["tokens"]) == len(s["prefill"]) == len(s["requests"]), s
        assert names[s["step"]] == iteration_name(s), (names[s["step"]], s)

    # The session ended by itself after its window (the frontend profile runs until stopped).
    status, answer, _ = server.get("/stepscope/status")
    (after,) = answer["workers"]
    assert (after["phase"], after["trigger_step"]["step"]) == ("idle", slow["step"]), after
    assert server.post("/stop_profile")[0] == 200
