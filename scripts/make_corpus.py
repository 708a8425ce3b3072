"""Write the labelled corpus of real training runs (``tools/realruns/corpus.py``).

Every run really trains a tiny LoRA adapter on the CPU; faults are made by
training going wrong, never by editing files. The corpus is built in a
temporary directory beside OUT and renamed into place, so OUT is either the
old corpus or the complete new one.

    python scripts/make_corpus.py OUT                      # every run
    python scripts/make_corpus.py OUT --only dead-adapter  # a subset

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
from realruns import corpus

LABELS_FILE = "labels.json"


def generate(out: Path, names: list[str]) -> None:
    """Write the runs ``names`` into a fresh directory, then swap it in for ``out``.

    ``out`` is only replaced when it is absent or holds nothing but corpus
    stores and ``labels.json``, so a mistyped OUT cannot wipe unrelated files.
    """
    if out.exists():
        known = {*corpus.LABELS, LABELS_FILE}
        unexpected = sorted(p.name for p in out.iterdir() if p.name not in known)
        if unexpected:
            raise AdapterProbeError(
                f"{out} holds files that are not corpus stores ({', '.join(unexpected)}); "
                "refusing to replace it"
            )
    began = time.perf_counter()
    _preload()
    print(f"{'(imports)':<26} {time.perf_counter() - began:5.1f} s", flush=True)
    with atomic_dir(out, overwrite=True) as fresh:
        fresh.chmod(0o755)  # as mkdir would make it (mkdtemp makes 0700)
        for name in names:
            start = time.perf_counter()
            corpus.write_corpus(fresh, names=[name])
            took = time.perf_counter() - start
            print(f"{name:<26} {took:5.1f} s  {_summary(fresh / name)}", flush=True)
    total = time.perf_counter() - began
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len(names)} runs in {out}: {size / 1024:.0f} KiB, trained in {total:.1f} s")


def _preload() -> None:
    """Import the training stack up front so the per-run timings are the training's own."""
    import peft  # noqa: F401
    import transformers

    transformers.LlamaForCausalLM  # noqa: B018 (resolves the lazy module)


def _summary(store: Path) -> str:
    info = corpus.summarize(store)
    return (
        f"{info['label']:<24} steps={info['steps']:<4} "
        f"loss {info['first_loss']:.3f} -> {info['last_loss']:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, metavar="OUT", help="destination directory")
    parser.add_argument(
        "--only",
        nargs="+",
        action="extend",
        choices=list(corpus.LABELS),
        metavar="NAME",
        help="write only these runs (default: all)",
    )
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(args.only)) if args.only else list(corpus.LABELS)
    # transformers/peft deprecation chatter says nothing about the runs.
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        generate(args.out.resolve(), names)
    except AdapterProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
