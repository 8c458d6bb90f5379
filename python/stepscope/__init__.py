"""stepscope: profile a few chosen engine iterations, from every worker, without stalling it.

A drop-in for vLLM's ``WorkerProfiler`` (same methods, same delay/max semantics), driven by one
``step()`` per engine iteration::

    import stepscope

    profiler = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": "/tmp/traces",
         "delay_iterations": 10, "max_iterations": 3},
        worker_name="rank0",
    )
    profiler.start()
    for batch in engine:
        profiler.step(stepscope.Iteration(num_ctx_reqs=1, num_ctx_tokens=512,
                                          num_gen_reqs=31, num_gen_tokens=31))
        run_model(batch)
        profiler.step_end()
    ticket = profiler.write_ticket()
    profiler.stop()          # returns at once; the trace is written in the background
    profiler.wait_written(ticket)   # optional: returns once it is on disk (or raises naming it)

Inside vLLM nothing changes: the plugin (``stepscope.vllm``) makes vLLM's own
``--profiler-config`` create stepscope's profiler. See docs/vllm.md.
"""

from __future__ import annotations

import os

# The extension links no torch: `import stepscope` works with any torch, or none. The torch
# backend loads its Kineto glue (built per torch minor version, see stepscope.glue) at the first
# torch capture, matching the torch imported in the process.
from stepscope import glue as _glue
from stepscope._native import (
    DEFAULT_FLUSH_TIMEOUT_S,
    MANIFEST_SUFFIX,
    MANIFEST_VERSION,
    TIMELINE_FIELDS,
    BackendError,
    ConfigError,
    Iteration,
    RequestLog,
    StartRefused,
    __version__,
    _add_kineto_glue_dir,
    flushing_marker,
    flushing_markers,
    kineto_glue,
    manifest_name,
    manifest_trace_path,
    read_manifest,
)
from stepscope.profiler import WorkerProfiler, torch_backend_error, traces_in_flight
from stepscope.writes import TraceNotWritten, check_written

#: Rust's name for an iteration's counts (``stepscope::IterationInfo``; C: ``stepscope_iteration``).
IterationInfo = Iteration

if not os.environ.get("STEPSCOPE_KINETO_GLUE_DIR"):  # set: it replaces these
    for _dir in _glue.default_dirs():
        _add_kineto_glue_dir(str(_dir))

__all__ = [
    "DEFAULT_FLUSH_TIMEOUT_S",
    "MANIFEST_SUFFIX",
    "MANIFEST_VERSION",
    "TIMELINE_FIELDS",
    "BackendError",
    "ConfigError",
    "Iteration",
    "IterationInfo",
    "RequestLog",
    "StartRefused",
    "WorkerProfiler",
    "__version__",
    "flushing_marker",
    "flushing_markers",
    "kineto_glue",
    "manifest_name",
    "manifest_trace_path",
    "read_manifest",
    "torch_backend_error",
    "traces_in_flight",
    "TraceNotWritten",
    "check_written",
]
