"""The committed real-run fixtures the verdict tests judge: regenerate, check, swap in.

The verdict tests must fail only when the product changed, never because
today's torch trains a chaotic run (lr 30, a ReLU blow-up) to another end on
another CPU. So the labelled runs are trained once, here, and committed under
``tests/fixtures/realruns/``:

- ``corpus/``: every run of :mod:`realruns.corpus` (dlm stores);
- ``field/``: ``FIELD_SUBSET`` of :mod:`realruns.field` (Trainer output dirs);
- ``MANIFEST.json``: the environment that trained them and every file's SHA-256.

Regenerating is deliberate::

    python tools/realruns/fixtures.py            # train, check the physics, swap in
    python tools/realruns/fixtures.py --check    # train and check only; keep the old ones

Both modes train into a staging folder, then run the physics tests
(``tests/test_corpus.py`` and ``tests/test_field_corpus.py``) on it; only a
staging folder whose labels hold physically replaces the committed one.
Afterwards the script prints which files were added, removed or changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "realruns"
MANIFEST = "MANIFEST.json"
PHYSICS_TESTS = ("tests/test_corpus.py", "tests/test_field_corpus.py")
#: Set to "fresh" (train in the session) or a folder holding corpus/ and field/;
#: unset, the tests read FIXTURES.
SOURCE_ENV = "ADAPTERPROBE_REALRUNS"
#: The packages whose numerics decide what a run trains to.
TRAINING_STACK = ("torch", "transformers", "peft", "safetensors", "numpy")


#: The field runs the tests judge: every fault class, the layouts (LoRA, full,
#: resumed) and the healthy traps (small-batch noise, RL losses, a 0.0 loss).
FIELD_SUBSET = (
    "lora-b2-log1",
    "full-b2-log1",
    "lora-resumed-b8-log1",
    "rl-reinforce-b8-log1",
    "lora-prompt-only-rows-b2-log1",
    "lr-too-high-full-adam1-log1",
    "nan-empty-batch-b2-log1",
    "nan-empty-batch-nofilter-log1",
    "nan-logged-weights-fine-nofilter",
    "frozen-lora-b-b8-log5",
    "overfit-full-32seq-eval20",
    "dead-relu-sgd-log1",
    "no-progress-full-lr1e-9-b4-log1",
    "no-progress-lr-horizon-log10",
    "too-few-steps-full-log1",
    "too-few-steps-lora-log10",
)


#: The two parts, each a folder of FIXTURES.
PARTS = ("corpus", "field")


def write_part(part: str, root: Path, *, progress: bool = False) -> None:
    """Train one part into the folder ``root``: "corpus" (every run of
    :mod:`realruns.corpus`) or "field" (``FIELD_SUBSET`` of :mod:`realruns.field`)."""
    if part == "corpus":
        from realruns.corpus import write_corpus

        write_corpus(root)
    elif part == "field":
        from realruns.field import write_field_corpus

        write_field_corpus(root, FIELD_SUBSET, progress=progress)
    else:
        raise ValueError(f"no fixture part named {part!r} (known: {', '.join(PARTS)})")


def write_all(out: Path) -> None:
    """Train every part into the empty folder ``out``, saying how long each took."""
    for part in PARTS:
        began = time.perf_counter()
        write_part(part, out / part, progress=True)
        print(f"{part} trained in {time.perf_counter() - began:.0f} s", flush=True)


def file_hashes(root: Path) -> dict[str, str]:
    """``relative posix path -> sha256`` of every file under ``root`` but the manifest."""
    hashes = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            hashes[path.relative_to(root).as_posix()] = hashlib.sha256(
                path.read_bytes()
            ).hexdigest()
    return hashes


def environment() -> dict[str, Any]:
    """What trained the runs: the training stack's versions and the CPU."""
    versions = {}
    for name in TRAINING_STACK:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "packages": versions,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_manifest(root: Path) -> dict[str, Any]:
    manifest = {
        "generator": "python tools/realruns/fixtures.py",
        "environment": environment(),
        "files": file_hashes(root),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def check_physics(root: Path) -> int:
    """Run the physics tests on the runs under ``root``; pytest's exit code."""
    env = {**os.environ, SOURCE_ENV: str(root)}
    command = [sys.executable, "-m", "pytest", *PHYSICS_TESTS, "-q", "-p", "no:cacheprovider"]
    print("checking the physics: " + " ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def describe_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Lines naming the files added, removed and changed between two manifests."""
    lines = []
    for what, names in (
        ("added", sorted(new.keys() - old.keys())),
        ("removed", sorted(old.keys() - new.keys())),
        ("changed", sorted(k for k in new.keys() & old.keys() if new[k] != old[k])),
    ):
        lines.append(f"{what}: {len(names)} file(s)")
        lines.extend(f"  {name}" for name in names[:40])
        if len(names) > 40:
            lines.append(f"  ... and {len(names) - 40} more")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/realruns/fixtures.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="train and check the physics, but keep the committed fixtures",
    )
    parser.add_argument("--out", type=Path, default=FIXTURES, help="default: %(default)s")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".realruns-", dir=out.parent))
    try:
        write_all(staging)
        manifest = write_manifest(staging)
        if check_physics(staging) != 0:
            print("the physics tests failed on the fresh runs; fixtures left as they were")
            return 1
        old_path = out / MANIFEST
        old = json.loads(old_path.read_text())["files"] if old_path.exists() else {}
        print("\n".join(describe_changes(old, manifest["files"])))
        if args.check:
            print("--check: the committed fixtures were left as they were")
            return 0
        retired = out.with_name(out.name + ".old")
        if out.exists():
            os.rename(out, retired)
        os.rename(staging, out)
        shutil.rmtree(retired, ignore_errors=True)
        out.chmod(0o755)
        print(f"fixtures written to {out} ({len(manifest['files'])} files)")
        return 0
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tools"))
    sys.exit(main())
