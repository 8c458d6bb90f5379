"""This machine's peaks as `stepscope analyze` takes them (`--peak-tflops X --peak-gbs Y`), for
the CPU captures of `make demo`: a CPU is not in stepscope's device table. Measured here, not
looked up: the best of a few bfloat16 matrix products (the demo model's dtype) through torch,
and the best of a few copies of a buffer far larger than the caches. Prints the flags."""

from __future__ import annotations

import sys
import time

import torch


def best(f, runs: int = 5) -> float:
    f()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    n = 1024
    a = torch.randn(n, n, dtype=torch.bfloat16)
    b = torch.randn(n, n, dtype=torch.bfloat16)
    tflops = 2 * n**3 / best(lambda: a @ b) / 1e12
    src = torch.empty(256 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    # A copy reads and writes each byte.
    gbs = 2 * src.numel() / best(lambda: dst.copy_(src)) / 1e9
    print(f"--peak-tflops {tflops:.3f} --peak-gbs {gbs:.1f}")
    print(
        f"cpu_peaks: bf16 matmul {tflops:.3f} TFLOP/s, copy {gbs:.1f} GB/s (measured now)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
