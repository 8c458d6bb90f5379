"""``merge_profiles``: once every rank's traces of a profile are on disk, the streaming
``stepscope merge`` in a child process, off the scheduler thread."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("stepscope.sglang")

#: The ``stepscope`` executable for ``merge_profiles`` (default: the one installed with this
#: package, else on ``PATH``).
CLI_ENV = "STEPSCOPE_CLI"


def merge_when_written(
    output_dir: Path,
    profile: str,
    profile_id: str,
    profilers: list[Any],
    expected: int,
    *,
    poll: float = 0.2,
) -> Path | None:
    """Waits (off the scheduler thread) for this rank's traces, then for ``expected`` complete
    manifests of the profile in the output directory (every rank's; up to the flush timeout),
    then runs ``stepscope merge`` on their traces into ``merged-{profile_id}.trace.json.gz``, in a
    child process. Returns the merged file, or None (logged) when it could not be made."""
    import stepscope

    timeout = max(
        (p.flush_timeout_s for p in profilers), default=stepscope.DEFAULT_FLUSH_TIMEOUT_S
    )
    for p in profilers:
        p.flush(timeout)

    prefix = str(output_dir / glob.escape(profile + "-"))
    pattern = prefix + "*" + stepscope.MANIFEST_SUFFIX
    deadline = time.monotonic() + timeout
    while True:
        manifests = [(p, _read_manifest(p)) for p in sorted(glob.glob(pattern))]
        done = [(p, m) for p, m in manifests if m is not None and m.get("status") != "writing"]
        if len(done) >= expected and len(done) == len(manifests):
            break
        if time.monotonic() > deadline:
            logger.warning(
                "stepscope: merge_profiles: %d of %d traces of %s complete after %.0f s; "
                "merging those",
                len(done),
                expected,
                profile_id,
                timeout,
            )
            break
        time.sleep(poll)
    traces = []
    for path, m in done:
        if m.get("status") != "complete":
            continue
        try:
            # Beside its manifest, under either name (a tool may have renamed both).
            traces.append(str(stepscope.manifest_trace_path(path)))
        except OSError as e:
            logger.error("stepscope: merge_profiles: %s", e)
    from stepscope._cli import executable

    cli = os.environ.get(CLI_ENV) or executable() or shutil.which("stepscope")
    if not traces:
        logger.error(
            "stepscope: merge_profiles: no complete trace of %s to merge",
            profile_id,
        )
        return None
    if cli is None:
        logger.error(
            "stepscope: merge_profiles needs the stepscope command (this package carries none: "
            "set %s=/path/to/stepscope); the %d traces are in %s, unmerged",
            CLI_ENV,
            len(traces),
            output_dir,
        )
        return None
    out = output_dir / f"merged-{profile_id}.trace.json.gz"
    # Written under a hidden name and renamed, so the merged name only holds a whole trace.
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial.gz")
    run = subprocess.run(
        [cli, "merge", *traces, "--output", str(partial)],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        partial.unlink(missing_ok=True)
        logger.error("stepscope: merge_profiles: stepscope merge failed: %s", run.stderr.strip())
        return None
    os.replace(partial, out)
    logger.info("stepscope: merged %d traces of %s into %s", len(traces), profile_id, out)
    return out


def _read_manifest(path: str) -> dict[str, Any] | None:
    import stepscope

    try:
        return stepscope.read_manifest(path)
    except (OSError, ValueError):
        return None  # removed, or not a manifest: read again at the next poll
