"""stepscope's op table (`{worker}.profiler_out.txt`, the table vLLM writes from torch's
`key_averages()`) held against torch's own table on the same events: the `KinetoEvent`s of one
`torch.profiler` capture go to stepscope's rule (`_op_table`, what the writer runs on a
capture's events) and to torch's `key_averages().table()`, and the two tables must agree row
by row: the same names in the same order, the same calls, the same times to the last digit
torch prints (a value at a rounding tie may round the other way: torch sums floats of
microseconds where stepscope sums integer nanoseconds).

CPU captures only here: the device columns (kernels counted for the ops that launched them)
need a GPU and are compared where torch sees one."""

from __future__ import annotations

import collections
import decimal
import glob
import gzip
import json
import re
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import stepscope
from stepscope._native import _op_table


def as_glue_reads(e) -> dict:
    """A `KinetoEvent` as the writer reads it from the glue (cpp/kineto.cc)."""
    return {
        "name": e.name(),
        "start_thread_id": e.start_thread_id(),
        "end_thread_id": e.end_thread_id(),
        "start_ns": e.start_ns(),
        "duration_ns": e.duration_ns(),
        "correlation_id": e.correlation_id(),
        "linked_correlation_id": e.linked_correlation_id(),
        "on_device": e.device_type() != DeviceType.CPU,
        "is_async": e.is_async(),
        "is_hidden_event": e.is_hidden_event(),
        "is_user_annotation": e.is_user_annotation(),
        "is_python_function": e.is_python_function(),
        "overhead": e.activity_type() == "overhead",
    }


UNIT = {"s": 1e6, "ms": 1e3, "us": 1.0}


def close(ours: str, theirs: str) -> bool:
    """Equal, or both times (or shares) within one unit of the last digit printed."""
    if ours == theirs:
        return True
    for pattern, scale in (
        (r"^(-?[0-9.]+)(s|ms|us)$", None),
        (r"^(-?[0-9.]+)%$", 0.01),
    ):
        a, b = re.match(pattern, ours), re.match(pattern, theirs)
        if a and b:
            if scale is None:
                if a.group(2) != b.group(2):
                    return False
                scale = 0.001
            return abs(float(a.group(1)) - float(b.group(1))) <= scale * 1.01
    return False


def rows_of(table: str) -> tuple[list[str], list[list[str]], list[str]]:
    """A table's header lines, its rows (cells split at the column widths the rules give),
    and its total lines."""
    lines = table.rstrip("\n").split("\n")
    widths = [len(w) for w in lines[0].split("  ") if w]
    rows = []
    for line in lines[3:]:
        if line.startswith("-"):
            break
        cells, at = [], 0
        for w in widths:
            cells.append(line[at : at + w].strip())
            at += w + 2
        rows.append(cells)
    return lines[:3], rows, lines[3 + len(rows) + 1 :]


#: The trace's categories of the CPU events a table of CPU time reads: what stepscope's
#: serializer keeps of the activities it writes where torch's finalize built no event list
#: (cpp/kineto_writer.h, TableRows).
KEPT = ("cpu_op", "user_annotation", "python_function")


def ns(value) -> int:
    """A trace's microseconds (three decimals, read exactly) in nanoseconds."""
    return int(decimal.Decimal(value) * 1000)


def as_rows_kept(trace: dict, stop_unix_ns: int | None = None) -> list[dict]:
    """The CPU events of a trace as stepscope's serializer keeps them for the op table (its
    thread the trace's, ending on it; times in nanoseconds from the trace's base), those that
    began after `stop_unix_ns` left out as the writer leaves them out."""
    base = int(trace["baseTimeNanoseconds"])
    rows = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in KEPT:
            continue
        start = base + ns(e["ts"])
        if stop_unix_ns is not None and start > stop_unix_ns:
            continue
        rows.append({
            "name": e["name"], "start_thread_id": e["tid"], "end_thread_id": e["tid"],
            "start_ns": start, "duration_ns": ns(e["dur"]),
            "correlation_id": 0, "linked_correlation_id": 0, "on_device": False,
            "is_async": False, "is_hidden_event": False,
            "is_user_annotation": e["cat"] == "user_annotation",
            "is_python_function": e["cat"] == "python_function", "overhead": False,
        })  # fmt: skip
    return rows


_TRACES: dict[int, tuple[profile, dict]] = {}


def trace_of(prof: profile) -> dict:
    """The capture's trace, as torch exports it (once: torch saves a capture once)."""
    cached = _TRACES.get(id(prof))
    if cached is None or cached[0] is not prof:
        with tempfile.TemporaryDirectory() as d:
            prof.export_chrome_trace(f"{d}/trace.json")
            with open(f"{d}/trace.json") as f:
                cached = _TRACES[id(prof)] = (prof, json.load(f, parse_float=decimal.Decimal))
    return cached[1]


def assert_same_table(
    prof: profile, sort_by: str, row_limit: int | None = None
) -> None:
    """stepscope's table of the capture's events against torch's; and for a table of CPU time,
    stepscope's table of the CPU events the capture's trace holds (what a save keeps where the
    finalize built no event list) against torch's of the same capture."""
    theirs = prof.key_averages().table(
        sort_by=sort_by, **({} if row_limit is None else {"row_limit": row_limit})
    )
    events = [as_glue_reads(e) for e in prof.profiler.kineto_results.events()]
    ours = _op_table(events, sort_by, "CUDA", torch.__version__, row_limit)
    assert_same_text(ours, theirs, sort_by, row_limit)
    if "cpu" in sort_by and not any(e["on_device"] for e in events):
        kept = as_rows_kept(trace_of(prof))
        # The same CPU events as torch's list, each as often.
        assert collections.Counter(e["name"] for e in kept) == collections.Counter(e["name"] for e in events)
        ours = _op_table(kept, sort_by, "CUDA", torch.__version__, row_limit)
        assert_same_text(ours, theirs, sort_by, row_limit)


def assert_same_text(
    ours: str, theirs: str, sort_by: str, row_limit: int | None
) -> None:
    both = f"ours:\n{ours}\ntorch's:\n{theirs}"
    t_head, t_rows, t_tail = rows_of(theirs)
    o_head, o_rows, o_tail = rows_of(ours)
    assert o_head == t_head, both
    assert len(o_rows) == len(t_rows), both
    # The rows in the same order, but for rows whose sorted column is equal: torch sorts
    # floats of microseconds taken from the trace's start, in which equal nanoseconds can
    # differ in the last bit. Sorted by a column the table does not show (device time on a
    # CPU), every row is 0: they come in the order torch's list has the names, as ours do.
    headers = re.split(r"\s{2,}", t_head[1].strip())
    sorted_by = "Self CPU" if "cpu" in sort_by else "Self CUDA"
    column = headers.index(sorted_by) if sorted_by in headers else None

    def groups(rows):
        out = []
        for r in rows:
            if out and column is not None and close(out[-1][0], r[column]):
                out[-1][1].append(r)
            else:
                out.append((r[column] if column is not None else "", [r]))
        return out

    t_groups, o_groups = groups(t_rows), groups(o_rows)
    assert [len(g) for _, g in o_groups] == [len(g) for _, g in t_groups], both
    cut = row_limit is not None and len(t_rows) == row_limit
    for k, ((_, o), (_, t)) in enumerate(zip(o_groups, t_groups, strict=True)):
        # Of a tie cut by the limit, either table may show any.
        if cut and k == len(t_groups) - 1:
            continue
        # A name may have two rows (on the CPU and on the device): rows pair up by their
        # cells but the shares, which ties leave in either order.
        for ours_row, their_row in zip(sorted(o), sorted(t), strict=True):
            assert ours_row[-1] == their_row[-1], (
                f"calls: {ours_row} against {their_row}\n{both}"
            )
            bad = [
                (i, a, b)
                for i, (a, b) in enumerate(zip(ours_row, their_row, strict=True))
                if not close(a, b)
            ]
            assert not bad, (
                f"{ours_row[0]}: cells differ (column, ours, torch's): {bad}\n{both}"
            )
    assert len(o_tail) == len(t_tail)
    for a, b in zip(o_tail, t_tail, strict=True):
        head_a, _, value_a = a.rpartition(" ")
        head_b, _, value_b = b.rpartition(" ")
        assert head_a == head_b and close(value_a, value_b), f"{a!r} against {b!r}"


def work(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b).sum(dim=0)


@pytest.fixture(scope="module", autouse=True)
def warm():
    """A `record_function` before any capture: its first use in a process imports torch's
    CUPTI monitor (`torch.profiler._cupti_monitor`, torch 2.13 and later), and a capture with
    stacks around that import records a frame of it whose name is read from freed memory (a
    torch bug: the name changes between reads, and key_averages() itself may fail to decode
    it). stepscope starts Kineto from C++ and records no such frame of its own."""
    with record_function("warm"):
        work(torch.ones(4, 4), torch.ones(4, 4))


@pytest.mark.parametrize("with_stack", [False, True], ids=["no-stack", "stack"])
def test_nested_annotations_and_ops(with_stack: bool) -> None:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU], with_stack=with_stack) as prof:
        for i in range(4):
            with record_function(f"execute_context_{i}"):
                with record_function("inner"):
                    work(a, b)
                torch.cat([a, b]).mean()
    # vLLM's two tables: by device time at its default 100 rows (on CPU, every device time is
    # 0: the order is torch's list's), by CPU time at 50; and every row.
    assert_same_table(prof, "self_cpu_time_total", 50)
    assert_same_table(prof, "self_cpu_time_total", 10_000)
    assert_same_table(prof, "self_device_time_total")


def test_profiler_steps_backward_and_threads() -> None:
    """`ProfilerStep#N` (counted as one name), autograd's backward, and ops on a second
    thread nesting apart from the first's."""
    x = torch.randn(32, 32, requires_grad=True)
    w = torch.randn(32, 32)
    done = threading.Event()

    def other() -> None:
        while not done.is_set():
            work(w, w)

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=0, active=5),
        with_stack=True,
    ) as prof:
        thread = threading.Thread(target=other)
        thread.start()
        try:
            for _ in range(5):
                work(x, w).sum().backward()
                prof.step()
        finally:
            done.set()
            thread.join()
    names = {e.key for e in prof.key_averages()}
    assert "ProfilerStep*" in names
    assert_same_table(prof, "self_cpu_time_total", 50)
    assert_same_table(prof, "self_cpu_time_total", 10_000)


@pytest.mark.parametrize("with_stack", [True, False], ids=["stack", "no-stack"])
def test_a_capture_finalized_without_torchs_list_has_the_table_of_its_trace(tmp_path, with_stack) -> None:
    """Under torch's trace_only the finalize builds no event list: a table of CPU time (CPU the
    only activity, as vLLM's CPU workers record) is made from the CPU events stepscope's
    serializer keeps as it writes the trace, and is the table of the trace's own CPU events
    (which the tests above hold against torch's table of the same capture)."""
    config = {
        "profiler": "torch",
        "torch_profiler_dir": str(tmp_path),
        "torch_profiler_activities": ["CPU"],
        "torch_profiler_with_stack": with_stack,
    }
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    p = stepscope.WorkerProfiler(config, "w")
    p.start()
    for _ in range(4):
        p.step()
        with record_function("inner"):
            work(a, b)
        torch.cat([a, b]).mean()
        p.step_end()
    p.stop()
    assert p.flush(300)
    p.shutdown()
    (manifest,) = [json.loads(Path(m).read_text()) for m in glob.glob(f"{tmp_path}/*.stepscope.json")]
    assert manifest["status"] == "complete", manifest.get("error")
    with gzip.open(tmp_path / manifest["trace_file"], "rt") as f:  # gzip'd, vLLM's default
        trace = json.load(f, parse_float=decimal.Decimal)
    table = (tmp_path / manifest["summary_file"]).read_text()  # the op table (its old key)
    if with_stack and not stepscope._native.kineto_glue()["writes_python_parents"]:
        # torch 2.14 on: stacks keep the finalize whole, and the table torch's list's.
        assert "trace_only" not in trace
    else:
        assert trace["trace_only"] == 1
    stop = trace["stepscope"]["stop_unix_ns"]
    kept = as_rows_kept(trace, stop)
    assert (sum(e["is_python_function"] for e in kept) > 10) == with_stack
    # vLLM's table of CPU time: 50 rows, then the newline print() adds.
    ours = _op_table(kept, "self_cpu_time_total", "CUDA", torch.__version__, 50)
    assert table == ours + "\n"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernels_and_the_ops_that_launched_them() -> None:
    """On a GPU: kernels and copies as rows of their own, and counted for the ops that
    launched them (Self CUDA, CUDA total), in vLLM's table sorted by self device time."""
    a = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(4):
            with record_function(f"execute_context_{i}"):
                work(a, a).cpu()
        torch.cuda.synchronize()
    assert_same_table(prof, "self_device_time_total")
    assert_same_table(prof, "self_cpu_time_total", 10_000)


# What a CPU cannot record (kernels, copies, runtime calls, CUPTI's overhead records), given to
# torch's own post-processing of a capture (`_parse_kineto_results`, the event tree, then
# `key_averages().table()`, as `torch.profiler` runs them on a real result) as stand-ins for
# `KinetoEvent`s, and to stepscope's table as the glue reads them.


class FakeEvent:
    """A `KinetoEvent`'s methods that torch's post-processing calls."""

    def __init__(
        self,
        name: str,
        start: int,
        duration: int,
        thread: int = 1,
        end_thread: int | None = None,
        correlation: int = 0,
        linked: int = 0,
        device: DeviceType = DeviceType.CPU,
        is_async: bool = False,
        user_annotation: bool = False,
        activity: str = "cpu_op",
    ) -> None:
        self.values = {
            "name": name,
            "start_thread_id": thread,
            "end_thread_id": thread if end_thread is None else end_thread,
            "start_ns": start,
            "duration_ns": duration,
            "correlation_id": correlation,
            "linked_correlation_id": linked,
            "is_async": is_async,
            "is_hidden_event": False,
            "is_user_annotation": user_annotation,
            "is_python_function": False,
            "activity_type": activity,
        }
        self.device = device

    def __getattr__(self, method: str):
        v = self.__dict__["values"]
        if method in v:
            return lambda: v[method]
        fixed = {
            "end_ns": v["start_ns"] + v["duration_ns"],
            "device_type": self.device,
            "device_index": 0,
            "device_resource_id": v["start_thread_id"],
            "fwd_thread_id": v["start_thread_id"],
            "overload_name": "",
            "sequence_nr": -1,
            "scope": 0,
            "flops": 0,
            "metadata_json": "",
            "flow_id": 0,
            "flow_type": 0,
            "flow_start": False,
            "external_id": 0,
            "python_id": -1,
            "python_parent_id": -1,
            "python_module_id": -1,
            "cuda_elapsed_us": -1,
            "privateuse1_elapsed_us": -1,
        }
        if method in fixed:
            return lambda: fixed[method]
        if method in ("extra_meta", "typed_metadata"):
            return lambda: None
        if method in ("kwinputs",):
            return lambda: {}
        if method in (
            "shapes",
            "concrete_inputs",
            "stack",
            "structured_input_shapes",
            "structured_input_strides",
            "dtypes",
        ):
            return lambda: []
        raise AttributeError(method)


class FakeResult:
    def __init__(self, events: list[FakeEvent]) -> None:
        self._events = events

    def events(self) -> list[FakeEvent]:
        return self._events

    def trace_start_ns(self) -> int:
        return 0


def torch_table(events: list[FakeEvent], sort_by: str, row_limit: int) -> str:
    from types import SimpleNamespace

    from torch.autograd.profiler import profile as autograd_profile
    from torch.autograd.profiler_util import EventList

    this = SimpleNamespace(use_device="cuda")
    parsed = autograd_profile._parse_kineto_results(this, FakeResult(events))
    tree = EventList(parsed, use_device="cuda")
    tree._build_tree()
    return tree.key_averages().table(sort_by=sort_by, row_limit=row_limit)


def assert_same_for(events: list[FakeEvent]) -> None:
    glue = [
        {
            **{k: v for k, v in e.values.items() if k != "activity_type"},
            "on_device": e.device != DeviceType.CPU,
            "overhead": e.values["activity_type"] == "overhead",
        }
        for e in events
    ]
    for sort_by, limit in (
        ("self_device_time_total", 100),
        ("self_cpu_time_total", 50),
    ):
        theirs = torch_table(events, sort_by, limit)
        ours = _op_table(glue, sort_by, "CUDA", torch.__version__, limit)
        assert_same_text(ours, theirs, sort_by, limit)


CUDA = DeviceType.CUDA


def kernel(name: str, start: int, duration: int, linked: int, **kw) -> FakeEvent:
    return FakeEvent(name, start, duration, thread=7, linked=linked, device=CUDA,
                     activity="kernel", **kw)  # fmt: skip


def launch(start: int, linked: int, thread: int = 1) -> FakeEvent:
    return FakeEvent("cudaLaunchKernel", start, 500, thread=thread, linked=linked,
                     activity="cuda_runtime")  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "kernels of nested ops",
        "a region and its GPU annotation",
        "a Triton kernel named as its launch",
        "a launch on another thread",
        "a folded op's kernels",
        "an overhead record in an op",
        "an asynchronous op's kernel",
    ],
)
def test_device_columns_as_torch_computes_them(case: str) -> None:
    events = {
        "kernels of nested ops": [
            FakeEvent("aten::linear", 0, 20_000, correlation=1),
            FakeEvent("aten::addmm", 1_000, 15_000, correlation=2),
            launch(2_000, linked=2),
            kernel("gemm", 5_000, 30_000, linked=2),
            launch(12_000, linked=1),
            kernel("bias", 40_000, 2_000, linked=1),
            FakeEvent("aten::relu", 25_000, 3_000, correlation=3),
            launch(25_500, linked=3),
            kernel("relu_kernel", 43_000, 1_000, linked=3),
        ],
        "a region and its GPU annotation": [
            FakeEvent(
                "execute_model",
                0,
                30_000,
                correlation=1,
                user_annotation=True,
                activity="user_annotation",
            ),  # fmt: skip
            FakeEvent("aten::mm", 1_000, 5_000, correlation=2),
            launch(2_000, linked=2),
            kernel("gemm", 4_000, 9_000, linked=2),
            FakeEvent(
                "execute_model",
                3_000,
                40_000,
                thread=7,
                device=CUDA,
                linked=1,
                user_annotation=True,
                activity="gpu_user_annotation",
            ),  # fmt: skip
        ],
        "a Triton kernel named as its launch": [
            FakeEvent(
                "triton_poi_fused_add_0",
                0,
                4_000,
                correlation=1,
                user_annotation=True,
                activity="user_annotation",
            ),  # fmt: skip
            launch(1_000, linked=1),
            kernel("triton_poi_fused_add_0", 3_000, 2_000, linked=1),
            FakeEvent(
                "triton_poi_fused_add_0",
                10_000,
                4_000,
                correlation=2,
                user_annotation=True,
                activity="user_annotation",
            ),  # fmt: skip
            launch(11_000, linked=2),
            kernel("triton_poi_fused_add_0", 13_000, 3_000, linked=2),
        ],
        "a launch on another thread": [
            FakeEvent("aten::mm", 0, 10_000, correlation=1),
            launch(2_000, linked=1, thread=2),
            kernel("gemm", 4_000, 8_000, linked=1),
            FakeEvent("other", 1_000, 5_000, thread=2),
        ],
        "a folded op's kernels": [
            FakeEvent("aten::copy_", 0, 10_000, correlation=1),
            launch(500, linked=1),
            kernel("copy_outer", 3_000, 1_000, linked=1),
            FakeEvent("aten::copy_", 1_000, 8_000, correlation=2),
            launch(1_500, linked=2),
            kernel("copy_inner", 5_000, 4_000, linked=2),
        ],
        "an overhead record in an op": [
            FakeEvent("aten::add", 0, 10_000, correlation=2),
            FakeEvent(
                "Activity Buffer Request",
                1_000,
                2_000,
                correlation=2,
                activity="overhead",
            ),  # fmt: skip
            launch(4_000, linked=2),
            kernel("add_kernel", 6_000, 8_000, linked=2),
        ],
        "an asynchronous op's kernel": [
            FakeEvent("aten::to", 0, 10_000, correlation=1, end_thread=2),
            launch(1_000, linked=1),
            kernel("copy_kernel", 3_000, 2_000, linked=1),
            FakeEvent("aten::mm", 12_000, 3_000, correlation=2),
            launch(12_500, linked=2),
            kernel("gemm", 14_000, 5_000, linked=2),
        ],
    }[case]
    assert_same_for(events)
