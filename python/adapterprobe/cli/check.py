"""``adapterprobe check``: the health of one store or one adapter version."""

from __future__ import annotations

import argparse

from adapterprobe.cli import positive_int
from adapterprobe.cli.render import add_output_options
from adapterprobe.cli.scan import probe_list, run_scan
from adapterprobe.errors import UsageError

EPILOG = """\
examples:
  adapterprobe check /data/adapters/support-bot
  adapterprobe check /data/adapters/support-bot/adapter/versions/v0003
  adapterprobe check ./store --format json --fail-on warn
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="probe one store or one adapter version",
        description="Probe one store (its loss curve and current adapter versions) "
        "or one adapter version directory.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", metavar="PATH", help="a store or an adapter version directory")
    add_output_options(p)
    p.add_argument("--all-versions", action="store_true", help="probe every version of the store")
    p.add_argument(
        "--probes",
        type=probe_list,
        default=None,
        metavar="P[,P...]",
        help="probes to run (default: all): adapter_weights, gradient_ghost, training_drift",
    )
    p.add_argument(
        "--workers", type=positive_int, default=None, metavar="N", help=argparse.SUPPRESS
    )
    p.set_defaults(run=run, engine="local", address=None)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"no such file or directory: {path}")
    looks_like_store = (path / "adapter").is_dir() or (path / "logs").is_dir()
    looks_like_version = (path / "adapter_model.safetensors").is_file() or (
        path / "training_state.pt"
    ).is_file()
    if not (looks_like_store or looks_like_version):
        raise UsageError(
            f"{path} is neither a store (adapter/ or logs/ inside) nor an adapter version "
            "directory; use `adapterprobe scan` to search a tree"
        )
    return run_scan([str(path)], args)
