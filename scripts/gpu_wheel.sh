# Sourced by the GPU scripts (scripts/gpu_run.sh, scripts/gpu_serializer.sh) on a GPU machine
# with no Rust and no registry, from the repository's root, with dist/*.whl carried along:
# installs the wheel into a scratch directory on PYTHONPATH and builds the Kineto glue for the
# machine's torch from the wheel's sources (python -m stepscope.glue build: $CXX, then g++),
# its output in "$out/glue.txt". Needs $out; exits 3 or 4 when a step fails.
mkdir -p "$out"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" dist/stepscope-*.whl || exit 3
export PYTHONPATH=$site PYTHONUNBUFFERED=1
echo "CXX=${CXX:-} $(command -v g++)"
python3 -m stepscope.glue build >"$out/glue.txt" 2>&1 || { cat "$out/glue.txt"; echo "the glue build failed"; exit 4; }
tail -4 "$out/glue.txt"
