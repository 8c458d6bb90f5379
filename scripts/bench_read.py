#!/usr/bin/env python3
"""Peak RSS and throughput of `stepscope analyze --from-traces` on traces of three sizes.

- the real 35 MB Kineto trace in cli/tests/data/hta;
- a ~3 GB trace: that trace's events written over and over into one traceEvents array
  (gzip-compressed, as workers write them);
- a directory of 64 ranks of ~100 MB of JSON each (one ~105 MB trace, hard-linked 64 times);
- `stepscope diff` of two ~1 GB traces (the real trace's events 29 and 30 times over).

Each is timed as a whole process (`/usr/bin/time`: wall, CPU, max RSS); MB/s is JSON bytes
over wall time and over CPU time (per core). The synthetic traces go to a temporary directory
removed at exit. Usage: scripts/bench_read.py [--skip-big]. Not part of `make test`.
"""

import gzip
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "cli/tests/data/hta/trace_diff__control__control.json.gz")
BIN = os.path.join(ROOT, "target/release/stepscope")


def events_text(path):
    """The text between the traceEvents array's brackets, and the rest of the document."""
    doc = gzip.open(path).read().decode()
    start = doc.index("[", doc.index('"traceEvents"')) + 1
    # Kineto ends the array with "]" followed by the closing keys or "}".
    end = doc.rindex("]")
    return doc[:start], doc[start:end].strip().rstrip(","), doc[end:]


def write_repeated(path, times, level=1):
    head, body, tail = events_text(TRACE)
    with gzip.open(path, "wt", compresslevel=level) as f:
        f.write(head)
        for i in range(times):
            if i:
                f.write(",\n")
            f.write(body)
        f.write(tail)


def json_bytes(path):
    n = 0
    with gzip.open(path) as f:
        while chunk := f.read(1 << 24):
            n += len(chunk)
    return n


def run(args, command=("analyze", "--json", "--from-traces")):
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%e %U %S %M", BIN, *command, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    wall, user, sys_, rss = out.stderr.strip().splitlines()[-1].split()
    return float(wall), float(user) + float(sys_), int(rss) / 1024


def report(name, paths, size, command=("analyze", "--json", "--from-traces")):
    best = min((run(paths, command) for _ in range(3 if size < 1e9 else 1)), key=lambda r: r[0])
    wall, cpu, rss = best
    print(
        f"{name:<34} {size / 1e6:>9.0f} MB JSON  wall {wall:>7.2f} s  "
        f"{size / 1e6 / wall:>6.0f} MB/s  per core {size / 1e6 / cpu:>5.0f} MB/s  "
        f"peak RSS {rss:>6.1f} MB",
        flush=True,
    )


def main():
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "stepscope-cli"], cwd=ROOT, check=True)
    report("35 MB real trace", [TRACE], json_bytes(TRACE))
    if "--skip-big" in sys.argv:
        return
    tmp = tempfile.mkdtemp(prefix="stepscope-bench-read-")
    try:
        ranks = os.path.join(tmp, "ranks")
        os.mkdir(ranks)
        one = os.path.join(tmp, "one_rank.json.gz")
        write_repeated(one, 3)
        for r in range(64):
            os.link(one, os.path.join(ranks, f"trace_rank-{r}.json.gz"))
        report("64 ranks x ~100 MB (directory)", [ranks], 64 * json_bytes(one))
        before, after = os.path.join(tmp, "before.json.gz"), os.path.join(tmp, "after.json.gz")
        print("writing two ~1 GB traces…", file=sys.stderr, flush=True)
        write_repeated(before, 29)
        write_repeated(after, 30)
        size = json_bytes(before) + json_bytes(after)
        report("diff of two ~1 GB traces", [before, after], size, ("diff", "--json"))
        os.unlink(before)
        os.unlink(after)
        big = os.path.join(tmp, "big.json.gz")
        print("writing the ~3 GB trace (a minute or two)…", file=sys.stderr, flush=True)
        write_repeated(big, 86)
        report("~3 GB trace (one file)", [big], json_bytes(big))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
