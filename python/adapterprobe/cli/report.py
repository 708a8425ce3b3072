"""``adapterprobe report``: a scan as one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys

from adapterprobe.cli.render import add_output_options, summary_line
from adapterprobe.cli.scan import add_scan_options, default_roots, nothing_found, scan_records

EPILOG = """\
examples:
  adapterprobe report /data/adapters -o health.html
  adapterprobe report out/ -o run.html --all-versions --fail-on warn

The page needs no network (no CDN, inline SVG plots): the loss curve of every
problem store with its trend, spikes and NaN steps marked, per adapter the
layer bars of the optimizer state and of the weights, the verdict reasons and
the settings used. Healthy stores are folded; big scans are paged. Exit codes
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
    add_output_options(p)
    add_scan_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from adapterprobe.cli.scan import scan_settings
    from adapterprobe.probes import DEFAULT_PROBES
    from adapterprobe.records import ScanReport

    roots = default_roots(args.roots, args)
    settings = scan_settings(args)
    batches, problems, found, stop = scan_records(roots, args, settings)
    if not found:
        stop()
        return nothing_found(roots, problems, args)
    report = ScanReport(
        (r for batch in batches for r in batch),
        problems,
        settings.to_dict(args.probes or DEFAULT_PROBES),
    )
    stop()
    path = report.to_html(args.output)
    print(f"adapterprobe: wrote {path}", file=sys.stderr)
    print(summary_line(report, len(report), args.fail_on), file=sys.stderr)
    for where, message in problems:
        print(f"adapterprobe: not searched: {where}: {message}", file=sys.stderr)
    return report.exit_code(args.fail_on)
