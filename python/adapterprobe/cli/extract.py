"""``adapterprobe extract``: pull a LoRA adapter out of a full fine-tune."""

from __future__ import annotations

import argparse
import json
import sys

from adapterprobe.cli import positive_int

_DESCRIPTION = """\
Extract a PEFT LoRA adapter from the difference between a base and a fully
fine-tuned checkpoint. Each changed Linear weight delta is factored with a
randomized truncated SVD; its rank is the smallest that keeps
--explained-variance of the delta's energy, clamped to [--rank-min, --rank-max]
(equal bounds give a fixed rank). Checkpoints are read tensor by tensor, so
models larger than memory work. Needs torch: pip install 'adapterprobe[torch]'.
"""

_EPILOG = """\
examples:
  adapterprobe extract --base base/ --tuned tuned/ --out lora/
  adapterprobe extract --base base/ --tuned tuned/ --out lora/ --rank-min 32 --rank-max 32
  adapterprobe extract --base b.safetensors --tuned t.safetensors --out lora/ --device cuda
"""


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0.0 < value <= 1.0):
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "extract",
        help="extract a LoRA adapter from a full fine-tune (needs torch)",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--base",
        required=True,
        metavar="PATH",
        help="base checkpoint: .safetensors file or dir (model.safetensors or sharded index)",
    )
    p.add_argument(
        "--tuned", required=True, metavar="PATH", help="fine-tuned checkpoint, same layout"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="PEFT adapter directory to write")
    p.add_argument(
        "--rank-min", type=positive_int, default=8, metavar="R", help="smallest rank (default 8)"
    )
    p.add_argument(
        "--rank-max", type=positive_int, default=64, metavar="R", help="largest rank (default 64)"
    )
    p.add_argument(
        "--explained-variance",
        type=_fraction,
        default=0.95,
        metavar="F",
        help="share of each delta's energy to keep (default 0.95)",
    )
    p.add_argument(
        "--device", default=None, help="where the SVDs run (default: cuda when available)"
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16", "base"],
        help="dtype of the saved factors (default float32; 'base': the base weight's)",
    )
    p.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="only modules matching (repeatable; 'q_proj' matches '*.q_proj')",
    )
    p.add_argument(
        "--exclude", action="append", metavar="GLOB", help="skip modules matching (repeatable)"
    )
    p.add_argument(
        "--embeddings",
        choices=["skip", "save"],
        default="skip",
        help="embeddings/lm_head: skip them, or save changed ones whole as modules_to_save",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from adapterprobe.errors import UsageError, require

    require("torch", "torch")
    from adapterprobe.lora.extract import extract_lora

    if args.rank_min > args.rank_max:
        raise UsageError(f"--rank-min {args.rank_min} is larger than --rank-max {args.rank_max}")

    kwargs = dict(
        min_rank=args.rank_min,
        max_rank=args.rank_max,
        explained_variance=args.explained_variance,
        device=args.device,
        dtype=args.dtype,
        include=args.include,
        exclude=args.exclude,
        embeddings=args.embeddings,
        overwrite=args.overwrite,
    )
    if args.no_progress:
        report = extract_lora(args.base, args.tuned, args.out, **kwargs)
    else:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        bar = Progress(
            TextColumn("[bold]extract[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}", markup=False),
            console=Console(stderr=True),
        )
        task = bar.add_task("", total=None)
        started = False

        def progress(name: str, done: int, total: int) -> None:
            nonlocal started
            if not started:  # only once the inputs have been validated
                bar.start()
                started = True
            bar.update(task, completed=done, total=total, description=name)

        try:
            report = extract_lora(args.base, args.tuned, args.out, progress=progress, **kwargs)
            bar.update(task, description="done")
        finally:
            if started:
                bar.stop()
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.summary())
    return 0
