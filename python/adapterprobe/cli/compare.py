"""``adapterprobe compare A B [C ...]``: runs, checkpoints or adapters side by side."""

from __future__ import annotations

import argparse
import sys

EPILOG = """\
examples:
  adapterprobe compare out-seed0/ out-seed1/
  adapterprobe compare run/checkpoint-20 run/checkpoint-60 --format json
  adapterprobe compare a/ b/ c/ --format html -o compare.html

Each path is an adapter directory (or its .safetensors), an HF Trainer output
or checkpoint, or a store adapterprobe scans (its newest adapter and its logs).
Shown: best/final/eval loss and where they were reached, the step at which the
highest best loss was first reached, rank, rank used and ‖ΔW‖ of each adapter,
and the cosine of the updates per module and over all shared modules (energy-
weighted), with the principal angles between their column spaces. Modules of
other names or shapes are left out and listed.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare runs or adapters (loss curves, update similarity)",
        description="Compare two or more runs, checkpoints or adapters.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="two or more runs or adapters")
    p.add_argument(
        "--format",
        choices=("table", "markdown", "json", "html"),
        default="table",
        help="output format (default: table)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--no-angles", action="store_true", help="skip the principal angles")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from adapterprobe._fs import atomic_write_text
    from adapterprobe.comparison import compare
    from adapterprobe.errors import UsageError

    if len(args.paths) < 2:
        raise UsageError("compare needs at least two paths")
    result = compare(*args.paths, angles=not args.no_angles)
    text = {
        "table": result.to_table,
        "markdown": result.to_markdown,
        "json": lambda: result.to_json() + "\n",
        "html": result.to_html,
    }[args.format]()
    if args.output:
        path = atomic_write_text(args.output, text)
        print(f"adapterprobe: wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
