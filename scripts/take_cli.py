"""Takes the stepscope executable out of the binary wheel maturin built for the CLI (the one
wheel in DIR) into DEST, executable. Usage: python scripts/take_cli.py DIR DEST"""

import os
import sys
import zipfile
from pathlib import Path


def main() -> int:
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    wheels = sorted(src.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        print(f"take_cli: no wheel in {src}", file=sys.stderr)
        return 1
    with zipfile.ZipFile(wheels[-1]) as z:
        names = [n for n in z.namelist() if n.endswith(".data/scripts/stepscope")]
        if len(names) != 1:
            print(f"take_cli: {wheels[-1]} holds {names} (want one scripts/stepscope)", file=sys.stderr)
            return 1
        data = z.read(names[0])
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    os.replace(tmp, dest)
    print(f"take_cli: {dest} ({len(data) / 1e6:.1f} MB) from {wheels[-1].name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
