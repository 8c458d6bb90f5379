"""SGLang: each finished request's engine steps as OpenTelemetry spans (``"stepscope": {"otel":
...}``), from the scheduler's request log, under SGLang's own root span of the request (``Req
…``: the same trace, its span the parent) when SGLang traces (``--enable-trace``), else under a
request span of stepscope's own.

The scheduler's result hook hands each request that finished, with the trace context SGLang
carries on it (``req.time_stats.trace_ctx``), to :class:`stepscope.otel.Exporter`'s bounded
queue; the exporter's thread builds the spans from the log (``RequestLog.spans_otlp``, without
the GIL) and exports them with SGLang's own span exporter (``get_otlp_span_exporter``: SGLang's
protocol), to stepscope's endpoint, else SGLang's ``--otlp-traces-endpoint`` when SGLang
traces, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``. ``/server_info`` carries its counters.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from stepscope import _plugin, otel
from stepscope.sglang.interface import warn_once

logger = logging.getLogger("stepscope.sglang")

_exporter = otel.Once()
_settings: list[dict[str, Any] | None] = []


def settings() -> dict[str, Any] | None:
    """``"stepscope": {"otel": ...}`` as the library reads it, read once (None: off, or bad:
    logged)."""
    if not _settings:
        try:
            _settings.append(otel.settings(_plugin.stepscope_keys_from_env()))
        except ValueError as e:
            warn_once("otel-config", "stepscope: OpenTelemetry export off: %s", e)
            _settings.append(None)
    return _settings[0]


def parent_of(req: Any) -> tuple[str | None, str | None]:
    """SGLang's root span of ``req`` (trace id, span id, in hex), from the trace context
    SGLang carries on it into the scheduler; ``(None, None)`` when SGLang traces it not."""
    ctx = getattr(getattr(req, "time_stats", None), "trace_ctx", None)
    if not getattr(ctx, "tracing_enable", False):
        return None, None
    root = getattr(ctx, "root_span_context", None)
    if root is None:
        return None, None
    from opentelemetry import trace

    span = trace.get_current_span(root).get_span_context()
    if not span.is_valid:
        return None, None
    return f"{span.trace_id:032x}", f"{span.span_id:016x}"


def _endpoint(cfg: dict[str, Any], scheduler: Any) -> str | None:
    args = getattr(scheduler, "server_args", None)
    traced = getattr(args, "enable_trace", False)
    sglang = getattr(args, "otlp_traces_endpoint", None) if traced else None
    return cfg.get("endpoint") or sglang or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def exporter(scheduler: Any, log: Any) -> otel.Exporter | None:
    """This scheduler process's exporter, made at the first finished request when the export
    is on and an endpoint is known; None otherwise."""
    return _exporter.get(lambda: _make(scheduler, log))


def _make(scheduler: Any, log: Any) -> otel.Exporter | None:
    cfg = settings()
    if cfg is None:
        return None

    def make(endpoint: str) -> Any:
        from sglang.srt.observability.trace import get_otlp_span_exporter

        builder, salt = otel.SpanBuilder(), otel.process_salt()
        costliest, steps = int(cfg["costliest"]), bool(cfg["steps"])

        def fetch(batch: list[otel.Wanted]) -> list[otel.Built]:
            return [builder.build(log, batch, salt, costliest, steps)]

        return get_otlp_span_exporter(endpoint), fetch

    hint = ('start SGLang with --enable-trace --otlp-traces-endpoint, or set "otel": '
            '{"endpoint": ...}')  # fmt: skip
    return otel.start(cfg, _endpoint(cfg, scheduler), make, logger, warn_once, hint)


def finished(log: Any, scheduler: Any, req: Any) -> None:
    """``req`` finished in a step of ``scheduler``: to the exporter, with SGLang's span of it.
    Never blocks (a full queue drops it, counted)."""
    e = exporter(scheduler, log)
    if e is not None:
        e.offer(str(req.rid), *parent_of(req))


def status() -> dict[str, Any] | None:
    """The export's counters for ``/server_info`` (None when off)."""
    e = _exporter.value
    return e.status() if e is not None else None
