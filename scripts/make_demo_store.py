"""Regenerate the demo stores bundled with adapterprobe (``adapterprobe/demo_store``).

Each store comes from really training a tiny LoRA adapter (see
``tools/realruns/dlm.py``), so ``adapterprobe scan`` can be shown on real dlm
output without the user needing torch. Output is deterministic for a given
seed and torch/transformers/peft version.

    python scripts/make_demo_store.py            # rewrite the bundled demo
    python scripts/make_demo_store.py --out DIR  # write elsewhere

Needs the ``peft`` extra (torch, transformers, peft, safetensors).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from adapterprobe._fs import atomic_dir
from adapterprobe.errors import AdapterProbeError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from realruns import dlm as storegen

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "python" / "adapterprobe" / "demo_store"


def generate(out: Path, *, seed: int) -> None:
    """Write every demo store into a fresh directory, then swap it in for ``out``.

    ``out`` is only replaced when it is absent or holds nothing but demo
    stores, so a mistyped ``--out`` cannot wipe unrelated files.
    """
    if out.exists():
        unexpected = sorted(p.name for p in out.iterdir() if p.name not in storegen.DEMO_STORES)
        if unexpected:
            raise AdapterProbeError(
                f"{out} holds files that are not demo stores ({', '.join(unexpected)}); "
                "refusing to replace it"
            )
    with atomic_dir(out, overwrite=True) as fresh:
        for directory, scenario in storegen.DEMO_STORES.items():
            began = time.perf_counter()
            storegen.write_store(fresh / directory, scenario, seed=seed)
            took = time.perf_counter() - began
            print(f"{directory:<14} ({scenario}) written in {took:.1f} s")
        _make_world_readable(fresh)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"demo stores in {out}: {size / 1024:.0f} KiB")


def _make_world_readable(root: Path) -> None:
    """The stores ship in the wheel: safetensors writes its files 0600, which a
    system-wide install would leave unreadable to other users."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="destination directory")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    args = parser.parse_args(argv)
    # transformers/peft deprecation chatter says nothing about the stores.
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        generate(args.out.resolve(), seed=args.seed)
    except AdapterProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
