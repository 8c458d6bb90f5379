"""The worker's answers to ``collective_rpc`` (installed on vLLM's ``Worker`` by
``stepscope.vllm.worker``): its status, its step timeline, and a stop's ticket and the writes
since it. Each answers at once; none waits on a write."""

from __future__ import annotations

import os
from typing import Any


def worker_timeline(self: Any, since: int = 0) -> dict[str, Any]:
    """``Worker.stepscope_timeline``, for ``collective_rpc("stepscope_timeline")``: the
    worker's steps above ``since`` as arrays in ``fields`` order, with its name and rank;
    ``steps`` is ``None`` when its timeline is off."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if not isinstance(profiler, stepscope.WorkerProfiler):
        return {"rank": getattr(self, "rank", None), "steps": None, "fields": []}
    return profiler.timeline_dict(int(since))


def worker_stop_ticket(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_stop_ticket``, for ``collective_rpc`` right before a stop: the
    worker keeps a mark of its trace writes (:meth:`stepscope.WorkerProfiler.write_ticket`)
    that :func:`worker_writes` reads from, and says how its stop is to be answered
    (``stepscope.stop_returns``) and for how long at most (``flush_timeout_s``)."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if not isinstance(profiler, stepscope.WorkerProfiler):
        self._stepscope_ticket = None
        return {"stepscope": False, "rank": getattr(self, "rank", None)}
    self._stepscope_ticket = profiler.write_ticket()
    keys = profiler.config.get("stepscope", {})
    return {
        "stepscope": True,
        "rank": getattr(self, "rank", None),
        "worker_name": profiler.worker_name,
        "stop_returns": keys.get("stop_returns", "written"),
        "flush_timeout_s": profiler.flush_timeout_s,
    }


def worker_writes(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_writes``, for ``collective_rpc`` while a stop's caller waits: where
    the worker's traces since its stop ticket stand (:meth:`stepscope.WorkerProfiler.
    writes_since`). Answers at once: it never waits on a write."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    ticket = getattr(self, "_stepscope_ticket", None)
    if not isinstance(profiler, stepscope.WorkerProfiler) or ticket is None:
        return {"stepscope": False, "rank": getattr(self, "rank", None)}
    return {
        "stepscope": True,
        "rank": getattr(self, "rank", None),
        "worker_name": profiler.worker_name,
        **profiler.writes_since(ticket),
    }


def worker_status(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_status``, for ``collective_rpc("stepscope_status")``: the worker's
    profiler status, or what is known before its first ``/start_profile``."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if isinstance(profiler, stepscope.WorkerProfiler):
        return {"pid": os.getpid(), **profiler.status()}
    config = getattr(self, "profiler_config", None)
    return {
        "rank": getattr(self, "rank", None),
        "backend": getattr(config, "profiler", None),
        "phase": "not_created",
        "note": "no /start_profile has reached this worker yet"
        if profiler is None
        else f"vLLM's own {type(profiler).__name__} profiles this worker",
    }
