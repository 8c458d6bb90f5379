"""What stepscope serves of a profile request and what it refuses, naming the field, and
what SGLang asserts against."""

from __future__ import annotations

from typing import Any

from stepscope.sglang.interface import warn_once
from stepscope.sglang.naming import STAGES

#: SGLang's activities stepscope serves, and the Kineto activity of each.
KINETO_ACTIVITIES = {"CPU": "CPU", "GPU": "CUDA", "XPU": "XPU"}


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
            warn_once(
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
