"""Print a ScanReport as a table, JSON or CSV, and shared scan options."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from adapterprobe.probes.options import RULE_SETS
from adapterprobe.probes.result import Verdict
from adapterprobe.records import FAIL_ON, ScanRecord, ScanReport, json_chunks, write_csv

STYLE = {
    Verdict.ERROR: "bold magenta",
    Verdict.FAIL: "bold red",
    Verdict.WARN: "yellow",
    Verdict.SKIP: "dim",
    Verdict.PASS: "green",
}


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("table", "json", "csv"),
        default=None,
        help="output format (default: table on a terminal, json otherwise)",
    )
    p.add_argument(
        "--rules",
        choices=RULE_SETS,
        default="robust",
        help="verdict rules: robust (default; 0 false alarms on healthy runs, for CI gates) "
        "or sway (dlm-sway's exact heuristics)",
    )
    p.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default="fail",
        help="exit 1 when any verdict is this bad or worse; error always counts (default: fail)",
    )


def _short(path: str | None, base: str) -> str:
    if path is None:
        return "-"
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def print_batches(
    batches: Iterable[list[ScanRecord]],
    problems: list[tuple[str, str]],
    fmt: str | None,
    fail_on: str,
) -> int:
    """Write records to stdout as batches arrive (JSON and CSV stream; the
    table, sorted worst first, waits for all). Problems go to stderr.
    Returns the exit code."""
    fmt = fmt or ("table" if sys.stdout.isatty() else "json")
    out = sys.stdout
    seen = ScanReport([], problems)
    if fmt == "table":
        report = ScanReport((r for batch in batches for r in batch), problems)
        _print_table(report, fail_on)
        code = report.exit_code(fail_on)
    else:
        code, first = 0, True
        for batch in batches:
            seen.records = batch
            code = max(code, seen.exit_code(fail_on))
            if fmt == "json":
                out.writelines(json_chunks(batch, first=first, last=False))
            else:
                write_csv(out, batch, header=first)
            first = False
            out.flush()
        if fmt == "json":
            out.write("[\n]\n" if first else "\n]\n")
        elif first:
            write_csv(out, [], header=True)
    for path, message in problems:
        print(f"adapterprobe: not searched: {path}: {message}", file=sys.stderr)
    return code


def _print_table(report: ScanReport, fail_on: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    stores = [r.store for r in report]
    base = os.path.commonpath(stores) if stores else ""
    if base in stores and len(set(stores)) > 1:
        base = str(Path(base).parent)
    table = Table(show_lines=False, header_style="bold", expand=False)
    table.add_column("verdict", no_wrap=True)
    table.add_column("probe", no_wrap=True)
    table.add_column("store", no_wrap=True)
    table.add_column("adapter", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("message", overflow="fold", ratio=1)
    ordered = sorted(report, key=lambda r: (-r.verdict.severity, r.store, r.adapter or ""))
    for r in ordered:
        table.add_row(
            f"[{STYLE[r.verdict]}]{r.verdict.value.upper()}[/]",
            r.probe,
            _short(r.store, base),
            _short(r.adapter, r.store),
            "-" if r.score is None else f"{r.score:.2f}",
            r.message,
        )
    console.print(table)
    counts = report.counts()
    parts = [f"[{STYLE[Verdict(v)]}]{n} {v}[/]" for v, n in counts.items() if n]
    stores_n = len(set(stores))
    code = report.exit_code(fail_on)
    console.print(
        f"{len(report)} records from {stores_n} stores: "
        + ", ".join(parts or ["nothing found"])
        + f"  (exit {code}, --fail-on {fail_on})"
    )
