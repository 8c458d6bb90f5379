"""Request spans from an SGLang scheduler's log (`"stepscope": {"otel": ...}`), on SGLang's own
modules as the request-log tests drive them (tests/python/test_sglang.py: SGLang's
``_add_request_to_queue``, the scheduler loop around the plugin's hooks), with SGLang's own
tracing on (``process_tracing_init``, OTLP/HTTP) and its trace context carried into the
scheduler as SGLang carries it (the API server's ``APIServerReqTimeStats`` pickled, the
scheduler's ``Req`` made from it): stepscope's spans are children of SGLang's root span of each
request, in its trace; a request without SGLang's context gets a root of its own; the short
request's queue span names the long prefill that held it; `/server_info` carries the export's
counters. The collector decodes with the official `opentelemetry-proto` messages.

SGLang's tracing sets this process's OpenTelemetry provider, once: this file runs after the
other SGLang tests (scripts/pytest_envs.sh).
"""

from __future__ import annotations

import json
import pickle
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from otlp_receiver import OtlpReceiver  # noqa: E402
from test_sglang import D, P, Loop, new_req, plugin, sglang_queue  # noqa: E402

from stepscope.otel import Once  # noqa: E402


def wait_until(what, predicate, timeout=60):
    deadline = time.monotonic() + timeout  # bounds a broken export only
    while time.monotonic() < deadline:
        if (value := predicate()) is not None:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def traced(monkeypatch):
    """SGLang's tracing on, to a test collector; the plugin's log and export on, made afresh."""
    from sglang.srt.observability import trace as sglang_trace
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS", "50")
    monkeypatch.setenv(
        "STEPSCOPE_CONFIG", json.dumps({"stepscope": {"requests": True, "otel": {"steps": True}}})
    )
    sglang_trace.process_tracing_init(receiver.url, "sglang-test")
    lc, ot = plugin.lifecycles, plugin.otel
    for module, name, value in [(lc, "_log", None), (lc, "_tried", False), (lc, "_in_flight", {}),
                                (ot, "_exporter", Once()), (ot, "_settings", [])]:
        monkeypatch.setattr(module, name, value)  # fmt: skip
    for target, hook in lc.hooks():
        if target not in HookRegistry._patched:
            HookRegistry.register(target, hook, HookType.AROUND)
    HookRegistry.apply_hooks()
    try:
        yield receiver
    finally:
        from opentelemetry import trace

        # SGLang's spans still queued go now, while the collector listens.
        trace.get_tracer_provider().force_flush()
        receiver.close()


def sglang_traced_req(rid: str, prompt: int, max_new: int):
    """A request as SGLang's API server starts tracing it (its root span begun) and hands it
    to the scheduler (the time stats pickled across, the ``Req`` made from them); returns the
    API server's time stats (which end the root span) and the scheduler's ``Req``."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats
    from sglang.srt.sampling.sampling_params import SamplingParams

    api = APIServerReqTimeStats()
    api.init_trace_ctx(rid, None)
    assert api.trace_ctx.tracing_enable
    api.set_created_time()
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
    params.normalize(None)
    sent = pickle.loads(pickle.dumps(api))
    req = Req(rid, "", [3 + k % 500 for k in range(prompt)], params, time_stats=sent)
    return api, req


def test_a_schedulers_spans_sit_under_sglangs_root_span_of_each_request(traced):
    import sglang.srt.managers.scheduler as sm
    from sglang.srt.managers.io_struct import GetInternalStateReq, GetInternalStateReqOutput

    receiver = traced
    sched = sglang_queue()
    # SGLang traces: the export goes to its --otlp-traces-endpoint.
    sched.server_args = SimpleNamespace(enable_trace=True, otlp_traces_endpoint=receiver.url)
    loop = Loop(sched)
    (api_long, long), (api_short, short) = (sglang_traced_req("long", 300, 3),
                                           sglang_traced_req("short", 8, 3))  # fmt: skip
    plain = new_req("plain", 8, 2)  # no trace context of SGLang's
    for r in (long, short, plain):
        sm.Scheduler._add_request_to_queue(sched, r)
    loop.run(P, [long], extend=[(256, 0)])  # 1: the long prompt's first chunk; short waits
    loop.run(P, [long, short, plain], extend=[(44, 256), (8, 0), (8, 0)])  # 2
    loop.run(D, [long, short, plain])  # 3
    loop.run(D, [long, short])  # 4: plain ended in 3
    loop.drain()
    assert long.finished() and short.finished() and plain.finished()
    for api in (api_long, api_short):
        api.set_finished_time()  # SGLang's API server ends its root span

    def arrived():
        ours = receiver.named("stepscope.engine")
        roots = [s for s in receiver.spans if s["attributes"].get("rid") in ("long", "short")
                 and s["parent"] is None]  # fmt: skip
        return (ours, roots) if len(ours) == 3 and len(roots) == 2 else None

    ours, roots = wait_until("SGLang's and stepscope's spans", arrived)
    root_of = {s["attributes"]["rid"]: s for s in roots}
    engine_of = {s["attributes"]["gen_ai.request.id"]: s for s in ours}
    for rid in ("long", "short"):
        root, engine = root_of[rid], engine_of[rid]
        assert (engine["trace_id"], engine["parent"]) == (root["trace_id"], root["span_id"])
        # Inside SGLang's root span: it began before the request reached the scheduler and
        # ended after its last step.
        assert root["start"] <= engine["start"] <= engine["end"] <= root["end"], (root, engine)
    # Without SGLang's context: a root of stepscope's own.
    own = [s for s in receiver.named("stepscope.request")
           if s["attributes"]["gen_ai.request.id"] == "plain"]  # fmt: skip
    assert len(own) == 1 and engine_of["plain"]["parent"] == own[0]["span_id"]
    # What the log recorded, as spans: the short request waited behind the long prefill.
    doc = json.loads(plugin.lifecycles.request_log().document_json())
    record = {r["id"]: r for r in doc["requests"]}
    children = lambda rid, name: [s for s in receiver.named(name)  # noqa: E731
                                  if s["parent"] == engine_of[rid]["span_id"]]  # fmt: skip
    (queue,) = children("short", "stepscope.queue")
    assert queue["attributes"]["stepscope.queue.largest_prefill.request"] == "long"
    assert queue["attributes"]["stepscope.queue.steps"] == 1
    assert len(children("long", "stepscope.prefill")) == record["long"]["prefill_steps"] == 2
    (decode,) = children("long", "stepscope.decode")
    assert decode["attributes"]["stepscope.decode.steps"] == record["long"]["decode_steps"]
    # Each step once.
    assert sorted(s["attributes"]["stepscope.step"] for s in receiver.named("stepscope.step")) == [
        1, 2, 3, 4]  # fmt: skip
    # /server_info carries the export's counters. The collector has the spans once it read
    # the request; the exporter counts them once it has the answer: until then they are
    # in flight.
    controller = SimpleNamespace(scheduler=SimpleNamespace(profiler_manager=None))

    def otel_status():
        out = plugin.hooks.after_internal_state(
            GetInternalStateReqOutput(internal_state={}), controller, GetInternalStateReq()
        )
        return out.internal_state["stepscope"]["otel"]

    status = wait_until("the export's answer", lambda: (s := otel_status())["in_flight"] == 0 and s or None)
    assert status["endpoint"] == receiver.url
    assert (status["exported_requests"], status["dropped"], status["failed"]) == (3, 0, 0), status
