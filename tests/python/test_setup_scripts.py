"""What scripts/setup.sh relies on from its helpers, run as setup runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

WARM = Path(__file__).resolve().parents[2] / "scripts" / "warm_bytecode.py"


def test_warm_bytecode_writes_what_its_entries_load_and_nothing_else(tmp_path):
    """Where PYTHONDONTWRITEBYTECODE is set, as on machines of this kind (setup runs the script
    with it unset, but the script must not depend on that): the .pyc of each module an entry
    point loads is written, none of a module nothing loads, and a module that fails to import is
    named on stderr without stopping the others."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "entry.py").write_text("from pkg import loaded\n")
    (pkg / "loaded.py").write_text("X = 1\n")
    (pkg / "unused.py").write_text("X = 2\n")
    (pkg / "broken.py").write_text("raise RuntimeError('this module cannot load')\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    proc = subprocess.run(
        [sys.executable, str(WARM), "pkg.broken", "pkg.entry", "no_such_module"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    written = {p.name.split(".")[0] for p in (pkg / "__pycache__").glob("*.pyc")}
    # A module is compiled (and its bytecode written) before it runs: the broken one too.
    assert written == {"__init__", "entry", "loaded", "broken"}, written
    assert "not imported: pkg.broken (RuntimeError: this module cannot load)" in proc.stderr
    assert "not imported: no_such_module (ModuleNotFoundError" in proc.stderr
