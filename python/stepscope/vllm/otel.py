"""vLLM: each finished request's engine steps as OpenTelemetry spans (``"stepscope": {"otel":
...}``), under vLLM's own ``llm_request`` span of it (the same trace, its span the parent) when
vLLM traces (``--otlp-traces-endpoint``), else under a request span of stepscope's own, sent
to the same collector or to ``"otel": {"endpoint": ...}``'s.

- In the API server (``OutputProcessor``): a finished request's id, with vLLM's span of it as
  vLLM ends that span (a span processor on vLLM's tracer provider, while ``do_tracing`` runs),
  goes to :class:`stepscope.otel.Exporter`'s bounded queue; its thread exports with vLLM's own
  span exporter (``vllm.tracing.otel.get_span_exporter``: vLLM's protocol and endpoint).
- In each engine core: ``EngineCore.stepscope_request_spans`` (``stepscope.vllm.lifecycles``,
  with the log), the exporter's utility call, hands the batch to a thread of its own
  (``stepscope-spans``) and returns a future, which vLLM answers once it is done: the engine's
  thread only passes the batch on, and the spans are built from the request log off it
  (``RequestLog.spans_otlp``).

docs/otel.md has each span and attribute, and what it costs.
"""

from __future__ import annotations

import asyncio
import os
import threading
from types import ModuleType
from typing import Any

from stepscope import otel
from stepscope.vllm.environment import logger, stepscope_keys, warn_once
from stepscope.vllm.interfaces import PATCHED_MARK, signature_known

#: How long the exporter waits for the engine cores to build a batch (seconds).
BUILD_TIMEOUT_S = 60.0

_exporter = otel.Once()
#: The request whose vLLM span is being ended on this thread (set around ``do_tracing``).
_current = threading.local()


def settings() -> dict[str, Any] | None:
    """``"stepscope": {"otel": ...}`` as the library reads it (None: off, or bad: logged)."""
    try:
        return otel.settings(stepscope_keys())
    except ValueError as e:
        warn_once("otel-config", "stepscope: OpenTelemetry export off: %s", e)
        return None


def wanted() -> bool:
    return settings() is not None


# -- The API server: which requests, with which parent, and the export. ------------------------


def _fetch_from(core: Any, loop: asyncio.AbstractEventLoop, cfg: dict[str, Any], salt: int) -> Any:
    """The exporter's ``fetch``: the batch asked of every engine core (each holds the requests
    it served), through vLLM's utility calls on the server's event loop."""

    def fetch(batch: list[otel.Wanted]) -> list[otel.Built]:
        wanted = [list(w) for w in batch]
        args = ("stepscope_request_spans", wanted, salt, int(cfg["costliest"]), bool(cfg["steps"]))
        every = getattr(core, "call_utility_all_async", None)
        call = every(*args) if every is not None else core.call_utility_async(*args)
        answers = asyncio.run_coroutine_threadsafe(call, loop).result(timeout=BUILD_TIMEOUT_S)
        if every is None:
            answers = [answers]
        return [
            (a["otlp"], int(a["requests"]), int(a["spans"]), int(a["steps_lost"]))
            for a in answers
            if a.get("otlp") is not None
        ]

    return fetch


def exporter(processor: Any) -> otel.Exporter | None:
    """This API server's exporter, made at the first finished request when the export is on
    and an endpoint is known (stepscope's key, else vLLM's, which vLLM's tracer puts in
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); None otherwise, or before the engine client is
    known (:func:`attach`)."""
    core = getattr(processor, "_stepscope_engine_core", None)
    if core is None:
        return _exporter.value
    return _exporter.get(lambda: _make(core))


def _make(core: Any) -> otel.Exporter | None:
    cfg = settings()
    if cfg is None:
        return None
    endpoint = cfg.get("endpoint") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

    def make(endpoint: str) -> Any:
        from vllm.tracing.otel import get_span_exporter

        # The server's event loop: the utility calls run on it (none offline: no export).
        loop = asyncio.get_running_loop()
        fetch = _fetch_from(core, loop, cfg, otel.process_salt())
        return get_span_exporter(endpoint), fetch

    hint = 'start vLLM with --otlp-traces-endpoint or set "otel": {"endpoint": ...}'
    return otel.start(cfg, endpoint, make, logger, warn_once, hint)


def status() -> dict[str, Any] | None:
    """The export's counters for ``/stepscope/status`` (None when off)."""
    e = _exporter.value
    return e.status() if e is not None else None


def _on_end(span: Any) -> None:
    """As vLLM ends its ``llm_request`` span of the request ``do_tracing`` runs for (this
    thread notes which), the request goes to the exporter with that span as its parent."""
    rid = getattr(_current, "request_id", None)
    e = _exporter.value
    if rid is None or e is None or span.name != "llm_request":
        return
    ctx = span.get_span_context()
    e.offer(rid, f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    _current.request_id = None


def _catch_parents() -> bool:
    """Puts a span processor calling :func:`_on_end` on vLLM's tracer provider; False when
    it has none that takes span processors (the request then gets a span of stepscope's
    own)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor

    add = getattr(trace.get_tracer_provider(), "add_span_processor", None)
    if add is None:
        return False

    class ParentCatcher(SpanProcessor):  # type: ignore[misc]
        def on_end(self, span: Any) -> None:
            _on_end(span)

    add(ParentCatcher())
    return True


def _patch_output_processor(module: ModuleType) -> None:
    """``OutputProcessor``: ``_update_stats_from_finished`` (every finished request) offers
    the request when vLLM does not trace it; ``do_tracing`` notes the request whose span
    vLLM ends, for :func:`_on_end`. Never raises into vLLM's output loop."""
    cls = getattr(module, "OutputProcessor", None)
    tracing = getattr(cls, "do_tracing", None)
    finished = getattr(cls, "_update_stats_from_finished", None)
    if cls is None or tracing is None or finished is None or hasattr(tracing, PATCHED_MARK):
        return
    if not (
        signature_known("OutputProcessor.do_tracing", tracing, module)
        and signature_known("OutputProcessor._update_stats_from_finished", finished, module)
    ):
        return
    catching = {"on": None}

    def do_tracing(
        self: Any, engine_core_output: Any, req_state: Any, iteration_stats: Any
    ) -> Any:
        rid = None
        try:
            if exporter(self) is not None:
                if catching["on"] is None:
                    catching["on"] = _catch_parents()
                if catching["on"]:
                    rid = str(req_state.request_id)
        except Exception as err:  # noqa: BLE001 - vLLM's own tracing goes on
            warn_once("otel-catch", "stepscope: request spans not parented to vLLM's: %r", err)
        _current.request_id = rid
        try:
            return tracing(self, engine_core_output, req_state, iteration_stats)
        finally:
            if rid is not None and getattr(_current, "request_id", None) == rid:
                # vLLM ended no span of it (sampled out, or an error): one of our own.
                _current.request_id = None
                if (e := _exporter.value) is not None:
                    e.offer(rid)

    def update_stats_from_finished(
        self: Any, req_state: Any, finish_reason: Any, iteration_stats: Any
    ) -> Any:
        try:
            e = exporter(self)
            # vLLM traces it: do_tracing, next, offers it with vLLM's span as the parent.
            traced = getattr(self, "tracing_enabled", False) and catching["on"] is not False
            if e is not None and not traced:
                e.offer(str(req_state.request_id))
        except Exception as err:  # noqa: BLE001 - never into vLLM's output loop
            warn_once("otel-offer", "stepscope: a finished request was not exported: %r", err)
        return finished(self, req_state, finish_reason, iteration_stats)

    for new, old in ((do_tracing, tracing), (update_stats_from_finished, finished)):
        new.__qualname__ = old.__qualname__
        new.__wrapped__ = old  # type: ignore[attr-defined]
        setattr(new, PATCHED_MARK, old)
    cls.do_tracing = do_tracing
    cls._update_stats_from_finished = update_stats_from_finished
    logger.debug("stepscope: %s.OutputProcessor exports request spans", module.__name__)


def attach(engine_client: Any) -> None:
    """The API server's engine client (the endpoint plugin's ``init_state``): the exporter
    reads the request log through its engine cores."""
    processor = getattr(engine_client, "output_processor", None)
    core = getattr(engine_client, "engine_core", None)
    if processor is not None and core is not None:
        processor._stepscope_engine_core = core
