"""The OpenTelemetry export's parts outside an engine (``stepscope.otel``): a real request log,
the library's spans, the OpenTelemetry SDK's OTLP/HTTP exporter and a receiver decoding with
the official ``opentelemetry-proto`` messages (tests/python/otlp_receiver.py).

- ``RequestLog.spans_otlp`` builds on another thread while the engine's thread records into the
  same log: nothing is refused or lost on either side;
- its OTLP protobuf is the message its OTLP/JSON is, as the official messages decode each;
- the exporter sends each request once, and the step spans once across batches, with the
  requests' links naming them; an exporter that encodes spans itself gets the SDK's spans;
- a collector that never answers: ``offer`` never blocks, the queue never holds more than its
  cap, and every request offered is accounted for (exported, queued, in flight or dropped).
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

import stepscope
from otlp_receiver import OtlpReceiver
from stepscope import otel

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")


def served(log: stepscope.RequestLog, rid: str, prompt: int = 4, decode: int = 2) -> None:
    """`rid` arrives, prefills in one step and decodes `decode` steps, then finishes."""
    log.arrived(rid, prompt)
    step = log.begin_step(0)
    log.scheduled(step, [rid], [prompt], [0], outputs=[0])
    log.end_step(step)
    log.produced(step, [rid], [1])
    for k in range(decode):
        step = log.begin_step(0)
        log.scheduled(step, [rid], [1], [prompt + k], outputs=[k + 1])
        log.end_step(step)
        log.produced(step, [rid], [1])
    log.finished(step, rid, "length")


def http_exporter(url: str, timeout: float = 10.0):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=url, timeout=timeout)


def test_spans_are_built_on_another_thread_while_the_engine_records():
    log = stepscope.RequestLog(requests=1024, steps=4096)
    for k in range(64):
        served(log, f"warm-{k}")
    errors: list[BaseException] = []
    stop = threading.Event()

    def engine() -> None:
        # 900 more requests: the warm ones stay in the ring (1024).
        try:
            for k in range(900):
                if stop.is_set():
                    return
                served(log, f"r-{k}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=engine)
    t.start()
    built = 0
    try:
        deadline = time.monotonic() + 60  # bounds a broken build only
        while (built < 200 or t.is_alive()) and time.monotonic() < deadline:
            text, requests, spans, through, lost = log.spans_otlp(
                [(f"warm-{k}", None, None) for k in range(64)], salt=1, steps_after=-1
            )
            assert requests == 64 and spans > 64 * 4 and lost == 0, (requests, spans)
            built += 1
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert built >= 200
    # The engine's records are whole: every request it served is in the log, finished.
    doc = json.loads(log.document_json())
    assert all(r["finish"] == "length" for r in doc["requests"])


def test_the_protobuf_and_the_json_are_one_message():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otlp_receiver import from_otlp_json

    log = stepscope.RequestLog(requests=64, steps=256)
    made = time.monotonic()  # after the log's clock was anchored
    for k in range(5):
        served(log, f"r{k}", prompt=4 + k, decode=k)
    # One preempted and back: the engine span's events.
    log.arrived("p", 4)
    s = log.begin_step(0)
    log.scheduled(s, ["p"], [4], [0], outputs=[0])
    log.end_step(s)
    log.produced(s, ["p"], [1])
    s = log.begin_step(0)
    log.preempted(s, ["p"])
    log.end_step(s)
    s = log.begin_step(0)
    log.scheduled(s, ["p"], [5], [0], outputs=[1])
    log.end_step(s)
    log.produced(s, ["p"], [1])
    log.finished(s, "p", "stop")
    wanted = [(f"r{k}", None, None) for k in range(5)]
    wanted.append(("p", "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"))
    # The log's clock measures its rate against the monotonic clock until it has run a second
    # (src/clock.rs, SETTLE), each build reading it afresh until then: two builds within that
    # second may place and rank steps of near-equal lengths differently. After it, the first
    # build fixes the rate and both builds read the same one: a wait for the library's own
    # calibration period, not for the machine.
    time.sleep(max(0.0, 1.0 - (time.monotonic() - made)))
    text, n, spans, _, _ = log.spans_otlp(wanted, salt=3, steps_after=-1)
    encoded, n2, spans2, _, _ = log.spans_otlp(wanted, salt=3, steps_after=-1, protobuf=True)
    assert isinstance(text, str) and isinstance(encoded, bytes)
    assert (n, spans) == (n2, spans2) == (6, spans)
    from_json = from_otlp_json(text)
    from_proto = ExportTraceServiceRequest.FromString(encoded)
    # Each call places the log's clock on the wall clock by its own reading: times (and the
    # milliseconds derived from them) may differ by that reading's rounding, within a µs.
    for message in (from_json, from_proto):
        for rs in message.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    span.start_time_unix_nano //= 1000
                    span.end_time_unix_nano //= 1000
                    for e in span.events:
                        e.time_unix_nano //= 1000
    json_spans = [s for rs in from_json.resource_spans for ss in rs.scope_spans for s in ss.spans]
    got = [s for rs in from_proto.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(got) == len(json_spans) == spans
    for a, b in zip(got, json_spans, strict=True):
        assert abs(a.start_time_unix_nano - b.start_time_unix_nano) <= 1, (a, b)
        assert abs(a.end_time_unix_nano - b.end_time_unix_nano) <= 1, (a, b)
        b.start_time_unix_nano, b.end_time_unix_nano = a.start_time_unix_nano, a.end_time_unix_nano
        for ea, eb in zip(a.events, b.events, strict=True):
            assert abs(ea.time_unix_nano - eb.time_unix_nano) <= 1
            eb.time_unix_nano = ea.time_unix_nano
        for ka, kb in zip(a.attributes, b.attributes, strict=True):
            if ka.value.WhichOneof("value") == "double_value":  # milliseconds
                assert abs(ka.value.double_value - kb.value.double_value) <= 1e-3, (ka, kb)
                kb.value.double_value = ka.value.double_value
    assert from_proto == from_json
    assert any(e.name == "stepscope.preempted" for s in got for e in s.events)
    assert any(s.links for s in got)


def test_an_exporter_that_encodes_spans_itself_gets_the_sdks_spans():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    log = stepscope.RequestLog(requests=64, steps=256)
    served(log, "a")
    memory = InMemorySpanExporter()
    builder = otel.SpanBuilder()
    e = otel.Exporter(settings(), "memory", memory,
                      lambda batch: [builder.build(log, batch, 1, 3, False)],
                      logging.getLogger("test"))  # fmt: skip
    e.offer("a")
    wait_for("the export", lambda: e.status()["exported_requests"] == 1)
    names = sorted(s.name for s in memory.get_finished_spans())
    assert names == ["stepscope.decode", "stepscope.engine", "stepscope.prefill",
                     "stepscope.queue", "stepscope.request"]  # fmt: skip
    engine = next(s for s in memory.get_finished_spans() if s.name == "stepscope.engine")
    assert engine.attributes["gen_ai.request.id"] == "a"
    assert engine.attributes["stepscope.decode.steps"] == 2


def exporter_for(receiver: OtlpReceiver, log: stepscope.RequestLog, cfg: dict, timeout: float = 10.0):
    builder = otel.SpanBuilder()

    def fetch(batch):
        return [builder.build(log, batch, 42, cfg["costliest"], cfg["steps"])]

    return otel.Exporter(cfg, receiver.url, http_exporter(receiver.url, timeout), fetch,
                         logging.getLogger("test"))  # fmt: skip


def settings(**kw) -> dict:
    cfg = otel.settings({"requests": True, "otel": kw or True})
    assert cfg is not None
    return cfg


def wait_for(what, predicate, timeout=60):
    deadline = time.monotonic() + timeout  # bounds a broken exporter only
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_each_request_and_each_step_is_exported_once_with_links_to_its_steps():
    receiver = OtlpReceiver()
    try:
        log = stepscope.RequestLog(requests=64, steps=256)
        e = exporter_for(receiver, log, settings(steps=True, batch=3))
        for k in range(10):
            served(log, f"r{k}")
            e.offer(f"r{k}")
        e.offer("never-seen")
        wait_for("10 requests exported", lambda: e.status()["exported_requests"] == 10)
        wait_for("the stray one counted", lambda: e.status()["not_found"] == 1)
        status = e.status()
        assert (status["dropped"], status["failed"], status["steps_lost"]) == (0, 0, 0), status
        assert not receiver.errors, receiver.errors
        engines = receiver.named("stepscope.engine")
        assert sorted(s["attributes"]["gen_ai.request.id"] for s in engines) == sorted(
            f"r{k}" for k in range(10)
        )
        steps = receiver.named("stepscope.step")
        # 10 requests of 3 steps: 30 steps, each once across the batches.
        assert sorted(s["attributes"]["stepscope.step"] for s in steps) == list(range(1, 31))
        step_ids = {s["span_id"] for s in steps}
        links = [li[1] for s in receiver.spans for li in s["links"]]
        assert links and all(li in step_ids for li in links)
        assert status["exported_spans"] == len(receiver.spans)
    finally:
        receiver.close()


def test_a_collector_that_never_answers_blocks_nothing_and_the_queue_stays_within_its_cap():
    receiver = OtlpReceiver()
    receiver.silent()
    try:
        log = stepscope.RequestLog(requests=256, steps=1024)
        cap, batch = 4, 2
        # The export of the first batch hangs for the whole test.
        e = exporter_for(receiver, log, settings(queue=cap, batch=batch), timeout=600)
        offered = 0
        for k in range(40):
            served(log, f"r{k}")
            e.offer(f"r{k}")
            offered += 1
            s = e.status()
            assert s["queued"] <= cap, s
        wait_for("the export to reach the collector", lambda: receiver.held >= 1)
        s = e.status()
        assert s["offered"] == offered
        assert s["exported_requests"] == 0 and s["queued"] <= cap, s
        # Every request accounted for: taken into the hung batch, waiting, or dropped.
        taken = offered - s["queued"] - s["dropped"]
        assert 1 <= taken <= batch, s
        assert s["dropped"] >= offered - cap - batch, s
    finally:
        receiver.close()
