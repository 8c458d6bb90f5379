"""Each finished request's engine steps as OpenTelemetry spans (``"stepscope": {"otel": ...}``),
for the engine plugins: the settings, the exporter's bounded queue and thread, and the
library's OTLP/JSON spans as the OpenTelemetry SDK's, for the engine's own span exporter (the
protocol and endpoint its tracing uses). docs/otel.md has each span and attribute.

The spans are built and encoded by the library (``RequestLog.spans_otlp``: the one builder,
also ``stepscope export``'s) from the request log, as OTLP protobuf, which the engine's span
exporter sends as it is (its module's ``encode_spans`` passes a :class:`Prebuilt` batch
through; an exporter without one gets the SDK's spans instead). An engine hands each finished
request to :meth:`Exporter.offer`, which never blocks: a full queue drops it, counted. The exporter's
thread takes up to ``batch`` requests at a time, has them built (``fetch``: in the engine's
process, off its thread) and exports them; a slow or dead collector holds up that thread
alone, while the queue stays within its cap and the drops are counted (``status()``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

#: A finished request handed to the exporter: its id, and the engine's span of it (trace id,
#: span id, in hex), or ``None, None`` when the engine traced it not.
Wanted = tuple[str, "str | None", "str | None"]
#: What building a batch gave, per engine process: ``(OTLP protobuf bytes, requests, spans,
#: steps lost)`` (``RequestLog.spans_otlp``'s, without the step mark).
Built = tuple[bytes, int, int, int]

#: How long a batch waits for more requests once it has one, at most (seconds).
BATCH_WAIT_S = 0.2


def settings(keys: dict[str, Any]) -> dict[str, Any] | None:
    """The ``"otel"`` key of stepscope's ``keys`` as the library reads it, defaults filled in
    (None: off). Raises ``ConfigError`` naming a bad field (``otel`` needs ``requests``)."""
    from stepscope._native import otel_settings

    wanted = {"requests": keys.get("requests"), "otel": keys.get("otel")}
    return otel_settings({"stepscope": wanted})


def process_salt() -> int:
    """A number making this process's span ids its own: its pid and start time."""
    return ((os.getpid() << 40) ^ time.time_ns()) & ((1 << 64) - 1)


def start(
    cfg: dict[str, Any],
    endpoint: str | None,
    make: Callable[[str], tuple[Any, Callable[[list[Wanted]], list[Built]]]],
    log: logging.Logger,
    warn: Callable[..., None],
    hint: str,
) -> Exporter | None:
    """A plugin's exporter of ``cfg`` to ``endpoint``: ``make(endpoint)`` gives the engine's
    span exporter and the batch builder (``fetch``). None, said once through ``warn``, when
    there is no endpoint (``hint``: how to give one) or making it fails: the engine goes on
    without."""
    if not endpoint:
        warn("otel-endpoint", "stepscope: OpenTelemetry export on but no endpoint: %s", hint)
        return None
    try:
        span_exporter, fetch = make(endpoint)
        made = Exporter(cfg, endpoint, span_exporter, fetch, log)
    except Exception as e:  # noqa: BLE001 - the engine goes on without
        warn("otel-make", "stepscope: OpenTelemetry export off: %r", e)
        return None
    log.info("stepscope: request spans exported to %s (queue %d)", endpoint, cfg["queue"])
    return made


class Once:
    """A process's exporter, made once: at the first finished request, by whichever thread
    gets there first (:meth:`get`); ``value`` is None until then, or when making it gave
    none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made = False
        self.value: Exporter | None = None

    def get(self, make: Callable[[], Exporter | None]) -> Exporter | None:
        """The exporter, ``make()`` called for it the first time only."""
        if self._made:
            return self.value
        with self._lock:
            if not self._made:
                self._made = True
                self.value = make()
        return self.value


class SpanBuilder:
    """Builds batches of one request log's spans (``RequestLog.spans_otlp``), keeping the last
    step whose span went so that each step's goes once. One per engine process; its calls
    come from one thread at a time."""

    def __init__(self) -> None:
        self.steps_through: int | None = None

    def build(self, log: Any, wanted: list[Any], salt: int, costliest: int, steps: bool) -> Built:
        after = (-1 if self.steps_through is None else self.steps_through) if steps else None
        message, requests, spans, through, lost = log.spans_otlp(
            [(str(w[0]), w[1], w[2]) for w in wanted],
            salt=int(salt),
            costliest=int(costliest),
            steps_after=after,
            protobuf=True,
        )
        if through is not None:
            self.steps_through = through
        return (bytes(message), requests, spans, lost)


class Prebuilt(list):  # type: ignore[type-arg]
    """A batch already encoded (an ``ExportTraceServiceRequest``): what an exporter's
    ``export`` is handed, its length the spans it holds, once :func:`pass_prebuilt` let its
    module's ``encode_spans`` pass it through."""

    def __init__(self, message: Any, count: int) -> None:
        super().__init__()
        self.message = message
        self.count = count

    def __len__(self) -> int:
        return self.count


#: Marks an ``encode_spans`` that passes a :class:`Prebuilt` batch through.
_PASSES = "__stepscope_prebuilt__"


def pass_prebuilt(span_exporter: Any) -> bool:
    """Lets the module of ``span_exporter``'s class (the SDK's OTLP gRPC and HTTP exporters
    encode with the ``encode_spans`` they import) hand a :class:`Prebuilt` batch's message on
    as it is, every other batch to the SDK's encoder; False when it has no such function
    (the batch then goes as the SDK's spans)."""
    import sys

    module = sys.modules.get(type(span_exporter).__module__)
    encode = getattr(module, "encode_spans", None)
    if not callable(encode):
        return False
    if getattr(encode, _PASSES, False):
        return True

    def encode_spans(spans: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(spans, Prebuilt):
            return spans.message
        return encode(spans, *args, **kwargs)

    setattr(encode_spans, _PASSES, True)
    encode_spans.__wrapped__ = encode  # type: ignore[attr-defined]
    module.encode_spans = encode_spans  # type: ignore[union-attr]
    return True


class Exporter:
    """The bounded queue of finished requests and the thread (``stepscope-otel``) that has
    them built into spans and exports them with ``span_exporter`` (an OpenTelemetry SDK
    ``SpanExporter``). ``fetch(batch)`` builds a batch: one :data:`Built` per engine process
    that answered."""

    def __init__(
        self,
        cfg: dict[str, Any],
        endpoint: str,
        span_exporter: Any,
        fetch: Callable[[list[Wanted]], list[Built]],
        log: logging.Logger,
    ) -> None:
        self.cfg = cfg
        self.endpoint = endpoint
        self.span_exporter = span_exporter
        self.fetch = fetch
        self.log = log
        self.batch = int(cfg["batch"])
        self.queue: queue.Queue[Wanted] = queue.Queue(maxsize=int(cfg["queue"]))
        self.offered = 0
        self.dropped = 0
        self.exported_requests = 0
        self.exported_spans = 0
        self.not_found = 0
        self.failed = 0
        self.steps_lost = 0
        self.in_flight = 0
        self.last_error: str | None = None
        self._warned = False
        #: Whether the exporter passes prebuilt batches through (None: not yet known).
        self._prebuilt: bool | None = None
        self.thread = threading.Thread(target=self._run, name="stepscope-otel", daemon=True)
        self.thread.start()

    def offer(
        self, request_id: str, trace_id: str | None = None, span_id: str | None = None
    ) -> None:
        """Hands a finished request over; never blocks: a full queue drops it (counted)."""
        self.offered += 1
        try:
            self.queue.put_nowait((request_id, trace_id, span_id))
        except queue.Full:
            self.dropped += 1

    def status(self) -> dict[str, Any]:
        """The export's counters, as ``/stepscope/status`` shows them: ``queued`` never
        exceeds ``queue``; ``dropped``: requests that found it full; ``not_found``: requests
        the log no longer held (or not finished); ``failed``: requests whose export failed."""
        return {
            "endpoint": self.endpoint,
            "queue": self.queue.maxsize,
            "queued": self.queue.qsize(),
            "in_flight": self.in_flight,
            "offered": self.offered,
            "exported_requests": self.exported_requests,
            "exported_spans": self.exported_spans,
            "dropped": self.dropped,
            "not_found": self.not_found,
            "failed": self.failed,
            "steps_lost": self.steps_lost,
            "last_error": self.last_error,
        }

    def _take(self) -> list[Wanted]:
        batch = [self.queue.get()]
        deadline = time.monotonic() + BATCH_WAIT_S
        while len(batch) < self.batch:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(self.queue.get(timeout=left))
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            self.in_flight = len(batch)
            try:
                self._export(batch)
            except Exception as e:  # noqa: BLE001 - the export goes on with the next batch
                self.failed += len(batch)
                self.last_error = repr(e)
                if not self._warned:
                    self._warned = True
                    self.log.warning("stepscope: exporting request spans failed: %r", e)
            finally:
                self.in_flight = 0

    def _export(self, batch: list[Wanted]) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )
        from opentelemetry.sdk.trace.export import SpanExportResult

        found = count = 0
        message = ExportTraceServiceRequest()
        for encoded, requests, spans, lost in self.fetch(batch):
            found += requests
            count += spans
            self.steps_lost += lost
            message.MergeFromString(encoded)
        self.not_found += len(batch) - found
        if not count:
            return
        if self._prebuilt is None:
            self._prebuilt = pass_prebuilt(self.span_exporter)
        data = Prebuilt(message, count) if self._prebuilt else readable_spans(message)
        if self.span_exporter.export(data) != SpanExportResult.SUCCESS:
            raise RuntimeError(f"the collector at {self.endpoint} did not take {count} spans")
        self.exported_requests += found
        self.exported_spans += count


def readable_spans(message: Any) -> list[Any]:
    """An ``ExportTraceServiceRequest``'s spans as the OpenTelemetry SDK's ``ReadableSpan`` s,
    for an exporter that encodes them itself."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

    sampled = TraceFlags(TraceFlags.SAMPLED)

    def context(trace_id: bytes, span_id: bytes, remote: bool) -> Any:
        return SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"),
                           remote, sampled)  # fmt: skip

    out = []
    for rs in message.resource_spans:
        resource = Resource.create(_attrs(rs.resource.attributes))
        for ss in rs.scope_spans:
            library = InstrumentationScope(ss.scope.name, ss.scope.version)
            for s in ss.spans:
                out.append(
                    ReadableSpan(
                        name=s.name,
                        context=context(s.trace_id, s.span_id, False),
                        parent=context(s.trace_id, s.parent_span_id, True)
                        if s.parent_span_id
                        else None,
                        resource=resource,
                        attributes=_attrs(s.attributes),
                        events=[Event(e.name, _attrs(e.attributes), e.time_unix_nano)
                                for e in s.events],  # fmt: skip
                        links=[Link(context(li.trace_id, li.span_id, False)) for li in s.links],
                        kind=SpanKind.INTERNAL,
                        start_time=s.start_time_unix_nano,
                        end_time=s.end_time_unix_nano,
                        instrumentation_scope=library,
                    )
                )
    return out


def _attrs(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in items:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind) if kind else None
    return out
