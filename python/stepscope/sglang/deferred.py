"""A stop answered once its traces are written, without holding the scheduler: SGLang's
``Scheduler.process_input_requests`` answers control requests at dispatch or later
(``send_control_output``, as its deferred cache flush does); a stop that ended stepscope's
window takes its profilers' write tickets, gives no answer at dispatch, and is answered from a
later loop iteration."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from stepscope.sglang.interface import reply
from stepscope.sglang.window import found

logger = logging.getLogger("stepscope.sglang")

#: The scheduler whose ``process_input_requests`` is dispatching, on its thread.
_dispatching = threading.local()
#: Where a scheduler keeps the stops waiting for their traces.
_PENDING = "_stepscope_pending_stops"
#: How often a scheduler looks at its waiting stops, s (its loop spins while idle).
_PENDING_CHECK_S = 0.005


def around_input(original: Callable[..., Any], scheduler: Any, recv_reqs: Any) -> Any:
    """``Scheduler.process_input_requests``, which dispatches control requests and answers them
    (``send_control_output``, at once or later, as SGLang's deferred cache flush does): while it
    dispatches, a stop can defer its answer (:func:`defer`); afterwards, every stop whose
    traces are settled is answered. Runs every scheduler loop iteration; checks its waiting
    stops every 5 ms at most, and costs a dict lookup when none waits."""
    _dispatching.scheduler = scheduler
    try:
        return original(scheduler, recv_reqs)
    finally:
        _dispatching.scheduler = None
        if scheduler.__dict__.get(_PENDING):
            try:
                _answer_settled(scheduler)
            except Exception:  # noqa: BLE001 - never into SGLang's scheduler loop
                logger.exception("stepscope: answering a stop failed")


def stop_tickets(manager: Any, recv_req: Any) -> list[tuple[Any, int]] | None:
    """For a stop of stepscope's running window whose answer should wait for its traces
    (``stepscope.stop_returns`` ``"written"``, the default): each profiler with its write
    ticket, taken before the stop. None otherwise."""
    try:
        from sglang.srt.managers.io_struct import ProfileReqType

        state = found(manager)
        if (
            recv_req.req_type != ProfileReqType.STOP_PROFILE
            or state is None
            or not state.active
            or not state.profilers
            or getattr(_dispatching, "scheduler", None) is None
        ):
            return None
        keys = state.profilers[0].config.get("stepscope", {})
        if keys.get("stop_returns", "written") != "written":
            return None
        return [(p, p.write_ticket()) for p in state.profilers]
    except Exception:  # noqa: BLE001 - the stop is answered at once then
        logger.debug("stepscope: no stop tickets", exc_info=True)
        return None


def defer(reply: Any, recv_req: Any, tickets: list[tuple[Any, int]]) -> bool:
    """Keeps ``reply`` on the dispatching scheduler until the stop's traces are settled;
    False (answer now) when no scheduler can answer later."""
    scheduler = getattr(_dispatching, "scheduler", None)
    if scheduler is None or not callable(getattr(scheduler, "send_control_output", None)):
        return False
    timeout = max(p.flush_timeout_s for p, _ in tickets)
    now = time.monotonic()
    pending = scheduler.__dict__.setdefault(_PENDING, [])
    pending.append({"reply": reply, "req": recv_req, "tickets": tickets,
                    "deadline": now + timeout, "timeout": timeout, "began": now})  # fmt: skip
    scheduler.__dict__["_stepscope_next_check"] = 0.0
    return True


def _answer_settled(scheduler: Any) -> None:
    """Answers each waiting stop whose traces are all complete or failed (or whose wait ran out
    of ``flush_timeout_s``): SGLang's success reply with where the traces are, or a failure
    naming each trace not written and why."""
    import stepscope

    now = time.monotonic()
    if now < scheduler.__dict__.get("_stepscope_next_check", 0.0):
        return
    scheduler.__dict__["_stepscope_next_check"] = now + _PENDING_CHECK_S
    waiting = []
    for stop in scheduler.__dict__[_PENDING]:
        writes = [(p, p.writes_since(t)) for p, t in stop["tickets"]]
        if not all(w["settled"] for _, w in writes) and now < stop["deadline"]:
            waiting.append(stop)
            continue
        try:
            stepscope.check_written(((p.worker_name, w) for p, w in writes), stop["timeout"])
            files = [t["trace_file"] for _, w in writes for t in w["traces"]]
            answer = reply(True, "Succeeded. stepscope wrote " + (", ".join(files) or "no trace")
                           + f" ({now - stop['began']:.2f} s after the stop)")  # fmt: skip
        except stepscope.TraceNotWritten as e:
            logger.error("stepscope: %s", e)
            answer = reply(False, f"stepscope: {e}")
        scheduler.send_control_output(answer, stop["req"])
    scheduler.__dict__[_PENDING] = waiting
