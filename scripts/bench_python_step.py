"""Per-iteration cost of stepscope's Python surface when nothing is armed, against baselines
measured in the same run: a no-op Python method call, and vLLM's own Worker.annotate_profile
over vLLM's TorchProfilerWrapper (what the plugin replaces). Run by `make bench`; build the
extension with `maturin develop --release` first for release figures.

    .venv/bin/python scripts/bench_python_step.py
"""

from __future__ import annotations

import sys
import tempfile
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import stepscope  # noqa: E402


def best_ns(fs: dict, number: int, rounds: int = 9) -> dict:
    """Best time per call of each function, measured in alternating rounds so a noisy
    machine's drift falls on all of them alike."""
    best = {name: float("inf") for name in fs}
    for _ in range(rounds):
        for name, f in fs.items():
            best[name] = min(best[name], timeit.timeit(f, number=number) / number * 1e9)
    return best


def main() -> None:
    class Noop:
        def step(self, iteration=None):
            pass

    noop, it = Noop(), stepscope.Iteration(1, 512, 31, 31)
    p = stepscope.WorkerProfiler({}, "bench")
    p.step()  # registers the engine thread
    rows = list(
        best_ns(
            {
                "baseline: a no-op Python method": lambda: noop.step(it),
                "WorkerProfiler.step() idle": lambda: p.step(),
                "WorkerProfiler.step(Iteration) idle": lambda: p.step(it),
            },
            200_000,
        ).items()
    )

    try:
        import vllm.plugins
    except ImportError:
        vllm = None
    if vllm is not None:
        vllm.plugins.load_general_plugins()
        import vllm.v1.worker.gpu_worker as gpu_worker
        from test_vllm_plugin import bare_worker, scheduler_output
        from vllm.config import ProfilerConfig
        from vllm.profiler.wrapper import TorchProfilerWrapper

        cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=tempfile.mkdtemp())
        ours = bare_worker(gpu_worker, cfg)
        ours.profile(True)
        ours.profile(False)  # stepscope's profiler, idle
        theirs = bare_worker(gpu_worker, cfg)
        theirs.profiler = TorchProfilerWrapper(cfg, worker_name="b", local_rank=0, activities=["CPU"])
        original = gpu_worker.Worker.annotate_profile.__stepscope_original__
        so = scheduler_output()

        def vllm_idle():
            with original(theirs, so):
                pass

        def plugin_idle():
            with gpu_worker.Worker.annotate_profile(ours, so):
                pass

        rows += best_ns(
            {
                "baseline: vLLM's annotate_profile idle": vllm_idle,
                "stepscope plugin's annotate_profile idle": plugin_idle,
            },
            50_000,
        ).items()

    for label, ns in rows:
        print(f"{label:44} {ns:8.1f} ns")


if __name__ == "__main__":
    main()
