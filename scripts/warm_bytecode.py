"""Imports each module named on the command line, with bytecode writing on, so that Python
writes the .pyc of everything those imports load (and of nothing else) into its __pycache__.

scripts/setup.sh runs it once per test environment in place of compiling every file of
site-packages (`compileall`), of which the tests read about a third: each environment's entry
points (the modules its test processes and the servers they start import) are named there.
What an entry point does not load is compiled by the first test process that imports it, which
writes it too (scripts/pytest_envs.sh lets Python write bytecode: machines of this kind set
PYTHONDONTWRITEBYTECODE). A module that fails to import is named on stderr and skipped: the
tests will say what is wrong with it, and the others are still compiled.

    python scripts/warm_bytecode.py MODULE [MODULE ...]
"""

from __future__ import annotations

import importlib
import sys
import time
import warnings


def main(names: list[str]) -> int:
    sys.dont_write_bytecode = False
    warnings.filterwarnings("ignore")
    began = time.perf_counter()
    before = len(sys.modules)
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as e:  # an import may raise anything; ^C still stops
            first = str(e).splitlines()[0] if str(e) else ""
            failed.append(f"{name} ({type(e).__name__}: {first})")
    took = time.perf_counter() - began
    loaded = len(sys.modules) - before
    print(f"warm_bytecode: {loaded} modules loaded in {took:.1f} s", file=sys.stderr)
    for f in failed:
        print(f"warm_bytecode: not imported: {f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
