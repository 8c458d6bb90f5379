"""A Python engine loop doing torch work on CPU, profiled by stepscope's torch backend through
the Python API: real libtorch, real Kineto, real trace files read back."""

from __future__ import annotations

import collections
import contextlib
import gc
import gzip
import json
import logging
import platform
import sys
from pathlib import Path

import pytest
import torch

import stepscope

MM_PER_ITERATION = 3


def matmuls() -> torch.Tensor:
    """One iteration's work: MM_PER_ITERATION matmuls."""
    a = torch.ones(16, 16)
    for _ in range(MM_PER_ITERATION):
        a = torch.mm(a, a) / 16
    return a


def engine(
    profiler: stepscope.WorkerProfiler, iterations: int, requests: bool = False
) -> list[bool]:
    """Iteration i names itself with i context requests of i tokens (so the trace tells which
    iteration an annotation is) and runs matmuls(); with `requests`, its ids are req-i and
    req-0."""
    captured = []
    for i in range(1, iterations + 1):
        ids = [f"req-{i}", "req-0"] if requests else None
        profiler.step(stepscope.Iteration(i, i, 0, 0, request_ids=ids))
        captured.append(profiler.is_running)
        matmuls()
        profiler.step_end()
    return captured


@contextlib.contextmanager
def gil_kept():
    """This thread keeps the GIL until it blocks (the switch interval raised): a writer thread
    that needs the GIL (Kineto's Python tracer finalizes under it) cannot run meanwhile."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def name_of(i: int) -> str:
    return f"execute_context_{i}({i})_generation_0(0)"


def read_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def spans(events: list[dict], cat: str) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == cat]


def only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


def config(tmp_path: Path, **extra) -> dict:
    return {"profiler": "torch", "torch_profiler_dir": str(tmp_path), **extra}


def test_delay_and_max_select_exactly_the_iterations_in_the_trace(tmp_path):
    p = stepscope.WorkerProfiler(
        config(tmp_path, delay_iterations=3, max_iterations=2), "py-engine", local_rank=1
    )
    p.start()
    captured = engine(p, 8)
    assert captured == [False, False, True, True, False, False, False, False]
    assert p.flush(120)

    trace = only(sorted(tmp_path.glob("py-engine.*.pt.trace.json.gz")))
    events = read_trace(trace)
    annotations = spans(events, "user_annotation")
    assert sorted(a["name"] for a in annotations) == [name_of(3), name_of(4)]
    mms = [e for e in spans(events, "cpu_op") if e["name"] == "aten::mm"]
    assert len(mms) == 2 * MM_PER_ITERATION, "no matmul of an uncaptured iteration"
    for a in annotations:
        inside = [m for m in mms if a["ts"] <= m["ts"] <= a["ts"] + a["dur"]]
        assert len(inside) == MM_PER_ITERATION, a["name"]

    manifest = json.loads(only(sorted(tmp_path.glob("py-engine.*.stepscope.json"))).read_text())
    assert manifest["status"] == "complete"
    assert (manifest["first_step"], manifest["last_step"], manifest["iterations"]) == (3, 4, 2)
    assert manifest["trace_file"] == trace.name
    assert manifest["local_rank"] == 1
    assert (tmp_path / "py-engine.profiler_out.txt").exists()
    assert manifest["op_table_seconds"] > 0
    # The header says when the capture stopped (what analyze leaves out after it), on the
    # trace's clock through Kineto's baseTimeNanoseconds: after the last captured iteration.
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    header = doc["stepscope"] if isinstance(doc["stepscope"], dict) else json.loads(doc["stepscope"])
    assert header["stop_unix_ns"] == manifest["stop_time_unix_ns"]
    stop_us = (header["stop_unix_ns"] - doc["baseTimeNanoseconds"]) / 1000
    assert max(a["ts"] + a["dur"] for a in annotations) <= stop_us


def test_stop_returns_before_the_trace_is_written_and_flush_finds_it_complete(tmp_path):
    # with_stack (vLLM's default) runs Kineto's Python tracer, whose finalization needs the GIL:
    # with the switch interval raised this thread keeps the GIL until it blocks, so the trace
    # cannot be finished between stop() returning and the check below. flush() then has to
    # release the GIL for the writer to finish at all.
    p = stepscope.WorkerProfiler(config(tmp_path, torch_profiler_use_gzip=False), "stopper")
    p.start()
    engine(p, 3)
    with gil_kept():
        p.stop()
        pending_after_stop = p.pending_writes
        traces_after_stop = list(tmp_path.glob("stopper.*.pt.trace.json"))
    assert not p.is_active
    assert pending_after_stop == 1
    assert traces_after_stop == []

    assert p.flush(120)
    assert p.pending_writes == 0
    events = read_trace(only(sorted(tmp_path.glob("stopper.*.pt.trace.json"))))
    assert sorted(a["name"] for a in spans(events, "user_annotation")) == [
        name_of(i) for i in (1, 2, 3)
    ]
    assert spans(events, "python_function"), "the Python tracer's events (with_stack)"
    manifest = json.loads(only(sorted(tmp_path.glob("stopper.*.stepscope.json"))).read_text())
    assert manifest["status"] == "complete"


def test_every_session_writes_its_own_trace_and_manifest(tmp_path):
    p = stepscope.WorkerProfiler(config(tmp_path, max_iterations=1), "multi")
    for _ in range(3):
        p.start()
        engine(p, 2)
    assert p.flush(120)
    manifests = [json.loads(m.read_text()) for m in sorted(tmp_path.glob("multi.*.stepscope.json"))]
    assert sorted(m["first_step"] for m in manifests) == [1, 3, 5]
    assert all(m["status"] == "complete" for m in manifests)
    assert len(list(tmp_path.glob("multi.*.pt.trace.json.gz"))) == 3


def test_set_output_name_names_the_next_trace(tmp_path):
    p = stepscope.WorkerProfiler(config(tmp_path), "first")
    p.set_output_name("profile_rank0")
    p.start()
    engine(p, 1)
    p.stop()
    assert p.flush(120)
    only(list(tmp_path.glob("profile_rank0.*.pt.trace.json.gz")))


def read_manifests(directory, worker, *, by):
    """The manifests of `worker`'s traces in `directory`, ordered by the field `by`."""
    found = (json.loads(m.read_text()) for m in directory.glob(f"{worker}.*.stepscope.json"))
    return sorted(found, key=lambda m: m[by])


def test_set_profiler_kwargs_apply_to_the_next_session(tmp_path):
    p = stepscope.WorkerProfiler(config(tmp_path, torch_profiler_use_gzip=False), "kw")
    p.start()
    engine(p, 1)
    p.set_profiler_kwargs({"record_shapes": True})  # ignored: a session is active
    p.stop()
    p.set_profiler_kwargs({"record_shapes": True, "activities": [torch.profiler.ProfilerActivity.CPU]})
    p.start()
    engine(p, 1)
    p.stop()
    assert p.flush(120)
    manifests = read_manifests(tmp_path, "kw", by="first_step")
    assert [m["config"]["torch_profiler_record_shapes"] for m in manifests] == [False, True]
    assert manifests[1]["config"]["torch_profiler_activities"] == ["CPU"]
    shapes = []
    for m in manifests:
        mms = [e for e in spans(read_trace(tmp_path / m["trace_file"]), "cpu_op") if e["name"] == "aten::mm"]
        shapes.append(all("Input Dims" in e.get("args", {}) for e in mms))
    assert shapes == [False, True]


def test_profiler_kwargs_follow_vllm_0_33(tmp_path, caplog):
    """vLLM 0.33 passes /start_profile's profiler_kwargs (any torch.profiler.profile argument)
    on every start, None when the request has none: each call starts from the profiler's own
    config; keys with no Kineto counterpart are logged once, never raised."""
    p = stepscope.WorkerProfiler(config(tmp_path, torch_profiler_use_gzip=False), "kw33")
    kwargs = {
        "record_shapes": True,
        "with_modules": True,
        "acc_events": True,
        "experimental_config": object(),
        "record_shape": True,  # a typo: not applied, named in the log
        "with_flops": "yes",  # not a bool: not applied
    }
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        p.set_profiler_kwargs(kwargs)
        p.set_profiler_kwargs(kwargs)
    cfg = p.config
    assert cfg["torch_profiler_record_shapes"] is True
    assert cfg["stepscope"]["torch_with_modules"] is True
    assert cfg["torch_profiler_with_flops"] is False
    for key in ("acc_events", "experimental_config", "record_shape", "with_flops"):
        logged = [r for r in caplog.records if f"{key!r} not applied" in r.getMessage()]
        assert len(logged) == 1, (key, [r.getMessage() for r in caplog.records])
    p.start()
    engine(p, 1)
    p.stop()
    p.set_profiler_kwargs(None)  # the next session is the config's own again
    assert p.config["torch_profiler_record_shapes"] is False
    p.start()
    engine(p, 1)
    p.stop()
    assert p.flush(120)
    manifests = read_manifests(tmp_path, "kw33", by="start_time_unix_ns")
    assert [m["status"] for m in manifests] == ["complete", "complete"]
    assert [m["config"]["torch_profiler_record_shapes"] for m in manifests] == [True, False]


def test_annotate_context_manager_records_while_capturing(tmp_path):
    p = stepscope.WorkerProfiler(config(tmp_path, torch_profiler_use_gzip=False), "ann")
    with p.annotate_context_manager("before"):
        pass
    p.start()
    p.step()
    with p.annotate_context_manager("sample_tokens"):
        torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    p.step_end()
    p.stop()
    with p.annotate_context_manager("after"):
        pass
    assert p.flush(120)
    events = read_trace(only(list(tmp_path.glob("ann.*.pt.trace.json"))))
    names = {a["name"] for a in spans(events, "user_annotation")}
    assert "sample_tokens" in names
    assert not names & {"before", "after"}


def test_an_unwritable_directory_is_an_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match=str(blocker)):
        stepscope.WorkerProfiler(config(tmp_path, torch_profiler_dir=str(blocker / "traces")), "w")


def test_a_profiler_dropped_right_after_stop_waits_for_its_trace_without_the_gil(tmp_path, caplog):
    # Kineto's Python tracer (with_stack) needs the GIL to finish the session: dropping the
    # profiler waits for the write, and must do so without holding the GIL, or the wait runs
    # out (flush_timeout_s) and the library logs the trace as marked "unfinished".
    caplog.set_level(logging.WARNING, logger="stepscope")
    p = stepscope.WorkerProfiler(config(tmp_path, stepscope={"flush_timeout_s": 10}), "dropped")
    p.start()
    engine(p, 2)
    p.stop()
    del p
    gc.collect()
    manifest = json.loads(only(sorted(tmp_path.glob("dropped.*.stepscope.json"))).read_text())
    assert manifest["status"] == "complete", manifest.get("error")
    assert not [r.getMessage() for r in caplog.records if "unfinished" in r.getMessage()]


TWO_PROFILERS = """
import json, sys
from pathlib import Path
import torch, stepscope
out = Path(sys.argv[1])
profilers = [
    stepscope.WorkerProfiler({"profiler": "torch", "torch_profiler_dir": str(out / n)}, n)
    for n in ("a", "b")
]
interval = sys.getswitchinterval()
for _ in range(3):
    for p in profilers:
        # This thread keeps the GIL until start() gives it up: the other profiler's session,
        # stopped just before, cannot have been finalized (its Python tracer needs the GIL).
        sys.setswitchinterval(1000.0)
        try:
            p.start()
            for i in range(1, 3):
                p.step(stepscope.Iteration(i, i, 0, 0))
                torch.mm(torch.ones(16, 16), torch.ones(16, 16))
                p.step_end()
            p.stop()
        finally:
            sys.setswitchinterval(interval)
print("FLUSHED", all(p.flush(120) for p in profilers))
"""


def test_a_profiler_starting_while_anothers_session_finalizes_waits_for_it(tmp_path):
    """Kineto is one profiler per process: a session begun while another profiler's stopped
    session is being finalized took that session's buffers, and saving it then crashed the
    process (two SGLang schedulers' profilers one after the other did). A start waits for
    every session of the process to be finalized; both profilers' traces are whole. In a
    child process, so that a crash fails this test, not the test run."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", TWO_PROFILERS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert "FLUSHED True" in proc.stdout
    for name in ("a", "b"):
        manifests = sorted((tmp_path / name).glob(f"{name}.*.stepscope.json"))
        assert len(manifests) == 3, name
        for m in manifests:
            manifest = json.loads(m.read_text())
            assert manifest["status"] == "complete", manifest.get("error")
            events = read_trace(tmp_path / name / manifest["trace_file"])
            assert sorted(a["name"] for a in spans(events, "user_annotation")) == [
                name_of(1),
                name_of(2),
            ]


NO_GLUE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
import stepscope
print("TORCH_IMPORTED", "torch" in sys.modules)
p = stepscope.WorkerProfiler({"profiler": "torch", "torch_profiler_dir": sys.argv[1]}, "w")
p.start()  # backend failures are logged, never raised into the engine
print("RUNNING", p.is_running, p.status()["phase"])
"""


def test_a_torch_without_glue_fails_the_start_naming_the_versions(tmp_path):
    """import stepscope needs no torch; a torch capture under a torch there is no Kineto glue
    for fails at start with the torch version found and the versions there is glue for."""
    import subprocess

    glue_dir = tmp_path / "glue"
    glue_dir.mkdir()
    (glue_dir / "libstepscope_kineto-torch1.99.so").write_bytes(b"")  # some other torch's
    proc = subprocess.run(
        [sys.executable, "-c", NO_GLUE, str(tmp_path / "traces")],
        env={**__import__("os").environ, "STEPSCOPE_KINETO_GLUE_DIR": str(glue_dir)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "TORCH_IMPORTED False" in proc.stdout
    assert "RUNNING False start_failed" in proc.stdout
    (error,) = [line for line in proc.stdout.splitlines() if "failed to start" in line]
    assert f"no Kineto glue for torch {torch.__version__}" in error
    assert "glue for torch: 1.99" in error
    assert "python -m stepscope.glue build" in error


def test_a_glue_of_another_abi_fails_the_start_saying_to_rebuild_it(tmp_path):
    """A glue an older stepscope built (the user cache keeps them) may lack functions this one
    calls: the start fails naming the ABI it speaks and how to rebuild it, not calling it no
    glue."""
    import os
    import subprocess

    src = tmp_path / "old_glue.cc"
    src.write_text('#include <stdint.h>\nextern "C" uint32_t stepscope_kineto_abi(void) { return 3; }\n')
    glue = tmp_path / "libstepscope_kineto-old.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(glue), str(src)], check=True, timeout=300)
    proc = subprocess.run(
        [sys.executable, "-c", NO_GLUE, str(tmp_path / "traces")],
        env={**os.environ, "STEPSCOPE_KINETO_GLUE": str(glue)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (error,) = [line for line in proc.stdout.splitlines() if "failed to start" in line]
    assert f"{glue} speaks C ABI 3" in error, error
    assert "python -m stepscope.glue build --force" in error, error


def test_the_glue_build_falls_back_to_gxx_when_cxx_cannot_link_it(tmp_path):
    """`python -m stepscope.glue build` with a $CXX that fails to link (as a GPU machine's
    /opt/gcc did, its static libstdc++ defining std::__throw_bad_array_new_length again)
    builds with g++ on PATH; `--cxx` names the one compiler to use, with no fallback."""
    import os
    import subprocess

    src = tmp_path / "src"
    src.mkdir()
    (src / "stepscope_kineto.h").write_text('extern "C" int stepscope_glue_probe(void);\n')
    (src / "kineto_writer.h").write_text("")
    (src / "kineto.cc").write_text(
        '#include "stepscope_kineto.h"\n'
        'extern "C" __attribute__((visibility("default"))) int stepscope_glue_probe(void) { return 7; }\n'
    )
    bad = tmp_path / "bad-g++"
    bad.write_text("#!/bin/sh\necho 'multiple definition of std::__throw_bad_array_new_length' >&2\nexit 1\n")
    bad.chmod(0o755)
    out = tmp_path / "out"

    def build(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "stepscope.glue", "build", "--src", str(src), "--out", str(out), "--force", *args],
            env={**os.environ, "CXX": str(bad)},
            capture_output=True,
            text=True,
            timeout=300,
        )

    proc = build()
    assert proc.returncode == 0, proc.stderr
    assert f"{bad} failed; trying g++" in proc.stdout
    (glue,) = out.glob("libstepscope_kineto-torch*.so")
    import ctypes

    assert ctypes.CDLL(str(glue)).stepscope_glue_probe() == 7  # the file is a working library
    assert not list(out.glob("*.partial"))

    glue.unlink()
    proc = build("--cxx", str(bad))
    assert proc.returncode != 0
    assert "the build failed" in proc.stderr and "__throw_bad_array_new_length" in proc.stderr
    assert not list(out.iterdir())  # nothing half-written left behind


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_an_open_ended_capture_with_stacks_ends_itself_at_max_capture_mb(tmp_path):
    """vLLM's default max_iterations (0) and a /stop_profile that never comes: with Python
    stacks the process grows by hundreds of MB per second (some 325 MB/s in
    scripts/bench_capture_budget.py here), and writing the trace takes many times
    what the window grew (torch makes an event of every Python call). The budget ends the
    window at a step boundary, through the full stop, once what the capture will cost at its
    peak (its growth times the writer's expansion) passes max_capture_mb; the process never
    grows 600 MB, writing included; the trace is written and says why; the loop goes on."""
    import threading
    import time

    p = stepscope.WorkerProfiler(
        config(tmp_path, torch_profiler_with_stack=True, stepscope={"max_capture_mb": 300}),
        "budget",
    )
    assert p.status()["max_capture_mb"] == 300
    base = resident_mb()
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], resident_mb() - base)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        p.start()
        a = torch.ones(8, 8)
        steps_after = 0
        # Bounded: 200 small matmuls an iteration pass the budget long before this many
        # iterations on any machine.
        for _ in range(200_000):
            p.step()
            if not p.is_active:
                steps_after += 1
                if steps_after == 5:
                    break
            else:
                for _ in range(200):
                    torch.mm(a, a)
            p.step_end()
        assert steps_after == 5, "the budget never ended the window"
        cut = p.status()["last_cut"]
        assert p.flush(300)
    finally:
        done.set()
        sampler.join()
    assert cut["by"] == "max_capture_mb" and cut["limit_mb"] == 300, cut
    assert cut["expansion"] == 80 and cut["projected_mb"] > 300, cut
    assert peak[0] < 600, f"the process grew {peak[0]:.0f} MB, the trace's write included"
    m = json.loads(only(list(tmp_path.glob("budget.*.stepscope.json"))).read_text())
    assert m["status"] == "complete", m
    assert m["cut_short"] == cut, (m["cut_short"], cut)
    trace = tmp_path / m["trace_file"]
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    assert doc["stepscope"]["cut_short"]["by"] == "max_capture_mb"
    assert any(e.get("cat") == "python_function" for e in doc["traceEvents"])
    # The next start works.
    p.start()
    assert p.is_active
    p.stop()
    assert p.flush(120)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heap is handed back by glibc's malloc_trim")
def test_successive_budgeted_windows_are_each_cut_at_their_first_reading(tmp_path, caplog):
    """A budget reads resident memory, so a window that reuses what an earlier capture freed
    would grow unseen: with the memory budget on, the writer hands the heap back to the
    kernel after each capture is freed, and every window of one process is cut at its first
    reading (the MEASURE_EVERY-th step, src/profiler/driver.rs), not later with each
    capture's leftovers (32, 64, 96 steps in before it did). Growth per step is a count of
    events, not a speed: 32 steps of these grew 8 MB with stacks, where this budget allows
    100 / 80 = 1.25. With the budget off, nothing is handed back (no trim, no cost)."""

    def handed_back() -> int:
        return sum("freed heap handed back" in r.getMessage() for r in caplog.records)

    p = stepscope.WorkerProfiler(
        config(tmp_path, torch_profiler_with_stack=True, stepscope={"max_capture_mb": 100}),
        "again",
    )
    a = torch.ones(8, 8)
    gc.collect()  # no earlier test's objects freed into a window by the collector
    steps_in = []
    with caplog.at_level(logging.DEBUG, logger="stepscope"):
        for _ in range(3):
            p.start()
            steps = 0
            # Bounded: the budget ends each window long before this many iterations.
            for _ in range(10_000):
                p.step()
                steps += 1
                if not p.is_active:
                    break
                for _ in range(200):
                    torch.mm(a, a)
                p.step_end()
            assert not p.is_active, "the budget never ended the window"
            assert p.flush(300)
            steps_in.append(steps)
        # The first window's baseline may sit over memory freed by whatever ran before it in
        # this process (not a capture: each of those is handed back); the next two sit over
        # captures only.
        assert steps_in[1] == steps_in[2] == min(steps_in), steps_in
        assert handed_back() == 3
        manifests = sorted(tmp_path.glob("again.*.stepscope.json"))
        assert len(manifests) == 3
        for path in manifests:
            m = json.loads(path.read_text())
            assert m["status"] == "complete" and m["cut_short"]["by"] == "max_capture_mb", m

        off = stepscope.WorkerProfiler(config(tmp_path, stepscope={"max_capture_mb": 0}), "off")
        off.start()
        engine(off, 3)
        off.stop()
        assert off.flush(120)
        assert handed_back() == 3


def test_wait_written_returns_with_the_stops_traces_on_disk_and_names_one_not_written(tmp_path):
    """What the engine plugins build their waiting stop on: a ticket before the stop, then
    ``wait_written``, after which the files are acted on at once (as verl moves them)."""
    p = stepscope.WorkerProfiler(config(tmp_path), "w0")
    ticket = p.write_ticket()
    p.start()
    engine(p, 3)
    p.stop()
    writes = p.wait_written(ticket)
    (trace,) = writes["traces"]
    assert writes["settled"] and trace["status"] == "complete" and trace["seq"] == ticket
    # At once: whole, and its manifest complete.
    assert len(spans(read_trace(Path(trace["trace_file"])), "user_annotation")) == 3
    assert stepscope.read_manifest(trace["manifest_file"])["status"] == "complete"
    assert stepscope.manifest_trace_path(trace["manifest_file"]) == trace["trace_file"]
    assert p.status()["traces"][-1] == trace

    # A directory gone under the capture: the write fails, and the wait says which and why.
    ticket = p.write_ticket()
    p.start()
    engine(p, 2)
    for f in tmp_path.iterdir():
        f.unlink()
    tmp_path.rmdir()
    tmp_path.write_text("not a directory any more")
    p.stop()
    with pytest.raises(stepscope.TraceNotWritten) as e:
        p.wait_written(ticket)
    (failed,) = e.value.traces
    assert failed["worker"] == "w0" and failed["status"] == "failed"
    assert "w0" in str(e.value) and failed["trace_file"] in str(e.value)
    tmp_path.unlink()


def after_the_stop() -> torch.Tensor:
    """Work run after a stop (test_the_engine_threads_python_calls_after_the_stop_are_not_recorded)."""
    return matmuls()


@pytest.mark.parametrize("ends_by", ["stop", "max_iterations"])
def test_the_engine_threads_python_calls_after_the_stop_are_not_recorded(tmp_path, ends_by):
    # torch's Python tracer (with_stack, vLLM's default) is stopped by the finalize, on the
    # writer's thread, under the GIL; until then it recorded every Python call this thread made
    # after the stop (an engine's next steps). The stop takes it off this thread, as torch's own
    # stop does, whether stop() or the step after the last iteration ends the session. With the
    # switch interval raised this thread keeps the GIL until it blocks (in flush()), so the
    # finalize cannot stop the tracer first.
    p = stepscope.WorkerProfiler(config(tmp_path, torch_profiler_use_gzip=False), "late")
    if ends_by == "stop":
        p.start()
        engine(p, 2)
        with gil_kept():
            p.stop()
            assert sys.getprofile() is None
            after_the_stop()
    else:
        p.start(max_iterations=2)
        with gil_kept():
            captured = engine(p, 5)
            assert captured[0] and not captured[-1], captured
            assert sys.getprofile() is None
            after_the_stop()
    assert p.flush(120)
    events = read_trace(only(sorted(tmp_path.glob("late.*.pt.trace.json"))))
    frames = spans(events, "python_function")
    assert any("matmuls" in e["name"] for e in frames), "the window's own frames are there"
    # A frame is named "file(line): function"; the test's own name holds the word too.
    assert not [e for e in frames if e["name"].endswith("): after_the_stop")]
    table = (tmp_path / "late.profiler_out.txt").read_text()
    assert "): after_the_stop" not in table, table
    if ends_by == "stop":
        # aten::mm's calls are the window's two iterations'.
        (mm,) = [line.split() for line in table.splitlines() if line.split()[:1] == ["aten::mm"]]
        assert int(mm[-1]) == 2 * MM_PER_ITERATION, table


#: Args that name one run's objects or threads, not what was recorded: kept as keys, their
#: values masked.
RUN_IDS = {"External id", "Record function id", "Ev Idx", "Sequence number", "Fwd thread id"}


def what_was_recorded(doc: dict) -> collections.Counter:
    """A trace's events as a multiset: phase, category, name and args but times and ids."""
    return collections.Counter(
        (
            e.get("ph"),
            e.get("cat"),
            e.get("name"),
            json.dumps(
                {k: "(id)" if k in RUN_IDS else v for k, v in e.get("args", {}).items()},
                sort_keys=True,
            ),
        )
        for e in doc["traceEvents"]
        if e.get("ph") != "M"
    )


def test_a_capture_nothing_reads_torchs_event_list_of_is_finalized_trace_only_unchanged(
    tmp_path,
):
    # Without stacks, modules, memory, flops and the op table, nothing reads the event list
    # and event tree torch's finalize builds; torch's trace_only leaves them out. The same
    # iterations captured with the op table on (the device dump; CUDA listed, as a GPU
    # capture would) take torch's full finalize: the two traces record the same events, the
    # requests Kineto writes into each iteration's annotation (with shapes) among them.
    if not stepscope.kineto_glue()["has_trace_only"]:
        pytest.skip(f"torch {torch.__version__} has no trace_only")
    docs = {}
    for dump in (False, True):
        out = tmp_path / str(dump)
        p = stepscope.WorkerProfiler(
            config(
                out,
                torch_profiler_activities=["CPU", "CUDA"],
                torch_profiler_with_stack=False,
                torch_profiler_record_shapes=True,
                torch_profiler_dump_cuda_time_total=dump,
                torch_profiler_use_gzip=False,
                stepscope={"request_ids": True},
            ),
            "same",
        )
        p.start()
        engine(p, 3, requests=True)
        p.stop()
        assert p.flush(120)
        with open(only(sorted(out.glob("same.*.pt.trace.json")))) as f:
            docs[dump] = json.load(f)
        assert (out / "same.profiler_out.txt").exists() == dump
    assert docs[False].get("trace_only") == 1 and "trace_only" not in docs[True]
    assert len(spans(docs[False]["traceEvents"], "cpu_op")) >= 3 * MM_PER_ITERATION
    annotations = spans(docs[False]["traceEvents"], "user_annotation")
    annotated = [e for e in annotations if "req-0" in json.dumps(e)]
    assert len(annotated) == 3, "each iteration's requests are in the trace_only trace"
    assert what_was_recorded(docs[False]) == what_was_recorded(docs[True])
