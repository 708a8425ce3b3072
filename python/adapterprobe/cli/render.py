"""Print scan records as a table, JSON, CSV or Markdown; the shared output
and threshold options of ``scan`` and ``check``.

The table is plain text laid out for the width it gets (80 columns when
stdout is not a terminal, e.g. a CI log): one header line per record and
its message wrapped beneath, then one summary line per store and the final
summary on its own line. Colour only on a terminal (``NO_COLOR`` turns it
off). JSON and CSV stream batch by batch; the table and Markdown wait for
the whole scan.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import IO, Any

from adapterprobe.probes.options import RULE_SETS
from adapterprobe.probes.result import Verdict
from adapterprobe.records import (
    FAIL_ON,
    ScanRecord,
    ScanReport,
    json_chunks,
    natural_key,
    verdict_exit_code,
    write_csv,
)

FORMATS = ("table", "json", "csv", "markdown")
VERDICT_NAMES = tuple(v.value for v in Verdict)
COLOURS = {
    Verdict.ERROR: "\x1b[1;35m",
    Verdict.FAIL: "\x1b[1;31m",
    Verdict.WARN: "\x1b[33m",
    Verdict.SKIP: "\x1b[2m",
    Verdict.PASS: "\x1b[32m",
}
RESET = "\x1b[0m"


def verdict_list(text: str) -> frozenset[str]:
    """`--only warn,fail`: a comma-separated set of verdicts."""
    names = frozenset(n.strip().lower() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(VERDICT_NAMES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(VERDICT_NAMES)}, got {text!r}"
        )
    return names


def add_output_options(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    out.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="table (default on a terminal), json (default otherwise; full messages and "
        "evidence), csv, or markdown (a summary for CI step summaries and PR comments)",
    )
    out.add_argument(
        "--only",
        type=verdict_list,
        default=None,
        metavar="V[,V...]",
        help="show only records with these verdicts, e.g. --only warn,fail,error "
        "(the exit code still counts every record)",
    )
    gate = p.add_argument_group("verdicts")
    gate.add_argument(
        "--rules",
        choices=RULE_SETS,
        default=None,
        help="verdict rules: robust (default; no false alarms on healthy runs, for CI gates) "
        "or sway (dlm-sway's exact heuristics)",
    )
    gate.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=None,
        help="exit 1 when any verdict is this bad or worse; error always counts (default: fail)",
    )
    gate.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PROBE.OPTION=VALUE",
        help="override a threshold, e.g. --set training_drift.spike_z=7 (repeatable; see "
        "'Thresholds' below)",
    )
    gate.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML file with the settings ([tool.adapterprobe] or top-level keys); "
        "default: [tool.adapterprobe] of ./pyproject.toml when present",
    )


def _short(path: str | None, base: str) -> str:
    """A path relative to `base` when inside it; the last component when it
    is `base` itself (a store checked alone is named, not shown as '.')."""
    if path is None:
        return "-"
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        return path
    if rel in (".", ""):
        return os.path.basename(os.path.normpath(path)) or path
    return path if rel.startswith("..") else rel


def _base(stores: Sequence[str]) -> str:
    unique = sorted(set(stores))
    if not unique:
        return ""
    base = os.path.commonpath(unique)
    if base in unique and len(unique) > 1:
        base = os.path.dirname(base)
    return base


class TableWriter:
    """Plain-text records for a given width (see the module doc)."""

    def __init__(self, out: IO[str], width: int, colour: bool) -> None:
        self.out = out
        self.width = max(40, width)
        self.colour = colour

    def _verdict(self, v: Verdict, text: str | None = None) -> str:
        label = (text or v.value.upper()).ljust(5)
        return f"{COLOURS[v]}{label}{RESET}" if self.colour else label

    def records(self, records: Sequence[ScanRecord]) -> None:
        base = _base([r.store for r in records])
        ordered = sorted(
            records,
            key=lambda r: (-r.verdict.severity, r.store, natural_key(r.adapter or ""), r.probe),
        )
        indent = " " * 7
        for r in ordered:
            where = _short(r.store, base)
            if r.adapter:
                where += f" / {_short(r.adapter, r.store)}"
            score = "" if r.score is None else f"  {r.score:.2f}"
            head = f"{r.probe:<15} {where}{score}"
            room = self.width - 7
            if len(head) > room:
                head = head[: room - 1] + "…"
            self.out.write(f"{self._verdict(r.verdict)}  {head}\n")
            for line in textwrap.wrap(r.message, self.width - len(indent)) or [""]:
                self.out.write(f"{indent}{line}\n")

    def store_lines(self, records: Sequence[ScanRecord]) -> None:
        by_store: dict[str, list[ScanRecord]] = defaultdict(list)
        for r in records:
            by_store[r.store].append(r)
        if len(by_store) < 2:
            return
        base = _base(list(by_store))
        self.out.write("\nper store:\n")
        rows = sorted(
            by_store.items(),
            key=lambda kv: (-max(r.verdict.severity for r in kv[1]), kv[0]),
        )
        for store, recs in rows:
            worst = max((r.verdict for r in recs), key=lambda v: v.severity)
            counts = Counter(r.verdict.value for r in recs)
            parts = ", ".join(f"{counts[v]} {v}" for v in VERDICT_NAMES if counts[v])
            layout = recs[0].layout
            line = f"{_short(store, base)}  ({layout}: {parts})"
            room = self.width - 7
            if len(line) > room:
                line = "…" + line[-(room - 1) :]
            self.out.write(f"{self._verdict(worst)}  {line}\n")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def summary_line(report: ScanReport, shown: int, fail_on: str, width: int = 80) -> str:
    """The final summary: counts per verdict and the exit code with its
    reason, wrapped to `width`."""
    counts = report.counts()
    stores = len({r.store for r in report})
    parts = ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "nothing found"
    code = report.exit_code(fail_on)
    reason = {
        0: f"nothing reached --fail-on {fail_on}",
        1: f"a verdict reached --fail-on {fail_on}",
        3: "nothing found",
    }.get(code, "")
    hidden = f" ({len(report) - shown} hidden by --only)" if shown < len(report) else ""
    text = (
        f"{_plural(len(report), 'record')} from {_plural(stores, 'store')}: {parts}{hidden}. "
        f"Exit {code}: {reason}."
    )
    return "\n".join(textwrap.wrap(text, max(40, width)))


def print_batches(
    batches: Iterable[list[ScanRecord]],
    problems: list[tuple[str, str]],
    fmt: str | None,
    fail_on: str,
    *,
    only: frozenset[str] | None = None,
    settings: dict[str, Any] | None = None,
    before_output: Any = None,
) -> int:
    """Write records to stdout (JSON and CSV as batches arrive; the table
    and Markdown once the scan is done, after `before_output()` has cleared
    the progress bar). Problems go to stderr. Returns the exit code."""
    out = sys.stdout
    fmt = fmt or ("table" if out.isatty() else "json")

    def shown(records: Iterable[ScanRecord]) -> list[ScanRecord]:
        return [r for r in records if only is None or r.verdict.value in only]

    if fmt in ("table", "markdown"):
        report = ScanReport((r for batch in batches for r in batch), problems, settings)
        if before_output:
            before_output()
        visible = shown(report)
        if fmt == "markdown":
            from adapterprobe.reports.markdown import render_markdown

            out.write(render_markdown(report.to_dicts(), settings=settings, show=only))
        else:
            width = shutil.get_terminal_size((80, 24)).columns if out.isatty() else 80
            colour = out.isatty() and "NO_COLOR" not in os.environ
            writer = TableWriter(out, width, colour)
            writer.records(visible)
            writer.store_lines(visible)
            out.write("\n" + summary_line(report, len(visible), fail_on, width) + "\n")
        code = report.exit_code(fail_on)
    else:
        code, first = 0, True
        for batch in batches:
            code = max(code, verdict_exit_code(batch, fail_on))
            batch = shown(batch)
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
        if before_output:
            before_output()
    out.flush()
    for path, message in problems:
        print(f"adapterprobe: not searched: {path}: {message}", file=sys.stderr)
    return code
