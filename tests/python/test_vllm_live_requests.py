"""The request log (`"stepscope": {"requests": true}`) in a live `vllm serve` (vLLM's CPU build),
read through `GET /stepscope/requests` and `stepscope ctl requests`:

- against vLLM's own numbers: requests sent one at a time, each one's queue, prefill and decode
  times equal the deltas of vLLM's own histograms' sums on `/metrics` within a step, and its
  TTFT and end-to-end time are never later than vLLM's by more than a step (vLLM ends those in
  its API server, after the output's trip from the engine core);
- attribution: a long prompt prefilled in chunks while short requests arrive; `ctl requests`
  ranks the short requests first by queue wait with the long prefill's steps, and its id, as
  what cost them most;
- preemption: with a KV cache too small for three long requests at once, a preempted request
  shows its preemption and its return;
- in a capture (`"request_ids": true`, vLLM's `detailed_trace_annotation` on): each captured
  iteration's name, and its work (tokens and context lengths per phase) in the header, equal
  what vLLM's own `annotate_profile` writes for the same `SchedulerOutput` (run beside
  stepscope's in the worker: tests/python/vllm_slow_step), its requests with their tokens and
  phases sum to those counts, the header's model shape is the served `config.json`'s, and
  `stepscope analyze` with the device's peaks gives every captured step a floor;
  `stepscope analyze --requests`
  of the trace gives each request the prefill chunks, tokens and decode steps the request log
  recorded for it, and shares every iteration's CPU time out whole; the engine core's log of
  the window is on disk beside the trace when the stop returns, and joins each request's
  queue wait and TTFT to it, as `ctl requests` reads them from the live server.

The server (shared with the request-span tests, which run after these in the same process) also
exports request spans; nothing here depends on them.

The model is `TokenCostLlama` (tests/python/vllm_slow_step): every forward pass sleeps in
proportion to its tokens, so a step of a 128-token chunk is slower than one of a few decode
tokens by construction, on any CPU; no time is compared with a threshold. Chunked prefill runs
with a budget of 128 tokens a step, and the KV cache holds 1536 tokens (12 blocks of 128).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from live_vllm import VllmServer, cpu_build_missing, iteration_name, slow_step_env
from test_vllm_live import stepscope_cli

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

BUDGET = 128
# KV cache blocks (of 128 tokens on the CPU build): 1536 tokens.
KV_BLOCKS = 12
MAX_MODEL_LEN = 1024
# vLLM's histograms and the stretch of a request each measures.
METRICS = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


def token_cost_server(
    workdir: Path,
    keys: dict | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> VllmServer:
    """A (not yet started) server of `TokenCostLlama` with stepscope's plugin and its request
    log on: chunked prefill of BUDGET tokens a step, KV_BLOCKS blocks of KV cache; `keys`, more
    of stepscope's keys, `args` more of `vllm serve`'s flags, `env` more of its environment."""
    stepscope_keys = {"requests": True, "request_ids": True, **(keys or {})}
    return VllmServer(
        workdir,
        # Without Python stacks (vLLM records them by default): here its worker's Python
        # tracer records every turn of the loop in which the worker waits for its next step,
        # so on a loaded machine a capture grows with the wait, and its writing with it.
        {"profiler": "torch", "torch_profiler_dir": str(workdir / "traces"),
         "torch_profiler_with_stack": False, "detailed_trace_annotation": True},
        env=slow_step_env(
            STEPSCOPE_CONFIG=json.dumps({"stepscope": stepscope_keys}),
            STEPSCOPE_TEST_ANNOTATIONS=str(workdir / "vllm_annotations.jsonl"),
            **(env or {}),
        ),
        model_config={"architectures": ["TokenCostLlama"]},
        max_model_len=MAX_MODEL_LEN,
        args=[
            "--enforce-eager",
            "--enable-chunked-prefill",
            "--max-num-batched-tokens", str(BUDGET),
            "--max-num-seqs", "8",
            # The block count forced: fewer than the harness's KV_CACHE_BYTES would hold.
            "--num-gpu-blocks-override", str(KV_BLOCKS),
            *(args or []),
        ],
    )  # fmt: skip


#: The request spans' export queue and batch (tests/python/test_vllm_live_otel.py): small, so
#: that a silent collector fills the queue at once.
OTEL_QUEUE, OTEL_BATCH = 8, 4


def shared_server(workdir: Path, collector_url: str) -> VllmServer:
    """The one server this module's tests and the request-span tests share (conftest's
    `token_cost_live`; a server start is minutes of CPU on two cores): the request log, and
    request spans (with step spans) sent to `collector_url`, where vLLM's own tracing
    (`--otlp-traces-endpoint`) sends its spans too."""
    return token_cost_server(
        workdir,
        keys={"otel": {"steps": True, "queue": OTEL_QUEUE, "batch": OTEL_BATCH}},
        args=["--otlp-traces-endpoint", collector_url],
        env={
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            # vLLM's span processor sends every 100 ms (its default: 5 s).
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            # A silent collector holds an export for the rest of the test, not 10 s.
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "900",
        },
    )


@pytest.fixture(scope="module")
def server(token_cost_live):
    return token_cost_live


def prompt(n: int, seed: int) -> list[int]:
    return [3 + (seed * 131 + k * 7) % 500 for k in range(n)]


def log(server: VllmServer, since: int = 0) -> dict:
    status, answer, _ = server.get(f"/stepscope/requests?since={since}")
    assert status == 200, answer
    engines = answer["engines"]
    assert len(engines) == 1, answer
    return engines[0]


def metric_sums(server: VllmServer) -> dict[str, tuple[float, float]]:
    """Each of METRICS' (sum, count) on /metrics now."""
    status, text, _ = server.get("/metrics")
    assert status == 200
    out = {}
    for key, name in METRICS.items():
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith(f"{name}_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith(f"{name}_count"):
                count += float(line.rsplit(" ", 1)[1])
        out[key] = (total, count)
    return out


def settled_sums(server: VllmServer, count: float) -> dict[str, tuple[float, float]]:
    """The sums once vLLM has recorded `count` requests (its frontend records a request's
    stats as it processes the last output, which can come after the response)."""
    deadline = time.monotonic() + 300  # bounds a broken server only: no speed assumed
    while True:
        sums = metric_sums(server)
        if all(c >= count for _, c in sums.values()):
            return sums
        if time.monotonic() > deadline:
            raise AssertionError(f"vLLM's histograms did not reach {count} requests: {sums}")
        time.sleep(0.1)


def ctl_requests(server: VllmServer, *args: str) -> dict:
    out = subprocess.run(
        [stepscope_cli(), "ctl", "requests", "--worker", f"http://127.0.0.1:{server.port}",
         "--json", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def ms(ns_from: int, ns_to: int) -> float:
    return (ns_to - ns_from) / 1e6


def test_each_requests_times_equal_vllms_own_within_a_step(server):
    # Warm-up.
    server.completion_of(prompt(8, 0), 4)
    shapes = [(8, 6), (100, 12), (300, 4), (40, 20), (200, 9)]
    base = settled_sums(server, 1)
    since = log(server)["step_index"]
    ids = []
    vllm = []
    for k, (prompt_len, max_tokens) in enumerate(shapes):
        response_id, _ = server.completion_of(prompt(prompt_len, k + 1), max_tokens)
        ids.append(response_id)
        after = settled_sums(server, k + 2)
        vllm.append({key: (after[key][0] - base[key][0]) * 1e3 for key in METRICS})
        base = after
    doc = log(server, since)
    steps = {s["step"]: s for s in doc["steps"]}
    ours = [r for r in doc["requests"] if r["first_scheduled_step"] and r["first_scheduled_step"] > since]
    assert len(ours) == len(shapes), [r["id"] for r in doc["requests"]]
    for (prompt_len, max_tokens), response_id, theirs, r in zip(shapes, ids, vllm, ours, strict=True):
        # The engine's id is the response's, with vLLM's suffixes.
        assert r["id"].startswith(response_id), (r["id"], response_id)
        assert (r["prompt_tokens"], r["output_tokens"]) == (prompt_len, max_tokens), r
        assert r["finish"] == "length", r
        # Chunks of at most BUDGET tokens; then one decode step a token after the first.
        assert r["prefill_steps"] == -(-prompt_len // BUDGET), r
        assert r["decode_steps"] == max_tokens - 1, r
        lived = [steps[s] for s in range(r["first_scheduled_step"], r["finished_step"] + 1)]
        granularity = min(s["duration_ns"] for s in lived) / 1e6
        mine = {
            "queue": ms(r["queued_unix_ns"], r["first_scheduled_unix_ns"]),
            "prefill": ms(r["first_scheduled_unix_ns"], r["first_token_unix_ns"]),
            "decode": ms(r["first_token_unix_ns"], r["last_token_unix_ns"]),
            "ttft": ms(r["arrival_unix_ns"], r["first_token_unix_ns"]),
            "e2e": ms(r["arrival_unix_ns"], r["finished_unix_ns"]),
        }
        print(f"{r['id']}: step {granularity:.2f} ms; "
              + ", ".join(f"{k} {mine[k]:.2f}/{theirs[k]:.2f}" for k in METRICS))  # fmt: skip
        # Queue, prefill and decode: vLLM's engine-core stamps, as ours are.
        for key in ("queue", "prefill", "decode"):
            assert abs(mine[key] - theirs[key]) <= granularity, (key, mine, theirs, granularity, r)
        # TTFT and end-to-end: vLLM stamps their ends in its API server as it processes the
        # step's output, after its trip from the engine core (ours end in the engine core).
        # That trip is no step: 0.4-5.8 ms under make test's load, where a step took 5.6 ms.
        # Ours are never later than vLLM's by more than a step.
        for key in ("ttft", "e2e"):
            assert mine[key] - theirs[key] <= granularity, (key, mine, theirs, granularity, r)
        # The CLI's breakdown says the same.
    table = ctl_requests(server, "--since-step", str(since), "--top", "0")
    by_id = {b["id"]: b for b in table["requests"]}
    for r in ours:
        b = by_id[r["id"]]
        assert b["prefill"]["steps"] == r["prefill_steps"]
        assert b["decode"]["steps"] == r["decode_steps"]
        assert b["queue"]["steps"] == 0, b
        assert abs(b["ttft_ms"] - ms(r["arrival_unix_ns"], r["first_token_unix_ns"])) < 1e-3


def wait_until(what, predicate, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()) is not None:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


LONG_LEN = 900


def long_prefill_with_short_requests(server: VllmServer, seed: int = 50) -> tuple[int, str]:
    """A prompt of LONG_LEN tokens, prefilled in chunks of BUDGET; three short requests sent
    while its first chunks run (7 of its 8 take the whole budget). Prompts differ by `seed`
    (none of another call's in the prefix cache). Returns the step index before it and the
    long request's id."""
    since = log(server)["step_index"]
    errors: list[BaseException] = []

    def send(p: list[int], n: int) -> None:
        try:
            server.completion_of(p, n)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    long = threading.Thread(target=send, args=(prompt(LONG_LEN, seed), 4))
    long.start()

    def long_scheduled():
        for r in log(server, since)["requests"]:
            if r["prompt_tokens"] == LONG_LEN and r["first_scheduled_step"]:
                return r
        return None

    long_record = wait_until("the long prefill's first chunk", long_scheduled)
    shorts = [
        threading.Thread(target=send, args=(prompt(8, seed + 10 + k), 4)) for k in range(3)
    ]
    for t in shorts:
        t.start()
    for t in [long, *shorts]:
        t.join()
    assert not errors, errors
    return since, long_record["id"]


def test_short_requests_behind_a_long_chunked_prefill_are_charged_its_steps(server):
    since, long_id = long_prefill_with_short_requests(server)
    long_len = LONG_LEN
    # `--steps 0`: every step up to each request's first token, not the costliest few. Which
    # steps took longest depends on the machine (on a loaded one a short request's own prefill
    # step, beside the long one's last 4-token chunk, outlasted the full chunks); which request
    # each step waited on does not.
    table = ctl_requests(server, "--since-step", str(since), "--by", "queue", "--steps", "0")
    ranked = table["requests"]
    short_rows = [b for b in ranked if b["prompt_tokens"] == 8]
    assert len(short_rows) == 3, ranked
    # The short requests that waited behind it come first (all of them, unless one reached
    # the queue only after the long prefill's 7 full chunks, 1.8 s of sleep); the long one did
    # not wait.
    waited = [b for b in short_rows if b["queue"]["steps"] > 0]
    assert waited, short_rows
    assert {b["id"] for b in ranked[: len(waited)]} == {b["id"] for b in waited}, ranked
    for b in waited:
        # What held them: each step they waited through is one of the long prefill's full
        # chunks, named by its id.
        held = [c for c in b["costliest"] if c["role"] == "waiting"]
        assert held, b
        for c in held:
            assert c["largest_prefill_request"] == long_id, (c, long_id)
            assert c["largest_prefill_tokens"] == BUDGET, c
    long_row = next(b for b in ranked if b["id"] == long_id)
    assert long_row["prefill"]["steps"] == -(-long_len // BUDGET), long_row
    assert long_row["queue"]["steps"] == 0, long_row
    # By TTFT, the steps the short requests waited through are the long prefill's too, and
    # its own steps are its own chunks.
    by_ttft = ctl_requests(server, "--since-step", str(since), "--by", "ttft", "--steps", "0")
    for b in by_ttft["requests"]:
        if b["id"] in {w["id"] for w in waited}:
            held = [c for c in b["costliest"] if c["role"] == "waiting"]
            assert held and all(c["largest_prefill_request"] == long_id for c in held), b
        if b["id"] == long_id:
            # Its own chunks: the full ones are the largest prefill of their steps; the last
            # (4 tokens) ran beside the short requests' 8.
            assert len(b["costliest"]) == -(-long_len // BUDGET), b
            assert all(c["role"] == "prefill" for c in b["costliest"]), b["costliest"]
            full = [c for c in b["costliest"] if c["largest_prefill_tokens"] == BUDGET]
            assert len(full) == long_len // BUDGET, b["costliest"]
            assert all(c["own_prefill"] for c in full), b["costliest"]
    # The text names the long request as what cost a short one.
    text = subprocess.run(
        [stepscope_cli(), "ctl", "requests", "--worker", f"http://127.0.0.1:{server.port}",
         "--since-step", str(since), "--by", "queue", "--top", "1", "--steps", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "cost it most:" in text.stdout and f"largest prefill {BUDGET} tokens" in text.stdout, (
        text.stdout
    )


def test_a_request_preempted_for_kv_cache_shows_its_preemption(server):
    traces = Path(server.workdir) / "traces"
    before = set(traces.glob("*.json")) if traces.exists() else set()
    oracle = Path(server.workdir) / "vllm_annotations.jsonl"
    seen = len(oracle.read_text().splitlines()) if oracle.exists() else 0
    since = log(server)["step_index"]
    status, answer, _ = server.post("/start_profile")
    assert status == 200, answer
    try:
        # Three requests of 200 + 400 tokens: 15 blocks of 128 against 12.
        threads = [
            threading.Thread(target=server.completion_of, args=(prompt(200, 80 + k), 400))
            for k in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        status, answer, _ = server.post("/stop_profile")
    assert status == 200, answer
    doc = log(server, since)
    mine = [r for r in doc["requests"] if r["prompt_tokens"] == 200]
    assert len(mine) == 3, doc["requests"]
    preempted = [r for r in mine if r["preempted_at"]]
    assert preempted, mine
    steps = {s["step"]: s for s in doc["steps"]}
    # vLLM's own view of each step (its SchedulerOutput, in the worker): per request the
    # tokens scheduled and whether it was in its context phase.
    vllm_steps = [json.loads(line) for line in oracle.read_text().splitlines()[seen:]]
    for r in preempted:
        assert len(r["resumed_at"]) == len(r["preempted_at"]), r
        for p, back in zip(r["preempted_at"], r["resumed_at"], strict=True):
            assert p < back <= r["finished_step"], r
            assert steps[p]["preempted"] >= 1, steps[p]
        # vLLM's rule: prefill until the first token; the return after a preemption (past
        # the first token here: the KV cache runs out while the requests decode) is decode.
        # The prompt's chunks are at most BUDGET tokens each, how many depends on what the
        # other two requests took of each step as they arrived (two when it had the steps'
        # whole budget, three when it arrived beside another's chunk): vLLM's own count.
        chunks = [
            e["requests"][r["id"]][0] for e in vllm_steps
            if r["id"] in e["requests"] and e["requests"][r["id"]][2]
        ]  # fmt: skip
        assert sum(chunks) == 200 and max(chunks) <= BUDGET, (chunks, r)
        assert r["prefill_steps"] == len(chunks) >= -(-200 // BUDGET), (chunks, r)
        assert r["last_prefill_step"] < r["preempted_at"][0], r
        assert r["output_tokens"] == 400 and r["finish"] == "length", r
    # One request's every step: out from each preemption until its return.
    r = preempted[0]
    table = ctl_requests(server, "--since-step", str(since), "--by", "e2e", "--request", r["id"])
    (b,) = table["requests"]
    assert b["preempted_at"] == r["preempted_at"], b
    roles = {c["step"]: c["role"] for c in b["costliest"]}
    for p, back in zip(r["preempted_at"], r["resumed_at"], strict=True):
        assert all(roles[s] == "preempted" for s in range(p, back) if s in steps), (p, back, roles)
        assert roles[back] == "decode", roles

    # Step by step, the request's role in each step that scheduled it agrees: in the log
    # (`ctl requests`), in the capture (`analyze --request`), and in vLLM's own view of the
    # same SchedulerOutputs (its is_context_phase, run in the worker beside stepscope's).
    by_log = [c["role"] for c in b["costliest"] if c["role"] in ("prefill", "decode")]
    assert by_log.count("prefill") == r["prefill_steps"], by_log
    assert by_log.count("decode") == r["decode_steps"], by_log
    (manifest,) = [
        json.loads(p.read_text()) for p in set(traces.glob("rank0*.stepscope.json")) - before
    ]
    trace = traces / manifest["trace_file"]
    out = subprocess.run(
        [stepscope_cli(), "analyze", "--json", "--request", r["id"], str(trace)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ((captured,),) = [t["requests"] for t in json.loads(out.stdout)["requests"]]
    by_trace = [c["role"] for c in captured["costliest"]]
    vllms = []
    for line in oracle.read_text().splitlines()[seen:]:
        entry = json.loads(line)
        if r["id"] in entry["requests"]:
            n, computed, context = entry["requests"][r["id"]]
            vllms.append(("prefill" if context else "decode", n))
    assert by_log == by_trace == [role for role, _ in vllms], (by_log, by_trace, vllms)
    # And the tokens each step scheduled for it, as vLLM scheduled them.
    assert [c["own_tokens"] for c in captured["costliest"]] == [n for _, n in vllms]


def test_a_captured_long_prefill_and_its_requests_agree_with_the_request_log(server):
    traces = Path(server.workdir) / "traces"
    before = set(traces.glob("*.json")) if traces.exists() else set()
    status, answer, _ = server.post("/start_profile")
    assert status == 200, answer
    try:
        since, long_id = long_prefill_with_short_requests(server, seed=150)
    finally:
        status, answer, _ = server.post("/stop_profile")
    assert status == 200, answer
    # The stop returned: the worker's trace is on disk, as its manifest says.
    (manifest,) = [
        json.loads(p.read_text())
        for p in set(traces.glob("rank0*.stepscope.json")) - before
    ]
    assert manifest["status"] == "complete", manifest
    trace = traces / manifest["trace_file"]
    # And the engine core's request log of the window, as the stop returned.
    (window_log,) = set(traces.glob("engine0.*.requests.json")) - before
    assert json.loads(window_log.read_text())["requests"], window_log

    # Each captured iteration's requests come with their tokens and phases (an iteration that
    # scheduled nothing has none of the three).
    for s in manifest["steps"]:
        assert len(s.get("tokens", [])) == len(s.get("prefill", [])) == len(s["requests"]), s
    out = subprocess.run(
        [stepscope_cli(), "analyze", "--json", "--requests=0", str(trace)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    ((report,), (listed,)) = (doc["traces"], doc["requests"])
    # Each captured iteration is named as vLLM's own annotate_profile names it (detailed),
    # run on the same SchedulerOutput in the worker; its work in the header is that name's.
    own = {}
    for line in (Path(server.workdir) / "vllm_annotations.jsonl").read_text().splitlines():
        entry = json.loads(line)
        own[entry["step"]] = entry["name"]
    assert len(report["steps"]) == len(manifest["steps"]), report["steps"]
    for st, listed_step in zip(report["steps"], manifest["steps"], strict=True):
        assert st["step"] == listed_step["step"], (st, listed_step)
        assert st["name"] == own[st["step"]], (st["name"], own[st["step"]])
        assert listed_step["work"] == work_of(own[st["step"]]), listed_step
        assert st["work"] == listed_step["work"], st
    # The requests' tokens and phases sum to vLLM's own counts.
    annotated = [st for st in report["steps"] if st.get("requests")]
    assert len(annotated) >= -(-LONG_LEN // BUDGET), report["steps"]
    for st in annotated:
        assert simple_name(st["name"]) == iteration_name(st), st
    # The model's shape is the served config.json's.
    model = manifest["model"]
    config = json.loads((Path(server.workdir) / "model" / "config.json").read_text())
    assert (model["architecture"], model["layers"], model["hidden_size"], model["heads"],
            model["kv_heads"], model["head_dim"], model["intermediate_size"],
            model["vocab_size"]) == (
        config["architectures"][0], config["num_hidden_layers"], config["hidden_size"],
        config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"],
        config["intermediate_size"], config["vocab_size"])  # fmt: skip
    assert (model["weight_dtype"], model["tensor_parallel"]) == ("bfloat16", 1), model
    assert model["params"] > 0 and "params" not in model.get("unknown", []), model
    with gzip.open(trace, "rt") as f:
        assert json.load(f)["stepscope"]["model"] == model
    # No peaks for a CPU: the floor says so; with the peaks given, every step that scheduled
    # tokens has one (one that scheduled nothing ran no forward: none).
    assert "--peak-tflops" in report["floor_missing"], report["floor_missing"]
    floors = subprocess.run(
        [stepscope_cli(), "analyze", "--json", "--peak-tflops", "2", "--peak-gbs", "50",
         str(trace)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert floors.returncode == 0, floors.stderr
    (floored,) = json.loads(floors.stdout)["traces"]
    assert floored["peaks"]["source"] == "--peak-tflops, --peak-gbs", floored["peaks"]
    scheduled = {s["step"]: sum(s.get("tokens", [])) for s in manifest["steps"]}
    assert any(scheduled.values()), scheduled
    for st in floored["steps"]:
        if not scheduled[st["step"]]:
            assert st.get("floor") is None, st
            continue
        f = st["floor"]
        assert f["floor_us"] > 0, st
        assert abs(f["of_wall"] - f["floor_us"] / st["dur_us"]) <= 1e-12 * f["of_wall"], st

    # Per request, what the trace shows equals what the engine's request log recorded: every
    # request of the capture lived inside it (sent after the start, finished before the stop).
    recorded = {r["id"]: r for r in log(server, since)["requests"]}
    by_id = {r["id"]: r for r in listed["requests"]}
    assert set(by_id) == set(recorded), (set(by_id), set(recorded))
    for rid, r in by_id.items():
        rec = recorded[rid]
        assert r["prefill"]["steps"] == rec["prefill_steps"], (r, rec)
        assert r["prefill"]["tokens"] == rec["prefill_tokens"], (r, rec)
        assert rec["prefill_tokens"] == rec["prompt_tokens"] - rec["cached_tokens"], rec
        assert (r["decode"] or {"steps": 0})["steps"] == rec["decode_steps"], (r, rec)
        assert r["share_by"] == "tokens", r
    long = by_id[long_id]
    assert (long["prefill"]["steps"], long["prefill"]["tokens"]) == (
        -(-LONG_LEN // BUDGET),
        LONG_LEN,
    ), long
    # The long prefill's chunks cost most, by construction of the model: it ranks first.
    assert listed["requests"][0]["id"] == long_id, listed["requests"][0]
    # Its costliest steps are its prefill chunks. Which of them took longest depends on the
    # machine: its last 4-token chunk shares a step with the short requests' 8-token prefills
    # (theirs the largest there), and under make test's load that step once outlasted a full
    # chunk. So: each full chunk listed is its own, and at most one listed step is not.
    costliest = long["costliest"]
    assert costliest and all(c["role"] == "prefill" for c in costliest), costliest
    full = [c for c in costliest if c["own_tokens"] == BUDGET]
    for c in full:
        assert (c["own_prefill"], c["largest_prefill_request"]) == (True, long_id), c
    rest = [c for c in costliest if c["own_tokens"] != BUDGET]
    assert len(rest) <= 1 and all(c["own_tokens"] == LONG_LEN % BUDGET for c in rest), costliest

    # The log beside the trace gives each request its queue wait and TTFT: those `ctl requests`
    # reads from the server's log for the same steps.
    live = {b["id"]: b for b in ctl_requests(server, "--since-step", str(since), "--top", "0")[
        "requests"]}  # fmt: skip
    for rid, r in by_id.items():
        joined, served = r["log"], live[rid]
        assert joined["server"] == str(window_log), joined
        for key in ("ttft_ms", "e2e_ms", "queue", "prefill", "decode", "finish"):
            assert joined[key] == served[key], (rid, key, joined[key], served[key])
    # What a short request waited through, which the trace cannot show: the long prefill, among
    # its costliest steps. Not necessarily the first: under make test's load the short request's
    # own prefill step once outlasted the long prefill's chunks (as for `long` above).
    waited = [r for r in by_id.values() if r["id"] != long_id and r["log"]["queue"]["steps"] > 0]
    assert waited, by_id
    for r in waited:
        costliest = r["log"]["costliest"]
        assert any(c["largest_prefill_request"] == long_id for c in costliest), r["log"]

    # Shares by tokens give each iteration's CPU time out whole.
    shared = sum(r["cpu_ms"] for r in listed["requests"])
    whole = sum(st["cpu_op_us"] for st in annotated) / 1e3
    assert abs(shared - whole) <= 1e-6 * max(whole, 1.0), (shared, whole)

    # One request by id: every captured iteration it was in, in order.
    one = subprocess.run(
        [stepscope_cli(), "analyze", "--request", long_id, str(trace)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr
    assert f"request {long_id}:" in one.stdout and "prefill 128 tok" in one.stdout, one.stdout

    # The HTML report's waterfall: a row per request, the long one's iterations shown when the
    # page is opened at its row, in a real browser, without a script error.
    page = Path(server.workdir) / "report.html"
    made = subprocess.run(
        [stepscope_cli(), "report", str(trace), "-o", str(page)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    assert html.count('<g class="req" data-req=') == len(listed["requests"]), html[:2000]
    row = next(
        k
        for k, r in enumerate(sorted(listed["requests"], key=lambda r: r["first_step"]))
        if r["id"] == long_id
    )
    dom, console = render_in_chromium(page, f"req-{row}", Path(server.workdir) / "chromium")
    assert not console, console
    assert f'data-shown-request="{row}"' in dom and 'data-ready="1"' in dom, dom[-2000:]


def work_of(name: str) -> dict:
    """The work a detailed annotation name carries, as the header records it."""
    m = re.fullmatch(
        r"execute_\d+_context_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
        r"_generation_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)",
        name,
    )
    assert m, name
    n = [int(x) for x in m.groups()]
    keys = ("requests", "sq", "sk", "sqsq", "sqsk")
    return {
        "context": dict(zip(keys, n[:5], strict=True)),
        "generation": dict(zip(keys, n[5:], strict=True)),
    }


def simple_name(name: str) -> str:
    """vLLM's simple name of an iteration its detailed name describes."""
    w = work_of(name)
    c, g = w["context"], w["generation"]
    return (
        f"execute_context_{c['requests']}({c['sq']})_generation_{g['requests']}({g['sq']})"
    )


def render_in_chromium(page: Path, fragment: str, profile: Path) -> tuple[str, list[str]]:
    """The DOM headless Chromium renders for `page#fragment` once its scripts ran, and the
    console lines (errors) it printed."""
    out = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=2000",
         f"--user-data-dir={profile}", "--dump-dom", f"file://{page}#{fragment}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    console = [
        line for line in out.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line
    ]
    return out.stdout, console
