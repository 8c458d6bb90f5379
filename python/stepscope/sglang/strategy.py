"""The profile manager SGLang runs, as one interface (:class:`Mode`: the default manager,
:mod:`.legacy`, or ``SGLANG_PROFILE_V2``'s, :mod:`.v2`), and the request flow both share."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from stepscope.sglang.interface import profile_v2, reply
from stepscope.sglang.legacy import Legacy
from stepscope.sglang.naming import activities_of
from stepscope.sglang.requests import cannot_serve, check_request
from stepscope.sglang.v2 import V2
from stepscope.sglang.window import SchedulerProfiler

logger = logging.getLogger("stepscope.sglang")


class Mode(Protocol):
    """What differs between SGLang's two profile managers."""

    #: Whether this is ``SGLANG_PROFILE_V2``.
    v2: bool

    def stop_request(self, state: SchedulerProfiler) -> Any: ...
    def start_request(self, state: SchedulerProfiler, req: Any) -> Any: ...
    def requested(self, state: SchedulerProfiler, req: Any, answer: Any) -> None: ...
    def stop(self, state: SchedulerProfiler) -> Any: ...


LEGACY = Legacy()
V2_MODE = V2()


def mode() -> Legacy | V2:
    """The profile manager SGLang runs now."""
    return V2_MODE if profile_v2() else LEGACY


def handle_request(state: SchedulerProfiler, req: Any) -> Any:
    """A reply when stepscope refuses ``req`` (naming why) or serves it itself; None to let
    SGLang's own code take it."""
    from sglang.srt.managers.io_struct import ProfileReqType

    import stepscope

    now = mode()
    if req.req_type != ProfileReqType.START_PROFILE:
        return now.stop_request(state)
    why = cannot_serve(activities_of(req))
    if why is not None:
        in_flight = stepscope.traces_in_flight()
        if in_flight:
            # Kineto is one profiler per process: torch.profiler starting while stepscope's
            # writer still finalizes a session crashes the process. Refused, not waited for:
            # waiting would stall the scheduler for as long as the write takes.
            message = (
                f"this request needs SGLang's own profiler ({why}), which cannot start "
                f"while stepscope still writes {in_flight} trace(s) in this process: "
                "retry once they are written"
            )
            logger.warning("stepscope: %s", message)
            return reply(False, message)
        logger.info("stepscope: SGLang's own profiler serves this request: %s", why)
        return None
    error = check_request(req, v2=now.v2)
    if error is not None:
        logger.error("stepscope: %s", error)
        return reply(False, error)
    return now.start_request(state, req)
