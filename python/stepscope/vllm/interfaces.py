"""What the vLLM plugin expects of vLLM: the modules it patches, the signatures of the callables
it replaces or drives (as vLLM 0.32 and 0.33 declare them), and the warning when vLLM differs."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from stepscope._plugin import KW, POS, signature_of
from stepscope.vllm.environment import logger, warn_once

WRAPPER = "vllm.profiler.wrapper"
GPU_WORKER = "vllm.v1.worker.gpu_worker"
ASYNC_LLM = "vllm.v1.engine.async_llm"
LLM_ENGINE = "vllm.v1.engine.llm_engine"
PROFILE_ROUTER = "vllm.entrypoints.serve.profile.api_router"
ENGINE_UTILS = "vllm.v1.engine.utils"
V1_UTILS = "vllm.v1.utils"
MULTIPROC_EXECUTOR = "vllm.v1.executor.multiproc_executor"
SCHEDULER = "vllm.v1.core.sched.scheduler"
ENGINE_CORE = "vllm.v1.engine.core"
OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"
#: The attribute a replacement carries: the callable it replaced.
PATCHED_MARK = "__stepscope_original__"


#: Parameter (name, kind) lists the plugin knows, per patched callable. Another vLLM with
#: other signatures: one warning, and vLLM's own profiler.
KNOWN_SIGNATURES: dict[str, list[tuple[tuple[str, Any], ...]]] = {
    "create_worker_profiler": [
        (("profiler_config", POS), ("worker_name", KW), ("local_rank", KW)),  # 0.32
        (("profiler_config", POS), ("worker_name", KW), ("local_rank", KW),
         ("profiler_kwargs", KW)),  # 0.33
    ],
    "create_frontend_profiler": [(("profiler_config", POS), ("worker_name", KW))],
    "Worker.annotate_profile": [(("self", POS), ("scheduler_output", POS))],
    "Worker.profile": [
        (("self", POS), ("is_start", POS), ("profile_prefix", POS),
         ("delay_iterations", KW), ("max_iterations", KW)),  # 0.32
        (("self", POS), ("is_start", POS), ("profile_prefix", POS),
         ("delay_iterations", KW), ("max_iterations", KW), ("profiler_kwargs", KW)),  # 0.33
    ],
    "shutdown": [(("procs", POS), ("timeout", POS))],
    "AsyncLLM.stop_profile": [(("self", POS),)],
    "LLMEngine.stop_profile": [(("self", POS),)],
    "MultiprocExecutor._ensure_worker_termination": [(("worker_procs", POS),)],
    "OutputProcessor.do_tracing": [
        (("self", POS), ("engine_core_output", POS), ("req_state", POS),
         ("iteration_stats", POS)),
    ],
    "OutputProcessor._update_stats_from_finished": [
        (("self", POS), ("req_state", POS), ("finish_reason", POS), ("iteration_stats", POS)),
    ],
}  # fmt: skip


def signature_known(name: str, fn: Any, module: ModuleType) -> bool:
    """Whether ``fn`` (``name`` in KNOWN_SIGNATURES) has a signature the plugin knows; else
    one warning naming it, and False (the caller leaves vLLM's code in place)."""
    sig = signature_of(fn)
    if sig in KNOWN_SIGNATURES[name]:
        return True
    shown = "(" + ", ".join(n for n, _ in sig) + ")" if sig is not None else "(unreadable)"
    warn_once(
        f"signature:{name}",
        "stepscope: %s.%s%s is not a signature this stepscope knows (vLLM %s); vLLM's own "
        "profiler stays in place",
        module.__name__,
        name,
        shown,
        vllm_version(),
    )
    return False


def vllm_version() -> str:
    try:
        import vllm.version

        return str(vllm.version.__version__)
    except Exception:  # noqa: BLE001 - only for a message
        return "unknown"


def warn_unpatched(module: ModuleType, names: str) -> None:
    logger.warning(
        "stepscope: %s has no %s (a vLLM version this stepscope does not know); "
        "vLLM's own profiler stays in place",
        module.__name__,
        names,
    )
