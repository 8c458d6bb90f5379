# Sourced by the HTA benches: sets $venv to .bench-venv/, a venv with Holistic Trace Analysis
# 0.5.0 from the package registry, made the first time.
venv=.bench-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import hta" 2>/dev/null; then
  echo "bench: creating $venv with holistictraceanalysis 0.5.0 (once)…" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check holistictraceanalysis==0.5.0
fi
