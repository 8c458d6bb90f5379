"""The hooks SGLang's ``HookRegistry`` runs around its profiler managers' methods: each passes
to stepscope (:mod:`.strategy`, :mod:`.window`) or to SGLang's own code, and none lets an error
reach SGLang's scheduler loop."""

from __future__ import annotations

import logging
from typing import Any, Callable

from stepscope.sglang.deferred import defer, stop_tickets
from stepscope.sglang.interface import reply, warn_once
from stepscope.sglang.status import status_of, timeline_steps
from stepscope.sglang.strategy import LEGACY, V2_MODE, handle_request, mode
from stepscope.sglang.window import found, found_for_v2, state_of

logger = logging.getLogger("stepscope.sglang")


def around_profile(original: Callable[..., Any], manager: Any, recv_req: Any) -> Any:
    """``SchedulerProfilerManager._profile``: refuses what stepscope must refuse, then lets
    SGLang's own code take the request (its start and stop reach stepscope's hooks). A stop
    that ended stepscope's window is answered once its traces are written (see
    :func:`stepscope.sglang.deferred.around_input`), when the scheduler that dispatched it is
    known."""
    tickets = stop_tickets(manager, recv_req)
    try:
        answer = handle_request(state_of(manager), recv_req)
    except Exception:  # noqa: BLE001 - never into SGLang's scheduler
        logger.exception(
            "stepscope: handling %s failed; SGLang's own profiler serves it",
            type(recv_req).__name__,
        )
        answer = None
    if answer is None:
        answer = original(manager, recv_req)
        try:
            mode().requested(state_of(manager), recv_req, answer)
        except Exception:  # noqa: BLE001
            logger.debug("stepscope: recording the request failed", exc_info=True)
    if tickets and getattr(answer, "success", False) and defer(answer, recv_req, tickets):
        return None
    return answer


def around_start(original: Callable[..., Any], manager: Any, stage: Any = None) -> Any:
    """``SchedulerProfilerManager._start_profile``: a stepscope window where SGLang would start
    torch.profiler."""
    if mode() is not LEGACY:
        return original(manager, stage)
    import stepscope

    try:
        return LEGACY.start(state_of(manager), stage, lambda: original(manager, stage))
    except stepscope.StartRefused as e:
        # A capture limit (disk, captures still being written): the start's answer says so.
        logger.warning("stepscope: %s", e)
        return reply(False, f"stepscope: {e}")
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: starting a window failed; SGLang's own profiler starts")
        return original(manager, stage)


def around_stop(original: Callable[..., Any], manager: Any, stage: Any = None) -> Any:
    """``SchedulerProfilerManager._stop_profile``: ends stepscope's window, else SGLang's."""
    state = found(manager)
    if state is None or not state.active or mode() is not LEGACY:
        return original(manager, stage)
    try:
        return LEGACY.stop(state)
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: stopping the window failed")
        manager.profile_in_progress = False
        return reply(False, "stepscope: stopping the window failed; see the scheduler's log")


def around_batch(original: Callable[..., Any], manager: Any, batch: Any) -> Any:
    """``SchedulerProfilerManager._profile_batch_predicate``: SGLang's own predicate decides
    (starting or stopping through the hooks), then the batch is one ``step()`` of stepscope's
    running window, and of the step timeline when it is on."""
    state = found(manager)
    if state is None:
        if timeline_steps() is None:
            return original(manager, batch)
        state = state_of(manager)
    try:
        state.time_batch(batch)
    except Exception:  # noqa: BLE001 - the scheduler loop goes on
        warn_once("timeline", "stepscope: the step timeline failed; it stops here")
        logger.debug("stepscope: timeline step failed", exc_info=True)
        state.timeline = None
    state.in_predicate = True
    try:
        result = original(manager, batch)
    finally:
        state.in_predicate = False
    if state.active:
        try:
            state.on_batch(batch)
        except Exception:  # noqa: BLE001 - the scheduler loop goes on
            warn_once("batch", "stepscope: a forward batch's step failed; later ones go on")
            logger.debug("stepscope: step failed", exc_info=True)
    return result


def around_v2_start(original: Callable[..., Any], v2: Any, stage: Any = None) -> Any:
    """V2's ``ProfileManager._do_start``: a stepscope window for the stage."""
    state = found_for_v2(v2)
    if state is None:
        return original(v2, stage)
    import stepscope

    try:
        return V2_MODE.start(state, v2, stage, lambda: original(v2, stage))
    except stepscope.StartRefused as e:
        # V2's start has no answer to carry it: logged, and no window (SGLang's own profiler
        # would meet the same disk).
        logger.error("stepscope: no window: %s", e)
        return None
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: starting a window failed; SGLang's own profiler starts")
        return original(v2, stage)


def around_v2_stop(original: Callable[..., Any], v2: Any) -> Any:
    """V2's ``ProfileManager._do_stop``."""
    state = found_for_v2(v2)
    if state is None or not state.active:
        return original(v2)
    try:
        V2_MODE.stop(state)
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: stopping the window failed")
    return None


def after_internal_state(result: Any, controller: Any, recv_req: Any) -> Any:
    """``/server_info``: adds this scheduler's stepscope status to its internal state."""
    try:
        state = found(getattr(controller.scheduler, "profiler_manager", None))
        result.internal_state["stepscope"] = status_of(state)
    except Exception:  # noqa: BLE001 - /server_info answers without it
        logger.debug("stepscope: no status for /server_info", exc_info=True)
    return result
