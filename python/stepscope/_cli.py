"""The ``stepscope`` command (analyze, merge, report, ctl) shipped inside this package: a
native executable at ``stepscope/_bin/stepscope``, run by the ``stepscope`` console script and
by ``python -m stepscope``. ``import stepscope`` never loads this module."""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The packaged executable.
BINARY = Path(__file__).resolve().parent / "_bin" / "stepscope"


def executable() -> str | None:
    """The packaged ``stepscope`` executable, or None when this package carries none (a
    development install built without it)."""
    return str(BINARY) if os.access(BINARY, os.X_OK) else None


def main(argv: list[str] | None = None) -> int:
    """Runs the command in this process's place (its exit status, signals and terminal are
    the caller's); returns only when it cannot be run."""
    args = sys.argv[1:] if argv is None else argv
    exe = executable()
    if exe is None:
        print(
            "stepscope: this installation carries no stepscope command (a development build "
            f"without it: {BINARY} is missing); `make wheel` builds a package with it, or "
            "`cargo build --release -p stepscope-cli` builds target/release/stepscope",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["stepscope", *args])
    return 2  # not reached: execv replaces the process or raises


if __name__ == "__main__":
    sys.exit(main())
