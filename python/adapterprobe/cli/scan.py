"""``adapterprobe scan``: the health of every adapter and run under some roots."""

from __future__ import annotations

import argparse
import sys

from adapterprobe.cli import positive_int
from adapterprobe.cli.render import add_output_options, print_batches

EPILOG = """\
examples:
  adapterprobe scan                          the bundled demo store
  adapterprobe scan /data/adapters           every store below /data/adapters
  adapterprobe scan a/ b/ --format json      JSON records for two roots
  adapterprobe scan /data --fail-on warn     exit 1 on any warning (for CI)
  adapterprobe scan /data --all-versions     every version, not just current.txt
  adapterprobe scan /data --format csv > health.csv

A store is a directory with adapter/ and/or logs/ (dlm layout). Each store
gets one training_drift record (its loss curve) and each probed adapter
version one gradient_ghost record (its optimizer state). Exit codes: 0 no
verdict reached --fail-on, 1 one did, 2 usage error (e.g. a missing root).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan",
        help="probe every store under one or more roots",
        description="Probe every adapter store under the given roots, in parallel, "
        "without loading any model or importing torch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "roots",
        nargs="*",
        metavar="ROOT",
        help="store, adapter version dir, or any directory holding stores "
        "(default: the bundled demo store)",
    )
    add_output_options(p)
    add_scan_options(p)
    p.set_defaults(run=run)


def probe_list(text: str) -> tuple[str, ...]:
    """`--probes a,b`: a comma-separated subset of the probes."""
    from adapterprobe.probes import PROBES

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PROBES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(PROBES)}, got {text!r}"
        )
    return names


def add_scan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--probes",
        type=probe_list,
        default=None,
        metavar="P[,P...]",
        help="probes to run (default: all): adapter_weights, gradient_ghost, training_drift",
    )
    p.add_argument(
        "--all-versions",
        action="store_true",
        help="probe every versions/vNNNN, not only the one current.txt names",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="threads to read with (default: one per core)",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local threads (default) or a Ray cluster (pip install 'adapterprobe[ray]')",
    )
    p.add_argument(
        "--address", default=None, metavar="ADDR", help="Ray cluster to join (with --engine ray)"
    )


def run_scan(roots: list[str], args: argparse.Namespace) -> int:
    from adapterprobe.probes import PROBES, resolve_options
    from adapterprobe.records import EXIT_NOTHING_FOUND
    from adapterprobe.scan import LAYOUTS, discover, scan_batches

    probes = args.probes or tuple(PROBES)
    resolve_options(probes, None, args.rules)  # bad options fail before the walk
    targets, problems = discover(*roots, all_versions=args.all_versions, workers=args.workers)
    if not targets:
        for path, message in problems:
            print(f"adapterprobe: not searched: {path}: {message}", file=sys.stderr)
        print(
            f"adapterprobe: nothing to probe under {', '.join(roots)}: looked for {LAYOUTS}",
            file=sys.stderr,
        )
        if args.format == "json" or (args.format is None and not sys.stdout.isatty()):
            print("[]")
        return EXIT_NOTHING_FOUND
    with _progress_bar() as progress:
        batches = scan_batches(
            targets,
            workers=args.workers,
            probes=probes,
            engine=args.engine,
            address=args.address,
            rules=args.rules,
            progress=progress,
        )
        return print_batches(batches, problems, args.format, args.fail_on)


def run(args: argparse.Namespace) -> int:
    roots = args.roots
    if not roots:
        from adapterprobe.scan import DEMO_STORE

        print(
            f"adapterprobe: no ROOT given, scanning the bundled demo store {DEMO_STORE}",
            file=sys.stderr,
        )
        roots = [str(DEMO_STORE)]
    return run_scan(roots, args)


class _progress_bar:
    """A rich progress bar on stderr, shown only on a terminal and for big scans."""

    MIN_STORES = 200

    def __enter__(self):
        self._bar = None
        return self.update

    def update(self, done: int, total: int) -> None:
        if self._bar is None:
            if total < self.MIN_STORES or not sys.stderr.isatty():
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("scanning stores", total=total)
        self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
