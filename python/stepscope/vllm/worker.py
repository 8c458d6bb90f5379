"""The engine worker: ``Worker.annotate_profile`` hands each iteration's counts (and request
ids) to stepscope's profiler; ``Worker.stepscope_status`` and ``Worker.stepscope_timeline``
answer ``collective_rpc``; and the API server's ``GET /stepscope/status`` and
``GET /stepscope/timeline?since=N`` routes (:class:`StatusEndpoint`) ask every worker, its
``GET /stepscope/requests?since=N`` every engine core (``stepscope.vllm.lifecycles``)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
from contextlib import nullcontext
from types import ModuleType
from typing import Any, Callable

from stepscope.vllm.environment import key_on, logger
from stepscope.vllm.factory import make_factory
from stepscope.vllm.interfaces import PATCHED_MARK, WRAPPER, signature_known, warn_unpatched
from stepscope.vllm.model import record_model
from stepscope.vllm.scheduled import iteration_of

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
        warn_unpatched(module, ", ".join(missing))
        return
    # How the worker drives its profiler (profile) and hands it iterations (annotate_profile)
    # must be as the plugin knows it; the factory it calls too.
    if not all(
        hasattr(fn, PATCHED_MARK) or signature_known(name, fn, module)
        for name, fn in (
            ("Worker.profile", getattr(worker, "profile", None)),
            ("Worker.annotate_profile", original_annotate),
            ("create_worker_profiler", factory),
        )
    ):
        return
    if not hasattr(factory, PATCHED_MARK):
        # gpu_worker imported the factory by name before the wrapper module was patched.
        wrapper = sys.modules.get(WRAPPER)
        patched = getattr(wrapper, "create_worker_profiler", None)
        module.create_worker_profiler = (
            patched if hasattr(patched, PATCHED_MARK) else make_factory(factory)
        )
    if not hasattr(original_annotate, PATCHED_MARK):
        worker.annotate_profile = _make_annotate(
            original_annotate, compute_iteration_details, module
        )
    if not hasattr(worker, "stepscope_status"):
        worker.stepscope_status = worker_status
    if not hasattr(worker, "stepscope_timeline"):
        worker.stepscope_timeline = worker_timeline
    if not hasattr(worker, "stepscope_stop_ticket"):
        worker.stepscope_stop_ticket = worker_stop_ticket
        worker.stepscope_writes = worker_writes


def _make_annotate(
    original: Callable[..., Any], compute_iteration_details: Any, module: ModuleType
) -> Callable[..., Any]:
    import stepscope

    def annotate_profile(self: Any, scheduler_output: Any) -> Any:
        profiler = getattr(self, "profiler", None)
        if profiler is None and timeline_wanted():
            profiler = _timeline_profiler(self, module)
        if not isinstance(profiler, stepscope.WorkerProfiler):
            return original(self, scheduler_output)
        if not profiler.is_armed:
            if not profiler.has_timeline:
                # Nothing will read counts: skip computing them (vLLM's idle cost).
                profiler.step()
                return _IDLE
            # The timeline keeps the counts and times the step until the scope exits.
            profiler.step(iteration_of(scheduler_output, compute_iteration_details))
            return _IterationScope(profiler)
        # Armed: each request's counts (the step's work, summed by the core), their ids only
        # when stepscope.request_ids asks for them, and the model's shape once.
        record_model(self, profiler)
        wanted = profiler.wants_request_ids
        profiler.step(
            iteration_of(scheduler_output, compute_iteration_details, shares=True, ids=wanted)
        )
        return _IterationScope(profiler)

    annotate_profile.__doc__ = original.__doc__
    annotate_profile.__name__ = "annotate_profile"
    annotate_profile.__qualname__ = getattr(original, "__qualname__", "annotate_profile")
    setattr(annotate_profile, PATCHED_MARK, original)
    return annotate_profile


def timeline_wanted() -> bool:
    """``"stepscope": {"timeline": ...}`` is set (and not false) in ``STEPSCOPE_CONFIG``."""
    return key_on("timeline")


def _timeline_profiler(worker: Any, module: ModuleType) -> Any:
    """The worker's profiler, made at its first step rather than at its first
    ``/start_profile``, so that the timeline covers every step; ``None`` when vLLM's config
    names no profiler stepscope serves, or making it failed (then not tried again). vLLM's
    ``profile()`` uses it as its own, since it makes one only when there is none."""
    if getattr(worker, "_stepscope_timeline_tried", False):
        return None
    worker._stepscope_timeline_tried = True
    config = getattr(worker, "profiler_config", None)
    if getattr(config, "profiler", None) not in ("torch", "cuda"):
        return None
    # The factory Worker.profile() calls (the plugin's, patched into gpu_worker).
    factory = getattr(module, "create_worker_profiler", None)
    if not hasattr(factory, PATCHED_MARK):
        return None
    try:
        from vllm.distributed.utils import get_worker_rank_suffix

        name = get_worker_rank_suffix(global_rank=worker.rank)
    except Exception:  # noqa: BLE001 - an older vLLM: the rank alone
        name = f"rank{getattr(worker, 'rank', 0)}"
    try:
        profiler = factory(config, worker_name=name, local_rank=getattr(worker, "local_rank", 0))
    except Exception as e:  # noqa: BLE001 - never into the engine loop
        logger.warning("stepscope: the step timeline is off on %s: %s", name, e)
        return None
    worker.profiler = profiler
    logger.info("stepscope: step timeline on for %s", name)
    return profiler


def worker_timeline(self: Any, since: int = 0) -> dict[str, Any]:
    """``Worker.stepscope_timeline``, for ``collective_rpc("stepscope_timeline")``: the
    worker's steps above ``since`` as arrays in ``fields`` order, with its name and rank;
    ``steps`` is ``None`` when its timeline is off."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if not isinstance(profiler, stepscope.WorkerProfiler):
        return {"rank": getattr(self, "rank", None), "steps": None, "fields": []}
    return json.loads(profiler.timeline_json(int(since)))


def worker_stop_ticket(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_stop_ticket``, for ``collective_rpc`` right before a stop: the
    worker keeps a mark of its trace writes (:meth:`stepscope.WorkerProfiler.write_ticket`)
    that :func:`worker_writes` reads from, and says how its stop is to be answered
    (``stepscope.stop_returns``) and for how long at most (``flush_timeout_s``)."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if not isinstance(profiler, stepscope.WorkerProfiler):
        self._stepscope_ticket = None
        return {"stepscope": False, "rank": getattr(self, "rank", None)}
    self._stepscope_ticket = profiler.write_ticket()
    keys = profiler.config.get("stepscope", {})
    return {
        "stepscope": True,
        "rank": getattr(self, "rank", None),
        "worker_name": profiler.worker_name,
        "stop_returns": keys.get("stop_returns", "written"),
        "flush_timeout_s": profiler.flush_timeout_s,
    }


def worker_writes(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_writes``, for ``collective_rpc`` while a stop's caller waits: where
    the worker's traces since its stop ticket stand (:meth:`stepscope.WorkerProfiler.
    writes_since`). Answers at once: it never waits on a write."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    ticket = getattr(self, "_stepscope_ticket", None)
    if not isinstance(profiler, stepscope.WorkerProfiler) or ticket is None:
        return {"stepscope": False, "rank": getattr(self, "rank", None)}
    return {
        "stepscope": True,
        "rank": getattr(self, "rank", None),
        "worker_name": profiler.worker_name,
        **profiler.writes_since(ticket),
    }


def worker_status(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_status``, for ``collective_rpc("stepscope_status")``: the worker's
    profiler status, or what is known before its first ``/start_profile``."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if isinstance(profiler, stepscope.WorkerProfiler):
        return {"pid": os.getpid(), **profiler.status()}
    config = getattr(self, "profiler_config", None)
    return {
        "rank": getattr(self, "rank", None),
        "backend": getattr(config, "profiler", None),
        "phase": "not_created",
        "note": "no /start_profile has reached this worker yet"
        if profiler is None
        else f"vLLM's own {type(profiler).__name__} profiles this worker",
    }


def api_tokens(args: Any) -> list[bytes]:
    """The SHA-256 digests of the API keys the server was started with, as vLLM reads them:
    ``--api-key`` (one or several), else ``VLLM_API_KEY``; empty when it has none."""
    keys = getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]
    if isinstance(keys, str):
        keys = [keys]
    return [hashlib.sha256(k.encode()).digest() for k in keys if k]


def authorized(tokens: list[bytes], authorization: str | None) -> bool:
    """Whether an ``Authorization`` header carries one of the keys (``Bearer KEY``, compared
    in constant time, as vLLM's own middleware does); always true for a server without keys."""
    if not tokens:
        return True
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = hashlib.sha256(key.encode()).digest()
    match = False
    for token in tokens:
        match |= secrets.compare_digest(digest, token)
    return match


class StatusEndpoint:
    """The ``vllm.endpoint_plugins`` entry point: ``GET /stepscope/status`` on the API server,
    answering ``{"workers": [status, ...]}`` from every engine worker (through vLLM's
    ``collective_rpc``, to the method the general plugin installs).

    The routes answer what a server's operators see (its workers' state, steps and timings),
    so on a server started with ``--api-key`` (or ``VLLM_API_KEY``) they require the key as
    vLLM's ``/v1`` routes do, and answer 401 without it. vLLM's own ``/start_profile`` and
    ``/stop_profile`` keep vLLM's rule (its middleware guards ``/v1``-style paths only): the
    plugin never changes who may call vLLM's routes (docs/vllm.md)."""

    name = "stepscope"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        from fastapi import Request
        from fastapi.responses import JSONResponse, Response

        def since_of(request: Any) -> Any:
            """The query's ``since`` step index, or a 400 answer saying what it must be."""
            try:
                since = int(request.query_params.get("since", "0"))
                if since >= 0:
                    return since
            except ValueError:
                pass
            return JSONResponse(
                {"error": "since must be a step index (an integer >= 0)"}, status_code=400
            )

        def refused(request: Any) -> Any:
            """A 401 answer unless the request carries the server's key."""
            tokens = getattr(request.app.state, "stepscope_api_tokens", [])
            if authorized(tokens, request.headers.get("Authorization")):
                return None
            return JSONResponse({"error": "Unauthorized"}, status_code=401)

        async def stepscope_status(request):  # type: ignore[no-untyped-def]
            if (denied := refused(request)) is not None:
                return denied
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

        async def stepscope_timeline(request):  # type: ignore[no-untyped-def]
            if (denied := refused(request)) is not None:
                return denied
            engine = getattr(request.app.state, "stepscope_engine_client", None)
            if engine is None:
                return JSONResponse({"error": "this server has no engine"}, status_code=503)
            since = since_of(request)
            if isinstance(since, JSONResponse):
                return since
            try:
                workers = await engine.collective_rpc("stepscope_timeline", args=(since,))
            except Exception as e:  # noqa: BLE001 - reported to the caller, not raised
                return JSONResponse(
                    {"error": f"collective_rpc('stepscope_timeline') failed: {e}"}, status_code=500
                )
            return JSONResponse({"workers": list(workers)})

        async def stepscope_requests(request):  # type: ignore[no-untyped-def]
            if (denied := refused(request)) is not None:
                return denied
            engine = getattr(request.app.state, "stepscope_engine_client", None)
            core = getattr(engine, "engine_core", None)
            if core is None:
                return JSONResponse({"error": "this server has no engine core"}, status_code=503)
            since = since_of(request)
            if isinstance(since, JSONResponse):
                return since
            try:
                every = getattr(core, "call_utility_all_async", None)
                if every is not None:
                    answers = await every("stepscope_requests", since)
                else:
                    answers = [await core.call_utility_async("stepscope_requests", since)]
            except Exception as e:  # noqa: BLE001 - reported to the caller, not raised
                return JSONResponse(
                    {"error": f"the engine core's stepscope_requests failed: {e}"},
                    status_code=500,
                )
            # Each engine core's answer is its log as JSON text (megabytes at the default
            # sizes): joined as it is, not parsed and written again on the server's event loop.
            body = '{"engines": [' + ",".join(str(a) for a in answers) + "]}"
            return Response(body, media_type="application/json")

        # Real classes, not the strings this module's annotations become: FastAPI reads them
        # to pass the request in.
        for route in (stepscope_status, stepscope_timeline, stepscope_requests):
            route.__annotations__ = {"request": Request, "return": JSONResponse}
        app.add_api_route("/stepscope/status", stepscope_status, methods=["GET"])
        app.add_api_route("/stepscope/timeline", stepscope_timeline, methods=["GET"])
        app.add_api_route("/stepscope/requests", stepscope_requests, methods=["GET"])

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        state.stepscope_engine_client = engine_client
        state.stepscope_api_tokens = api_tokens(args)


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
