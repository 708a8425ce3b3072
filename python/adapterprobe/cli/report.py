"""``adapterprobe report``: a scan as one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from adapterprobe.cli.render import add_gate_options, print_problems
from adapterprobe.cli.scan import add_scan_options, nothing_found, scan_records

EPILOG = """\
examples:
  adapterprobe report /data/adapters -o health.html
  adapterprobe report out/ -o run.html --all-versions --fail-on warn
  adapterprobe report /data -o health.html --junit junit.xml

The page needs no network (no CDN, inline SVG plots): the loss curve of every
problem store with its trend, spikes and NaN steps marked, per adapter the
layer bars of the optimizer state and of the weights, the verdict reasons and
the settings used. Healthy stores are folded; big scans are paged, and only
the stores that get plots keep their curves in memory while the scan runs.
The file is written atomically with the usual permissions (0666 minus the
umask); a missing directory is made when the one above it exists. Exit codes
as for `adapterprobe scan`.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML report of a scan (plots, offline)",
        description="Scan the roots and write a self-contained HTML report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("roots", nargs="*", metavar="ROOT", help="as for scan (default: the demo)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    p.add_argument(
        "--from",
        dest="from_scan",
        metavar="SCAN_JSON",
        help="re-render a saved `scan --format json` instead of scanning",
    )
    add_gate_options(p)
    add_scan_options(p)
    p.set_defaults(run=run, format=None)


def run(args: argparse.Namespace) -> int:
    from adapterprobe.cli.scan import default_roots, scan_settings
    from adapterprobe.escape import terminal
    from adapterprobe.probes import DEFAULT_PROBES
    from adapterprobe.records import ScanRecord, Tally
    from adapterprobe.reports.html import write_streamed_html
    from adapterprobe.reports.table import summary_text

    if args.from_scan:
        from adapterprobe.comparison.baseline import report_from_saved

        path, saved = report_from_saved(args.from_scan, args.output)
        print(f"adapterprobe: wrote {terminal(str(path))}", file=sys.stderr)
        return saved.exit_code(args.fail_on or "fail")
    settings = scan_settings(args)
    roots = default_roots(args.roots, args)
    batches, problems, found, stop = scan_records(roots, args, settings)
    if not found:
        stop()
        return nothing_found(roots, problems, args)
    tally = Tally()
    junit = None
    if args.junit is not None:
        from adapterprobe.reports.junit import JUnitWriter

        junit = JUnitWriter(args.junit, args.fail_on)

    def counted() -> Iterator[list[ScanRecord]]:
        for batch in batches:
            for r in batch:
                tally.add(r)
            if junit is not None:
                junit.add(batch)
            yield batch

    page_settings: dict[str, Any] = settings.to_dict(args.probes or DEFAULT_PROBES)
    try:
        path, _ = write_streamed_html(args.output, counted(), settings=page_settings)
    finally:
        stop()
    if junit is not None:
        junit.write()
    print(f"adapterprobe: wrote {terminal(str(path))}", file=sys.stderr)
    print(summary_text(tally, args.fail_on), file=sys.stderr)
    print_problems(problems)
    return tally.exit_code(args.fail_on)
