"""vLLM's profiler factories, replaced: ``create_worker_profiler`` returns stepscope's profiler
for ``"torch"`` and ``"cuda"``, ``create_frontend_profiler`` stepscope's API-server profiler;
anything else, or a config stepscope cannot serve, stays vLLM's."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable

from stepscope.vllm.config import build_profiler, torch_unavailable
from stepscope.vllm.environment import logger, warn_once
from stepscope.vllm.frontend import FrontendProfiler
from stepscope.vllm.interfaces import PATCHED_MARK, WRAPPER, signature_known, warn_unpatched

def make_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_worker_profiler(
        profiler_config: Any, *, worker_name: str, local_rank: int, **extra: Any
    ) -> Any:
        # extra: what this vLLM's factory takes beyond 0.32's (0.33: profiler_kwargs), checked
        # against its signature when patched.
        def vllms_own() -> Any:
            return original(profiler_config, worker_name=worker_name, local_rank=local_rank, **extra)

        kind = getattr(profiler_config, "profiler", None)
        if kind not in ("torch", "cuda"):
            return vllms_own()
        if kind == "torch":
            why = torch_unavailable()
            if why is not None:
                warn_once(
                    "torch-glue",
                    "stepscope: the torch backend cannot run here (%s); vLLM's own torch "
                    "profiler stays (\"cuda\" is still stepscope's)",
                    why,
                )
                return vllms_own()
        import stepscope

        try:
            profiler = build_profiler(profiler_config, worker_name=worker_name, local_rank=local_rank)
        except stepscope.ConfigError as e:
            # A vLLM field this stepscope does not accept: vLLM's own profiler honours it.
            if not getattr(e, "unknown_key", False):
                logger.warning("stepscope: %s; using vLLM's own profiler for %s", e, worker_name)
            return vllms_own()
        if extra.get("profiler_kwargs"):
            profiler.set_profiler_kwargs(extra["profiler_kwargs"])
        return profiler

    create_worker_profiler.__doc__ = "stepscope's profiler for torch and cuda (stepscope.vllm)."
    setattr(create_worker_profiler, PATCHED_MARK, original)
    return create_worker_profiler


def make_frontend_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_frontend_profiler(profiler_config: Any, *, worker_name: str) -> Any:
        if getattr(profiler_config, "profiler", None) != "torch" or torch_unavailable():
            return original(profiler_config, worker_name=worker_name)
        try:
            return FrontendProfiler(profiler_config, worker_name)
        except Exception as e:  # noqa: BLE001 - vLLM's own profiler takes over
            if not getattr(e, "unknown_key", False):  # else warned once already
                logger.warning(
                    "stepscope: %s; using vLLM's own profiler for the API server (%s)",
                    e,
                    worker_name,
                )
            return original(profiler_config, worker_name=worker_name)

    create_frontend_profiler.__doc__ = "stepscope's profiler for the API server (stepscope.vllm)."
    setattr(create_frontend_profiler, PATCHED_MARK, original)
    return create_frontend_profiler


def _patch_wrapper(module: ModuleType) -> None:
    original = getattr(module, "create_worker_profiler", None)
    if original is None:
        warn_unpatched(module, "create_worker_profiler")
    elif not hasattr(original, PATCHED_MARK) and signature_known(
        "create_worker_profiler", original, module
    ):
        module.create_worker_profiler = make_factory(original)
    frontend = getattr(module, "create_frontend_profiler", None)
    if (
        frontend is not None
        and not hasattr(frontend, PATCHED_MARK)
        and signature_known("create_frontend_profiler", frontend, module)
    ):
        module.create_frontend_profiler = make_frontend_factory(frontend)


def _patch_async_llm(module: ModuleType) -> None:
    # AsyncLLM imported create_frontend_profiler by name before the wrapper was patched.
    factory = getattr(module, "create_frontend_profiler", None)
    if factory is None or hasattr(factory, PATCHED_MARK):
        return
    if not signature_known("create_frontend_profiler", factory, module):
        return
    wrapper = sys.modules.get(WRAPPER)
    patched = getattr(wrapper, "create_frontend_profiler", None)
    module.create_frontend_profiler = (
        patched if hasattr(patched, PATCHED_MARK) else make_frontend_factory(factory)
    )
