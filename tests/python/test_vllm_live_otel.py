"""Request spans (`"stepscope": {"otel": ...}`) from a live `vllm serve` (vLLM's CPU build)
started with vLLM's own tracing (`--otlp-traces-endpoint`, OTLP/HTTP) pointing at a test
collector that decodes every request with the official `opentelemetry-proto` messages
(tests/python/otlp_receiver.py):

- requests sent one at a time: each request's stepscope spans are in vLLM's `llm_request`
  span's trace, children of it, inside its times; the queue span's length is vLLM's own
  `gen_ai.latency.time_in_queue` within a step; the spans' step counts (prefill chunks, decode
  steps, steps waited) are `ctl requests --json`'s for that request;
- the long-prefill workload of the request-log test: a short request's queue span names the
  long request as the prefill that held it;
- the step spans: each step once, every link from a request's span names one;
- `/stepscope/status` and `ctl status` show the export's counters;
- a collector that stops answering: the engine serves on, the export's queue never holds more
  than its cap, and what did not fit is counted as dropped.

The server is the request-log test's (conftest's `token_cost_live`: one server start for both;
these tests run after that module's, in the same process, the silent collector last). The model
is `TokenCostLlama` (tests/python/vllm_slow_step): step times follow tokens on any CPU; no time
is compared with a threshold.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from live_vllm import cpu_build_missing
from otlp_receiver import OtlpReceiver
from test_vllm_live import stepscope_cli
from test_vllm_live_requests import (
    BUDGET,
    OTEL_BATCH,
    OTEL_QUEUE,
    ctl_requests,
    log,
    long_prefill_with_short_requests,
    prompt,
)

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

#: The export's queue and batch, as the shared server was started with.
QUEUE, BATCH = OTEL_QUEUE, OTEL_BATCH
#: The engine's clock read against the wall clock, and vLLM's API server's wall clock: a
#: request's spans may start before vLLM's by this much (a reading's error, not a wait).
CLOCKS_NS = 1_000_000


@pytest.fixture(scope="module")
def receiver(otlp_collector):
    return otlp_collector


@pytest.fixture(scope="module")
def server(token_cost_live):
    return token_cost_live


@pytest.fixture(scope="module", autouse=True)
def counters_before(server):
    """The export's counters as this module begins (the shared server exported the request-log
    tests' requests before; none before the first request made the exporter): this module's
    tests judge what changed since."""
    return server.get("/stepscope/status")[1]["otel"] or {}


def wait_until(what, predicate, timeout=180):
    deadline = time.monotonic() + timeout  # bounds a broken export only: no speed assumed
    while time.monotonic() < deadline:
        if (value := predicate()) is not None:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def spans_of(receiver: OtlpReceiver, response_id: str) -> dict | None:
    """vLLM's span of the request answered as `response_id` and stepscope's under it, once
    both have arrived: {"vllm", "engine", "queue", "prefill": [...], "decode"}."""
    # vLLM's id of the request and the engine core's: the response's, with suffixes.
    vllm = [s for s in receiver.named("llm_request")
            if str(s["attributes"].get("gen_ai.request.id")).startswith(response_id)]  # fmt: skip
    engine = [s for s in receiver.named("stepscope.engine")
              if str(s["attributes"]["gen_ai.request.id"]).startswith(response_id)]  # fmt: skip
    if not vllm or not engine:
        return None
    assert len(vllm) == 1 and len(engine) == 1, (vllm, engine)
    children = [s for s in receiver.spans if s["parent"] == engine[0]["span_id"]]
    one = lambda name: [s for s in children if s["name"] == name]  # noqa: E731
    return {
        "vllm": vllm[0],
        "engine": engine[0],
        "queue": one("stepscope.queue"),
        "prefill": sorted(one("stepscope.prefill"), key=lambda s: s["start"]),
        "decode": one("stepscope.decode"),
        "children": children,
    }


def test_one_at_a_time_each_requests_spans_sit_under_vllms_and_agree_with_it_and_ctl(server, receiver):
    server.completion_of(prompt(8, 0), 4)
    since = log(server)["step_index"]
    shapes = [(8, 6), (100, 12), (300, 4), (40, 20)]
    answered = [server.completion_of(prompt(n, k + 1), m)[0] for k, (n, m) in enumerate(shapes)]
    got = [wait_until(f"the spans of {rid}", lambda rid=rid: spans_of(receiver, rid)) for rid in answered]
    doc = log(server, since)
    steps = {s["step"]: s for s in doc["steps"]}
    table = {b["id"]: b for b in ctl_requests(server, "--since-step", str(since))["requests"]}
    for (prompt_len, max_tokens), rid, s in zip(shapes, answered, got, strict=True):
        vllm, engine = s["vllm"], s["engine"]
        engine_id = engine["attributes"]["gen_ai.request.id"]
        record = next(r for r in doc["requests"] if r["id"] == engine_id)
        # vLLM's trace, vLLM's span the parent.
        assert (engine["trace_id"], engine["parent"]) == (vllm["trace_id"], vllm["span_id"])
        # Inside vLLM's span (vLLM starts it at the request's arrival in its API server and
        # ends it after the last output's trip back from the engine core).
        assert vllm["start"] - CLOCKS_NS <= engine["start"] <= engine["end"] <= vllm["end"] + CLOCKS_NS, (
            vllm, engine)  # fmt: skip
        # Its children inside it, in the same trace.
        assert s["children"]
        for c in s["children"]:
            assert c["trace_id"] == vllm["trace_id"]
            assert engine["start"] <= c["start"] <= c["end"] <= engine["end"], (c, engine)
        # The queue: vLLM's own time in queue, within a step.
        lived = [steps[n] for n in range(record["first_scheduled_step"], record["finished_step"] + 1)]
        granularity_s = min(st["duration_ns"] for st in lived) / 1e9
        (queue,) = s["queue"]
        ours_s = (queue["end"] - queue["start"]) / 1e9
        theirs_s = vllm["attributes"]["gen_ai.latency.time_in_queue"]
        print(f"{rid}: queue {ours_s * 1e3:.2f}/{theirs_s * 1e3:.2f} ms, step {granularity_s * 1e3:.2f} ms")
        assert abs(ours_s - theirs_s) <= granularity_s, (ours_s, theirs_s, granularity_s)
        # Step counts: ctl requests' for the same request.
        b = table[engine_id]
        assert len(s["prefill"]) == b["prefill"]["steps"] == -(-prompt_len // BUDGET), b
        (decode,) = s["decode"]
        assert decode["attributes"]["stepscope.decode.steps"] == b["decode"]["steps"] == max_tokens - 1
        assert queue["attributes"]["stepscope.queue.steps"] == b["queue"]["steps"], (queue, b)
        # What vLLM and stepscope say of the request's size agree.
        assert engine["attributes"]["gen_ai.usage.input_tokens"] == prompt_len
        assert engine["attributes"]["gen_ai.usage.output_tokens"] == max_tokens
        assert vllm["attributes"]["gen_ai.usage.prompt_tokens"] == prompt_len


def test_a_short_requests_queue_span_names_the_long_prefill_that_held_it(server, receiver):
    since, long_id = long_prefill_with_short_requests(server, seed=70)
    rows = ctl_requests(server, "--since-step", str(since), "--by", "queue")["requests"]
    shorts = [b for b in rows if b["prompt_tokens"] == 8]
    assert len(shorts) == 3, rows
    waited = [b for b in shorts if b["queue"]["steps"] > 0]
    assert waited, shorts

    def queue_span(engine_id: str):
        engines = [s for s in receiver.named("stepscope.engine")
                   if s["attributes"]["gen_ai.request.id"] == engine_id]  # fmt: skip
        if not engines:
            return None
        return next(s for s in receiver.named("stepscope.queue") if s["parent"] == engines[0]["span_id"])

    for b in waited:
        queue = wait_until(f"{b['id']}'s spans", lambda b=b: queue_span(b["id"]))
        assert queue["attributes"]["stepscope.queue.largest_prefill.request"] == long_id, queue
        assert queue["attributes"]["stepscope.queue.largest_prefill.tokens"] == BUDGET, queue
        assert queue["attributes"]["stepscope.queue.steps"] == b["queue"]["steps"], (queue, b)


def test_each_step_span_is_exported_once_and_the_requests_links_name_them(server, receiver, counters_before):
    # Everything exported so far has settled (the earlier tests waited for their spans).
    status = wait_until("the export to settle", lambda: (
        (s := server.get("/stepscope/status")[1]["otel"])["queued"] == 0 and s["in_flight"] == 0
        and s or None))  # fmt: skip
    steps = receiver.named("stepscope.step")
    ids = [s["span_id"] for s in steps]
    assert len(ids) == len(set(ids)), "a step span was exported twice"
    numbers = [s["attributes"]["stepscope.step"] for s in steps]
    assert len(numbers) == len(set(numbers))
    linked = {li[1] for s in receiver.spans for li in s["links"]}
    assert linked and linked <= set(ids), linked - set(ids)
    grew = {k: status[k] - counters_before.get(k, 0)
            for k in ("dropped", "failed", "steps_lost", "exported_requests")}  # fmt: skip
    assert (grew["dropped"], grew["failed"], grew["steps_lost"]) == (0, 0, 0), (status, counters_before)
    assert grew["exported_requests"] >= 8, (status, counters_before)


def test_stepscope_export_of_the_captures_log_gives_the_spans_sent_live(server, receiver, tmp_path):
    from pathlib import Path

    traces = Path(server.workdir) / "traces"
    before = set(traces.glob("*.requests.json")) if traces.exists() else set()
    status, answer, _ = server.post("/start_profile")
    assert status == 200, answer
    try:
        answered = [server.completion_of(prompt(n, 300 + n), 5)[0] for n in (20, 150)]
    finally:
        status, answer, _ = server.post("/stop_profile")
    assert status == 200, answer
    (window_log,) = set(traces.glob("engine0.*.requests.json")) - before
    live = [wait_until(f"the spans of {rid}", lambda rid=rid: spans_of(receiver, rid)) for rid in answered]
    out = tmp_path / "spans.jsonl"
    run = subprocess.run(
        [stepscope_cli(), "export", "--otlp-json", str(out), str(window_log)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    from otlp_receiver import from_otlp_json
    from otlp_receiver import spans_of as decoded

    exported = [s for line in out.read_text().splitlines()
                for s in decoded(from_otlp_json(line))]  # fmt: skip
    for s in live:
        engine_id = s["engine"]["attributes"]["gen_ai.request.id"]
        (engine,) = [e for e in exported if e["name"] == "stepscope.engine"
                     and e["attributes"]["gen_ai.request.id"] == engine_id]  # fmt: skip
        children = [e for e in exported if e["parent"] == engine["span_id"]]

        def shape(spans):
            # Names, attributes and lengths; the wall-clock placement is each document's own
            # reading of the engine's clock, so times may differ by that reading's rounding.
            return sorted((x["name"], sorted((k, v) for k, v in x["attributes"].items()
                                             if not isinstance(v, float)),
                           x["end"] - x["start"]) for x in spans)  # fmt: skip

        ours, theirs = shape([engine, *children]), shape([s["engine"], *s["children"]])
        assert [x[:2] for x in ours] == [x[:2] for x in theirs]
        assert all(abs(a[2] - b[2]) <= 1000 for a, b in zip(ours, theirs, strict=True)), (ours, theirs)


def test_ctl_status_shows_the_export(server, receiver):
    out = subprocess.run(
        [stepscope_cli(), "ctl", "status", "--worker", f"http://127.0.0.1:{server.port}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"otel → {receiver.url}:" in out.stdout and "requests exported" in out.stdout, out.stdout


def test_a_silent_collector_blocks_nothing_and_the_queue_stays_within_its_cap(server, receiver):
    before = server.get("/stepscope/status")[1]["otel"]
    receiver.silent()
    sent = 24
    errors: list[BaseException] = []

    def send(k: int) -> None:
        try:
            server.completion_of(prompt(8, 900 + k), 3)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    # Four at a time: the engine serves them all while the export is held.
    for wave in range(sent // 4):
        threads = [threading.Thread(target=send, args=(wave * 4 + k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = server.get("/stepscope/status")[1]["otel"]
        assert s["queued"] <= QUEUE, s
    assert not errors, errors
    after = wait_until("the last requests offered", lambda: (
        (s := server.get("/stepscope/status")[1]["otel"])["offered"] - before["offered"] == sent
        and s or None))  # fmt: skip
    assert receiver.held >= 1
    assert after["queued"] <= QUEUE and after["in_flight"] <= BATCH, after
    assert after["exported_requests"] == before["exported_requests"], after
    # Every request accounted for: in the held batch, waiting, or dropped.
    dropped = after["dropped"] - before["dropped"]
    assert dropped >= sent - QUEUE - BATCH, after
    others = sum(after[k] - before[k] for k in ("failed", "not_found"))
    assert dropped + after["queued"] + after["in_flight"] + others == sent, after
    # The collector answers again for whatever runs after (the server is shared).
    receiver.answer_again()
