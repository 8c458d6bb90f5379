"""What the plugin knows of SGLang's interface: where its profiler managers and scheduler live,
the signatures of what it hooks (checked before anything is hooked: another SGLang keeps its own
profiler, with one warning), which profile manager runs (``SGLANG_PROFILE_V2``), and its
version."""

from __future__ import annotations

import logging
from typing import Any

from stepscope import _plugin
from stepscope._plugin import POS, signature_of

logger = logging.getLogger("stepscope.sglang")

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

_warned: set[str] = set()


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
        warn_once(
            "interface",
            "stepscope: this SGLang (%s) is not one stepscope knows: %s; SGLang's own profiler "
            "stays in place",
            sglang_version(),
            "; ".join(problems),
        )
        return False
    return True


def input_known() -> bool:
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


def has_state_controller() -> bool:
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


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - only for a message
        return "unknown version"


def warn_once(key: str, message: str, *args: Any) -> None:
    """Logs ``message`` once per process for ``key``."""
    _plugin.once(logger, logging.WARNING, _warned, key, message, *args)


def profile_v2() -> bool:
    """Whether SGLang runs its newer profile manager (``SGLANG_PROFILE_V2``)."""
    try:
        from sglang.srt.environ import envs

        return bool(envs.SGLANG_PROFILE_V2.get())
    except Exception:  # noqa: BLE001 - an SGLang without the switch
        return False


def reply(success: bool, message: str) -> Any:
    """SGLang's answer to a profile request."""
    from sglang.srt.managers.io_struct import ProfileReqOutput

    return ProfileReqOutput(success=success, message=message)
