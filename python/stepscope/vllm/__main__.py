"""``python -m stepscope.vllm --check``: the versions found, whether the plugin is installed and
its patches apply to this vLLM, and which backends can run."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from stepscope.vllm import register
from stepscope.vllm.environment import CONFIG_ENV, SWITCH_ENV, enabled, stepscope_keys_from_env
from stepscope.vllm.interfaces import GPU_WORKER, MULTIPROC_EXECUTOR, PATCHED_MARK, V1_UTILS, WRAPPER

def check() -> int:
    """What ``python -m stepscope.vllm --check`` prints: the versions found, whether the plugin
    is installed and its patches apply to this vLLM, and which backends can run. Returns the
    exit status: 0 when the plugin takes over vLLM's profiler here."""
    import importlib.metadata as md
    import platform

    import stepscope

    ok = True

    def line(label: str, value: str) -> None:
        print(f"{label:<28} {value}")

    line("stepscope", f"{stepscope.__version__} ({os.path.dirname(stepscope.__file__)})")
    line("python", f"{platform.python_version()} ({sys.executable})")
    try:
        import torch

        line("torch", f"{torch.__version__} ({os.path.dirname(torch.__file__)})")
    except ImportError as e:
        line("torch", f"not importable ({e})")
    try:
        vllm_version = md.version("vllm")
    except md.PackageNotFoundError:
        line("vllm", "not installed: nothing to patch")
        return 1
    line("vllm", vllm_version)
    points = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "stepscope"]
    line("plugin entry point", points[0].value if points else "MISSING (reinstall stepscope)")
    ok &= bool(points)
    if not enabled():
        line("plugin", f"switched off ({SWITCH_ENV}={os.environ[SWITCH_ENV]})")
        ok = False
    try:
        keys = stepscope_keys_from_env()
        line(CONFIG_ENV, json_text(keys) if keys else "(unset)")
    except ValueError as e:
        line(CONFIG_ENV, f"ERROR: {e}")
        ok = False

    # The patches, applied as a vLLM process applies them, then read back.
    register()
    import importlib

    patched: dict[str, bool] = {}
    for label, module_name, attr in (
        ("create_worker_profiler", WRAPPER, "create_worker_profiler"),
        ("create_frontend_profiler", WRAPPER, "create_frontend_profiler"),
        ("Worker.annotate_profile", GPU_WORKER, "Worker.annotate_profile"),
        ("shutdown wait", V1_UTILS, "shutdown"),
        ("worker termination wait", MULTIPROC_EXECUTOR, "MultiprocExecutor._ensure_worker_termination"),
    ):
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
            patched[label] = hasattr(obj, PATCHED_MARK)
            state = "patched" if patched[label] else "NOT patched (see the warning above)"
        except Exception as e:  # noqa: BLE001 - reported, the check goes on
            patched[label] = False
            state = f"NOT patched: {module_name} does not import here ({type(e).__name__}: {e})"
        line(label, state)
    ok &= patched["create_worker_profiler"] and patched["Worker.annotate_profile"]

    why = stepscope.torch_backend_error()
    if why is None:
        glue = stepscope.kineto_glue()
        line('"profiler": "torch"', f"stepscope's (Kineto glue {glue['path']}, built for torch {glue['built_for']})")
    else:
        line('"profiler": "torch"', f"vLLM's own: {why}")
    line('"profiler": "cuda"', "stepscope's (" + _cuda_driver() + ")")
    line("verdict", "the plugin takes over vLLM's profiler here" if ok else "the plugin does NOT take over here")
    return 0 if ok else 1


def json_text(value: Any) -> str:
    import json

    return json.dumps(value)


def _cuda_driver() -> str:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return "CUDA driver libcuda.so.1 found"
    except OSError:
        return "no CUDA driver here: start would fail with a message"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stepscope.vllm",
        description="stepscope's vLLM plugin. --check: the vLLM and torch versions found, "
        "whether the plugin's patches apply to this vLLM, and which backends can run.",
    )
    parser.add_argument("--check", action="store_true", help="check this environment (exit 0: the plugin takes over)")
    args = parser.parse_args(argv)
    if not args.check:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return check()


if __name__ == "__main__":
    sys.exit(main())
