"""SGLang plugin: SGLang's own ``/start_profile`` and ``/stop_profile`` drive stepscope in every
scheduler process, with exactly the windows SGLang's own profiler would capture.

Installed with the ``stepscope`` package as the ``sglang.srt.plugins`` entry point
``stepscope = "stepscope.sglang:register"``; SGLang runs :func:`register` in each process it
starts (``SGLANG_PLUGINS``, when set, must name ``stepscope``). In scheduler processes it
registers ``AROUND`` hooks with SGLang's ``HookRegistry``.

**SGLang decides, stepscope records.** SGLang's ``SchedulerProfilerManager`` keeps deciding
when a window begins and ends (``start_step`` clamped to the next forward pass, ``num_steps``,
a new request replacing a pending one, by-stage counting where idle and prebuilt batches
neither count nor end a window, ``SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS``, and with
``SGLANG_PROFILE_V2`` its newer stage trigger): the plugin hooks only the methods that start
and stop SGLang's recording (``_start_profile``/``_stop_profile``, and V2's
``ProfileManager._do_start``/``_do_stop``) and puts a :class:`stepscope.WorkerProfiler` window
in the place of ``torch.profiler`` there. ``_profile_batch_predicate`` gives each forward batch
of a window one ``step()`` with its request and token counts (one Kineto annotation and one
NVTX range each). Traces are named as SGLang names them (``[prefix-]{profile_id}-TP-{n}
[-DP-..][-PP-..][-EP-..][-STAGE].trace.json.gz``) with a stepscope manifest beside each, and
written off the scheduler thread: the scheduler never waits on an export or a barrier.
``merge_profiles`` runs the streaming ``stepscope merge`` in a child process once every rank's
traces are on disk.

Deliberate differences from SGLang's own profiler (each one's reason in docs/sglang.md): a
request SGLang would crash or hang on is refused with a message (by stage without
``num_steps``; under V2, what V2 asserts against); ``profile_stages`` is honoured without V2
too; a window is named by the stage it captured; ``/stop_profile`` under V2 ends a running
window.

A request asking what stepscope cannot do (``MEM``, ``RPD`` or an unknown activity) is logged
and served by SGLang's own profiler, as is everything while the plugin is off
(``STEPSCOPE_SGLANG=0``) or when SGLang's code is not what the plugin knows (one warning). No
failure of the plugin reaches SGLang's import or its scheduler loop.

``/server_info``'s ``internal_states`` carry each answering scheduler's stepscope status
(``"stepscope"``), which ``stepscope ctl status --engine sglang`` reads, and with
``"stepscope": {"timeline": true}`` the last forward batches of its step timeline, which
``stepscope ctl top --engine sglang`` reads.

Environment: ``STEPSCOPE_SGLANG=0`` turns it off; ``STEPSCOPE_CONFIG`` supplies stepscope's own
keys (its ``"stepscope"`` object, as for vLLM); ``STEPSCOPE_CLI`` names the ``stepscope``
executable for ``merge_profiles`` (default: the one installed with this package, else on
``PATH``).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from stepscope import _plugin
from stepscope._plugin import POS, signature_of

logger = logging.getLogger("stepscope.sglang")

#: Set to ``0`` (or ``false``/``no``/``off``) to turn the plugin off.
SWITCH_ENV = "STEPSCOPE_SGLANG"
#: The ``stepscope`` executable for ``merge_profiles`` (default: found on ``PATH``).
CLI_ENV = "STEPSCOPE_CLI"

MANAGER_MODULE = "sglang.srt.managers.scheduler_components.profiler_manager"
#: The scheduler, whose ``process_input_requests`` dispatches and answers control requests.
SCHEDULER_INPUT = "sglang.srt.managers.scheduler.Scheduler.process_input_requests"
MANAGER = MANAGER_MODULE + ".SchedulerProfilerManager"
#: SGLANG_PROFILE_V2's profile manager.
V2_MODULE = "sglang.srt.utils.profile_utils"
V2_MANAGER = V2_MODULE + ".ProfileManager"
#: Where ``/server_info``'s ``internal_states`` are made, in each scheduler.
STATE_MODULE = "sglang.srt.managers.scheduler_components.internal_state"
STATE_CONTROLLER = STATE_MODULE + ".SchedulerInternalStateController"

#: The parameter lists of the hooked methods, as SGLang 0.5.23 declares them, per class.
#: Others: one warning, and SGLang's own profiler.
KNOWN_SIGNATURES: dict[str, dict[str, tuple[tuple[str, Any], ...]]] = {
    "SchedulerProfilerManager": {
        "_profile": (("self", POS), ("recv_req", POS)),
        "_profile_batch_predicate": (("self", POS), ("batch", POS)),
        "_start_profile": (("self", POS), ("stage", POS)),
        "_stop_profile": (("self", POS), ("stage", POS)),
    },
    "ProfileManager": {
        "_do_start": (("self", POS), ("stage", POS)),
        "_do_stop": (("self", POS),),
    },
}
#: The ``ProfileReq`` fields the plugin reads.
REQUEST_FIELDS = (
    "req_type", "output_dir", "start_step", "num_steps", "activities", "profile_by_stage",
    "with_stack", "record_shapes", "profile_id", "merge_profiles", "profile_prefix",
    "profile_stages", "detailed_annotations",
)  # fmt: skip
#: SGLang's activities stepscope serves, and the Kineto activity of each.
KINETO_ACTIVITIES = {"CPU": "CPU", "GPU": "CUDA", "XPU": "XPU"}
#: What SGLang records when a request names no activities.
DEFAULT_ACTIVITIES = ("CPU", "GPU")
#: SGLang's stages, in the order SGLang names them.
STAGES = ("prefill", "decode")
#: The manifest key (and trace header key) of the forward pass a window began in.
FIRST_FORWARD_KEY = "sglang_first_forward_pass"

_STATE = "_stepscope_state"
_lock = threading.Lock()
_registered = False
_warned: set[str] = set()


def register() -> None:
    """SGLang's plugin entry point. In a process that has imported the scheduler (where
    profiling happens), registers the hooks; SGLang's ``load_plugins`` applies them."""
    global _registered
    with _lock:
        if _registered:
            return
        if not enabled():
            logger.info(
                "stepscope: %s=%s, SGLang's profiler stays",
                SWITCH_ENV,
                os.environ[SWITCH_ENV],
            )
            return
        module = sys.modules.get(MANAGER_MODULE)
        if module is None:
            # Not a scheduler process (the detokenizer, a tokenizer-only process): nothing to
            # profile, and importing the scheduler's modules here would only cost start-up.
            logger.debug("stepscope: %s not imported in this process; no hooks", MANAGER_MODULE)
            return
        try:
            v2 = sys.modules.get(V2_MODULE)
            if not interface_known(module, v2):
                return
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType

            for target, hook in (
                (MANAGER + "._profile", _around_profile),
                (MANAGER + "._start_profile", _around_start),
                (MANAGER + "._stop_profile", _around_stop),
                (MANAGER + "._profile_batch_predicate", _around_batch),
                (V2_MANAGER + "._do_start", _around_v2_start),
                (V2_MANAGER + "._do_stop", _around_v2_stop),
            ):
                HookRegistry.register(target, hook, HookType.AROUND)
            if _input_known():
                HookRegistry.register(SCHEDULER_INPUT, _around_input, HookType.AROUND)
            if _has_state_controller():
                HookRegistry.register(
                    STATE_CONTROLLER + ".get_internal_state",
                    _after_internal_state,
                    HookType.AFTER,
                )
        except Exception:  # noqa: BLE001 - SGLang must load whatever happens here
            logger.warning(
                "stepscope: registering SGLang hooks failed; SGLang's profiler stays",
                exc_info=True,
            )
            return
        _registered = True


def enabled() -> bool:
    """False when ``STEPSCOPE_SGLANG`` turns the plugin off."""
    return _plugin.switched_on(SWITCH_ENV)


def interface_known(module: Any, v2_module: Any = None) -> bool:
    """Whether SGLang's profiler managers and ``ProfileReq`` are what the plugin knows; else one
    warning naming what differs, and False."""
    classes = {
        "SchedulerProfilerManager": getattr(module, "SchedulerProfilerManager", None),
        "ProfileManager": getattr(v2_module, "ProfileManager", None) if v2_module else None,
    }
    req = getattr(module, "ProfileReq", None)
    problems = []
    if classes["SchedulerProfilerManager"] is None or req is None:
        problems.append("SchedulerProfilerManager or ProfileReq is missing")
    elif v2_module is None or classes["ProfileManager"] is None:
        problems.append(f"{V2_MODULE}.ProfileManager is missing")
    else:
        for cls_name, methods in KNOWN_SIGNATURES.items():
            for name, known in methods.items():
                sig = signature_of(getattr(classes[cls_name], name, None))
                if sig != known:
                    shown = "(" + ", ".join(n for n, _ in sig) + ")" if sig else " is missing"
                    problems.append(f"{cls_name}.{name}{shown}")
        fields = set(
            getattr(req, "__struct_fields__", ()) or getattr(req, "__dataclass_fields__", {})
        )
        missing = [f for f in REQUEST_FIELDS if f not in fields]
        if missing:
            problems.append("ProfileReq has no " + ", ".join(missing))
    if problems:
        _warn_once(
            "interface",
            "stepscope: this SGLang (%s) is not one stepscope knows: %s; SGLang's own profiler "
            "stays in place",
            _sglang_version(),
            "; ".join(problems),
        )
        return False
    return True


def _input_known() -> bool:
    """Whether ``Scheduler.process_input_requests`` is what the plugin knows (SGLang 0.5.23's,
    answering through ``send_control_output``); else a stop is answered at once."""
    try:
        import importlib

        cls = importlib.import_module(SCHEDULER_INPUT.rsplit(".", 2)[0]).Scheduler
    except Exception:  # noqa: BLE001 - no scheduler module here: stops answered at once
        logger.info("stepscope: no SGLang scheduler here; a stop is answered at once")
        return False
    known = signature_of(getattr(cls, "process_input_requests", None)) == (
        ("self", POS),
        ("recv_reqs", POS),
    ) and callable(getattr(cls, "send_control_output", None))
    if not known:
        logger.info("stepscope: Scheduler.process_input_requests is not one stepscope knows; "
                    "a stop is answered before its traces are written")  # fmt: skip
    return known


def _has_state_controller() -> bool:
    try:
        import importlib

        cls = importlib.import_module(STATE_MODULE).SchedulerInternalStateController
    except Exception:  # noqa: BLE001 - an SGLang without it: no status in /server_info
        logger.info("stepscope: %s not found; /server_info carries no stepscope status",
                    STATE_CONTROLLER)  # fmt: skip
        return False
    return signature_of(getattr(cls, "get_internal_state", None)) == (
        ("self", POS),
        ("recv_req", POS),
    )


def _sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - only for a message
        return "unknown version"


def _warn_once(key: str, message: str, *args: Any) -> None:
    _plugin.once(logger, logging.WARNING, _warned, key, message, *args)


def profile_v2() -> bool:
    """Whether SGLang runs its newer profile manager (``SGLANG_PROFILE_V2``)."""
    try:
        from sglang.srt.environ import envs

        return bool(envs.SGLANG_PROFILE_V2.get())
    except Exception:  # noqa: BLE001 - an SGLang without the switch
        return False


# --- the hooks ----------------------------------------------------------------------------------


def _around_profile(original: Callable[..., Any], manager: Any, recv_req: Any) -> Any:
    """``SchedulerProfilerManager._profile``: refuses what stepscope must refuse, then lets
    SGLang's own code take the request (its start and stop reach stepscope's hooks). A stop
    that ended stepscope's window is answered once its traces are written (see
    :func:`_around_input`), when the scheduler that dispatched it is known."""
    tickets = _stop_tickets(manager, recv_req)
    try:
        reply = _state_of(manager).request(recv_req)
    except Exception:  # noqa: BLE001 - never into SGLang's scheduler
        logger.exception(
            "stepscope: handling %s failed; SGLang's own profiler serves it",
            type(recv_req).__name__,
        )
        reply = None
    if reply is None:
        reply = original(manager, recv_req)
        try:
            _state_of(manager).requested(recv_req, reply)
        except Exception:  # noqa: BLE001
            logger.debug("stepscope: recording the request failed", exc_info=True)
    if tickets and getattr(reply, "success", False) and _defer(reply, recv_req, tickets):
        return None
    return reply


# --- a stop answered once its traces are written ------------------------------------------------

#: The scheduler whose ``process_input_requests`` is dispatching, on its thread.
_dispatching = threading.local()
#: Where a scheduler keeps the stops waiting for their traces.
_PENDING = "_stepscope_pending_stops"
#: How often a scheduler looks at its waiting stops, s (its loop spins while idle).
_PENDING_CHECK_S = 0.005


def _around_input(original: Callable[..., Any], scheduler: Any, recv_reqs: Any) -> Any:
    """``Scheduler.process_input_requests``, which dispatches control requests and answers them
    (``send_control_output``, at once or later, as SGLang's deferred cache flush does): while it
    dispatches, a stop can defer its answer (:func:`_defer`); afterwards, every stop whose
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


def _stop_tickets(manager: Any, recv_req: Any) -> list[tuple[Any, int]] | None:
    """For a stop of stepscope's running window whose answer should wait for its traces
    (``stepscope.stop_returns`` ``"written"``, the default): each profiler with its write
    ticket, taken before the stop. None otherwise."""
    try:
        from sglang.srt.managers.io_struct import ProfileReqType

        state = manager.__dict__.get(_STATE)
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


def _defer(reply: Any, recv_req: Any, tickets: list[tuple[Any, int]]) -> bool:
    """Keeps ``reply`` on the dispatching scheduler until the stop's traces are settled;
    False (answer now) when no scheduler can answer later."""
    scheduler = getattr(_dispatching, "scheduler", None)
    if scheduler is None or not callable(getattr(scheduler, "send_control_output", None)):
        return False
    timeout = max(p._flush_timeout_s() for p, _ in tickets)
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
            reply = _reply(True, "Succeeded. stepscope wrote " + (", ".join(files) or "no trace")
                           + f" ({now - stop['began']:.2f} s after the stop)")  # fmt: skip
        except stepscope.TraceNotWritten as e:
            logger.error("stepscope: %s", e)
            reply = _reply(False, f"stepscope: {e}")
        scheduler.send_control_output(reply, stop["req"])
    scheduler.__dict__[_PENDING] = waiting


def _around_start(original: Callable[..., Any], manager: Any, stage: Any = None) -> Any:
    """``SchedulerProfilerManager._start_profile``: a stepscope window where SGLang would start
    torch.profiler."""
    if profile_v2():
        return original(manager, stage)
    import stepscope

    try:
        return _state_of(manager).start_legacy(stage, lambda: original(manager, stage))
    except stepscope.StartRefused as e:
        # A capture limit (disk, captures still being written): the start's answer says so.
        logger.warning("stepscope: %s", e)
        return _reply(False, f"stepscope: {e}")
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: starting a window failed; SGLang's own profiler starts")
        return original(manager, stage)


def _around_stop(original: Callable[..., Any], manager: Any, stage: Any = None) -> Any:
    """``SchedulerProfilerManager._stop_profile``: ends stepscope's window, else SGLang's."""
    state = manager.__dict__.get(_STATE)
    if state is None or not state.active or profile_v2():
        return original(manager, stage)
    try:
        return state.stop_legacy()
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: stopping the window failed")
        manager.profile_in_progress = False
        return _reply(False, "stepscope: stopping the window failed; see the scheduler's log")


def _around_batch(original: Callable[..., Any], manager: Any, batch: Any) -> Any:
    """``SchedulerProfilerManager._profile_batch_predicate``: SGLang's own predicate decides
    (starting or stopping through the hooks), then the batch is one ``step()`` of stepscope's
    running window, and of the step timeline when it is on."""
    state = manager.__dict__.get(_STATE)
    if state is None:
        if timeline_steps() is None:
            return original(manager, batch)
        state = _state_of(manager)
    try:
        state.time_batch(batch)
    except Exception:  # noqa: BLE001 - the scheduler loop goes on
        _warn_once("timeline", "stepscope: the step timeline failed; it stops here")
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
            _warn_once("batch", "stepscope: a forward batch's step failed; later ones go on")
            logger.debug("stepscope: step failed", exc_info=True)
    return result


def _around_v2_start(original: Callable[..., Any], v2: Any, stage: Any = None) -> Any:
    """V2's ``ProfileManager._do_start``: a stepscope window for the stage."""
    state = v2.__dict__.get(_STATE)
    if state is None:
        return original(v2, stage)
    import stepscope

    try:
        return state.start_v2(v2, stage, lambda: original(v2, stage))
    except stepscope.StartRefused as e:
        # V2's start has no answer to carry it: logged, and no window (SGLang's own profiler
        # would meet the same disk).
        logger.error("stepscope: no window: %s", e)
        return None
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: starting a window failed; SGLang's own profiler starts")
        return original(v2, stage)


def _around_v2_stop(original: Callable[..., Any], v2: Any) -> Any:
    """V2's ``ProfileManager._do_stop``."""
    state = v2.__dict__.get(_STATE)
    if state is None or not state.active:
        return original(v2)
    try:
        state.stop_window()
    except Exception:  # noqa: BLE001
        logger.exception("stepscope: stopping the window failed")
    return None


def _after_internal_state(result: Any, controller: Any, recv_req: Any) -> Any:
    """``/server_info``: adds this scheduler's stepscope status to its internal state."""
    try:
        manager = getattr(controller.scheduler, "profiler_manager", None)
        state = manager.__dict__.get(_STATE) if manager is not None else None
        result.internal_state["stepscope"] = status_of(state)
    except Exception:  # noqa: BLE001 - /server_info answers without it
        logger.debug("stepscope: no status for /server_info", exc_info=True)
    return result


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
    "timeline"}`` (``workers`` empty before the first request stepscope served; ``timeline``
    the step timeline's last :data:`SERVER_INFO_STEPS` forward batches, or None when off)."""
    import stepscope

    workers = []
    for p in state.profilers if state is not None else []:
        workers.append(json.loads(p.status_json()))
    timeline = getattr(state, "timeline", None)
    return {
        "plugin": "sglang",
        "version": stepscope.__version__,
        "workers": workers,
        "timeline": None if timeline is None else timeline_of(timeline),
    }


def timeline_of(profiler: Any) -> dict[str, Any]:
    """One scheduler's timeline as ``/server_info`` carries it: the form of vLLM's
    ``GET /stepscope/timeline`` workers (``stepscope ctl top --engine sglang`` reads both)."""
    import stepscope

    status = profiler.status()
    steps = profiler.timeline() or []
    return {
        "worker_name": status["worker_name"],
        "rank": status["rank"],
        "phase": status["phase"],
        "step_index": status["step_index"],
        "now_unix_ns": time.time_ns(),
        "timeline": status["timeline"],
        "fields": list(stepscope.TIMELINE_FIELDS),
        "steps": [list(t) for t in steps[-SERVER_INFO_STEPS:]],
    }


def _state_of(manager: Any) -> _SchedulerProfiler:
    state = manager.__dict__.get(_STATE)
    if state is None:
        state = _SchedulerProfiler(manager)
        manager.__dict__[_STATE] = state
    return state


def _reply(success: bool, message: str) -> Any:
    from sglang.srt.managers.io_struct import ProfileReqOutput

    return ProfileReqOutput(success=success, message=message)


# --- one scheduler's profiler ---------------------------------------------------------------------


class _Window:
    """The stepscope window running now, and what its stop needs."""

    def __init__(
        self, *, profile: str, profile_id: str, trace: str, output_dir: Path, merge: bool
    ) -> None:
        #: ``[prefix-]{profile_id}``: what every rank's files of this profile begin with.
        self.profile = profile
        #: This rank's file stem for the window.
        self.trace = trace
        self.profile_id = profile_id
        self.output_dir = output_dir
        self.merge = merge


class _SchedulerProfiler:
    """stepscope's side of one ``SchedulerProfilerManager``: a torch profiler for the Kineto
    activities, a cuda one for ``CUDA_PROFILER``; made at the first window, remade when a
    window is made with other settings (the output directory, the activities), the old ones
    kept until their traces are written."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.profilers: list[Any] = []
        self._made_with: list[dict[str, Any]] = []
        self._retired: list[Any] = []
        #: The window running now, or None.
        self.window: _Window | None = None
        #: The stages the last by-stage request chose (``profile_stages``); None: all.
        self.stages: list[str] | None = None
        #: Windows begun per profile (``merge_profiles`` waits for that many traces per rank).
        self.windows: dict[str, int] = {}
        #: Inside SGLang's ``_profile_batch_predicate``: a window begun here holds this batch.
        self.in_predicate = False
        #: The step timeline (``"stepscope": {"timeline": ...}``): a profiler of its own that
        #: steps at every forward batch, made at the first.
        self.timeline: Any = None
        self._timeline_made = False

    @property
    def active(self) -> bool:
        return self.window is not None

    # -- requests --

    def request(self, req: Any) -> Any:
        """A reply when stepscope refuses ``req`` (naming why); None to let SGLang's own code
        take it."""
        from sglang.srt.managers.io_struct import ProfileReqType

        import stepscope

        v2 = profile_v2()
        if v2:
            self._link_v2()
        if req.req_type != ProfileReqType.START_PROFILE:
            return self._stop_v2() if v2 else None
        why = cannot_serve(activities_of(req))
        if why is not None:
            in_flight = stepscope.traces_in_flight()
            if in_flight:
                # Kineto is one profiler per process: torch.profiler starting while stepscope's
                # writer still finalizes a session crashes the process. Refused, not waited
                # for: waiting would stall the scheduler for as long as the write takes.
                message = (
                    f"this request needs SGLang's own profiler ({why}), which cannot start "
                    f"while stepscope still writes {in_flight} trace(s) in this process: "
                    "retry once they are written"
                )
                logger.warning("stepscope: %s", message)
                return _reply(False, message)
            logger.info("stepscope: SGLang's own profiler serves this request: %s", why)
            return None
        error = check_request(req, v2=v2)
        if error is not None:
            logger.error("stepscope: %s", error)
            return _reply(False, error)
        if v2 and self.active:
            # V2's configure asserts that no stage window runs.
            return _reply(False, "Profiling is already in progress. Call /stop_profile first.")
        forward_ct = int(self.manager.get_forward_ct())
        if not v2 and req.start_step and not req.profile_by_stage and req.start_step <= forward_ct:
            logger.info(
                "stepscope: start_step %d has passed on this rank (forward pass %d): as SGLang "
                "does, the window begins in the next forward pass, %d",
                req.start_step,
                forward_ct,
                forward_ct + 1,
            )
        if not v2 and req.start_step and req.profile_by_stage:
            logger.info(
                "stepscope: start_step %d is not used by profile_by_stage (SGLang's windows "
                "begin at the first batch of each stage)",
                req.start_step,
            )
        return None

    def requested(self, req: Any, reply: Any) -> None:
        """After SGLang took a start request: the stages it chose, for the windows to come."""
        from sglang.srt.managers.io_struct import ProfileReqType

        if req.req_type == ProfileReqType.START_PROFILE and getattr(reply, "success", False):
            if req.profile_by_stage:
                self.stages = list(req.profile_stages) if req.profile_stages else None

    def _link_v2(self) -> None:
        v2 = getattr(self.manager, "_profile_manager", None)
        if v2 is not None and _STATE not in v2.__dict__:
            v2.__dict__[_STATE] = self

    def _stop_v2(self) -> Any:
        """``/stop_profile`` under V2 (whose manual stop raises NotImplementedError): ends the
        running stage window and drops the stages still to come."""
        v2 = getattr(self.manager, "_profile_manager", None)
        trigger = getattr(v2, "stage_based_trigger", None)
        pending = list(getattr(trigger, "stage_configs", {}) or {})
        if trigger is not None:
            trigger.running_state = None
            trigger.stage_configs = {}
        if self.active:
            return _reply(True, self.stop_window())
        if pending:
            return _reply(True, f"Succeeded. No window was running; {', '.join(pending)} dropped.")
        return _reply(False, "Profiling is not in progress. Call /start_profile first.")

    # -- windows --

    def start_legacy(self, stage: Any, sglang_start: Callable[[], Any]) -> Any:
        """SGLang's ``_start_profile(stage)``, with a stepscope window in torch.profiler's
        place (or SGLang's own start, for what stepscope does not record)."""
        m = self.manager
        activities = list(m.profiler_activities or DEFAULT_ACTIVITIES)
        why = cannot_serve(activities)
        if why is not None:
            return self._sglang_start(why, sglang_start)
        name = stage_of(stage) if stage is not None else None
        if name is not None and self.stages is not None and name not in self.stages:
            logger.info("stepscope: no %s window: profile_stages is %s", name, self.stages)
            return _reply(True, "Succeeded")
        profile = profile_name(m.profile_prefix, m.profile_id)
        suffix = legacy_stage_suffix(name) if name else ""
        window = self.window
        if window is not None:
            # SGLang starts again while a window runs in two cases: a request whose
            # _init_profile refused (refused here too), and a batch of a stage whose window
            # begins while another stage's runs (by stage: a prefill batch in a decode window
            # begun first). SGLang's own replaces the running torch.profiler there without
            # writing it; stepscope writes it, then begins the new window, unless it would
            # carry the same file name (it then goes on).
            if not self.in_predicate:
                return _reply(False, "Profiling is already in progress. Call /stop_profile first.")
            if window.trace == trace_stem(profile) + suffix:
                return _reply(True, "Succeeded")
            logger.info(
                "stepscope: %s begins while %s runs, which is written as it stands",
                trace_stem(profile) + suffix,
                window.trace,
            )
            self.stop_window()
        self._begin(
            profile=profile,
            profile_id=str(m.profile_id),
            trace=trace_stem(profile) + suffix,
            output_dir=Path(m.torch_profiler_output_dir),
            activities=activities,
            with_stack=m.torch_profiler_with_stack,
            record_shapes=m.torch_profiler_record_shapes,
            merge=bool(m.merge_profiles),
        )
        m.profile_in_progress = True
        self._annotate(bool(m.detailed_annotations))
        return _reply(True, "Succeeded")

    def start_v2(self, v2: Any, stage: Any, sglang_start: Callable[[], Any]) -> None:
        """V2's ``_do_start(stage)`` with a stepscope window."""
        kw = v2.profiler_kwargs
        activities = list(kw["activities"] or DEFAULT_ACTIVITIES)
        why = cannot_serve(activities)
        if why is not None:
            self._sglang_start(why, sglang_start)
            return
        profile = profile_name(kw["output_prefix"], kw["profile_id"])
        self._begin(
            profile=profile,
            profile_id=str(kw["profile_id"]),
            trace=trace_stem(profile) + (f"-{stage}" if stage else ""),
            output_dir=Path(kw["output_dir"]).expanduser(),
            activities=activities,
            with_stack=kw["with_stack"],
            record_shapes=kw["record_shapes"],
            merge=False,
        )
        self._annotate(bool(v2.detailed_annotations))

    def _sglang_start(self, why: str, sglang_start: Callable[[], Any]) -> Any:
        import stepscope

        in_flight = stepscope.traces_in_flight()
        if in_flight:
            logger.warning(
                "stepscope: SGLang's own profiler (%s) not started: stepscope still writes %d "
                "trace(s) in this process, and Kineto is one profiler per process",
                why,
                in_flight,
            )
            return _reply(False, f"stepscope still writes {in_flight} trace(s); retry")
        return sglang_start()

    def _begin(
        self,
        *,
        profile: str,
        profile_id: str,
        trace: str,
        output_dir: Path,
        activities: list[str],
        with_stack: Any,
        record_shapes: Any,
        merge: bool,
    ) -> None:
        self._make_profilers(output_dir, activities, with_stack, record_shapes)
        first = int(self.manager.get_forward_ct()) + (0 if self.in_predicate else 1)
        try:
            for p in self.profilers:
                p.set_trace_name(trace)
                p.set_trace_metadata(FIRST_FORWARD_KEY, first)
                p.start()
        except Exception:
            for p in self.profilers:
                p.stop()
            raise
        self.window = _Window(
            profile=profile, profile_id=profile_id, trace=trace, output_dir=output_dir, merge=merge
        )
        self.windows[profile] = self.windows.get(profile, 0) + 1
        logger.info(
            "stepscope: profiling %s from forward pass %d into %s",
            trace,
            first,
            output_dir,
        )

    def stop_legacy(self) -> Any:
        """SGLang's ``_stop_profile`` for stepscope's window."""
        message = self.stop_window()
        m = self.manager
        m.profile_in_progress = False
        m.profiler_start_forward_ct = None
        return _reply(True, message)

    def stop_window(self) -> str:
        """Ends the running window (its trace is written in the background); returns the
        reply's message."""
        window = self.window
        assert window is not None
        for p in self.profilers:
            p.stop()
        self.window = None
        self._annotate(False)
        logger.info("stepscope: profiling of %s stopped", window.profile)
        if window.merge and is_merging_rank():
            expected = self.windows.get(window.profile, 1) * _world_size()
            threading.Thread(
                target=merge_when_written,
                name="stepscope-merge",
                args=(window, list(self.profilers), expected),
                daemon=True,
            ).start()
        return (
            f"Succeeded. stepscope writes the traces to {window.output_dir} off the scheduler "
            f"thread; each {window.profile}-*.stepscope.json says when its trace is complete, "
            f"and `stepscope wait {window.output_dir}` returns once they all are."
        )

    def _make_profilers(
        self,
        output_dir: Path,
        activities: list[str],
        with_stack: Any,
        record_shapes: Any,
    ) -> None:
        import stepscope

        from stepscope._plugin import stepscope_keys_from_env

        keys = stepscope_keys_from_env()
        wanted: list[dict[str, Any]] = []
        kineto = [KINETO_ACTIVITIES[a] for a in activities if a in KINETO_ACTIVITIES]
        # SGLang calls cudaProfilerStart on the first GPU of each node only (nsys's capture
        # range is the node's); so does stepscope.
        cuda = "CUDA_PROFILER" in activities and first_rank_in_node()
        if kineto:
            wanted.append(
                {
                    "profiler": "torch",
                    "torch_profiler_dir": str(output_dir),
                    "torch_profiler_activities": kineto,
                    "torch_profiler_with_stack": True if with_stack is None else bool(with_stack),
                    "torch_profiler_record_shapes": bool(record_shapes),
                    "torch_profiler_dump_cuda_time_total": False,
                    # With CUDA_PROFILER too, the cuda profiler's NVTX ranges are the ones.
                    "stepscope": dict(keys, **({"nvtx": "off"} if cuda else {})),
                }
            )
        if cuda:
            wanted.append({"profiler": "cuda", "stepscope": dict(keys)})
        if wanted == self._made_with:
            return
        made = [
            stepscope.WorkerProfiler(
                c,
                worker_name=worker_name(),
                local_rank=_local_rank(),
                rank=_global_rank(),
            )
            for c in wanted
        ]
        for p in made:
            p.set_trace_metadata("sglang_version", _sglang_version())
        self._retire()
        self.profilers, self._made_with = made, wanted

    def _retire(self) -> None:
        """Keeps the old profilers until their traces are written (dropping one waits for
        them, which the scheduler must not)."""
        self._retired.extend(self.profilers)
        self._retired = [p for p in self._retired if p.pending_writes]
        self.profilers = []

    def _annotate(self, on: bool) -> None:
        apply = getattr(self.manager, "_apply_detailed_annotations", None)
        if apply is not None:
            apply(on)

    # -- forward batches --

    def time_batch(self, batch: Any) -> None:
        """One step of the timeline per forward batch. SGLang has no call at a batch's end, so
        a step lasts until the next batch's predicate: the scheduler loop's period, batch and
        scheduling together."""
        if not self._timeline_made:
            self._timeline_made = True
            steps = timeline_steps()
            if steps is None:
                return
            import stepscope

            self.timeline = stepscope.WorkerProfiler(
                {"stepscope": {"timeline": steps}},
                worker_name=worker_name(),
                local_rank=_local_rank(),
                rank=_global_rank(),
            )
        if self.timeline is not None:
            self.timeline.step(iteration_of(batch))

    def on_batch(self, batch: Any) -> None:
        """One ``step()`` of the running window: the batch's counts (and, with
        ``stepscope.request_ids``, its requests' ``rid`` s)."""
        ids = [str(r.rid) for r in batch.reqs] if self._wants_ids() else None
        iteration = iteration_of(batch, ids)
        for p in self.profilers:
            p.step(iteration)

    def _wants_ids(self) -> bool:
        return any(p.wants_request_ids for p in self.profilers)


def cannot_serve(activities: list[str]) -> str | None:
    """Why stepscope cannot record ``activities`` here (SGLang's own profiler then does), or
    None."""
    import stepscope

    others = [a for a in activities if a not in KINETO_ACTIVITIES and a != "CUDA_PROFILER"]
    if others:
        known = ", ".join([*KINETO_ACTIVITIES, "CUDA_PROFILER"])
        return f"activities {', '.join(map(str, others))} (stepscope records {known})"
    if any(a in KINETO_ACTIVITIES for a in activities):
        missing = stepscope.torch_backend_error()
        if missing is not None:
            _warn_once(
                "torch",
                "stepscope: %s; SGLang's own torch profiler serves torch captures",
                missing,
            )
            return "stepscope's torch backend cannot run here"
    return None


def check_request(req: Any, *, v2: bool) -> str | None:
    """What stepscope refuses in a start request, naming the field (where SGLang's own
    profiler would raise into the scheduler, or record nothing); None when it is fine."""
    for name in ("start_step", "num_steps"):
        value = getattr(req, name)
        if value is not None and (not isinstance(value, int) or value < 0):
            return f"{name} must be a whole number >= 0, not {value!r}"
    if req.profile_by_stage:
        if not req.num_steps:
            # SGLang's own counts None + 1 in the next batch: a TypeError in the scheduler.
            return "profile_by_stage needs num_steps (the forward passes of each stage)"
        stages = req.profile_stages or list(STAGES)
        bad = [s for s in stages if s not in STAGES]
        if bad or len(set(stages)) != len(stages):
            among = ", ".join(STAGES)
            return f"profile_stages {stages!r}: a list of distinct stages among {among}"
    elif req.profile_stages:
        return "profile_stages needs profile_by_stage"
    if v2:
        # What SGLANG_PROFILE_V2's configure asserts (an AssertionError in the scheduler).
        if not req.profile_by_stage:
            return "with SGLANG_PROFILE_V2, SGLang profiles only by stage: set profile_by_stage"
        if req.start_step is not None:
            return "with SGLANG_PROFILE_V2, start_step is not supported (SGLang's own asserts)"
        if req.merge_profiles:
            return "with SGLANG_PROFILE_V2, merge_profiles is not supported (SGLang's own asserts)"
    return None


def first_rank_in_node() -> bool:
    """Whether this scheduler's GPU is the first of its node (SGLang's test for
    ``cudaProfilerStart``); True where SGLang's device config is not published."""
    try:
        from sglang.srt.runtime_context import get_device

        dev = get_device()
        return dev.gpu_id == dev.base_gpu_id
    except Exception:  # noqa: BLE001 - no device config (a tool, a test)
        return True


# --- SGLang's names and counts --------------------------------------------------------------------


def activities_of(req: Any) -> list[str]:
    """The activities a request asks for (SGLang's default when it names none)."""
    return list(req.activities or DEFAULT_ACTIVITIES)


def profile_name(prefix: str | None, profile_id: Any) -> str:
    """``[prefix-]{profile_id}``: how every rank's file names of one profile begin."""
    return (f"{prefix}-" if prefix else "") + str(profile_id)


def trace_stem(profile: str) -> str:
    """SGLang's trace file stem for this rank: ``{profile}-TP-{n}`` plus ``-DP-``, ``-PP-`` and
    ``-EP-`` parts where that parallelism is on."""
    return "-".join([profile, *rank_parts()])


def rank_parts() -> list[str]:
    """``TP-{n}`` and the ``DP``/``PP``/``EP`` parts of SGLang's file names for this rank."""
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    parts = [f"TP-{par.tp_rank}"]
    if par.num_dp_ranks > 1:
        parts.append(f"DP-{par.dp_rank}")
    if par.pp_size > 1:
        parts.append(f"PP-{par.pp_rank}")
    if par.moe_ep_size > 1:
        parts.append(f"EP-{par.moe_ep_rank}")
    return parts


def legacy_stage_suffix(stage: str) -> str:
    """The stage's part of the file name as SGLang's default profiler writes it: ``-EXTEND``
    / ``-DECODE`` (V2 writes ``-prefill`` / ``-decode``)."""
    return "-EXTEND" if stage == "prefill" else "-DECODE"


def stage_of(forward_mode: Any) -> str | None:
    """SGLang's profiling stage of a forward mode: ``prefill`` (every extend kind, mixed
    included), ``decode``, or None (idle, prebuilt: no model forward)."""
    if forward_mode.is_prefill():
        return "prefill"
    if forward_mode.is_decode():
        return "decode"
    return None


def iteration_of(batch: Any, request_ids: list[str] | None = None) -> Any:
    """The batch's counts as a :class:`stepscope.Iteration`: extend requests and tokens as the
    context part, decoding requests (one token each) as the generation part; a mixed batch has
    both; with the requests' ``rid`` s when given. None for a batch with no model forward."""
    import stepscope

    mode = batch.forward_mode
    reqs = len(batch.reqs)
    if mode.is_decode():
        return stepscope.Iteration(num_gen_reqs=reqs, num_gen_tokens=reqs, request_ids=request_ids)
    if not mode.is_extend():
        return None
    decoding = len(batch.decoding_reqs or ()) if mode.is_mixed() else 0
    tokens = int(batch.extend_num_tokens or 0)
    return stepscope.Iteration(
        num_ctx_reqs=reqs - decoding,
        num_ctx_tokens=max(tokens - decoding, 0),
        num_gen_reqs=decoding,
        num_gen_tokens=decoding,
        request_ids=request_ids,
    )


def worker_name() -> str:
    try:
        return "sglang-" + "-".join(rank_parts())
    except Exception:  # noqa: BLE001 - no parallel state published (a test, a tool)
        return "sglang"


def _local_rank() -> int:
    try:
        from sglang.srt.runtime_context import get_device

        return int(get_device().gpu_id)
    except Exception:  # noqa: BLE001
        return 0


def _global_rank() -> int | None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001
        pass
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank)
    except Exception:  # noqa: BLE001
        return None


def _world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # noqa: BLE001
        pass
    return 1


def is_merging_rank() -> bool:
    """The rank that merges (SGLang's: TP, DP, PP and EP rank 0)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        return (
            par.tp_rank == 0
            and (par.num_dp_ranks <= 1 or par.dp_rank == 0)
            and (par.pp_size <= 1 or par.pp_rank == 0)
            and (par.moe_ep_size <= 1 or par.moe_ep_rank == 0)
        )
    except Exception:  # noqa: BLE001
        return True


# --- merge_profiles ----------------------------------------------------------------------------


def merge_when_written(
    window: _Window, profilers: list[Any], expected: int, *, poll: float = 0.2
) -> Path | None:
    """Waits (off the scheduler thread) for this rank's traces, then for ``expected`` complete
    manifests of the profile in the output directory (every rank's; up to the flush timeout),
    then runs ``stepscope merge`` on their traces into ``merged-{profile_id}.trace.json.gz``, in a
    child process. Returns the merged file, or None (logged) when it could not be made."""
    timeout = 600.0
    for p in profilers:
        timeout = float(p.config.get("stepscope", {}).get("flush_timeout_s", timeout))
        p.flush(timeout)
    import stepscope

    prefix = str(window.output_dir / glob.escape(window.profile + "-"))
    pattern = prefix + "*" + stepscope.MANIFEST_SUFFIX
    deadline = time.monotonic() + timeout
    while True:
        manifests = [(p, _read_manifest(p)) for p in sorted(glob.glob(pattern))]
        done = [(p, m) for p, m in manifests if m is not None and m.get("status") != "writing"]
        if len(done) >= expected and len(done) == len(manifests):
            break
        if time.monotonic() > deadline:
            logger.warning(
                "stepscope: merge_profiles: %d of %d traces of %s complete after %.0f s; "
                "merging those",
                len(done),
                expected,
                window.profile_id,
                timeout,
            )
            break
        time.sleep(poll)
    traces = []
    for path, m in done:
        if m.get("status") != "complete":
            continue
        try:
            # Beside its manifest, under either name (a tool may have renamed both).
            traces.append(str(stepscope.manifest_trace_path(path)))
        except OSError as e:
            logger.error("stepscope: merge_profiles: %s", e)
    from stepscope._cli import executable

    cli = os.environ.get(CLI_ENV) or executable() or shutil.which("stepscope")
    if not traces:
        logger.error(
            "stepscope: merge_profiles: no complete trace of %s to merge",
            window.profile_id,
        )
        return None
    if cli is None:
        logger.error(
            "stepscope: merge_profiles needs the stepscope command (this package carries none: "
            "set %s=/path/to/stepscope); the %d traces are in %s, unmerged",
            CLI_ENV,
            len(traces),
            window.output_dir,
        )
        return None
    out = window.output_dir / f"merged-{window.profile_id}.trace.json.gz"
    # Written under a hidden name and renamed, so the merged name only holds a whole trace.
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial.gz")
    run = subprocess.run(
        [cli, "merge", *traces, "--output", str(partial)],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        partial.unlink(missing_ok=True)
        logger.error("stepscope: merge_profiles: stepscope merge failed: %s", run.stderr.strip())
        return None
    os.replace(partial, out)
    logger.info("stepscope: merged %d traces of %s into %s", len(traces), window.profile_id, out)
    return out


def _read_manifest(path: str) -> dict[str, Any] | None:
    import stepscope

    try:
        return stepscope.read_manifest(path)
    except (OSError, ValueError):
        return None  # removed, or not a manifest: read again at the next poll
