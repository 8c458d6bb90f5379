"""vLLM plugin: vLLM's own ``--profiler-config`` drives stepscope in every worker.

Installed with the ``stepscope`` package as the ``vllm.general_plugins`` entry point
``stepscope = "stepscope.vllm:register"``; vLLM calls :func:`register` in each process it
starts. Then, in worker processes:

- ``create_worker_profiler`` (what ``vllm.v1.worker.gpu_worker.Worker.profile`` calls on
  ``/start_profile``) returns a :class:`stepscope.WorkerProfiler` for ``"profiler": "torch"`` and
  ``"cuda"`` (Proton stays vLLM's). Its ``stop()`` returns at once; the trace is written off the
  engine thread, and ``AsyncLLM.stop_profile()`` / ``LLM.stop_profile()`` (``/stop_profile``)
  return once it is on disk, the engine serving on meanwhile (``stop``).
- ``Worker.annotate_profile`` hands each iteration's request and token counts to stepscope, so
  the NVTX range and the Kineto annotation carry vLLM's names (simple or detailed) and counts.

Environment:

- ``STEPSCOPE_VLLM=0`` turns the plugin off (vLLM's profilers stay).
- ``STEPSCOPE_CONFIG``: stepscope's own keys, as a config whose ``"stepscope"`` object is used
  (JSON text or a path), e.g. ``'{"stepscope": {"nvtx": "always"}}'``. vLLM's keys come from
  ``--profiler-config`` only; setting them here too is an error.

With the endpoint plugin also allowed (``VLLM_PLUGINS`` naming ``stepscope``; vLLM loads
endpoint plugins only when named), the API server answers ``GET /stepscope/status`` with every
engine worker's :meth:`stepscope.WorkerProfiler.status`, which ``stepscope ctl status`` shows,
and ``GET /stepscope/timeline?since=N`` with every worker's step timeline (``"stepscope":
{"timeline": true}`` in ``STEPSCOPE_CONFIG``; the worker's profiler is then made at its first
step so that every step is timed), which ``stepscope ctl top`` and ``stepscope ctl timeline``
read. With ``"stepscope": {"requests": true}`` too, each engine core's scheduler records every
request's lifecycle (``lifecycles``), which ``GET /stepscope/requests?since=N`` serves and
``stepscope ctl requests`` reads; with ``"otel"`` too, each finished request's engine steps
go to an OpenTelemetry collector as spans under vLLM's own span of it (``otel``).

If vLLM's names differ from what the plugin knows (another vLLM version), it logs one warning
and leaves vLLM untouched. :func:`register` is idempotent.

Modules, one job each: ``environment`` (the switch, ``STEPSCOPE_CONFIG``, the one-time log
lines), ``interfaces`` (vLLM's modules and signatures the plugin knows), ``config`` (vLLM's
config as stepscope's, and the profiler made from it), ``factory`` (vLLM's profiler factories,
replaced), ``frontend`` (the API server's profiler), ``stop`` (a stop returns with its traces
on disk; a refused start is an error), ``worker`` (``annotate_profile`` patched), ``rpc`` (the
worker's ``collective_rpc`` answers), ``endpoints`` (the API server's ``/stepscope/*`` routes,
made by one function), ``scheduled`` (a ``SchedulerOutput`` as an iteration: counts, each
request's tokens, phase and computed tokens), ``model`` (the served model's shape, recorded
once for each step's floor), ``lifecycles`` (the request log in the engine core), ``otel``
(its requests as OpenTelemetry spans), ``shutdown`` (process managers wait for traces being
written), ``__main__`` (``python -m stepscope.vllm --check``). What the SGLang plugin shares
with this one is in ``stepscope._plugin``; the import hook in ``stepscope._imports``.
"""

from __future__ import annotations

import os
import threading

from stepscope._imports import when_imported
from stepscope.vllm import (
    config,
    environment,
    factory,
    frontend,
    interfaces,
    lifecycles,
    otel,
    endpoints,
    model,
    rpc,
    scheduled,
    shutdown,
    stop,
    worker,
)
from stepscope.vllm.config import build_profiler, config_dict, make_with_known_fields, rank_of
from stepscope.vllm.environment import (
    CONFIG_ENV,
    SWITCH_ENV,
    enabled,
    logger,
    stepscope_keys_from_env,
)
from stepscope.vllm.frontend import FrontendProfiler
from stepscope.vllm.shutdown import wait_for_flushes
from stepscope.vllm.scheduled import Requests, iteration_of, request_ids_of, requests_of
from stepscope.vllm.endpoints import StatusEndpoint
from stepscope.vllm.rpc import worker_status, worker_timeline

__all__ = [
    "CONFIG_ENV",
    "SWITCH_ENV",
    "FrontendProfiler",
    "Requests",
    "StatusEndpoint",
    "build_profiler",
    "config",
    "config_dict",
    "enabled",
    "environment",
    "factory",
    "frontend",
    "interfaces",
    "iteration_of",
    "lifecycles",
    "make_with_known_fields",
    "model",
    "otel",
    "endpoints",
    "rpc",
    "rank_of",
    "register",
    "request_ids_of",
    "requests_of",
    "scheduled",
    "shutdown",
    "stepscope_keys_from_env",
    "stop",
    "wait_for_flushes",
    "worker",
    "worker_status",
    "worker_timeline",
]

#: What stays in place when a patch fails.
_FALLBACK = "vLLM's own profiler stays in place"

#: What a failed request-log patch leaves.
_NO_LOG = "the request log is off"

#: What a failed OpenTelemetry patch leaves.
_NO_OTEL = "no request spans are exported"

_lock = threading.Lock()
_registered = False


def register() -> None:
    """vLLM's plugin entry point. Patches vLLM's profiler factory and ``annotate_profile`` as
    their modules are imported (now, if they already are)."""
    global _registered
    with _lock:
        if _registered:
            return
        if not enabled():
            logger.info("stepscope: %s=%s, vLLM's profilers stay", SWITCH_ENV, os.environ[SWITCH_ENV])
            return
        try:
            environment.load_keys()
        except ValueError as e:
            logger.error("stepscope: %s; vLLM's profilers stay", e)
            return
        _registered = True
    when_imported(interfaces.WRAPPER, factory._patch_wrapper, logger, _FALLBACK)
    when_imported(interfaces.GPU_WORKER, worker._patch_gpu_worker, logger, _FALLBACK)
    when_imported(interfaces.ASYNC_LLM, factory._patch_async_llm, logger, _FALLBACK)
    when_imported(interfaces.ASYNC_LLM, stop._patch_async_llm, logger, _FALLBACK)
    when_imported(interfaces.LLM_ENGINE, stop._patch_llm_engine, logger, _FALLBACK)
    when_imported(interfaces.PROFILE_ROUTER, stop._patch_profile_router, logger, _FALLBACK)
    when_imported(interfaces.V1_UTILS, shutdown._patch_process_shutdown, logger, _FALLBACK)
    when_imported(interfaces.ENGINE_UTILS, shutdown._patch_process_shutdown, logger, _FALLBACK)
    when_imported(
        interfaces.MULTIPROC_EXECUTOR, shutdown._patch_multiproc_executor, logger, _FALLBACK
    )
    when_imported(interfaces.ENGINE_CORE, lifecycles._patch_engine_core, logger, _NO_LOG)
    if lifecycles.requests_wanted():
        when_imported(interfaces.SCHEDULER, lifecycles._patch_scheduler, logger, _NO_LOG)
    if otel.wanted():
        when_imported(interfaces.OUTPUT_PROCESSOR, otel._patch_output_processor, logger, _NO_OTEL)
