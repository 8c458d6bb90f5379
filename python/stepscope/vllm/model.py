"""The served model's shape, recorded once in each worker's profiler from vLLM's own model
config (its Hugging Face config, read by stepscope's core: ``WorkerProfiler.set_model``) and
what only the worker knows: the tensor-parallel size, the weights' and the KV cache's dtypes,
the parameters this rank loaded. ``stepscope analyze`` computes each step's floor from it."""

from __future__ import annotations

from typing import Any

from stepscope.vllm.environment import logger

#: The attribute that marks a profiler whose model was recorded (or could not be).
_DONE = "_stepscope_model_recorded"


def shape_inputs(worker: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's Hugging Face config (as a dict) and the keywords of
    ``WorkerProfiler.set_model`` from a vLLM worker's config and loaded model."""
    vllm_config = worker.vllm_config
    model_config = vllm_config.model_config
    hf = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    config = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    architectures = getattr(model_config, "architectures", None) or config.get("architectures")
    if architectures:
        config["architectures"] = list(architectures)
    extra: dict[str, Any] = {
        "tensor_parallel": int(vllm_config.parallel_config.tensor_parallel_size),
        "weight_dtype": str(model_config.dtype).removeprefix("torch."),
    }
    cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    extra["kv_cache_dtype"] = extra["weight_dtype"] if cache_dtype == "auto" else cache_dtype
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    if model is not None and hasattr(model, "parameters"):
        extra["params"] = int(sum(p.numel() for p in model.parameters()))
    return config, extra


def record_model(worker: Any, profiler: Any) -> None:
    """Records the worker's model shape in ``profiler`` the first time it is armed; a worker
    whose config cannot be read is logged once and left without (never raises)."""
    if getattr(profiler, _DONE, False):
        return
    try:
        setattr(profiler, _DONE, True)
    except AttributeError:
        return
    try:
        config, extra = shape_inputs(worker)
        shape = profiler.set_model(config, **extra)
        if shape.get("unknown"):
            logger.info("stepscope: the model's %s are unknown", ", ".join(shape["unknown"]))
    except Exception as e:  # noqa: BLE001 - a profiler never fails its engine
        logger.warning("stepscope: the model's shape is not recorded: %s", e)
