"""The OpenTelemetry export's parts outside an engine (``stepscope.otel``): a real request log,
the library's spans, the OpenTelemetry SDK's OTLP/HTTP exporter and a receiver decoding with
the official ``opentelemetry-proto`` messages (tests/python/otlp_receiver.py).

- ``RequestLog.spans_json`` builds on another thread while the engine's thread records into the
  same log: nothing is refused or lost on either side;
- the exporter sends each request once, and the step spans once across batches, with the
  requests' links naming them;
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
            text, requests, spans, through, lost = log.spans_json(
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


def exporter_for(receiver: OtlpReceiver, log: stepscope.RequestLog, cfg: dict, timeout: float = 10.0):
    state = {"through": None}

    def fetch(batch):
        after = state["through"] if cfg["steps"] else None
        if cfg["steps"] and after is None:
            after = -1
        text, requests, spans, through, lost = log.spans_json(
            list(batch), salt=42, costliest=cfg["costliest"], steps_after=after
        )
        if through is not None:
            state["through"] = through
        return [(text, requests, spans, lost)]

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
