"""The "Python parent id" of each Python frame where torch's finalize built no event tree
(torch's `trace_only`, asked for under Python stacks when stepscope's serializer writes the
trace: src/backend/torch/session.rs) and stepscope's serializer writes it instead
(cpp/kineto_writer.h, `PythonParents`), held against torch's own:

- on the same capture: the frames of a torch.profiler capture with stacks, whose parents torch's
  tree gave, go through the serializer's rule (compiled into tests/python/python_parents.cc
  against this torch) in the order Kineto handed them to its writer, and every parent must be
  torch's. Frames on three threads and two waiting ones, frames called from inside ops (a custom op's Python body,
  a Python backward run by autograd's engine), C calls calling back into Python;
- end to end: a stepscope capture finalized under `trace_only`, whose every frame has a parent
  (those of the frames Kineto's writer writes too), and whose frames, each named by its path of
  callers, are those of torch.profiler's capture of the same work."""

from __future__ import annotations

import collections
import decimal
import gc
import glob
import gzip
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import stepscope

REPO = Path(__file__).resolve().parents[2]
# A frame whose file name Kineto's writer rewrites ('\\' to '/', a non-ASCII letter): such a
# frame is Kineto's to write, and its parent goes into its metadata.
ODD_FILE = "odd\\dir/naïve.py"
ODD_SOURCE = "def odd(x):\n    return torch.relu(x)\n"
ODD_SCOPE: dict = {"torch": torch}
exec(compile(ODD_SOURCE, ODD_FILE, "exec"), ODD_SCOPE)


@torch.library.custom_op("stepscope_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    """A custom op whose body is Python: its frames run inside the op's record."""
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


twice.register_autograd(lambda ctx, grad: grad * 2)


class Scale(torch.autograd.Function):
    """Its backward is Python, called by autograd's engine from inside its ops."""

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


def key(v: int) -> int:
    return -v


def numbers():
    yield from range(3)


def hook(module, inputs, output):
    return output + 1


MODEL = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
MODEL.register_forward_hook(hook)


def work(loops: int) -> None:
    x = torch.ones(4, 8, requires_grad=True)
    for _ in range(loops):
        y = MODEL(x)
        y = twice(y)
        y = Scale.apply(y)
        y = ODD_SCOPE["odd"](y)
        y.sum().backward()
        sorted([3, 1, 2], key=key)
        list(numbers())
        try:
            raise ValueError("caught")
        except ValueError:
            pass


def frames(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "python_function"]


def ns(value) -> int:
    """A trace's microseconds (three decimals, read exactly) in nanoseconds."""
    return int(decimal.Decimal(value) * 1000)


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f, parse_float=decimal.Decimal)


def parents_program(tmp_path: Path) -> Path:
    from stepscope import glue

    _, root, abi = glue._torch_at(None)
    exe = tmp_path / "python_parents"
    cmd = [
        # The compiler the glue's build falls back to (g++ where $CXX is another).
        *glue._compilers(None)[-1], "-O1", "-DFMT_HEADER_ONLY", *glue.cxx_flags(root, abi),
        "-I", str(REPO / "cpp"), str(Path(__file__).with_name("python_parents.cc")), "-o", str(exe),
    ]  # fmt: skip
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr[-4000:]
    return exe


def test_the_serializers_parents_are_torchs_on_the_same_capture(tmp_path):
    exe = parents_program(tmp_path)
    work(1)  # first calls (the custom op's, autograd's) set things up once, outside the capture
    go = threading.Event()

    def worker():
        go.wait()
        work(3)

    done = threading.Event()
    # The tracer follows the threads that exist when the capture starts. Two of them wait
    # throughout: torch gives the frames of such a thread thread 0, one for both, and its tree
    # nests one's frames in the other's, as the rule does.
    threads = [threading.Thread(target=worker) for _ in range(2)]
    waiting = [threading.Thread(target=done.wait) for _ in range(2)]
    for t in threads + waiting:
        t.start()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        go.set()
        work(3)
        for t in threads:
            t.join()
    done.set()
    for t in waiting:
        t.join()
    path = tmp_path / "torch.json"
    prof.export_chrome_trace(str(path))
    trace = load(path)
    py = frames(trace)
    tids = {e["tid"] for e in py}
    assert 0 in tids and len(tids) >= 4, tids  # and any threads earlier tests left
    lines = "".join(
        f"{e['tid']} {ns(e['ts'])} {ns(e['ts']) + ns(e['dur'])} {e['args']['Python id']}\n" for e in py
    )
    ran = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, timeout=120, check=True)
    ours = [int(v) for v in ran.stdout.split()]
    # A root's parent is null (torch 2.13) or left out (2.14 on).
    torchs = [-1 if e["args"].get("Python parent id") is None else e["args"]["Python parent id"] for e in py]
    assert len(ours) == len(torchs) > 1000
    wrong = [(e["name"], o, t) for e, o, t in zip(py, ours, torchs, strict=True) if o != t]
    assert not wrong, wrong[:5]

    # The capture holds what the rule must get right: frames inside ops, C calls calling back.
    by_id = {e["args"]["Python id"]: e for e in py}
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]

    def inside_an_op(e) -> bool:
        return any(
            o["tid"] == e["tid"] and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
            for o in ops
        )

    called_back = [e for e in py if e["name"].endswith(": key")]
    assert called_back and all(by_id[e["args"]["Python parent id"]]["name"] == "<built-in function sorted>"
                               for e in called_back)  # fmt: skip
    for body in (": twice", ": backward"):
        assert any(e["name"].endswith(body) and inside_an_op(e) for e in py), body


def test_ties_and_crossed_frames_close_as_torchs_tree_closes_them(tmp_path):
    """What real captures seldom hold, on frames made up for it ("thread start end id" in,
    parents out): torch's tree closes only what ended strictly before a start, never opens an
    event of no duration, and closing a frame closes what is still open above it."""
    exe = parents_program(tmp_path)
    frames_in = [
        (1, 0, 100, 1),  # the root of thread 1
        (1, 0, 10, 2),  # same start, entered after 1: its child
        (1, 10, 20, 3),  # begins as 2 ends: still 2's child
        (1, 15, 18, 4),  # 2 ended before it began, and closed 3 with it: 1's child
        (1, 30, 200, 5),  # 1's child, ending after 1
        (1, 40, 40, 6),  # no duration: 5's child, and never open
        (1, 40, 45, 7),  # so 5's child, not 6's
        (2, 5, 50, 8),  # another thread: a root of its own
        (1, 150, 160, 9),  # 1 ended before it began, and closed 5 with it: no parent
        (2, 60, 70, 10),  # 8 ended: a root
    ]
    lines = "".join(" ".join(map(str, f)) + "\n" for f in frames_in)
    ran = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, timeout=60, check=True)
    assert [int(v) for v in ran.stdout.split()] == [-1, 1, 2, 1, 1, 5, 5, -1, -1, -1]


def callers(trace: dict) -> collections.Counter:
    """Each frame under `work`, as its path of callers from `work` (object addresses left out
    of C calls' names), counted. The stop's own calls are left out: torch's tracer ends the
    last frame of a generator at the capture's end, so what is called after `work` returns
    nests under it (in torch's tree as here), and the two profilers stop differently."""
    py = frames(trace)
    by_id = {e["args"]["Python id"]: e for e in py}
    paths: collections.Counter = collections.Counter()
    for e in py:
        path = []
        at = e
        while at is not None:
            path.append(re.sub(r" at 0x[0-9a-f]+", "", at["name"]))
            if at["name"].endswith(": work"):
                if not any("WorkerProfiler" in n for n in path):
                    paths[tuple(reversed(path))] += 1
                break
            parent = at["args"].get("Python parent id")
            at = None if parent is None else by_id[parent]
    return paths


def test_a_trace_only_capture_has_torchs_parents(tmp_path):
    work(1)
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
            work(2)
        prof.export_chrome_trace(str(tmp_path / "torch.json"))
        # CPU and CUDA listed and no device dump: no op table, so torch's finalize builds
        # neither its event list nor its tree, on this machine or one with a GPU.
        config = {
            "profiler": "torch",
            "torch_profiler_dir": str(tmp_path / "ours"),
            "torch_profiler_activities": ["CPU", "CUDA"],
            "torch_profiler_with_stack": True,
            "torch_profiler_dump_cuda_time_total": False,
        }
        p = stepscope.WorkerProfiler(config, "w")
        p.start()
        work(2)
        p.stop()
        assert p.flush(300)
        p.shutdown()
    finally:
        gc.enable()
    (manifest,) = [json.loads(Path(m).read_text()) for m in glob.glob(f"{tmp_path}/ours/*.stepscope.json")]
    assert manifest["status"] == "complete", manifest.get("error")
    ours = load(tmp_path / "ours" / manifest["trace_file"])
    py = frames(ours)
    if not stepscope._native.kineto_glue()["writes_python_parents"]:
        # torch 2.14 on: its trace_only leaves out each frame's "CallFrom" too, which the
        # serializer does not write, so the finalize builds the tree (the parents are torch's).
        assert "trace_only" not in ours
    else:
        assert ours.get("trace_only") == 1  # the finalize built no tree: the parents are ours
        assert py and all("Python parent id" in e["args"] for e in py)
        # The frames Kineto's writer writes have theirs too.
        odd = [e for e in py if "odd/dir" in e["name"] or e["name"] == "unknown"]
        assert odd and all(e["args"]["Python parent id"] is not None for e in odd)
    expected = callers(load(tmp_path / "torch.json"))
    assert sum(expected.values()) > 100
    assert callers(ours) == expected


@pytest.mark.parametrize("serializer", ["kineto", "compare"])
def test_where_kinetos_writer_writes_torch_builds_the_tree(tmp_path, serializer):
    """Kineto's own writer adds no parents: under stacks the capture is finalized whole."""
    config = {
        "profiler": "torch",
        "torch_profiler_dir": str(tmp_path),
        "torch_profiler_activities": ["CPU", "CUDA"],
        "torch_profiler_with_stack": True,
        "torch_profiler_dump_cuda_time_total": False,
        "stepscope": {"serializer": serializer},
    }
    p = stepscope.WorkerProfiler(config, "w")
    p.start()
    work(1)
    p.stop()
    assert p.flush(300)
    p.shutdown()
    (manifest,) = [json.loads(Path(m).read_text()) for m in glob.glob(f"{tmp_path}/*.stepscope.json")]
    trace = load(tmp_path / manifest["trace_file"])
    assert "trace_only" not in trace
    if stepscope._native.kineto_glue()["writes_python_parents"]:
        # torch 2.13 writes a root's parent as null: every frame has one.
        assert all("Python parent id" in e["args"] for e in frames(trace))
