"""Print the packages whose pinned version differs between two requirement
files (``name==version`` lines, as uv writes a lock), and how many moved.

    python3 scripts/pin_changes.py OLD NEW

A file that does not exist counts as pinning nothing. Used by
scripts/lock.sh (what an update moved) and scripts/newest.sh (the drift of
the newest releases from the lock).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PIN = re.compile(r"([A-Za-z0-9_.-]+)==(\S+)")


def pins(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = PIN.match(line)
        if m:
            found[m.group(1).lower()] = m.group(2)
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    old, new = pins(Path(argv[0])), pins(Path(argv[1]))
    moved = [n for n in sorted(old.keys() | new.keys()) if old.get(n) != new.get(n)]
    for name in moved:
        print(f"  {name:<32} {old.get(name, '-'):>16} -> {new.get(name, '-')}")
    print(f"  {len(moved)} moved, {len(new)} pinned")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
