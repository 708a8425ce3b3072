"""``adapterprobe similar ROOT``: near-duplicate adapters across a store."""

from __future__ import annotations

import argparse
import json
import sys

from adapterprobe.cli import non_negative_int

EPILOG = """\
examples:
  adapterprobe similar /data/adapters
  adapterprobe similar /data/adapters --threshold 0.95 --format json

Every pair of adapters under ROOT with the same target modules and shapes
whose updates have an energy-weighted cosine at or above the threshold. Each
adapter is read once into a small sketch; the pairs the sketch cannot rule
out are computed exactly (--exhaustive: every pair exactly). The
--max-pairs most similar pairs are listed, and every pair found is counted.
A run's checkpoints (checkpoint-N/, a dlm store's versions/) are near-copies
of its final adapter: one adapter per run is compared, the final one or else
the newest checkpoint (--all-checkpoints compares every one).
Exit 0 either way; 3 when no adapter was found.
"""


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [-1, 1], got {value}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "similar",
        help="find near-duplicate adapters under a root",
        description="Find adapters whose updates are (almost) the same.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("root", metavar="ROOT", help="directory to search for adapters")
    p.add_argument(
        "--threshold",
        type=_threshold,
        default=0.99,
        help="cosine at or above which a pair is reported (default 0.99)",
    )
    p.add_argument("--exhaustive", action="store_true", help="compute every pair exactly (slow)")
    p.add_argument(
        "--max-pairs",
        type=non_negative_int,
        default=10_000,
        metavar="N",
        help="list at most the N most similar pairs; the others are counted (default 10000)",
    )
    p.add_argument(
        "--all-checkpoints",
        action="store_true",
        help="compare every checkpoint of a run too (default: one adapter per run)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from adapterprobe.cli import EXIT_NOTHING_FOUND
    from adapterprobe.comparison import similar
    from adapterprobe.escape import terminal as safe_text

    found = similar(
        args.root,
        threshold=args.threshold,
        exhaustive=args.exhaustive,
        max_pairs=args.max_pairs,
        all_checkpoints=args.all_checkpoints,
    )
    nothing = found["adapters"] == 0 and not found["skipped"]
    if args.format == "json":
        sys.stdout.write(json.dumps(found["pairs"], indent=2) + "\n")
    elif not nothing:  # "0 pairs among 0 adapters" says nothing the line below does not
        if found["pairs"]:
            print(f"{'similarity':<10}  adapter A  adapter B")
        for p in found["pairs"]:
            print(f"{p['similarity']:<10.6f}  {safe_text(p['a'])}  {safe_text(p['b'])}")
        print(
            f"{len(found['pairs'])} pairs at or above {args.threshold} among "
            f"{found['adapters']} adapters ({found['pairs_exact']} of "
            f"{found['pairs_considered']} pairs computed exactly)",
            file=sys.stderr,
        )
    if found["pairs_found"] > len(found["pairs"]):
        print(
            f"adapterprobe: {found['pairs_found']} pairs are at or above {args.threshold}; "
            f"the {len(found['pairs'])} most similar are listed (--max-pairs)",
            file=sys.stderr,
        )
    if found["left_out"]:
        print(
            f"adapterprobe: {found['left_out']} checkpoints left out, one adapter per run "
            "(--all-checkpoints compares them too)",
            file=sys.stderr,
        )
    for s in found["skipped"]:
        print(
            f"adapterprobe: skipped {safe_text(s['path'])}: {safe_text(s['reason'])}",
            file=sys.stderr,
        )
    if nothing:
        print(f"adapterprobe: no adapters found under {safe_text(args.root)}", file=sys.stderr)
        return EXIT_NOTHING_FOUND
    return 0
