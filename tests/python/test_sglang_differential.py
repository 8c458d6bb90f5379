"""Differential: the same scripted ``ProfileReq`` s and forward batches through SGLang 0.5.23's
own profiler and through the stepscope plugin, on SGLang's real ``SchedulerProfilerManager``
(and, with ``SGLANG_PROFILE_V2``, its real ``ProfileManager``), comparing the traces each
writes: their names and the forward passes in them (each forward runs inside
``record_function("fwd#{n}")``).

The sequences are generated (seeded, so a failure names a sequence that replays): random mixes
of prefill, decode, mixed and idle batches of 1-4 requests, ``start_step``/``num_steps``,
by-stage and manual requests, stops, and ``SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS``; plus the
cases issue #29 found by hand. Left out, with the reason, are the requests on which SGLang's
own profiler breaks (see ``legacy_request``) and the documented differences (docs/sglang.md):
a window is named by the stage it captured.

Runs in the ``.venv-sglang`` environment (``make test``); skipped where SGLang is not installed.
"""

from __future__ import annotations

import gc
import gzip
import json
import random
import re
import time
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("sglang")

import stepscope  # noqa: E402
from sglang_harness import D, I, M, P, Scheduler, scheduler_process  # noqa: E402

#: Generated sequences per profile manager (each runs twice: SGLang's own, then stepscope).
LEGACY_SEQUENCES = 40
V2_SEQUENCES = 30
FORWARD = re.compile(r"^fwd#(\d+)$")
MODES = {"E": P, "D": D, "M": M, "I": I}


@pytest.fixture(scope="module", autouse=True)
def sglang_process():
    # SGLang's own _stop_profile ends with gc.collect(), a full collection of every object
    # torch and SGLang made at import: 0.47 s a window here, 30 of the 31 s of the generated
    # sequences. Frozen, those objects are left out of collections; what a sequence makes is
    # still collected.
    gc.freeze()
    try:
        with scheduler_process():
            yield
    finally:
        gc.unfreeze()


@pytest.fixture
def profile_env(monkeypatch):
    """Sets SGLang's profiling variables for one sequence."""

    def apply(v2: bool, min_bs: int) -> None:
        monkeypatch.setenv("SGLANG_PROFILE_V2", "1" if v2 else "0")
        monkeypatch.setenv("SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS", str(min_bs))

    return apply


# --- running one sequence ------------------------------------------------------------------------


def play(
    ops: list[tuple] | Callable[[Any, int], tuple | None], out: Path, *, own: bool
) -> tuple[list[tuple], list[tuple[str, tuple[int, ...]]]]:
    """Runs ``ops`` on a fresh scheduler: a list, or a function of (SGLang's manager, forward
    count) giving the next op, or None at the end (a sequence generated as it runs, from
    SGLang's own state). Returns the ops run and each written trace as (file name, forward
    passes in it), in the order the windows began."""
    out.mkdir(parents=True)
    rescue = out / "rescued"
    s = Scheduler(own=own, mark_forwards=True, rescue=rescue if own else None)
    exported: list[Path] = []
    done: list[tuple] = []
    script = iter(ops) if isinstance(ops, list) else None
    while True:
        op = next(script, None) if script is not None else ops(s.manager, s.forward_ct)
        if op is None:
            break
        done.append(op)
        kind = op[0]
        if kind == "batch":
            _, mode, reqs = op
            s.run(MODES[mode], reqs=reqs, decoding=1 if mode == "M" else 0)
        elif kind == "start":
            s.profile(output_dir=str(out), activities=["CPU"], with_stack=False, **op[1])
        else:
            s.stop()
        if own:
            # SGLang's own profiler writes at its stop: each file put aside at once, so a
            # second file of the same name cannot replace it.
            files = sorted(rescue.glob("*.trace.json.gz")) + sorted(out.glob("*.trace.json.gz"))
            for f in files:
                kept = out / "own" / f"{len(exported):03d}" / f.name.split("~")[-1]
                kept.parent.mkdir(parents=True)
                f.rename(kept)
                exported.append(kept)
    if not own:
        deadline = time.monotonic() + 120
        while stepscope.traces_in_flight():
            assert time.monotonic() < deadline, "stepscope's traces were never written"
            time.sleep(0.02)
        exported = sorted(out.glob("*.trace.json.gz"))
        for m in out.glob("*.stepscope.json"):
            assert json.loads(m.read_text())["status"] == "complete", m
    windows = [(f.name, forwards(f)) for f in exported]
    return done, sorted(windows, key=lambda w: (w[1][:1], w[0]))


def forwards(trace: Path) -> tuple[int, ...]:
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    found = []
    for e in events:
        m = FORWARD.match(str(e.get("name", "")))
        if m and e.get("ph") == "X":
            found.append(int(m.group(1)))
    return tuple(sorted(found))


def named_by_stage(windows, ops) -> list[tuple[str, tuple[int, ...]]]:
    """SGLang's own windows as stepscope names them: a window of a by-stage request is named by
    the stage it captured (its first prefill or decode batch), where SGLang's default profiler
    names it by the call that stopped it (``/stop_profile``: no stage; a prefill batch after
    the prefill window: ``-EXTEND``, replacing that window's trace). The one documented naming
    difference (docs/sglang.md)."""
    stage_of_forward = {}
    n = 0
    for op in ops:
        if op[0] == "batch":
            n += 1
            stage_of_forward[n] = {"E": "-EXTEND", "M": "-EXTEND", "D": "-DECODE"}.get(op[1])
    renamed = []
    for name, fwd in windows:
        stem = re.sub(r"(-EXTEND|-DECODE)?\.trace\.json\.gz$", "", name)
        if stem.endswith("-TP-0") and by_stage_request(stem, ops):
            stage = next((stage_of_forward[f] for f in fwd if stage_of_forward[f]), "")
            name = f"{stem}{stage}.trace.json.gz"
        renamed.append((name, fwd))
    return sorted(renamed, key=lambda w: (w[1][:1], w[0]))


def by_stage_request(stem: str, ops) -> bool:
    pid = stem[: -len("-TP-0")]
    return any(op[0] == "start" and op[1]["profile_id"] == pid and op[1].get("profile_by_stage")
               for op in ops)  # fmt: skip


def differential(tmp_path: Path, ops, *, v2: bool) -> None:
    ops, own = play(ops, tmp_path / "own", own=True)
    _, ours = play(ops, tmp_path / "ours", own=False)
    expected = own if v2 else named_by_stage(own, ops)
    assert ours == expected, f"SGLang's own: {expected}\nstepscope:    {ours}\nops: {ops}"


# --- generating sequences ------------------------------------------------------------------------


def batch(rng: random.Random) -> tuple:
    mode = rng.choices("EDMI", weights=[3, 6, 1, 1])[0]
    return ("batch", mode, rng.randint(1, 4))


def legacy_sequence(rng: random.Random) -> Callable[[Any, int], tuple | None]:
    """A sequence for SGLang's default profiler, each op drawn from the state SGLang's own
    manager is in. Not drawn: a start without ``start_step`` (``num_steps`` from now, or
    manual) while SGLang's own is in progress or holds a start forward count not reached yet
    (a ``start_step`` request's, which a ``/stop_profile`` before it does not clear). SGLang
    calls ``_start_profile`` for such a request whatever ``_init_profile`` answered, or again
    at that forward count, and there replaces its running torch.profiler without writing it;
    stepscope refuses the first and goes on at the second (test_sglang.py pins both)."""
    left = rng.randint(8, 30)
    k = 0
    ended = False

    def next_op(m: Any, forward_ct: int) -> tuple | None:
        nonlocal left, k, ended
        if left == 0:
            if ended:
                return None
            ended = True
            return ("stop",)
        left -= 1
        r = rng.random()
        if r < 0.15:
            pending = m.profiler_start_forward_ct and m.profiler_start_forward_ct > forward_ct
            shapes = ["by_stage", "start_step"]
            if not m.profile_in_progress and not pending:
                shapes += ["now", "manual"]
            shape = rng.choice(shapes)
            n = rng.choice([None, 1, 2, 3])
            req: dict = {"profile_id": f"r{k}"}
            k += 1
            if shape == "by_stage":
                req.update(profile_by_stage=True, num_steps=n or 2)
            elif shape == "start_step":
                req.update(start_step=max(1, forward_ct + rng.randint(-2, 4)), num_steps=n)
            elif shape == "now":
                req.update(num_steps=n or 1)
            return ("start", req)
        if r < 0.22:
            return ("stop",)
        return batch(rng)

    return next_op


def v2_sequence(rng: random.Random) -> list[tuple]:
    """V2: by-stage requests only (its configure asserts the rest); no ``/stop_profile`` (its
    manual stop raises NotImplementedError): every window ends by itself, after enough batches
    of each stage at the end."""
    ops: list[tuple] = []
    n_max = 1
    for k in range(rng.randint(1, 3)):
        for _ in range(rng.randint(0, 10)):
            ops.append(batch(rng))
        n = rng.randint(1, 3)
        n_max = max(n_max, n)
        stages = rng.choice([None, ["prefill"], ["decode"], ["prefill", "decode"]])
        req = {"profile_id": f"r{k}", "profile_by_stage": True, "num_steps": n}
        if stages:
            req["profile_stages"] = stages
        ops.append(("start", req))
        for _ in range(rng.randint(0, 12)):
            ops.append(batch(rng))
        # The next request only once this one's windows are done (V2 asserts otherwise).
        ops += [("batch", "E", 2)] * (n_max + 2) + [("batch", "D", 2)] * (n_max + 2)
    return ops


# --- the tests -----------------------------------------------------------------------------------


#: The three cases of issue #29's table, and its agreeing cases, as sequences.
TABLE = {
    "idle inside a by-stage window": (
        0,
        [("start", {"profile_id": "r0", "profile_by_stage": True, "num_steps": 3})]
        + [("batch", m, 2) for m in "EIMDIDDDE"],
    ),
    "decode min batch size": (
        3,
        [("start", {"profile_id": "r0", "profile_by_stage": True, "num_steps": 2})]
        + [("batch", "E", 2)] + [("batch", "D", b) for b in (1, 2, 3, 3, 3)],
    ),
    "a second start replaces a pending one": (
        0,
        [("start", {"profile_id": "r1", "start_step": 3, "num_steps": 2}),
         ("start", {"profile_id": "r2", "start_step": 4, "num_steps": 2})]
        + [("batch", "D", 2)] * 8,
    ),
    "a passed start_step is clamped": (
        0,
        [("batch", "D", 2)] * 5
        + [("start", {"profile_id": "r0", "start_step": 3, "num_steps": 2})]
        + [("batch", "D", 2)] * 4,
    ),
    "a decode window cut short by a prefill": (
        0,
        [("start", {"profile_id": "r0", "profile_by_stage": True, "num_steps": 1})]
        + [("batch", m, 2) for m in "EEDEDDD"] + [("stop",)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TABLE))
def test_the_issues_cases_match_sglangs_own_profiler(tmp_path, profile_env, case):
    min_bs, ops = TABLE[case]
    profile_env(False, min_bs)
    differential(tmp_path, ops, v2=False)


def test_generated_sequences_match_sglangs_own_profiler(tmp_path, profile_env):
    rng = random.Random(29)
    for i in range(LEGACY_SEQUENCES):
        seed = rng.randrange(2**32)
        min_bs = random.Random(seed).choice([0, 0, 2, 3])
        profile_env(False, min_bs)
        ops = legacy_sequence(random.Random(seed))
        try:
            differential(tmp_path / str(i), ops, v2=False)
        except AssertionError as e:
            raise AssertionError(f"sequence {i} (seed {seed}, min_bs {min_bs}): {e}") from None


def test_generated_sequences_match_sglangs_own_profiler_v2(tmp_path, profile_env):
    rng = random.Random(292)
    for i in range(V2_SEQUENCES):
        seed = rng.randrange(2**32)
        profile_env(True, 0)
        ops = v2_sequence(random.Random(seed))
        try:
            differential(tmp_path / str(i), ops, v2=True)
        except AssertionError as e:
            raise AssertionError(f"V2 sequence {i} (seed {seed}): {e}") from None
