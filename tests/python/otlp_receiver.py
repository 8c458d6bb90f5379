"""A test OpenTelemetry collector: OTLP/HTTP at ``/v1/traces``, each request decoded with the
official ``opentelemetry-proto`` messages (protobuf, or OTLP's JSON through protobuf's own JSON
parser), its spans kept as plain dicts. ``silent()`` makes it take requests and never answer
them, as a collector that hangs."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def from_otlp_json(text: str) -> Any:
    """An ``ExportTraceServiceRequest`` from OTLP/JSON. OTLP's JSON is protobuf's JSON mapping
    but for the ids: hex digits, where protobuf's mapping has base64 (the OTLP specification),
    so they are turned into base64 before protobuf's own parser reads the rest."""
    import base64
    import json

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    def b64(h: str) -> str:
        return base64.b64encode(bytes.fromhex(h)).decode()

    doc = json.loads(text)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = b64(span[key])
                for link in span.get("links", []):
                    link["traceId"], link["spanId"] = b64(link["traceId"]), b64(link["spanId"])
    return json_format.ParseDict(doc, ExportTraceServiceRequest())


def decode(body: bytes, content_type: str) -> Any:
    """One ``ExportTraceServiceRequest`` from an OTLP/HTTP body."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    if content_type.startswith("application/json"):
        return from_otlp_json(body.decode())
    return ExportTraceServiceRequest.FromString(body)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def spans_of(message: Any) -> list[dict[str, Any]]:
    """The spans of an ``ExportTraceServiceRequest`` as dicts: ids in hex, times in ns, the
    attributes, events and links, and the resource's attributes."""
    out = []
    for rs in message.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent": s.parent_span_id.hex() or None,
                        "name": s.name,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": {a.key: _value(a.value) for a in s.attributes},
                        "events": [
                            (e.name, e.time_unix_nano, {a.key: _value(a.value) for a in e.attributes})
                            for e in s.events
                        ],
                        "links": [(li.trace_id.hex(), li.span_id.hex()) for li in s.links],
                        "resource": resource,
                        "scope": ss.scope.name,
                    }
                )
    return out


class OtlpReceiver:
    """Listens on a free loopback port; ``url`` is its ``/v1/traces`` endpoint. With
    ``decoding=False`` (a benchmark's collector) requests are counted, not decoded."""

    def __init__(self, decoding: bool = True) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.held = 0
        self.errors: list[str] = []
        self._silent = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if receiver._silent.is_set():
                    with receiver._lock:
                        receiver.held += 1
                    # Never answers (until the receiver closes).
                    receiver._release.wait()
                    return
                if not decoding:
                    with receiver._lock:
                        receiver.requests += 1
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    message = decode(body, self.headers.get("Content-Type", ""))
                except Exception as e:  # noqa: BLE001 - kept for the test to report
                    with receiver._lock:
                        receiver.errors.append(repr(e))
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.requests += 1
                    receiver.spans.extend(spans_of(message))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def silent(self) -> None:
        """From now on, requests are read and never answered."""
        self._silent.set()

    def answer_again(self) -> None:
        """Requests held so far are let go (unanswered); later ones are answered."""
        self._silent.clear()
        self._release.set()

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.spans if s["name"] == name]

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

