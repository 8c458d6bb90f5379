#!/usr/bin/env bash
# The wheel `make wheel` writes is what a package index accepts and what a user gets:
# - pypa's auditwheel shows it consistent with manylinux_2_28 (torch's own floor): every ELF
#   file in it (the extension, the Kineto glue per torch, the stepscope command);
# - its extension is an optimized build (under 20 MB unpacked);
# - installed alone into a fresh environment holding only torch 2.15.0 (from uv's cache after
#   setup), with no Rust toolchain and no C++ compiler on PATH: `import stepscope`, a Kineto
#   capture from Python, and the `stepscope` command (the static executable the wheel puts on
#   PATH, and `python -m stepscope`)
#   analyzing it; and stepscope's serializer writing the events Kineto's own writer writes of
#   one save (`stepscope.serializer: "compare"`) under that torch.
# Everything is made under a temporary directory, removed at the end.
# Usage: scripts/check_wheel.sh UV
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${1:?usage: check_wheel.sh UV}
bin=$(dirname "$uv")
wheels=(dist/stepscope-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "check_wheel: want one wheel in dist/ (make wheel), found: ${wheels[*]}" >&2; exit 1; }
wheel=${wheels[0]}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { printf 'check_wheel: %s\n' "$*" >&2; }

case "$(basename "$wheel")" in
  *manylinux_2_28_x86_64*) ;;
  *) say "the wheel is not tagged manylinux_2_28: $wheel"; exit 1 ;;
esac
"$bin/auditwheel" show "$wheel" >"$work/audit.txt" 2>&1 || { cat "$work/audit.txt"; exit 1; }
if ! tr -s ' \n' ' ' <"$work/audit.txt" | grep -q 'consistent with the following platform tag: "manylinux_2_28_x86_64"'; then
  say "auditwheel does not find the wheel manylinux_2_28:"; cat "$work/audit.txt" >&2; exit 1
fi
say "auditwheel: consistent with manylinux_2_28_x86_64"

"$bin/python" - "$wheel" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    sizes = {i.filename: i.file_size for i in z.infolist()}
ext = [n for n in sizes if n.startswith("stepscope/_native") and n.endswith(".so")]
glue = sorted(n for n in sizes if n.startswith("stepscope/_glue/libstepscope_kineto-torch"))
cli = [n for n in sizes if n.endswith(".data/scripts/stepscope")]
assert len(ext) == 1, ext
mb = sizes[ext[0]] / 1e6
assert mb < 20, f"{ext[0]} is {mb:.1f} MB unpacked: not an optimized build"
assert [g.rsplit("torch", 1)[1] for g in glue] == ["2.13.so", "2.14.so", "2.15.so"], glue
assert len(cli) == 1, f"the stepscope command is not in the wheel's scripts: {cli}"
with zipfile.ZipFile(sys.argv[1]) as z:
    head = z.read(cli[0])[:4]
assert head == b"\x7fELF", f"{cli[0]} is not an executable: {head!r}"
print(f"check_wheel: extension {mb:.1f} MB unpacked; glue for torch 2.13, 2.14, 2.15; "
      f"stepscope command {sizes[cli[0]] / 1e6:.1f} MB", file=sys.stderr)
PY

say "a fresh environment with torch 2.15.0 only, then the wheel"
"$uv" venv --quiet --python "$(command -v python3)" "$work/venv"
"$uv" pip install --quiet --python "$work/venv/bin/python" torch==2.15.0
"$uv" pip install --quiet --python "$work/venv/bin/python" --no-deps "$wheel"
# No Rust toolchain, no compiler: only the environment's scripts and the system's basics.
export PATH="$work/venv/bin:/usr/bin:/bin" CXX=/nonexistent/c++ CC=/nonexistent/cc
unset VIRTUAL_ENV LIBTORCH_USE_PYTORCH STEPSCOPE_CLI
"$work/venv/bin/python" - "$work/traces" <<'PY'
import sys
import torch
import stepscope

glue = stepscope.kineto_glue()
assert glue["built_for"].startswith("2.15."), glue
p = stepscope.WorkerProfiler({"profiler": "torch", "torch_profiler_dir": sys.argv[1],
                              "torch_profiler_with_stack": False}, "wheel")
p.start()
x = torch.ones(64, 64)
for _ in range(3):
    p.step(stepscope.Iteration(num_gen_reqs=4, num_gen_tokens=4))
    x = torch.mm(x, x).tanh()
p.stop()
assert p.flush(120)
print(f"check_wheel: captured with torch {torch.__version__}, glue {glue['path']}", file=sys.stderr)

# stepscope's serializer against Kineto's own writer on one save of this torch's (the test
# suite's tests/python/test_kineto_writer.py covers torch 2.13 and 2.14).
import glob, json, pathlib
sys.path.insert(0, "scripts")
from kineto_compare import compare
out = pathlib.Path(sys.argv[1]).parent / "compare"
p = stepscope.WorkerProfiler({"profiler": "torch", "torch_profiler_dir": str(out), "torch_profiler_use_gzip": False,
                              "torch_profiler_with_stack": True, "torch_profiler_record_shapes": True,
                              "stepscope": {"serializer": "compare"}}, "cmp")
p.start()
for _ in range(3):
    p.step()
    for _ in range(20):
        x = torch.mm(x, x).tanh()
    p.step_end()
p.stop()
assert p.flush(120)
(trace,) = glob.glob(f"{out}/cmp.*.pt.trace.json")
ours, kineto = json.load(open(trace)), json.load(open(out / "cmp.kineto.json"))
differ = compare(ours, kineto)
assert differ["same_events"] and differ["same_header"], f"stepscope's serializer and Kineto's differ: {differ}"
assert any(line.startswith('{"ph": "X", "cat": "cpu_op"') for line in open(trace)), "no line of stepscope's"
print(f"check_wheel: stepscope's serializer wrote the {len(ours['traceEvents'])} events Kineto's does",
      file=sys.stderr)
PY
# `stepscope` on PATH is the static executable itself: no interpreter, no Python in front of it.
cmd=$(command -v stepscope)
[ "$cmd" = "$work/venv/bin/stepscope" ] || { say "stepscope on PATH is $cmd, not the wheel's"; exit 1; }
[ "$(head -c 4 "$cmd" | od -An -c | tr -d ' ')" = '177ELF' ] || { say "$cmd is not the executable: $(head -c 64 "$cmd")"; exit 1; }
if readelf -lW "$cmd" | grep -q 'INTERP\|program interpreter'; then
  say "$cmd is linked dynamically: $(readelf -lW "$cmd" | grep -i interpreter)"; exit 1
fi
stepscope --help >/dev/null
stepscope analyze "$work/traces" >"$work/analyze.txt"
grep -q "execute_context_0(0)_generation_4(4)" "$work/analyze.txt" || { cat "$work/analyze.txt"; exit 1; }
python -m stepscope analyze --json "$work/traces" >"$work/analyze.json"
python -c 'import json, sys; d = json.load(open(sys.argv[1])); assert len(d["traces"]) == 1 and not d["errors"], d' "$work/analyze.json"
say "ok: stepscope analyze (the static executable on PATH, and python -m stepscope) read the capture"

# pip install --target, as the GPU scripts install the wheel (scripts/gpu_wheel.sh): pip moves the
# scripts into {target}/bin after writing RECORD, whose path to the command is then wrong;
# python -m stepscope must still find the command (stepscope/_cli.py).
"$uv" pip install --quiet --python "$work/venv/bin/python" pip
"$work/venv/bin/python" -m pip install --quiet --no-index --no-deps --target "$work/target" "$wheel"
PYTHONPATH="$work/target" "$work/venv/bin/python" -m stepscope --version >/dev/null \
  || { say "python -m stepscope found no command in a pip install --target"; exit 1; }
say "ok: python -m stepscope runs the command of a pip install --target"
