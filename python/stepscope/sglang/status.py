"""What ``/server_info`` carries for each scheduler: its stepscope status and the last steps of
its step timeline."""

from __future__ import annotations

from typing import Any

from stepscope import _plugin
from stepscope.sglang.otel import status as otel_status
from stepscope.sglang.lifecycles import server_info_log

#: How many of the timeline's last steps ``/server_info`` carries per scheduler.
SERVER_INFO_STEPS = 512

_timeline_setting: list[Any] = []


def timeline_steps() -> Any:
    """``STEPSCOPE_CONFIG``'s ``"timeline"`` (``True`` or ``{"steps": N}``), or None when the
    timeline is off; read once."""
    if not _timeline_setting:
        try:
            value = _plugin.stepscope_keys_from_env().get("timeline")
        except ValueError:  # a bad STEPSCOPE_CONFIG: reported where a profiler is made
            value = None
        _timeline_setting.append(None if value in (None, False) else value)
    return _timeline_setting[0]


def status_of(state: Any) -> dict[str, Any]:
    """What ``/server_info`` carries for one scheduler: ``{"plugin", "workers": [status...],
    "timeline", "requests", "otel"}`` (``workers`` empty before the first request stepscope served;
    ``timeline`` the step timeline's last :data:`SERVER_INFO_STEPS` forward batches, or None
    when off; ``requests`` the request log's document of its last steps, or None when off;
    ``otel`` the OpenTelemetry export's counters, or None when off)."""
    import stepscope

    workers = []
    for p in state.profilers if state is not None else []:
        workers.append(p.status())
    timeline = getattr(state, "timeline", None)
    return {
        "plugin": "sglang",
        "version": stepscope.__version__,
        "workers": workers,
        "timeline": None if timeline is None else timeline_of(timeline),
        "requests": server_info_log(),
        "otel": otel_status(),
    }


def timeline_of(profiler: Any) -> dict[str, Any]:
    """One scheduler's timeline as ``/server_info`` carries it: the form of vLLM's
    ``GET /stepscope/timeline`` workers (``stepscope ctl top --engine sglang`` reads both), built
    by the native profiler."""
    return profiler.timeline_dict(0, SERVER_INFO_STEPS)
