"""Holistic Trace Analysis 0.5.0's own figures on real GPU traces, written as JSON for the
differential test of `stepscope analyze`'s step explanation (cli/tests/explain_hta.rs).

For each trace: HTA's idle-time breakdown (per stream: host wait, kernel wait, other),
its communication/computation overlap, and its kernel launch statistics (launch delay, the
events that ran shorter than their launch call), computed by HTA's own code
(`TraceAnalysis.get_idle_time_breakdown`, `get_comm_comp_overlap`,
`get_cuda_kernel_launch_stats`), nothing recomputed here but the quantiles and counts of the
launch table HTA returns.

HTA drops, by default, the kernels launched in and after a trace's last `ProfilerStep`
(`include_last_profiler_step=False`); stepscope's trace figures cover every event. So that
both read the same events, HTA's filter (`Trace._filter_irrelevant_gpu_kernels`) is turned off
here: the figures are HTA's definitions over the whole trace.

Run by scripts/hta_reference.sh (HTA in its own venv, .bench-venv/); not part of `make test`,
which compares against the committed output:

    scripts/hta_reference.sh [TRACE.json.gz ...]   # default: the GPU traces of cli/tests/data/hta
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import warnings

os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # stepscope reads timestamps as written
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import numpy as np  # noqa: E402
from hta.common.trace import Trace  # noqa: E402
from hta.trace_analysis import TraceAnalysis  # noqa: E402
import hta.version  # noqa: E402

# Every event, as stepscope reads them (see the module's docs).
Trace._filter_irrelevant_gpu_kernels = lambda self, *args, **kwargs: None


def reference(path: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="stepscope-hta-") as d:
        shutil.copy(path, d)
        ta = TraceAnalysis(trace_dir=d)
        (rank,) = ta.t.traces.keys()
        idle, _ = ta.get_idle_time_breakdown(ranks=[rank], visualize=False)
        streams: dict[str, dict[str, float]] = {}
        for row in idle.itertuples():
            s = streams.setdefault(str(int(row.stream)), {})
            s[str(row.idle_category)] = float(row.idle_time)
        overlap = ta.get_comm_comp_overlap(visualize=False)
        pct = overlap.loc[overlap["rank"] == rank, "comp_comm_overlap_pctg"]
        pct = None if pct.empty or np.isnan(pct.iloc[0]) else float(pct.iloc[0])
        launches = ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
        delay = launches["launch_delay"].to_numpy(dtype=float)
        return {
            "trace": os.path.basename(path),
            "hta_version": ".".join(map(str, hta.version.__version_tuple__)),
            "rank": int(rank),
            "idle_by_stream_us": streams,
            "comp_comm_overlap_pctg": pct,
            "launch": {
                "count": int(len(launches)),
                "delay_median_us": float(np.percentile(delay, 50)) if len(delay) else None,
                "delay_p90_us": float(np.percentile(delay, 90)) if len(delay) else None,
                "delay_sum_us": float(delay.sum()),
                "shorter_than_launch": int(
                    (launches["gpu_duration"] < launches["cpu_duration"]).sum()
                ),
            },
        }


def main(argv: list[str]) -> int:
    out_dir, traces = argv[0], argv[1:]
    os.makedirs(out_dir, exist_ok=True)
    for path in traces:
        name = os.path.basename(path)
        print(f"hta_reference: {name} …", file=sys.stderr, flush=True)
        doc = reference(path)
        stem = name[: -len(".json.gz")] if name.endswith(".json.gz") else name
        target = os.path.join(out_dir, stem + ".hta.json")
        with open(target + ".tmp", "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(target + ".tmp", target)
        print(f"hta_reference: wrote {target}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
