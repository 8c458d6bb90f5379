#!/usr/bin/env bash
# Regenerates HTA 0.5.0's own figures for the step explanation's differential test
# (cli/tests/data/hta/reference/*.hta.json, read by cli/tests/explain_hta.rs): HTA in its own
# venv (.bench-venv/, scripts/hta_venv.sh), run by scripts/hta_reference.py on each GPU trace.
# Usage: scripts/hta_reference.sh [TRACE.json.gz ...]   (default: the GPU traces of
# cli/tests/data/hta). Not part of `make test`, which reads the committed output.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/hta_venv.sh
if [ $# -eq 0 ]; then
  set -- $(ls cli/tests/data/hta/*.json.gz | grep -v cpu_only)
fi
"$venv/bin/python" scripts/hta_reference.py cli/tests/data/hta/reference "$@"
