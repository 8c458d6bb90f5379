"""Capture control beyond vLLM through the Python API: rank selection, aligned windows, stage
filters, the minimum batch, repeats, status()."""

from __future__ import annotations

import gzip
import json

import pytest

import stepscope

PREFILL = stepscope.Iteration(2, 300, 0, 0)
DECODE = stepscope.Iteration(0, 0, 8, 8)
MIXED = stepscope.Iteration(1, 100, 8, 8)


def run(p: stepscope.WorkerProfiler, iterations) -> list[int]:
    """Steps through `iterations`; the indices of the captured steps."""
    captured = []
    for it in iterations:
        p.step(it)
        if p.is_running:
            captured.append(p.step_index)
        p.step_end()
    return captured


@pytest.mark.parametrize(
    ("stepscope_keys", "field"),
    [
        ({"ranks": []}, "stepscope.ranks"),
        ({"start_at_step": 0}, "stepscope.start_at_step"),
        ({"stages": ["decoding"]}, "stepscope.stages"),
        ({"min_batch_tokens": -1}, "stepscope.min_batch_tokens"),
        ({"repeat": 2}, "stepscope.repeat_every"),
        ({"repeat": 2, "repeat_every": 1}, "stepscope.repeat_every"),
    ],
)
def test_each_option_is_validated_naming_it(stepscope_keys, field):
    with pytest.raises(stepscope.ConfigError, match=field.replace(".", r"\.")):
        stepscope.WorkerProfiler({"max_iterations": 2, "stepscope": stepscope_keys}, "w")


def test_start_at_step_captures_the_same_iterations_on_every_rank():
    config = {"max_iterations": 3}
    early = stepscope.WorkerProfiler(config, "rank0", rank=0)
    late = stepscope.WorkerProfiler(config, "rank1", rank=1)
    run(early, [DECODE] * 2)
    run(late, [DECODE] * 6)  # the start request reaches this rank later
    early.start(start_at_step=10)
    late.start(start_at_step=10)
    assert early.status()["start_at_step"] == 10
    assert run(early, [DECODE] * 15) == [10, 11, 12]
    assert run(late, [DECODE] * 11) == [10, 11, 12]
    with pytest.raises(ValueError, match="start_at_step"):
        late.start(start_at_step=5)  # already passed
    with pytest.raises(ValueError, match="start_at_step"):
        late.start(start_at_step=0)


def test_the_delay_counts_from_the_first_iteration_of_the_minimum_batch():
    p = stepscope.WorkerProfiler(
        {"delay_iterations": 1, "max_iterations": 2, "stepscope": {"min_batch_requests": 16}}, "w"
    )
    p.start()
    small, big = stepscope.Iteration(0, 0, 4, 4), stepscope.Iteration(0, 0, 32, 32)
    assert run(p, [small, small, big, small, small]) == [3, 4]


def test_ranks_not_listed_ignore_start_and_stop():
    config = {"stepscope": {"ranks": [0, 2]}}
    chosen = stepscope.WorkerProfiler(config, "w2", rank=2)
    other = stepscope.WorkerProfiler(config, "w1", rank=1)
    chosen.start()
    other.start()
    assert (chosen.is_active, other.is_active) == (True, False)
    assert other.status()["selected"] is False
    other.stop()


def test_ranks_need_the_workers_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    p = stepscope.WorkerProfiler({"stepscope": {"ranks": [0]}}, "w")
    with pytest.raises(stepscope.ConfigError, match=r"stepscope\.ranks"):
        p.start()
    p.set_rank(0)
    p.start()
    assert p.is_active


def test_ranks_fall_back_to_the_rank_environment_variable(monkeypatch):
    monkeypatch.setenv("RANK", "7")
    p = stepscope.WorkerProfiler({"stepscope": {"ranks": [7]}}, "w")
    assert p.status()["rank"] == 7
    p.start()
    assert p.is_active


def test_status_follows_a_repeated_session():
    p = stepscope.WorkerProfiler(
        {"max_iterations": 1, "stepscope": {"repeat": 2, "repeat_every": 3}}, "w"
    )
    assert p.status()["phase"] == "idle"
    p.start()
    assert run(p, [DECODE] * 2) == [1]
    s = p.status()
    assert (s["phase"], s["windows"], s["windows_done"], s["next_window_at"]) == ("between", 2, 1, 4)
    assert run(p, [DECODE] * 4) == [4]
    assert p.status()["phase"] == "idle"


def test_repeated_windows_write_one_torch_trace_each(tmp_path):
    p = stepscope.WorkerProfiler(
        {
            "profiler": "torch",
            "torch_profiler_dir": str(tmp_path),
            "max_iterations": 2,
            "torch_profiler_with_stack": False,
            "stepscope": {"repeat": 3, "repeat_every": 5, "stages": ["decode", "mixed"]},
        },
        "rep",
    )
    p.start()
    import torch

    for i in range(1, 16):
        p.step(PREFILL if i % 5 == 2 else DECODE)
        torch.mm(torch.ones(4, 4), torch.ones(4, 4))
        p.step_end()
    assert p.flush(120)
    manifests = sorted(
        (json.loads(m.read_text()) for m in tmp_path.glob("rep.*.stepscope.json")),
        key=lambda m: m["first_step"],
    )
    # Windows due at 1, 6, 11; step 2 (prefill) is paused over, so the first window's second
    # decode iteration is step 3.
    assert [(m["first_step"], m["last_step"], m["iterations"]) for m in manifests] == [
        (1, 3, 2),
        (6, 8, 2),
        (11, 13, 2),
    ]
    for m in manifests:
        with gzip.open(tmp_path / m["trace_file"], "rt") as f:
            events = json.load(f)["traceEvents"]
        names = [e["name"] for e in events if e.get("cat") == "user_annotation"]
        assert names and all("generation_8" in n and "context_0" in n for n in names), names


def test_stage_pauses_are_separate_profiler_windows_for_nsys(engine_script):
    r = engine_script(
        """
        p = stepscope.WorkerProfiler(
            {"profiler": "cuda", "max_iterations": 2, "stepscope": {"stages": ["decode"]}}, "w0")
        p.start()
        kinds = [stepscope.Iteration(2, 300, 0, 0), stepscope.Iteration(0, 0, 8, 8)]
        RESULT["captured"] = engine(p, 6, lambda i: kinds[int(i in (2, 4, 5))])
        """
    )
    # Steps 2, 4, 5 are decode: captured 2 and 4 (3 paused), the stop comes in step 5.
    assert r.result["captured"] == [False, True, False, True, False, False]
    assert r.driver() == [
        ("cuProfilerStart", "0"),
        ("cuProfilerStop", "0"),  # paused over prefill step 3
        ("cuProfilerStart", "0"),
        ("cuProfilerStop", "0"),
    ]
    pushes = [e.arg(1) for e in r.events if e.name == "push"]
    assert pushes == ["execute_context_0(0)_generation_8(8)"] * 2
    marks = [e.arg(1) for e in r.events if e.name == "mark"]
    assert marks == ["capture start", "capture pause", "capture resume", "capture stop"]


def test_a_stop_while_paused_makes_no_second_driver_stop(engine_script):
    r = engine_script(
        """
        p = stepscope.WorkerProfiler(
            {"profiler": "cuda", "stepscope": {"stages": ["decode"]}}, "w0")
        p.start()
        decode, prefill = stepscope.Iteration(0, 0, 8, 8), stepscope.Iteration(2, 300, 0, 0)
        RESULT["captured"] = engine(p, 3, lambda i: decode if i < 3 else prefill)
        RESULT["phase"] = p.phase
        p.stop()
        """
    )
    assert r.result["captured"] == [True, True, False]
    assert r.result["phase"] == "paused"
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]


def test_a_slow_step_starts_a_window_whose_iterations_name_their_requests(tmp_path):
    import time

    cfg = {
        "profiler": "torch",
        "torch_profiler_dir": str(tmp_path),
        "max_iterations": 2,
        "stepscope": {"slow_step_ms": 100, "request_ids": True},
    }
    p = stepscope.WorkerProfiler(cfg, worker_name="w0")
    assert not p.wants_request_ids
    p.start()
    assert (p.phase, p.wants_request_ids) == ("watching", True)
    captured = []
    for i in range(1, 9):
        ids = [f"req-{i}", "shared"] if p.wants_request_ids else None
        p.step(stepscope.Iteration(0, 0, 2, 2, request_ids=ids))
        if p.is_running:
            captured.append(p.step_index)
        if i == 3:
            time.sleep(0.3)  # the slow step: 300 ms against 100
        p.step_end()
    assert captured == [4, 5]
    status = p.status()
    assert (status["trigger_step"]["step"], status["slowest_step"]["step"]) == (3, 3)
    assert p.flush(120)
    (manifest,) = tmp_path.glob("w0.*.stepscope.json")
    m = json.loads(manifest.read_text())
    assert m["trigger"]["slow_step"]["step"] == 3
    assert m["trigger"]["slow_step"]["duration_ns"] >= 300_000_000
    assert m["steps"] == [
        {"step": 4, "requests": ["req-4", "shared"]},
        {"step": 5, "requests": ["req-5", "shared"]},
    ]
    (trace,) = tmp_path.glob("w0.*.pt.trace.json.gz")
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    annotated = [
        (e["args"]["Record function id"], e["args"]["requests"])
        for e in events
        if e.get("cat") == "user_annotation"
    ]
    assert annotated == [(4, ["req-4", "shared"]), (5, ["req-5", "shared"])]
    it = stepscope.Iteration(1, 2, 3, 4, request_ids=["x"])
    assert it.request_ids == ["x"] and stepscope.Iteration().request_ids is None
