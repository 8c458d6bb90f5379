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

import re
import threading

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from stepscope._native import _op_table


def kineto_rows(prof: profile) -> list[tuple]:
    """The capture's events as the writer reads them from the glue (cpp/kineto.cc)."""
    return [
        (
            e.name(),
            e.start_thread_id(),
            e.end_thread_id(),
            e.start_ns(),
            e.duration_ns(),
            e.correlation_id(),
            e.linked_correlation_id(),
            e.device_type() != DeviceType.CPU,
            e.is_async(),
            e.is_hidden_event(),
            e.is_user_annotation(),
            e.is_python_function(),
        )
        for e in prof.profiler.kineto_results.events()
    ]


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


def assert_same_table(
    prof: profile, sort_by: str, row_limit: int | None = None
) -> None:
    theirs = prof.key_averages().table(
        sort_by=sort_by, **({} if row_limit is None else {"row_limit": row_limit})
    )
    ours = _op_table(kineto_rows(prof), sort_by, "CUDA", torch.__version__, row_limit)
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
                out[-1][1].append(r[0])
            else:
                out.append((r[column] if column is not None else "", [r[0]]))
        return out

    t_groups, o_groups = groups(t_rows), groups(o_rows)
    assert [len(g) for _, g in o_groups] == [len(g) for _, g in t_groups], both
    cut = row_limit is not None and len(t_rows) == row_limit
    for k, ((_, o), (_, t)) in enumerate(zip(o_groups, t_groups, strict=True)):
        # Of a tie cut by the limit, either table may show any.
        if not (cut and k == len(t_groups) - 1):
            assert sorted(o) == sorted(t), both
    theirs_by_name = {r[0]: r for r in t_rows}
    for o in o_rows:
        t = theirs_by_name.get(o[0])
        if t is None:
            continue  # only in a tie cut by the limit (checked above)
        assert o[-1] == t[-1], f"calls of {o[0]}: ours {o[-1]}, torch's {t[-1]}"
        bad = [
            (i, a, b)
            for i, (a, b) in enumerate(zip(o, t, strict=True))
            if not close(a, b)
        ]
        assert not bad, f"{o[0]}: cells differ (column, ours, torch's): {bad}"
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
