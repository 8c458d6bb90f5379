#!/usr/bin/env bash
# The source distribution builds against whatever torch is installed: `maturin sdist`, then
# `pip install --no-build-isolation` into a scratch environment holding only torch (2.14.0, from
# uv's cache after setup) and maturin; the install must carry Kineto glue for that torch, and a
# torch capture from Python must write a trace. Everything is made under a temporary directory,
# removed at the end. Usage: scripts/check_sdist.sh UV
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${1:?usage: check_sdist.sh UV}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { printf 'check_sdist: %s\n' "$*" >&2; }

say "building the sdist"
"$(dirname "$uv")/maturin" sdist --out "$work/dist" >/dev/null
"$uv" venv --quiet --python "$(command -v python3)" "$work/venv"
"$uv" pip install --quiet --python "$work/venv/bin/python" torch==2.14.0 maturin==1.16.0
say "installing it with --no-build-isolation over torch 2.14.0 (compiles the crate: 1-3 min fresh)"
# The build must find torch through the target environment alone, not this project's .venv.
# What it checks is the glue an sdist build makes, not the code's optimization: a debug build
# (MATURIN_PEP517_ARGS) in a target directory of its own that later runs reuse (target/sdist;
# pip's is a new temporary each time, which recompiled every dependency in release mode).
env -u VIRTUAL_ENV -u LIBTORCH_USE_PYTORCH PATH="$work/venv/bin:$PATH" \
  CARGO_TARGET_DIR="$PWD/target/sdist" MATURIN_PEP517_ARGS="--profile dev" \
  "$uv" pip install --quiet --python "$work/venv/bin/python" --no-build-isolation --no-deps \
  "$work"/dist/stepscope-*.tar.gz
"$work/venv/bin/python" - "$work/traces" <<'PY'
import glob, sys
import torch
import stepscope

glue = stepscope.kineto_glue()
assert glue["built_for"].startswith("2.14."), glue
assert "/site-packages/stepscope/_glue/" in glue["path"], glue
p = stepscope.WorkerProfiler({"profiler": "torch", "torch_profiler_dir": sys.argv[1]}, "sdist")
p.start()
p.step()
torch.mm(torch.ones(8, 8), torch.ones(8, 8))
p.step_end()
p.stop()
assert p.flush(120)
traces = glob.glob(sys.argv[1] + "/sdist.*.pt.trace.json.gz")
assert len(traces) == 1, traces
print(f"check_sdist: ok: glue {glue['path']} (torch {torch.__version__}), trace {traces[0]}")
PY
