"""The Kineto glue: the one part of stepscope built per torch version.

libtorch's C++ ABI changes between torch minor versions, so ``"profiler": "torch"`` reaches
Kineto through a small shared library built against one torch, ``libstepscope_kineto-torch
{X}.{Y}.so``. The wheel carries one per supported torch; stepscope loads the one matching the
torch in the process at the first torch capture. Everything else (``import stepscope``, the
schedule, NVTX, the CUDA backend) does not depend on torch at all.

For another torch (one the wheel carries no glue for), build it where that torch is installed::

    python -m stepscope.glue build      # needs g++ and torch's headers (in every torch wheel)
    python -m stepscope.glue list       # what is found, and for which torch

The compiler is ``$CXX``, then ``g++`` on PATH if ``$CXX`` fails (a toolchain whose static
libstdc++ clashes with torch's cannot link the glue), or ``--cxx`` alone.
``build`` writes into the package when it is writable, else into ``~/.cache/stepscope/glue``
(``$XDG_CACHE_HOME``); both are searched. ``STEPSCOPE_KINETO_GLUE_DIR`` (``:``-separated)
replaces those two directories; ``STEPSCOPE_KINETO_GLUE`` names one glue file and overrides
the search.

This file also runs as a plain script (the Python extension's build runs it to build the glue
for the torch it is built with)::

    python python/stepscope/glue.py build --src cpp --out python/stepscope/_glue
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# Where the wheel's glue files live, with the C++ sources they were built from under src/.
PACKAGE_GLUE_DIR = PACKAGE_DIR / "_glue"
SOURCES = ("kineto.cc", "kineto_writer.h", "stepscope_kineto.h")
_NAME = re.compile(r"^libstepscope_kineto-torch(\d+)\.(\d+)\.so$")


def glue_name(torch_version: str) -> str:
    """The glue file for a torch version (``"2.13.0+cu130"`` -> ``…-torch2.13.so``)."""
    major, minor = _minor(torch_version)
    return f"libstepscope_kineto-torch{major}.{minor}.so"


def _minor(torch_version: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", torch_version)
    if m is None:
        raise ValueError(f"not a torch version: {torch_version!r}")
    return int(m.group(1)), int(m.group(2))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepscope" / "glue"


def default_dirs() -> list[Path]:
    """The directories searched unless ``STEPSCOPE_KINETO_GLUE_DIR`` is set."""
    return [PACKAGE_GLUE_DIR, cache_dir()]


def search_dirs() -> list[Path]:
    """Where glue files are looked for, in order (the native loader's list)."""
    env = [Path(d) for d in os.environ.get("STEPSCOPE_KINETO_GLUE_DIR", "").split(":") if d]
    return env or default_dirs()


def found() -> list[tuple[str, Path]]:
    """``(torch minor version, path)`` of every glue file in the search directories."""
    out = []
    for d in search_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            m = _NAME.match(p.name)
            if m:
                out.append((f"{m.group(1)}.{m.group(2)}", p))
    return out


def _source_dir(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else [PACKAGE_GLUE_DIR / "src", PACKAGE_DIR.parent.parent / "cpp"]
    for d in candidates:
        if all((d / f).is_file() for f in SOURCES):
            return d
    raise SystemExit(
        "stepscope.glue: the glue's C++ sources (" + ", ".join(SOURCES) + ") are not in "
        + " or ".join(str(d) for d in candidates)
    )


def _default_out() -> Path:
    try:
        PACKAGE_GLUE_DIR.mkdir(exist_ok=True)
        probe = PACKAGE_GLUE_DIR / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        return PACKAGE_GLUE_DIR
    except OSError:
        return cache_dir()


def _torch_at(torch_dir: str | None) -> tuple[str, Path, int]:
    """(version, package directory, _GLIBCXX_USE_CXX11_ABI) of the torch to build for: the one
    importable here, or an unpacked torch package at ``torch_dir`` (not imported: a CUDA torch
    built for another machine, say), read from its version.py; its C++ ABI from
    ``$STEPSCOPE_GLUE_CXX11_ABI`` (default 1, every torch wheel since 2.7)."""
    if torch_dir is None:
        import torch

        return torch.__version__, Path(torch.__file__).resolve().parent, int(torch._C._GLIBCXX_USE_CXX11_ABI)
    root = Path(torch_dir).resolve()
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", (root / "version.py").read_text(), re.M)
    if m is None:
        raise SystemExit(f"stepscope.glue: no __version__ in {root / 'version.py'}")
    return m.group(1), root, int(os.environ.get("STEPSCOPE_GLUE_CXX11_ABI", "1"))


def _includes(root: Path) -> list[Path]:
    """The header directories of the torch package at ``root`` that the glue includes."""
    include = root / "include"
    return [include, include / "torch/csrc/api/include", include / "kineto"]


def cxx_flags(root: Path, abi: int) -> list[str]:
    """What a translation unit of the glue's sources is compiled with against the torch
    package at ``root`` of C++ ABI ``abi`` (`_torch_at`): the language, the ABI, torch's
    headers. The glue's build adds its own (a shared, optimized library); a test of the
    sources compiles with these too."""
    return [
        "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DGLOG_USE_GLOG_EXPORT",
        *(f for d in _includes(root) for f in ("-isystem", str(d))),
    ]  # fmt: skip


def build(
    src: str | None = None,
    out: str | None = None,
    cxx: str | None = None,
    force: bool = False,
    torch_dir: str | None = None,
) -> Path:
    """Compiles the glue against the torch importable here (or the torch package directory
    ``torch_dir``); returns the file written. Skips the work when the file is newer than its
    sources (unless ``force``)."""
    version, root, abi = _torch_at(torch_dir)
    src_dir = _source_dir(src)
    out_dir = Path(out) if out else _default_out()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / glue_name(version)
    sources = [src_dir / f for f in SOURCES]
    if (
        not force
        and target.is_file()
        and target.stat().st_mtime >= max(s.stat().st_mtime for s in sources)
    ):
        print(f"stepscope.glue: {target} is up to date (torch {version})")
        return target
    lib = root / "lib"
    for d in (*_includes(root), lib):
        if not d.is_dir():
            raise SystemExit(f"stepscope.glue: torch {version} at {root} has no {d.name}/ ({d})")
    compilers = _compilers(cxx)
    # Written under a temporary name, renamed when complete: a process loading the glue never
    # sees half a file.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=out_dir)
    os.close(fd)
    flags = [
        "-shared", "-fPIC", "-O2", "-fvisibility=hidden", *cxx_flags(root, abi),
        str(src_dir / "kineto.cc"), "-o", tmp,
        # No libtorch at link time (no DT_NEEDED, no rpath): the glue takes torch's symbols
        # from the torch already loaded in the process, whose libtorch_cpu and libc10 the
        # loader makes visible before it loads the glue (src/backend/torch/kineto.rs). So the
        # wheel needs no libtorch and passes auditwheel as manylinux.
        "-Wl,--as-needed",
    ]  # fmt: skip
    print(f"stepscope.glue: building {target.name} for torch {version} (10-60 s)", flush=True)
    began = time.monotonic()
    failures = []
    for compiler in compilers:
        cmd = [*compiler, *flags]
        try:
            subprocess.run(cmd, check=True)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except (subprocess.CalledProcessError, OSError) as e:
            failures.append(f"{e}; command: {shlex.join(cmd)}")
            if compiler != compilers[-1]:
                # A toolchain whose static libstdc++ clashes with torch's (seen: /opt/gcc on a
                # GPU machine) fails to link; the system's g++ links the same sources.
                print(f"stepscope.glue: {shlex.join(compiler)} failed; trying {shlex.join(compilers[-1])}",
                      flush=True)  # fmt: skip
            continue
        print(f"stepscope.glue: wrote {target} with {shlex.join(compiler)} in {time.monotonic() - began:.0f} s")
        return target
    Path(tmp).unlink(missing_ok=True)
    raise SystemExit("stepscope.glue: the build failed: " + " | ".join(failures))


def _compilers(cxx: str | None) -> list[list[str]]:
    """The C++ compilers to try, in order, each a command (``"ccache g++"`` is two words): the
    one named (``--cxx``) alone; else ``$CXX``, then ``g++`` on PATH when ``$CXX`` is another
    (the fallback when ``$CXX`` cannot link the glue). A ``$CXX`` not found is said, then
    skipped."""
    if cxx:
        cmd = shlex.split(cxx)
        if not cmd or shutil.which(cmd[0]) is None:
            raise SystemExit(f"stepscope.glue: --cxx {cxx!r}: {cmd[0] if cmd else cxx!r} is not on PATH")
        return [cmd]
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()  # each command once: the compiler's real path, its words
    env = os.environ.get("CXX")
    for text in (env, "g++"):
        cmd = shlex.split(text) if text else []
        path = shutil.which(cmd[0]) if cmd else None
        if path is None:
            if text == env and text:
                print(f"stepscope.glue: $CXX={env!r}: {cmd[0]!r} is not on PATH; using g++", flush=True)
            continue
        key = (os.path.realpath(path), *cmd[1:])
        if key not in seen:
            seen.add(key)
            found.append(cmd)
    if not found:
        raise SystemExit(f"stepscope.glue: no C++ compiler on PATH ($CXX={env!r}, no g++)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stepscope.glue",
        description="Build or list stepscope's Kineto glue (the per-torch-version part of the "
        "torch backend). See the module docs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the glue for the torch importable here")
    b.add_argument("--out", help="directory to write to (default: the package, else ~/.cache/stepscope/glue)")
    b.add_argument("--src", help="directory holding the glue's C++ sources (SOURCES; default: the package's)")
    b.add_argument(
        "--cxx", help="C++ compiler, alone (default: $CXX, then g++ if $CXX fails; else g++)"
    )
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.add_argument("--torch-dir", help="build for the torch package unpacked here instead of the importable one")
    sub.add_parser("list", help="list the glue files found and the torch each is for")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.src, args.out, args.cxx, args.force, args.torch_dir)
        return 0
    rows = found()
    if not rows:
        print("no Kineto glue found in: " + ", ".join(str(d) for d in search_dirs()))
        return 1
    for version, path in rows:
        print(f"torch {version}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
