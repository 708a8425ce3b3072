"""``adapterprobe extract``: pull a LoRA adapter out of a full fine-tune."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("extract", help="extract a LoRA adapter from a full fine-tune (needs torch)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("extract is being built")
