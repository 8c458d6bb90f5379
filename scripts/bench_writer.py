"""The torch backend's writer on a capture with Python stacks (vLLM's default config records
them): a Python loop of small torch ops called through nested functions, captured with the
Python API, then stopped and waited for. The same workload is captured once per gzip level
asked (`stepscope.gzip_level`), the levels alternating capture by capture in one process, so
that each sees the same stretch of the machine; the medians are printed per level. With
`--serializers stepscope,kineto`, each level's capture is also written by each serializer
(`stepscope.serializer`): stepscope's, and Kineto's own alone, alternating in the same way.

For each capture: its JSON, Kineto's finalize (torch's post-processing, on stepscope's finalize
thread: wall and CPU seconds), the write (Kineto's serializer into the pipe, the gzip pump, the
summary, and the op table on a thread of its own beside them, which then frees torch's event
list and tree, then the free of what is left: wall to the rename, and CPU seconds of every thread
but the finalizer's to the end), JSON MB per second of the write's CPU time (per core), the free
of what was left of the capture after the rename (Kineto's buffers: the writer thread's CPU, the
manifest's `free_seconds`) and the MB per second of the write's CPU less it, the stop to
the trace on disk, the gzip'd size, what followed the rename (the wait for the op table, the
free, the manifest), the op table (the manifest's `op_table_seconds`, made beside the write) and
what the writer waited for it after the rename (`op_table_wait_seconds`).
`--one-core` pins the process to one CPU first, as vLLM's CPU workers are pinned (the writer's
threads then share the core left to them).
`--no-stack` captures without Python stacks (shapes recorded, CUDA listed beside CPU as a GPU
capture lists it), alternating the op table on and off (`torch_profiler_dump_cuda_time_total`):
with it off nothing reads torch's event list, and Kineto's finalize runs with torch's
`trace_only` (the trace header says `"trace_only": 1`). `--tables` does the same with Python
stacks: with the table off, the finalize is `trace_only` too and stepscope's serializer writes
each frame's `"Python parent id"` that torch's event tree would have given.

    .venv/bin/python scripts/bench_writer.py [--levels 6,1] [--serializers stepscope,kineto]
        [--rounds 5] [--ops 20000] [--one-core] [--no-stack | --tables]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import resource
import statistics
import sys
import tempfile
import time


#: The aten ops one `layer()` below records: mm, softmax (and the _softmax it dispatches to), mm,
#: relu, add.
ATEN_OPS_PER_LAYER = 6


def cpu_of_thread(name: str) -> float:
    """CPU seconds of this process's thread named `name` (0 if it does not exist yet), read from
    the thread's own CPU clock (nanoseconds; `/proc`'s stat counts 10 ms ticks, a tenth of a
    write's CPU here)."""
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(f"{task}/comm") as f:
                if f.read().strip() != name:
                    continue
            return time.clock_gettime(thread_cpu_clock(int(os.path.basename(task))))
        except OSError:
            continue
    return 0.0


def thread_cpu_clock(tid: int) -> int:
    """The clock id of thread `tid`'s CPU time (Linux's MAKE_THREAD_CPUCLOCK: the complement of
    the tid shifted by three, CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED)."""
    return (~tid << 3) | 4 | 2


def trace_header_says_trace_only(path: str) -> bool:
    """Whether the trace's metadata says the finalize ran with torch's trace_only."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return json.load(f).get("trace_only") == 1


def cpu_of_process() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def capture(level: int, serializer: str, table: str, ops: int, stack: bool = True) -> dict:
    import torch

    import stepscope

    a = torch.ones(8, 8)

    # Nested Python calls, as a model's forward makes them: each op carries a stack.
    def mlp(x):
        return torch.relu(torch.mm(x, a))

    def attention(x):
        return torch.softmax(torch.mm(x, a), dim=-1)

    def layer(x):
        return mlp(attention(x)) + x

    def forward(x, n):
        for _ in range(n):
            x = layer(x)
        return x

    with tempfile.TemporaryDirectory() as out:
        cfg = {
            "profiler": "torch",
            "torch_profiler_dir": out,
            "torch_profiler_with_stack": True,
            "stepscope": {"gzip_level": level, "serializer": serializer},
        }
        if table != "default":
            cfg |= {
                "torch_profiler_with_stack": stack,
                "torch_profiler_record_shapes": not stack,
                "torch_profiler_activities": ["CPU", "CUDA"],
                "torch_profiler_dump_cuda_time_total": table == "on",
            }
        p = stepscope.WorkerProfiler(cfg, "bench")
        p.start()
        per_step = 200
        for _ in range(max(1, ops // (per_step * ATEN_OPS_PER_LAYER))):
            p.step()
            forward(a, per_step)
            p.step_end()
        finalize_cpu = cpu_of_thread("stepscope-final")
        process_cpu = cpu_of_process()
        main_cpu = time.thread_time()
        began = time.perf_counter()
        p.stop()
        if not p.flush(600):
            raise RuntimeError("the trace was not written within 600 s")
        on_disk = time.perf_counter() - began
        main_cpu = time.thread_time() - main_cpu
        finalize_cpu = cpu_of_thread("stepscope-final") - finalize_cpu
        process_cpu = cpu_of_process() - process_cpu
        (manifest,) = [json.load(open(m)) for m in glob.glob(out + "/*.stepscope.json")]
        trace_only = trace_header_says_trace_only(os.path.join(out, manifest["trace_file"]))
        p.shutdown()
    if manifest["status"] != "complete":
        raise RuntimeError(f"the trace was not written: {manifest.get('error')}")
    json_mb = manifest["json_bytes"] / 1e6
    # Every thread's CPU over the stop and the write, but the finalizer's and this one's (which
    # only waits): the saver (Kineto's serializer, the free of Kineto's buffers), the op table's
    # thread, the gzip pump, the summary.
    write_cpu = process_cpu - finalize_cpu - main_cpu
    # Of which the free of Kineto's buffers after the rename (the writer thread's CPU, as the manifest
    # records it): torch's cost, which any use of its profiler pays, apart as the finalize is.
    free_cpu = manifest.get("free_seconds") or 0.0
    ours_cpu = write_cpu - free_cpu
    return {
        "level": level,
        "serializer": serializer,
        "table": table,
        "trace_only": trace_only,
        "json_mb": json_mb,
        "gz_mb": manifest["trace_bytes"] / 1e6,
        "finalize_s": manifest["finalize_seconds"],
        "finalize_cpu_s": finalize_cpu,
        "write_s": manifest["write_seconds"],
        "write_cpu_s": write_cpu,
        "mb_s_per_core": json_mb / write_cpu if write_cpu > 0 else float("nan"),
        "free_cpu_s": free_cpu,
        "ours_mb_s_per_core": json_mb / ours_cpu if ours_cpu > 0 else float("nan"),
        "on_disk_s": on_disk,
        # The wait for the op table, the free of Kineto's buffers and the final manifest, after
        # the rename.
        "after_rename_s": on_disk - manifest["writer_seconds"],
        # The op table (wall, on its own thread beside the write), and what of it the writer
        # waited for after the rename.
        "op_table_s": manifest.get("op_table_seconds") or 0.0,
        "op_table_wait_s": manifest.get("op_table_wait_seconds") or 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="6,1", help="gzip levels to compare (default 6,1)")
    ap.add_argument("--serializers", default="stepscope", help="serializers to compare (default stepscope)")
    ap.add_argument("--rounds", type=int, default=5, help="captures per level (default 5)")
    ap.add_argument("--ops", type=int, default=20000, help="torch ops per capture")
    ap.add_argument("--one-core", action="store_true", help="pin the process to one CPU first")
    ap.add_argument("--no-stack", action="store_true",
                    help="no Python stacks; the op table on and off (off: torch's trace_only)")  # fmt: skip
    ap.add_argument("--tables", action="store_true",
                    help="with Python stacks, the op table on and off (off: torch's trace_only)")  # fmt: skip
    args = ap.parse_args()
    tables = ("on", "off") if args.no_stack or args.tables else ("default",)
    variants = [(int(lvl), ser, t) for lvl in args.levels.split(",")
                for ser in args.serializers.split(",") for t in tables]  # fmt: skip
    if args.one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    runs: dict[tuple[int, str, str], list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else reversed(variants):
            row = capture(*v, args.ops, stack=not args.no_stack)
            runs[v].append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                  file=sys.stderr, flush=True)  # fmt: skip
    cores = "one core" if args.one_core else f"{len(os.sched_getaffinity(0))} cores"
    stacks = "no Python stacks" if args.no_stack else "Python stacks"
    print(f"medians of {args.rounds} captures per variant, {args.ops} ops each, {stacks}, {cores}")
    head = ("level", "serializer", "op table", "trace_only", "JSON MB", "gz MB", "finalize s", "(CPU s)", "write s", "(CPU s)",
            "MB/s/core", "free CPU s", "less free", "stop→disk s", "after rename", "op table s", "(waited s)")  # fmt: skip
    print("".join(f"{h:>13}" for h in head))
    keys = ("json_mb", "gz_mb", "finalize_s", "finalize_cpu_s", "write_s", "write_cpu_s",
            "mb_s_per_core", "free_cpu_s", "ours_mb_s_per_core", "on_disk_s", "after_rename_s",
            "op_table_s", "op_table_wait_s")  # fmt: skip
    for lvl, ser, table in variants:
        cells = [statistics.median(r[k] for r in runs[(lvl, ser, table)]) for k in keys]
        only = {str(r["trace_only"]) for r in runs[(lvl, ser, table)]}
        print(f"{lvl:>13}{ser:>13}{table:>13}{'/'.join(sorted(only)):>13}" + "".join(f"{c:>13.2f}" if c < 100 else f"{c:>13.0f}" for c in cells))


if __name__ == "__main__":
    main()
