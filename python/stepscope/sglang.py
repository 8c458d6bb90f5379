"""SGLang plugin: SGLang's own ``/start_profile`` and ``/stop_profile`` drive stepscope in every
scheduler process.

Installed with the ``stepscope`` package as the ``sglang.srt.plugins`` entry point
``stepscope = "stepscope.sglang:register"``; SGLang runs :func:`register` in each process it
starts (``SGLANG_PLUGINS``, when set, must name ``stepscope``). In scheduler processes it
registers two ``AROUND`` hooks with SGLang's ``HookRegistry`` on the scheduler's
``SchedulerProfilerManager``:

- ``_profile`` (what a ``ProfileReq`` reaches): a start request is served by a
  :class:`stepscope.WorkerProfiler` instead of ``torch.profiler``. ``start_step`` is an absolute
  forward count (every rank captures the same forward passes; one already passed is refused,
  where SGLang would quietly start later), ``num_steps`` the number of forward passes,
  ``profile_by_stage``/``profile_stages`` one window (and one trace) per stage, ``activities``
  the Kineto activities (``CUDA_PROFILER``: stepscope's ``cuda`` backend, for nsys),
  ``with_stack``/``record_shapes`` torch's options, ``detailed_annotations`` SGLang's span names.
  Traces are named as SGLang names them (``[prefix-]{profile_id}-TP-{n}[-DP-..][-PP-..][-EP-..]
  [-STAGE].trace.json.gz``) with a stepscope manifest beside each, and written off the scheduler
  thread: the scheduler never waits on an export or a barrier. ``merge_profiles`` runs the
  streaming ``stepscope merge`` in a child process once every rank's traces are on disk.
- ``_profile_batch_predicate`` (called once per forward batch): one ``step()`` per batch with its
  request and token counts (extend vs decode), so each captured batch is one Kineto annotation
  and one NVTX range.

A request asking what stepscope cannot do (``MEM``, ``RPD`` or an unknown activity) is logged
and served by SGLang's own profiler, as is everything while the plugin is off
(``STEPSCOPE_SGLANG=0``) or when SGLang's code is not what the plugin knows (one warning). No
failure of the plugin reaches SGLang's import or its scheduler loop.

Environment: ``STEPSCOPE_SGLANG=0`` turns it off; ``STEPSCOPE_CONFIG`` supplies stepscope's own
keys (its ``"stepscope"`` object, as for vLLM); ``STEPSCOPE_CLI`` names the ``stepscope``
executable for ``merge_profiles`` (default: the one on ``PATH``).
"""

from __future__ import annotations

import glob
import inspect
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

from stepscope.vllm import signature_of

logger = logging.getLogger("stepscope.sglang")

#: Set to ``0`` (or ``false``/``no``/``off``) to turn the plugin off.
SWITCH_ENV = "STEPSCOPE_SGLANG"
#: The ``stepscope`` executable for ``merge_profiles`` (default: found on ``PATH``).
CLI_ENV = "STEPSCOPE_CLI"

MANAGER_MODULE = "sglang.srt.managers.scheduler_components.profiler_manager"
MANAGER = MANAGER_MODULE + ".SchedulerProfilerManager"

_POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
#: The parameter lists of the hooked methods, as SGLang 0.5.23 declares them. Others: one
#: warning, and SGLang's own profiler.
KNOWN_SIGNATURES: dict[str, tuple[tuple[str, Any], ...]] = {
    "_profile": (("self", _POS), ("recv_req", _POS)),
    "_profile_batch_predicate": (("self", _POS), ("batch", _POS)),
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
                "stepscope: %s=%s, SGLang's profiler stays", SWITCH_ENV, os.environ[SWITCH_ENV]
            )
            return
        module = sys.modules.get(MANAGER_MODULE)
        if module is None:
            # Not a scheduler process (the detokenizer, a tokenizer-only process): nothing to
            # profile, and importing the scheduler's modules here would only cost start-up.
            logger.debug("stepscope: %s not imported in this process; no hooks", MANAGER_MODULE)
            return
        try:
            if not interface_known(module):
                return
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType

            HookRegistry.register(MANAGER + "._profile", _around_profile, HookType.AROUND)
            HookRegistry.register(
                MANAGER + "._profile_batch_predicate", _around_batch, HookType.AROUND
            )
        except Exception:  # noqa: BLE001 - SGLang must load whatever happens here
            logger.warning(
                "stepscope: registering SGLang hooks failed; SGLang's profiler stays", exc_info=True
            )
            return
        _registered = True


def enabled() -> bool:
    """False when ``STEPSCOPE_SGLANG`` turns the plugin off."""
    value = os.environ.get(SWITCH_ENV, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def interface_known(module: Any) -> bool:
    """Whether SGLang's profiler manager and ``ProfileReq`` are what the plugin knows; else one
    warning naming what differs, and False."""
    cls = getattr(module, "SchedulerProfilerManager", None)
    req = getattr(module, "ProfileReq", None)
    problems = []
    if cls is None or req is None:
        problems.append("SchedulerProfilerManager or ProfileReq is missing")
    else:
        for name, known in KNOWN_SIGNATURES.items():
            sig = signature_of(getattr(cls, name, None))
            if sig != known:
                shown = "(" + ", ".join(n for n, _ in sig) + ")" if sig else " is missing"
                problems.append(f"SchedulerProfilerManager.{name}{shown}")
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


def _sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - only for a message
        return "unknown version"


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


# --- the hooks ----------------------------------------------------------------------------------


def _around_profile(original: Callable[..., Any], manager: Any, recv_req: Any) -> Any:
    """``SchedulerProfilerManager._profile``: stepscope serves what it can, SGLang the rest."""
    try:
        state = _state_of(manager)
        reply = state.handle(recv_req)
    except Exception:  # noqa: BLE001 - never into SGLang's scheduler
        logger.exception(
            "stepscope: handling %s failed; SGLang's own profiler serves it",
            type(recv_req).__name__,
        )
        reply = None
    if reply is None:
        return original(manager, recv_req)
    return reply


def _around_batch(original: Callable[..., Any], manager: Any, batch: Any) -> Any:
    """``SchedulerProfilerManager._profile_batch_predicate``: one ``step()`` per forward batch
    while stepscope serves a request, then SGLang's own predicate (idle unless it serves one)."""
    state = manager.__dict__.get(_STATE)
    if state is not None and state.request is not None:
        try:
            state.on_batch(batch)
        except Exception:  # noqa: BLE001 - the scheduler loop goes on
            _warn_once("batch", "stepscope: a forward batch's step failed; later ones go on")
            logger.debug("stepscope: step failed", exc_info=True)
    return original(manager, batch)


def _state_of(manager: Any) -> _SchedulerProfiler:
    state = manager.__dict__.get(_STATE)
    if state is None:
        state = _SchedulerProfiler(manager)
        manager.__dict__[_STATE] = state
    return state


# --- one scheduler's profiler ---------------------------------------------------------------------


class _Request:
    """One start request, as stepscope runs it."""

    def __init__(self, req: Any, *, output_dir: Path) -> None:
        #: ``[prefix-]{profile_id}``: what every rank's files of this profile begin with.
        self.profile = profile_name(req.profile_prefix, req.profile_id)
        self.profile_id = str(req.profile_id)
        self.stem = trace_stem(self.profile)
        self.output_dir = output_dir
        self.num_steps = req.num_steps or 0
        self.by_stage = bool(req.profile_by_stage)
        self.stages_left = list(req.profile_stages or STAGES)
        self.merge = bool(req.merge_profiles)
        self.detailed = bool(req.detailed_annotations)
        #: By stage: this profiler's step index from which windows may begin (``start_step``).
        self.first_step: int | None = None
        self.stage: str | None = None
        self.count = 0
        self.windows = 0


class _SchedulerProfiler:
    """stepscope's profilers for one ``SchedulerProfilerManager``: a torch one for the Kineto
    activities, a cuda one for ``CUDA_PROFILER``; made at the first request, remade when a
    request changes what they are made with (the output directory), the old ones kept until
    their traces are written."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.request: _Request | None = None
        self.profilers: list[Any] = []
        self._made_with: list[dict[str, Any]] = []
        self._retired: list[Any] = []

    # -- requests --

    def handle(self, req: Any) -> Any:
        """The reply to ``req``, or None to leave it to SGLang's own profiler."""
        from sglang.srt.managers.io_struct import ProfileReqOutput, ProfileReqType

        import stepscope

        if req.req_type != ProfileReqType.START_PROFILE:
            if self.request is None:
                return None  # SGLang's own session, or none: SGLang answers
            return ProfileReqOutput(success=True, message=self.stop(why="/stop_profile"))
        why = self._cannot_serve(req)
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
                return ProfileReqOutput(success=False, message=message)
            logger.info("stepscope: SGLang's own profiler serves this request: %s", why)
            return None
        if self.request is not None or getattr(self.manager, "profile_in_progress", False):
            return ProfileReqOutput(
                success=False,
                message="Profiling is already in progress. Call /stop_profile first.",
            )
        error = self._check(req)
        if error is not None:
            logger.error("stepscope: %s", error)
            return ProfileReqOutput(success=False, message=error)
        output_dir = Path(
            req.output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        ).expanduser()
        try:
            self._make_profilers(req, output_dir, activities_of(req))
        except Exception as e:  # noqa: BLE001 - a bad config or a torch without glue
            logger.error("stepscope: cannot profile this request: %s", e)
            return ProfileReqOutput(success=False, message=f"stepscope: {e}")
        request = _Request(req, output_dir=output_dir)
        forward_ct = int(self.manager.get_forward_ct())
        if request.by_stage:
            if req.start_step:
                request.first_step = self._step_index() + int(req.start_step) - forward_ct
            self.request = request
            logger.info(
                "stepscope: profiling %s by stage (%s), %d forward passes each, into %s",
                request.stem,
                ", ".join(request.stages_left),
                request.num_steps,
                output_dir,
            )
            return ProfileReqOutput(success=True, message="Succeeded")
        try:
            for p in self.profilers:
                p.set_trace_name(request.stem)
                start_at = (
                    p.step_index + int(req.start_step) - forward_ct if req.start_step else None
                )
                p.start(max_iterations=request.num_steps, start_at_step=start_at)
        except Exception as e:  # noqa: BLE001 - the start failed: say so to the caller
            for p in self.profilers:
                p.stop()
            logger.error("stepscope: starting the profiler failed: %s", e)
            return ProfileReqOutput(success=False, message=f"stepscope: {e}")
        self.request = request
        self._annotate(request.detailed)
        when = f"at forward pass {req.start_step}" if req.start_step else "now"
        logger.info(
            "stepscope: profiling %s %s (%s) into %s",
            request.stem,
            when,
            f"{request.num_steps} forward passes" if request.num_steps else "until /stop_profile",
            output_dir,
        )
        return ProfileReqOutput(success=True, message="Succeeded")

    def _cannot_serve(self, req: Any) -> str | None:
        import stepscope

        activities = activities_of(req)
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

    def _check(self, req: Any) -> str | None:
        """What is wrong with ``req`` for stepscope, naming the field; None when it is fine."""
        for name in ("start_step", "num_steps"):
            value = getattr(req, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                return f"{name} must be a whole number >= 0, not {value!r}"
        if req.profile_by_stage:
            if not req.num_steps:
                return "profile_by_stage needs num_steps (the forward passes of each stage)"
            stages = req.profile_stages or list(STAGES)
            bad = [s for s in stages if s not in STAGES]
            if bad or len(set(stages)) != len(stages):
                among = ", ".join(STAGES)
                return f"profile_stages {stages!r}: a list of distinct stages among {among}"
        elif req.profile_stages:
            return "profile_stages needs profile_by_stage"
        forward_ct = int(self.manager.get_forward_ct())
        if req.start_step and req.start_step <= forward_ct:
            return (
                f"start_step {req.start_step} has passed on this rank (forward pass {forward_ct}); "
                "give every rank a later one so that all capture the same forward passes"
            )
        return None

    def _make_profilers(self, req: Any, output_dir: Path, activities: list[str]) -> None:
        import stepscope

        from stepscope.vllm import stepscope_keys_from_env

        keys = stepscope_keys_from_env()
        wanted: list[dict[str, Any]] = []
        kineto = [KINETO_ACTIVITIES[a] for a in activities if a in KINETO_ACTIVITIES]
        cuda = "CUDA_PROFILER" in activities
        if kineto:
            wanted.append(
                {
                    "profiler": "torch",
                    "torch_profiler_dir": str(output_dir),
                    "torch_profiler_activities": kineto,
                    "torch_profiler_with_stack": True
                    if req.with_stack is None
                    else bool(req.with_stack),
                    "torch_profiler_record_shapes": bool(req.record_shapes),
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
                c, worker_name=worker_name(), local_rank=_local_rank(), rank=_global_rank()
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

    def _step_index(self) -> int:
        return self.profilers[0].step_index if self.profilers else 0

    def _annotate(self, on: bool) -> None:
        apply = getattr(self.manager, "_apply_detailed_annotations", None)
        if apply is not None:
            apply(on)

    # -- forward batches --

    def on_batch(self, batch: Any) -> None:
        request = self.request
        if request is None:
            return
        armed = request.by_stage or any(p.is_armed for p in self.profilers)
        # Request ids are read only when stepscope.request_ids asks for them.
        ids = [str(r.rid) for r in batch.reqs] if self._wants_ids() else None
        iteration = iteration_of(batch, ids) if armed else None
        if request.by_stage:
            self._stage_windows(request, batch)
        for p in self.profilers:
            p.step(iteration)
        if request.by_stage:
            if request.stage is not None:
                request.count += 1
            elif not request.stages_left:
                self._finish(request)
        elif not any(p.is_active for p in self.profilers):
            self._finish(request)  # num_steps reached: the profilers stopped by themselves

    def _wants_ids(self) -> bool:
        return any(p.wants_request_ids for p in self.profilers)

    def _stage_windows(self, request: _Request, batch: Any) -> None:
        """Ends the running stage window at its count or at a batch of another stage, and
        begins the window of a stage still wanted; idle batches change nothing."""
        stage = stage_of(batch.forward_mode)
        if stage is None:
            return
        if request.first_step is not None and self._step_index() + 1 < request.first_step:
            return
        if request.stage is not None and (
            request.count >= request.num_steps or stage != request.stage
        ):
            for p in self.profilers:
                p.stop()
            self._annotate(False)
            request.stage = None
        if request.stage is None and stage in request.stages_left:
            request.stages_left.remove(stage)
            name = request.stem + stage_suffix(stage)
            try:
                for p in self.profilers:
                    p.set_trace_name(name)
                    p.start(max_iterations=request.num_steps)
            except Exception as e:  # noqa: BLE001 - this stage is lost; the next may run
                logger.error("stepscope: starting the %s window failed: %s", stage, e)
                for p in self.profilers:
                    p.stop()
                return
            logger.info("stepscope: profiling starts for %s (%s)", stage, name)
            self._annotate(request.detailed)
            request.stage, request.count = stage, 0
            request.windows += 1

    def stop(self, *, why: str) -> str:
        """Ends the running request (``/stop_profile``); returns the reply's message."""
        request = self.request
        for p in self.profilers:
            p.stop()
        self._finish(request)
        logger.info("stepscope: %s: profiling of %s stopped", why, request.stem)
        return (
            f"Succeeded. stepscope writes the traces to {request.output_dir} off the scheduler "
            f"thread; each {request.stem}*.stepscope.json says when its trace is complete."
        )

    def _finish(self, request: _Request) -> None:
        self.request = None
        self._annotate(False)
        if request.merge and is_merging_rank():
            windows = request.windows if request.by_stage else 1
            threading.Thread(
                target=merge_when_written,
                name="stepscope-merge",
                args=(request, list(self.profilers), windows * _world_size()),
                daemon=True,
            ).start()


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


def stage_suffix(stage: str) -> str:
    """The stage's part of the file name, as SGLang's profiler in use writes it: ``-EXTEND`` /
    ``-DECODE``, or ``-prefill`` / ``-decode`` with ``SGLANG_PROFILE_V2``."""
    try:
        from sglang.srt.environ import envs

        if envs.SGLANG_PROFILE_V2.get():
            return f"-{stage}"
    except Exception:  # noqa: BLE001 - an SGLang without the switch: the default names
        pass
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
    request: _Request, profilers: list[Any], expected: int, *, poll: float = 0.2
) -> Path | None:
    """Waits (off the scheduler thread) for this rank's traces, then for ``expected`` complete
    manifests of the profile in the output directory (every rank's; up to the flush timeout),
    then runs ``stepscope merge`` on their traces into ``merged-{profile_id}.trace.json.gz``, in a
    child process. Returns the merged file, or None (logged) when it could not be made."""
    timeout = 600.0
    for p in profilers:
        timeout = float(p.config.get("stepscope", {}).get("flush_timeout_s", timeout))
        p.flush(timeout)
    pattern = str(request.output_dir / glob.escape(request.profile + "-")) + "*.stepscope.json"
    deadline = time.monotonic() + timeout
    while True:
        manifests = [_read_json(m) for m in sorted(glob.glob(pattern))]
        done = [m for m in manifests if m is not None and m.get("status") != "writing"]
        if len(done) >= expected and len(done) == len(manifests):
            break
        if time.monotonic() > deadline:
            logger.warning(
                "stepscope: merge_profiles: %d of %d traces of %s complete after %.0f s; "
                "merging those",
                len(done),
                expected,
                request.profile_id,
                timeout,
            )
            break
        time.sleep(poll)
    traces = [
        str(request.output_dir / m["trace_file"])
        for m in done
        if m.get("status") == "complete" and m.get("trace_file")
    ]
    cli = os.environ.get(CLI_ENV) or shutil.which("stepscope")
    if not traces:
        logger.error(
            "stepscope: merge_profiles: no complete trace of %s to merge", request.profile_id
        )
        return None
    if cli is None:
        logger.error(
            "stepscope: merge_profiles needs the stepscope command (cargo install stepscope-cli, "
            "or %s=/path/to/stepscope); the %d traces are in %s, unmerged",
            CLI_ENV,
            len(traces),
            request.output_dir,
        )
        return None
    out = request.output_dir / f"merged-{request.profile_id}.trace.json.gz"
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
    logger.info("stepscope: merged %d traces of %s into %s", len(traces), request.profile_id, out)
    return out


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None  # being replaced right now: read again at the next poll
