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
(``"stepscope"``), which ``stepscope ctl status --engine sglang`` reads, with
``"stepscope": {"timeline": true}`` the last forward batches of its step timeline, which
``stepscope ctl top --engine sglang`` reads, and with ``"stepscope": {"requests": true}`` its
request log (:mod:`.lifecycles`), which ``stepscope ctl requests --engine sglang`` reads; with
``"otel"`` too, each finished request's engine steps go to an OpenTelemetry collector as spans
under SGLang's own span of it (:mod:`.otel`).

The package's modules, one job each: :mod:`.interface` (what the plugin knows of SGLang),
:mod:`.hooks` (what SGLang calls), :mod:`.strategy` with :mod:`.legacy` and :mod:`.v2` (SGLang's
two profile managers behind one interface), :mod:`.window` (one scheduler's profilers and
window), :mod:`.requests` (what is served and refused), :mod:`.deferred` (the stop answered
once written), :mod:`.status` (``/server_info``), :mod:`.naming` (SGLang's names and ranks),
:mod:`.merge` (``merge_profiles``), :mod:`.lifecycles` (the request log), :mod:`.otel` (its
requests as OpenTelemetry spans).

Environment: ``STEPSCOPE_SGLANG=0`` turns it off; ``STEPSCOPE_CONFIG`` supplies stepscope's own
keys (its ``"stepscope"`` object, as for vLLM); ``STEPSCOPE_CLI`` names the ``stepscope``
executable for ``merge_profiles`` (default: the one installed with this package, else on
``PATH``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from stepscope import _plugin
from stepscope.sglang import hooks, lifecycles
from stepscope.sglang.deferred import around_input
from stepscope.sglang.interface import (
    MANAGER,
    MANAGER_MODULE,
    SCHEDULER_INPUT,
    STATE_CONTROLLER,
    STATE_MODULE,
    V2_MANAGER,
    V2_MODULE,
    has_state_controller,
    input_known,
    interface_known,
    profile_v2,
)
from stepscope.sglang.merge import CLI_ENV, merge_when_written
from stepscope.sglang.naming import iteration_of, stage_of, trace_stem, worker_name
from stepscope.sglang.requests import cannot_serve, check_request
from stepscope.sglang.status import status_of, timeline_of

__all__ = [
    "CLI_ENV",
    "MANAGER_MODULE",
    "STATE_MODULE",
    "SWITCH_ENV",
    "V2_MODULE",
    "cannot_serve",
    "check_request",
    "enabled",
    "interface_known",
    "iteration_of",
    "merge_when_written",
    "profile_v2",
    "register",
    "stage_of",
    "status_of",
    "timeline_of",
    "trace_stem",
    "worker_name",
]

logger = logging.getLogger("stepscope.sglang")

#: Set to ``0`` (or ``false``/``no``/``off``) to turn the plugin off.
SWITCH_ENV = "STEPSCOPE_SGLANG"

_lock = threading.Lock()
_registered = False


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
                (MANAGER + "._profile", hooks.around_profile),
                (MANAGER + "._start_profile", hooks.around_start),
                (MANAGER + "._stop_profile", hooks.around_stop),
                (MANAGER + "._profile_batch_predicate", hooks.around_batch),
                (V2_MANAGER + "._do_start", hooks.around_v2_start),
                (V2_MANAGER + "._do_stop", hooks.around_v2_stop),
            ):
                HookRegistry.register(target, hook, HookType.AROUND)
            if input_known():
                HookRegistry.register(SCHEDULER_INPUT, around_input, HookType.AROUND)
            if lifecycles.requests_wanted() and lifecycles.scheduler_known():
                for target, hook in lifecycles.hooks():
                    HookRegistry.register(target, hook, HookType.AROUND)
            if has_state_controller():
                HookRegistry.register(
                    STATE_CONTROLLER + ".get_internal_state",
                    hooks.after_internal_state,
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
