"""``adapterprobe extract``: pull a LoRA adapter out of a full fine-tune."""

from __future__ import annotations

import argparse
import json
import sys

from adapterprobe.cli import positive_int

_DESCRIPTION = """\
Extract a PEFT LoRA adapter from the difference between a base checkpoint and a
fully fine-tuned one, so that the fine-tune can be shipped, stacked or swapped as
an adapter. Needs torch: pip install torch safetensors.

What goes into the adapter:
  Linear weights   each changed weight's delta is factored with a randomized
                   truncated SVD into a LoRA pair; its rank is the smallest that
                   keeps --explained-variance of the delta's energy, clamped to
                   [--min-rank, --max-rank] (equal bounds give a fixed rank).
  norms, biases    changed 1-D tensors are saved whole (--no-save-1d leaves
                   them out).
  embeddings       embeddings and output heads are large: left out unless
                   --embeddings save (a tied output head is saved with them).

The report shows, per category, how much of the fine-tune's delta energy the
adapter carries; --verify also loads the adapter with PEFT and measures how much
of the tuned model's logit change it recovers on random token batches.
Checkpoints are read tensor by tensor, so models larger than memory work; the
output directory appears atomically and is never an input or inside one.
"""

_EPILOG = """\
examples:
  adapterprobe extract --base base/ --tuned tuned/ --out lora/
  adapterprobe extract --base base/ --tuned tuned/ --out lora/ --embeddings save --verify
  adapterprobe extract --base base/ --tuned tuned/ --out lora/ --min-rank 32 --max-rank 32
  adapterprobe extract --base b.safetensors --tuned t.safetensors --out lora/ --device cuda

exit status: 0 written, 1 the checkpoints cannot be extracted (shapes differ,
non-finite values, malformed files), 2 bad arguments or paths.
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
    io = p.add_argument_group("checkpoints and output")
    io.add_argument(
        "--base",
        required=True,
        metavar="PATH",
        help="base checkpoint: a .safetensors file, or a directory with model.safetensors "
        "or a sharded model.safetensors.index.json",
    )
    io.add_argument(
        "--tuned", required=True, metavar="PATH", help="fine-tuned checkpoint, same layout"
    )
    io.add_argument("--out", required=True, metavar="DIR", help="PEFT adapter directory to write")
    io.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")

    rank = p.add_argument_group("rank of the LoRA factors")
    rank.add_argument(
        "--min-rank", type=positive_int, default=8, metavar="R", help="smallest rank (default 8)"
    )
    rank.add_argument(
        "--max-rank", type=positive_int, default=64, metavar="R", help="largest rank (default 64)"
    )
    # the spellings of earlier releases, kept working but not advertised
    rank.add_argument(
        "--rank-min",
        dest="min_rank",
        type=positive_int,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    rank.add_argument(
        "--rank-max",
        dest="max_rank",
        type=positive_int,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    rank.add_argument(
        "--explained-variance",
        type=_fraction,
        default=0.95,
        metavar="F",
        help="share of each delta's energy the rank must keep (default 0.95; 1 keeps all)",
    )

    what = p.add_argument_group("what goes into the adapter")
    what.add_argument(
        "--embeddings",
        choices=["skip", "save"],
        default="skip",
        help="embeddings and output heads: leave them out (default) or save the changed ones "
        "whole as modules_to_save",
    )
    what.add_argument(
        "--no-save-1d",
        dest="save_1d",
        action="store_false",
        help="leave changed norm weights and biases out (by default they are saved whole)",
    )
    what.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="only modules matching (repeatable; 'q_proj' matches '*.q_proj')",
    )
    what.add_argument(
        "--exclude", action="append", metavar="GLOB", help="skip modules matching (repeatable)"
    )
    what.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16", "base"],
        help="dtype of the saved factors (default float32; 'base': the base weight's)",
    )

    run_group = p.add_argument_group("checking and running")
    run_group.add_argument(
        "--verify",
        nargs="?",
        const=4,
        type=positive_int,
        metavar="N",
        help="load the adapter with PEFT and measure, on N random token batches (default 4), "
        "the share of the tuned model's logit change it recovers (needs transformers "
        "checkpoint directories with config.json, and peft)",
    )
    run_group.add_argument(
        "--device", default=None, help="where the SVDs run (default: cuda when available)"
    )
    run_group.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    run_group.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from adapterprobe.errors import UsageError, require

    require("torch", "torch")
    from adapterprobe.lora.extract import extract_lora

    if args.min_rank > args.max_rank:
        raise UsageError(f"--min-rank {args.min_rank} is larger than --max-rank {args.max_rank}")

    kwargs = dict(
        min_rank=args.min_rank,
        max_rank=args.max_rank,
        explained_variance=args.explained_variance,
        device=args.device,
        dtype=args.dtype,
        include=args.include,
        exclude=args.exclude,
        embeddings=args.embeddings,
        overwrite=args.overwrite,
        save_1d=args.save_1d,
        verify=args.verify or False,
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
    from adapterprobe.escape import terminal

    for warning in report.warnings:  # on stderr too, where --json leaves it unseen
        print(f"adapterprobe extract: warning: {terminal(warning)}", file=sys.stderr)
    return 0
