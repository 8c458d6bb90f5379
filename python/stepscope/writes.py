"""A stop's traces, checked: :class:`TraceNotWritten` names every trace not on disk. What
``WorkerProfiler.wait_written`` and the engine plugins' stops raise."""

from __future__ import annotations

from typing import Any, Iterable, Mapping


class TraceNotWritten(RuntimeError):
    """A stop's traces are not all on disk: one failed, or the wait ran out of
    ``stepscope.flush_timeout_s``. The message names each worker, trace file and reason;
    ``traces`` lists them as dicts (``worker``, ``trace_file``, ``status``, ``error``)."""

    def __init__(self, message: str, traces: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.traces = traces


def check_written(
    answers: Iterable[tuple[str, Mapping[str, Any]]], waited_s: float
) -> None:
    """Raises :class:`TraceNotWritten` naming every trace not ``complete`` among ``answers``
    (each a worker's name and its :meth:`WorkerProfiler.writes_since` answer), and every
    worker whose stop the engine thread has not carried out yet."""
    bad = []
    for worker, writes in answers:
        mine = []
        for t in writes.get("traces", []):
            if t["status"] == "complete":
                continue
            why = t.get("error") or (
                f"still being written after {waited_s:g} s (stepscope.flush_timeout_s)"
                if t["status"] == "writing"
                else t["status"]
            )
            mine.append({"worker": worker, **t, "error": why})
        if writes.get("stopping") and not mine:
            mine.append({"worker": worker, "trace_file": None, "status": "stopping",
                         "error": f"the stop was not carried out by the engine thread within "
                                  f"{waited_s:g} s (no engine step came)"})  # fmt: skip
        bad.extend(mine)
    if bad:
        raise TraceNotWritten(
            "the stop's traces are not all on disk: "
            + "; ".join(f"{b['worker']}: {b['trace_file'] or 'its stop'}: {b['error']}" for b in bad),
            bad,
        )
