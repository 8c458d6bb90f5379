"""The ``stepscope`` command (analyze, merge, report, ctl) this package installs: a native
executable the wheel carries as data, which the installer puts among the environment's scripts
(``bin/stepscope``), so that ``stepscope`` on PATH is the executable itself. ``python -m
stepscope`` runs the same file, found here through the package's installed files (its RECORD),
wherever the installer put the scripts (a venv, ``--user``, ``--prefix``, ``--target``:
:func:`executable`).
``import stepscope`` never loads this module."""

from __future__ import annotations

import os
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

#: The distribution whose RECORD lists the executable.
DISTRIBUTION = "stepscope"


def executable() -> str | None:
    """The ``stepscope`` executable this installation carries, or None when it carries none (a
    development install made without `make cli-bin`, or a build from the source distribution).

    Where RECORD says it is, else beside the package where ``pip install --target`` moves it
    (``{target}/bin/``: RECORD keeps the path from before the move), else among this
    interpreter's scripts; a file is taken only when its size is the one RECORD gives, so that
    another installation's ``stepscope`` is never run in its place."""
    try:
        files = metadata.distribution(DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        return None
    entries = [
        f
        for f in files
        if f.name == "stepscope" and f.parent.name in ("bin", "scripts")
    ]
    if not entries:
        return None
    sizes = {f.size for f in entries if f.size}
    candidates = [Path(str(f.locate())) for f in entries]
    candidates.append(Path(__file__).resolve().parent.parent / "bin" / "stepscope")
    candidates.append(Path(sysconfig.get_path("scripts")) / "stepscope")
    for path in candidates:
        try:
            ok = path.is_file() and os.access(path, os.X_OK)
            ok = ok and (not sizes or path.stat().st_size in sizes)
        except OSError:
            continue
        if ok:
            return str(path.resolve())
    return None


def main(argv: list[str] | None = None) -> int:
    """Runs the command in this process's place (its exit status, signals and terminal are
    the caller's); returns only when it cannot be run."""
    args = sys.argv[1:] if argv is None else argv
    exe = executable()
    if exe is None:
        print(
            "stepscope: this installation carries no stepscope command (a development build "
            "without it, or one from the source distribution): `make wheel` builds a package "
            "with it, or `cargo build --release -p stepscope-cli` builds target/release/stepscope",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["stepscope", *args])
    return 2  # not reached: execv replaces the process or raises


if __name__ == "__main__":
    sys.exit(main())
