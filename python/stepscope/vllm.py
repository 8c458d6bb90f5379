"""vLLM plugin: vLLM's own ``--profiler-config`` drives stepscope in every worker.

Installed with the ``stepscope`` package as the ``vllm.general_plugins`` entry point
``stepscope = "stepscope.vllm:register"``; vLLM calls :func:`register` in each process it
starts. Then, in worker processes:

- ``create_worker_profiler`` (what ``vllm.v1.worker.gpu_worker.Worker.profile`` calls on
  ``/start_profile``) returns a :class:`stepscope.WorkerProfiler` for ``"profiler": "torch"`` and
  ``"cuda"`` (Proton stays vLLM's). Its ``stop()`` returns at once; the trace is written off the
  engine thread.
- ``Worker.annotate_profile`` hands each iteration's request and token counts to stepscope, so
  the NVTX range and the Kineto annotation carry vLLM's names (simple or detailed) and counts.

Environment:

- ``STEPSCOPE_VLLM=0`` turns the plugin off (vLLM's profilers stay).
- ``STEPSCOPE_CONFIG``: stepscope's own keys, as a config whose ``"stepscope"`` object is used
  (JSON text or a path), e.g. ``'{"stepscope": {"nvtx": "always"}}'``. vLLM's keys come from
  ``--profiler-config`` only; setting them here too is an error.

With the endpoint plugin also allowed (``VLLM_PLUGINS`` naming ``stepscope``; vLLM loads
endpoint plugins only when named), the API server answers ``GET /stepscope/status`` with every
engine worker's :meth:`stepscope.WorkerProfiler.status`, which ``stepscope ctl status`` shows.

If vLLM's names differ from what the plugin knows (another vLLM version), it logs one warning
and leaves vLLM untouched. :func:`register` is idempotent.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import logging
import os
import re
import sys
import threading
from contextlib import nullcontext
from types import ModuleType
from typing import Any, Callable

logger = logging.getLogger("stepscope.vllm")

#: Set to ``0`` (or ``false``/``no``/``off``) to turn the plugin off.
SWITCH_ENV = "STEPSCOPE_VLLM"
#: stepscope's own keys: a config whose ``"stepscope"`` object is used.
CONFIG_ENV = "STEPSCOPE_CONFIG"

_WRAPPER = "vllm.profiler.wrapper"
_GPU_WORKER = "vllm.v1.worker.gpu_worker"
_PATCHED_MARK = "__stepscope_original__"

_lock = threading.Lock()
_registered = False
_stepscope_keys: dict[str, Any] | None = None


def register() -> None:
    """vLLM's plugin entry point. Patches vLLM's profiler factory and ``annotate_profile`` as
    their modules are imported (now, if they already are)."""
    global _registered, _stepscope_keys
    with _lock:
        if _registered:
            return
        if not enabled():
            logger.info("stepscope: %s=%s, vLLM's profilers stay", SWITCH_ENV, os.environ[SWITCH_ENV])
            return
        try:
            _stepscope_keys = stepscope_keys_from_env()
        except ValueError as e:
            logger.error("stepscope: %s; vLLM's profilers stay", e)
            return
        _registered = True
    _when_imported(_WRAPPER, _patch_wrapper)
    _when_imported(_GPU_WORKER, _patch_gpu_worker)


def enabled() -> bool:
    """False when ``STEPSCOPE_VLLM`` turns the plugin off."""
    value = os.environ.get(SWITCH_ENV, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def stepscope_keys_from_env() -> dict[str, Any]:
    """The ``"stepscope"`` object of ``STEPSCOPE_CONFIG`` (empty when unset), validated.

    Raises :class:`stepscope.ConfigError` (a ``ValueError``) naming the bad field.
    """
    import json

    import stepscope

    spec = os.environ.get(CONFIG_ENV, "").strip()
    if not spec:
        return {}
    if spec.startswith("{"):
        text, origin = spec, CONFIG_ENV
    else:
        try:
            with open(spec, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise stepscope.ConfigError(f"{CONFIG_ENV}: cannot read {spec}: {e}") from e
        origin = spec
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise stepscope.ConfigError(f"{origin}: invalid JSON: {e}") from e
    if not isinstance(value, dict):
        raise stepscope.ConfigError(f"{origin}: expected a JSON object")
    others = sorted(k for k in value if k != "stepscope")
    if others:
        raise stepscope.ConfigError(
            f"{origin}: {', '.join(others)}: vLLM's keys come from --profiler-config; "
            f"{CONFIG_ENV} holds only the \"stepscope\" object"
        )
    keys = value.get("stepscope", {})
    # The library validates the keys (and names a bad one).
    stepscope.WorkerProfiler({"stepscope": keys}, "stepscope-config-check")
    return keys


def config_dict(profiler_config: Any) -> dict[str, Any]:
    """vLLM's ``ProfilerConfig`` as stepscope's config: every vLLM field, plus the
    ``"stepscope"`` keys of ``STEPSCOPE_CONFIG``."""
    fields = {f.name: getattr(profiler_config, f.name) for f in dataclasses.fields(profiler_config)}
    keys = _stepscope_keys if _stepscope_keys is not None else stepscope_keys_from_env()
    if keys:
        fields["stepscope"] = keys
    return fields


# --- vllm.profiler.wrapper.create_worker_profiler --------------------------------------------


def _make_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_worker_profiler(profiler_config: Any, *, worker_name: str, local_rank: int) -> Any:
        if getattr(profiler_config, "profiler", None) not in ("torch", "cuda"):
            return original(profiler_config, worker_name=worker_name, local_rank=local_rank)
        import stepscope

        try:
            return stepscope.WorkerProfiler(
                config_dict(profiler_config),
                worker_name=worker_name,
                local_rank=local_rank,
                rank=rank_of(worker_name),
            )
        except stepscope.ConfigError as e:
            # A vLLM field this stepscope does not know: vLLM's own profiler honours it.
            logger.warning("stepscope: %s; using vLLM's own profiler for %s", e, worker_name)
            return original(profiler_config, worker_name=worker_name, local_rank=local_rank)

    create_worker_profiler.__doc__ = "stepscope's profiler for torch and cuda (stepscope.vllm)."
    setattr(create_worker_profiler, _PATCHED_MARK, original)
    return create_worker_profiler


def rank_of(worker_name: str) -> int | None:
    """The global rank in vLLM's worker name (``…_rank{N}``, from ``get_worker_rank_suffix``);
    ``None`` when absent (then the ``RANK`` environment variable is used)."""
    match = re.search(r"rank(\d+)$", worker_name)
    return int(match.group(1)) if match else None


def _patch_wrapper(module: ModuleType) -> None:
    original = getattr(module, "create_worker_profiler", None)
    if original is None:
        _warn_unpatched(module, "create_worker_profiler")
        return
    if hasattr(original, _PATCHED_MARK):
        return
    module.create_worker_profiler = _make_factory(original)


# --- vllm.v1.worker.gpu_worker -----------------------------------------------------------------


def _patch_gpu_worker(module: ModuleType) -> None:
    worker = getattr(module, "Worker", None)
    original_annotate = getattr(worker, "annotate_profile", None)
    factory = getattr(module, "create_worker_profiler", None)
    try:
        from vllm.v1.utils import compute_iteration_details
    except ImportError:
        compute_iteration_details = None
    missing = [
        name
        for name, found in (
            ("Worker.annotate_profile", original_annotate),
            ("create_worker_profiler", factory),
            ("vllm.v1.utils.compute_iteration_details", compute_iteration_details),
        )
        if found is None
    ]
    if missing:
        _warn_unpatched(module, ", ".join(missing))
        return
    if not hasattr(factory, _PATCHED_MARK):
        # gpu_worker imported the factory by name before the wrapper module was patched.
        wrapper = sys.modules.get(_WRAPPER)
        patched = getattr(wrapper, "create_worker_profiler", None)
        module.create_worker_profiler = (
            patched if hasattr(patched, _PATCHED_MARK) else _make_factory(factory)
        )
    if not hasattr(original_annotate, _PATCHED_MARK):
        worker.annotate_profile = _make_annotate(original_annotate, compute_iteration_details)
    if not hasattr(worker, "stepscope_status"):
        worker.stepscope_status = worker_status


def _make_annotate(original: Callable[..., Any], compute_iteration_details: Any) -> Callable[..., Any]:
    import stepscope

    def annotate_profile(self: Any, scheduler_output: Any) -> Any:
        profiler = getattr(self, "profiler", None)
        if not isinstance(profiler, stepscope.WorkerProfiler):
            return original(self, scheduler_output)
        if not profiler.is_armed:
            # Nothing will read counts: skip computing them (vLLM's idle cost).
            profiler.step()
            return _IDLE
        detailed = bool(getattr(self.vllm_config.profiler_config, "detailed_trace_annotation", False))
        profiler.step(iteration_of(scheduler_output, compute_iteration_details, detailed))
        return _IterationScope(profiler)

    annotate_profile.__doc__ = original.__doc__
    annotate_profile.__name__ = "annotate_profile"
    annotate_profile.__qualname__ = getattr(original, "__qualname__", "annotate_profile")
    setattr(annotate_profile, _PATCHED_MARK, original)
    return annotate_profile


def worker_status(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_status``, for ``collective_rpc("stepscope_status")``: the worker's
    profiler status, or what is known before its first ``/start_profile``."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if isinstance(profiler, stepscope.WorkerProfiler):
        return profiler.status()
    config = getattr(self, "profiler_config", None)
    return {
        "rank": getattr(self, "rank", None),
        "backend": getattr(config, "profiler", None),
        "phase": "not_created",
        "note": "no /start_profile has reached this worker yet"
        if profiler is None
        else f"vLLM's own {type(profiler).__name__} profiles this worker",
    }


class StatusEndpoint:
    """The ``vllm.endpoint_plugins`` entry point: ``GET /stepscope/status`` on the API server,
    answering ``{"workers": [status, ...]}`` from every engine worker (through vLLM's
    ``collective_rpc``, to the method the general plugin installs)."""

    name = "stepscope"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        from fastapi import Request
        from fastapi.responses import JSONResponse

        async def stepscope_status(request):  # type: ignore[no-untyped-def]
            engine = getattr(request.app.state, "stepscope_engine_client", None)
            if engine is None:
                return JSONResponse({"error": "this server has no engine"}, status_code=503)
            try:
                workers = await engine.collective_rpc("stepscope_status")
            except Exception as e:  # noqa: BLE001 - reported to the caller, not raised
                return JSONResponse(
                    {"error": f"collective_rpc('stepscope_status') failed: {e}"}, status_code=500
                )
            return JSONResponse({"workers": list(workers)})

        # Real classes, not the strings this module's annotations become: FastAPI reads them
        # to pass the request in.
        stepscope_status.__annotations__ = {"request": Request, "return": JSONResponse}
        app.add_api_route("/stepscope/status", stepscope_status, methods=["GET"])

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        state.stepscope_engine_client = engine_client


# nullcontext keeps no state, so one serves every idle iteration.
_IDLE = nullcontext()


class _IterationScope:
    """Closes the iteration's NVTX range and Kineto annotation when the model step ends."""

    __slots__ = ("_profiler",)

    def __init__(self, profiler: Any) -> None:
        self._profiler = profiler

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._profiler.step_end()


def iteration_of(scheduler_output: Any, compute_iteration_details: Any, detailed: bool) -> Any:
    """The :class:`stepscope.Iteration` of one ``SchedulerOutput``: vLLM's own
    ``compute_iteration_details`` counts (context = a new request or one still in its context
    phase), and with ``detailed`` vLLM's per-phase roofline sums."""
    import stepscope

    d = compute_iteration_details(scheduler_output)
    counts = (
        d.num_ctx_requests,
        d.num_ctx_tokens,
        d.num_generation_requests,
        d.num_generation_tokens,
    )
    if not detailed:
        return stepscope.Iteration(*counts)
    new_ids = {r.req_id for r in scheduler_output.scheduled_new_reqs}
    computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
    ctx = [0, 0, 0]
    gen = [0, 0, 0]
    for req_id, q in scheduler_output.num_scheduled_tokens.items():
        seq = computed.get(req_id, 0) + q
        sums = ctx if (req_id in new_ids or cached.is_context_phase(req_id)) else gen
        sums[0] += seq
        sums[1] += q * q
        sums[2] += q * seq
    return stepscope.Iteration(
        *counts,
        ctx_seq_len_sum=ctx[0],
        ctx_qq_compute=ctx[1],
        ctx_qk_compute=ctx[2],
        gen_seq_len_sum=gen[0],
        gen_qq_compute=gen[1],
        gen_qk_compute=gen[2],
    )


def _warn_unpatched(module: ModuleType, names: str) -> None:
    logger.warning(
        "stepscope: %s has no %s (a vLLM version this stepscope does not know); "
        "vLLM's own profiler stays in place",
        module.__name__,
        names,
    )


# --- patch a module when it is imported --------------------------------------------------------

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}


def _when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Runs ``patch(module)`` now if ``name`` is imported, else right after its import, so
    processes that never import it (vLLM's API server) pay nothing."""
    module = sys.modules.get(name)
    if module is not None:
        _run(patch, module)
        return
    _hooks.setdefault(name, []).append(patch)
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def _run(patch: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        patch(module)
    except Exception:  # noqa: BLE001 - a failed patch must not break vLLM's import
        logger.warning(
            "stepscope: patching %s failed; vLLM's own profiler stays in place",
            module.__name__,
            exc_info=True,
        )


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it asks the other finders, then wraps the
    loader so the patches run once the module has executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            for patch in _hooks.pop(fullname, []):
                _run(patch, module)

        loader.exec_module = exec_then_patch  # type: ignore[union-attr]
        return spec
