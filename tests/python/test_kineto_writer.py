"""stepscope's serializer of a Kineto capture (cpp/kineto_writer.h) against Kineto's own writer
on the same capture: `stepscope.serializer: "compare"` makes Kineto's own writer write the
capture too (`{stem}.kineto.json`), from the same calls of the same save. Real libtorch, real
Kineto, on CPU; the events include the kinds stepscope's serializer writes (CPU ops with
shapes, Python frames, the flows from forward ops to their backward) and those it leaves to
Kineto's writer (annotations, memory events, names Kineto rewrites)."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import subprocess
from pathlib import Path

import pytest
import torch

import stepscope

# A Python frame whose file name holds a backslash and a non-ASCII letter: Kineto rewrites
# the first ('\\' to '/') and calls the second unreadable; stepscope's serializer leaves both
# events to Kineto's writer.
ODD_FILE = "odd\\dir/naïve.py"
ODD_SOURCE = "def odd(x, a):\n    return torch.mm(x, a)\n"
REPO = Path(__file__).resolve().parents[2]
# How each line of stepscope's serializer begins (cpp/kineto_writer.h, kCat); Kineto's own
# writer indents its objects.
OURS_LINE = '{"ph": "X", "cat": "'


def capture(out: Path, serializer: str, *, gzip_trace: bool, loops: int = 20) -> dict:
    a = torch.ones(8, 8)
    scope: dict = {"torch": torch}
    exec(compile(ODD_SOURCE, ODD_FILE, "exec"), scope)
    odd = scope["odd"]

    def layer(x):
        return torch.relu(torch.mm(torch.softmax(torch.mm(x, a), dim=-1), a)) + x

    cfg = {
        "profiler": "torch",
        "torch_profiler_dir": str(out),
        "torch_profiler_with_stack": True,
        "torch_profiler_record_shapes": True,
        "torch_profiler_with_memory": True,
        "torch_profiler_use_gzip": gzip_trace,
        "stepscope": {"serializer": serializer, "request_ids": True},
    }
    p = stepscope.WorkerProfiler(cfg, "w")
    p.start()
    for i in range(3):
        p.step(stepscope.Iteration(1, 4, 0, 0, request_ids=[f"req-{i}"]))
        x = a
        for _ in range(loops):
            x = odd(layer(x), a) / 8
        # A backward pass: Kineto links forward ops to their backward with flow events.
        w = torch.ones(8, 8, requires_grad=True)
        torch.mm(x, w).sum().backward()
        with torch.profiler.record_function("a named range"):
            torch.mm(x, a)
        p.step_end()
    p.stop()
    assert p.flush(300)
    p.shutdown()
    (manifest,) = [json.loads(Path(m).read_text()) for m in glob.glob(f"{out}/*.stepscope.json")]
    assert manifest["status"] == "complete", manifest.get("error")
    return manifest


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def events(trace: dict) -> collections.Counter:
    return collections.Counter(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])


@pytest.mark.parametrize("gzip_trace", [False, True], ids=["json", "gzip"])
def test_stepscope_writes_the_capture_kineto_writes(tmp_path, gzip_trace):
    manifest = capture(tmp_path, "compare", gzip_trace=gzip_trace)
    ours_path = tmp_path / manifest["trace_file"]
    ours, kineto = load(ours_path), load(tmp_path / "w.kineto.json")

    # The same header, but the file each names itself by.
    assert set(ours) == set(kineto)
    for key in ours:
        if key not in ("traceEvents", "traceName"):
            assert ours[key] == kineto[key], key
    # The same events, each as often, to the byte of every value.
    assert events(ours) == events(kineto)

    # Both writers wrote: stepscope's one line per event, Kineto's its indented objects.
    opener = gzip.open if gzip_trace else open
    with opener(ours_path, "rt") as f:
        text = f.read()
    ours_lines = [ln for ln in text.splitlines() if ln.startswith(OURS_LINE)]
    cats = collections.Counter(json.loads(ln.rstrip(","))["cat"] for ln in ours_lines)
    assert cats["cpu_op"] > 100 and cats["python_function"] > 100, cats
    # The flows from forward ops to their backward, stepscope's too.
    flows = [ln for ln in text.splitlines() if ln.startswith(('{"ph": "s", "id": ', '{"ph": "f", "id": '))]
    assert {json.loads(ln.rstrip(","))["cat"] for ln in flows} == {"fwdbwd"}, flows[:3]
    assert len(flows) >= 2 and {json.loads(ln.rstrip(","))["ph"] for ln in flows} == {"s", "f"}
    left = {e.get("cat") for e in ours["traceEvents"]} - set(cats) - {"fwdbwd"}
    assert {"user_annotation", "cpu_instant_event"} <= left, left
    # The frames Kineto rewrites are Kineto's: its '/' for '\\', its "unknown".
    names = {e["name"] for e in kineto["traceEvents"] if e.get("cat") == "python_function"}
    assert any("odd/dir" in n for n in names) or "unknown" in names, sorted(names)[:5]
    assert not any("odd/dir" in ln or '"unknown"' in ln for ln in ours_lines)

    # The step's requests went into its annotation's args as before (the pump's line-by-line
    # pass over Kineto's layout).
    steps = [e for e in ours["traceEvents"] if e.get("cat") == "user_annotation" and "requests" in e.get("args", {})]
    assert sorted(r for e in steps for r in e["args"]["requests"]) == ["req-0", "req-1", "req-2"]
    # No side file or temporary is left.
    assert sorted(f.name for f in tmp_path.iterdir() if f.name.startswith(".")) == []


def test_a_capture_over_several_of_the_serializers_blocks_is_written_as_kinetos(tmp_path):
    """The serializer keeps its events' text in blocks of 4 MiB (cpp/kineto_writer.h, Blocks),
    each event whole in one: a capture whose lines of stepscope's serializer (the text those
    blocks held) come to more than three blocks' worth (the size is the C++ constant's,
    kBlock), against Kineto's own writer on the same save: 600 loops, about 16 MB of those lines
    in 28 MB of JSON (the rest is the events left to Kineto's writer and the file's own)."""
    manifest = capture(tmp_path, "compare", gzip_trace=False, loops=600)
    ours_path = tmp_path / manifest["trace_file"]
    with open(ours_path, "rb") as f:
        held = sum(len(ln) for ln in f if ln.startswith(OURS_LINE.encode()))
    assert held > 3 * (4 << 20), held
    ours, kineto = load(ours_path), load(tmp_path / "w.kineto.json")
    assert events(ours) == events(kineto)


def test_kineto_alone_writes_what_it_always_wrote(tmp_path):
    manifest = capture(tmp_path, "kineto", gzip_trace=False)
    text = (tmp_path / manifest["trace_file"]).read_text()
    assert OURS_LINE not in text  # no line of stepscope's serializer
    assert not (tmp_path / "w.kineto.json").exists()
    assert len(load(tmp_path / manifest["trace_file"])["traceEvents"]) > 100


def test_a_serializer_not_known_is_an_error_naming_the_field(tmp_path):
    with pytest.raises(Exception, match=r"stepscope\.serializer"):
        stepscope.WorkerProfiler(
            {"profiler": "torch", "torch_profiler_dir": str(tmp_path), "stepscope": {"serializer": "fast"}}, "w"
        )


def test_torch_2_13s_metadata_is_written_as_kinetos_metadata_json(tmp_path):
    """The serializer reads torch 2.13's metadata map in place (cpp/kineto_writer.h:
    pair_args_size, put_pair_args) instead of calling Kineto's metadataJson() for each event.
    tests/python/kineto_metadata_args.cc holds that text against metadataJson() of the same
    activities, quoted values, a backslash and a newline among them: compiled with the glue's
    flags against this torch's headers, linked to this libtorch. A torch that keeps typed
    metadata (2.14 on) is formatted by Kineto's metadataJson(), which the program says."""
    from stepscope import glue

    _, root, abi = glue._torch_at(None)
    lib = root / "lib"
    exe = tmp_path / "metadata_args"
    cmd = [
        # The compiler the glue's build falls back to (g++ where $CXX is another).
        *glue._compilers(None)[-1], "-O0", "-DFMT_HEADER_ONLY", *glue.cxx_flags(root, abi),
        "-I", str(REPO / "cpp"),
        str(Path(__file__).with_name("kineto_metadata_args.cc")), "-o", str(exe),
        "-L", str(lib), "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}",
    ]  # fmt: skip
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr[-4000:]
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    if ran.stdout.strip() == "typed":
        pytest.skip(f"torch {torch.__version__} keeps typed metadata: Kineto's metadataJson() formats it")
    assert ran.stdout.strip() == "ok 7", ran.stdout
