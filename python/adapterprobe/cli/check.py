"""``adapterprobe check``: the health of one store or one adapter version."""

from __future__ import annotations

import argparse
import sys

from adapterprobe.cli import EXIT_NOTHING_FOUND, positive_int
from adapterprobe.cli.render import add_output_options
from adapterprobe.cli.scan import add_probe_option, run_scan
from adapterprobe.errors import UsageError

EPILOG = """\
examples:
  adapterprobe check /data/adapters/support-bot                       a dlm store
  adapterprobe check /data/adapters/support-bot/adapter/versions/v0003  one dlm version
  adapterprobe check out/checkpoint-500                               one HF Trainer checkpoint
                                          (its adapters, optimizer state and trainer_state.json)
  adapterprobe check ./store --format json --fail-on warn

Exit codes as for `adapterprobe scan` (0 ok, 1 a verdict reached --fail-on,
2 usage: PATH missing or not a directory, 3 nothing to probe in PATH).
"""

# Names whose presence makes a directory something `check` can probe.
MARKERS = (
    "adapter",
    "logs",
    "adapter_model.safetensors",
    "adapter_config.json",
    "training_state.pt",
    "optimizer.pt",
    "trainer_state.json",
    "checkpoints",
    "metrics.csv",
    "runs",
)
#: What a TensorBoard event file's name starts with (a log-only run).
EVENTS_PREFIX = "events.out.tfevents."


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="probe one store or one adapter version",
        description="Probe one store (its loss curve and newest adapter versions), one "
        "adapter version directory, one HF Trainer checkpoint (its adapters, its optimizer "
        "state and the loss curve in its trainer_state.json), or a folder of TensorBoard "
        "event files.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", metavar="PATH", help="a store, an adapter version or a checkpoint")
    add_output_options(p)
    add_probe_option(p)
    p.add_argument("--all-versions", action="store_true", help="probe every version of the store")
    p.add_argument(
        "--workers", type=positive_int, default=None, metavar="N", help=argparse.SUPPRESS
    )
    p.set_defaults(run=run, engine="local", address=None)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    path = Path(args.path).expanduser()
    if not path.exists():
        raise UsageError("no such file or directory", path=path)
    if not path.is_dir():
        raise UsageError("is not a directory", path=path)
    looks_probeable = any((path / m).exists() for m in MARKERS) or any(
        p.name.startswith(("checkpoint-", EVENTS_PREFIX)) or p.suffix == ".ckpt"
        for p in path.iterdir()
    )
    if not looks_probeable:
        # Nothing to probe is exit 3, as for `scan`; usage errors (2) are for
        # paths that are missing or not directories.
        from adapterprobe.cli.scan import nothing_found
        from adapterprobe.escape import terminal
        from adapterprobe.scan import discover

        below = len(discover(path).targets)
        if not below:
            return nothing_found([str(path)], [], args)
        stores = f"{below} store{'s' if below != 1 else ''}"
        print(
            f"adapterprobe check: {terminal(str(path))} is not a store or an adapter version "
            f"itself but holds {stores} below it: `adapterprobe scan {terminal(str(path))}` "
            "checks them all",
            file=sys.stderr,
        )
        return EXIT_NOTHING_FOUND
    return run_scan([str(path)], args)
