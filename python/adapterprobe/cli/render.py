"""Write scan records in the format the place wants; the shared output and
threshold options of ``scan``, ``check`` and ``report``.

The human table is the default wherever stdout goes, a terminal or a CI log
(``--format json``/``--json`` or ``jsonl`` for a program); with
``GITHUB_ACTIONS=true`` the table comes with ``::error``/``::warning``
annotations and a Markdown summary appended to ``$GITHUB_STEP_SUMMARY``.
Every format streams: JSON, JSON Lines and CSV as batches arrive, the table
and Markdown through bounded summaries (:mod:`adapterprobe.reports.table`,
:mod:`adapterprobe.reports.markdown`), so memory does not grow with the
records. ``-o FILE`` writes atomically; ``--junit FILE`` adds a JUnit XML
report. Colour only on a terminal (``NO_COLOR`` turns it off,
``FORCE_COLOR`` on).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from adapterprobe.probes.options import RULE_SETS
from adapterprobe.probes.result import Verdict
from adapterprobe.records import FAIL_ON, ScanRecord, Tally, json_chunks, write_csv

FORMATS = ("table", "json", "jsonl", "csv", "markdown", "github")
VERDICT_NAMES = tuple(v.value for v in Verdict)


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
    """--format/--json, -o, -q/-v, --only, --junit, then the verdict options."""
    out = p.add_argument_group("output")
    out.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="table (default, on a terminal and in CI logs alike), json (one array, full "
        "messages and evidence), jsonl (one record per line), csv, markdown (a summary for "
        "step summaries and PR comments), github (the table plus ::error/::warning "
        "annotations and the markdown summary appended to $GITHUB_STEP_SUMMARY; the default "
        "when GITHUB_ACTIONS=true)",
    )
    out.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="same as --format json",
    )
    out.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help="write to FILE instead of stdout, atomically (a killed scan leaves the old "
        "file or none, never a truncated one)",
    )
    loud = out.add_mutually_exclusive_group()
    loud.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="table: only warn/fail/error records, the stores that have them, and the summary",
    )
    loud.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="table: every record (skips too) with its evidence, and why directories "
        "were not searched",
    )
    out.add_argument(
        "--only",
        type=verdict_list,
        default=None,
        metavar="V[,V...]",
        help="show only records with these verdicts, e.g. --only warn,fail,error "
        "(the exit code still counts every record)",
    )
    add_gate_options(p)


def add_junit_option(p: argparse._ActionsContainer) -> None:
    p.add_argument(
        "--junit",
        default=None,
        metavar="FILE",
        help="also write a JUnit XML report (one testcase per record; records that reach "
        "--fail-on fail) for GitLab, Jenkins, Buildkite and test-report actions",
    )


def add_gate_options(p: argparse.ArgumentParser) -> None:
    """--rules, --fail-on, --allow-empty, --set, --config and --junit."""
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
        help="exit 1 when any verdict is this bad or worse, error included (default: fail); "
        "never turns the gate off: exit 0 whatever the verdicts, errors too",
    )
    gate.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0, not 3, when nothing to probe is found under the roots (a pre-commit "
        "hook in a repository with no runs committed yet)",
    )
    gate.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PROBE.OPTION=VALUE",
        help="override a threshold, e.g. --set training_drift.spike_z=7 (repeatable; "
        "`adapterprobe scan --help` lists where the options are described)",
    )
    gate.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML file with the settings ([tool.adapterprobe] or top-level keys); "
        "default: [tool.adapterprobe] of ./pyproject.toml when present",
    )
    add_junit_option(gate)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def use_colour(out: IO[str]) -> bool:
    """Colour on a terminal; ``FORCE_COLOR`` forces it (CI logs that render
    ANSI), ``NO_COLOR`` turns it off."""
    if _env_flag("FORCE_COLOR"):
        return True
    if "NO_COLOR" in os.environ:
        return False
    return out.isatty()


def table_width(out: IO[str]) -> int:
    """The terminal's width, ``COLUMNS`` when set, else 80 (a CI log)."""
    if out.isatty() or "COLUMNS" in os.environ:
        return shutil.get_terminal_size((80, 24)).columns
    return 80


def choose_format(fmt: str | None) -> str:
    """The format asked for; otherwise github inside GitHub Actions, else the table."""
    if fmt:
        return fmt
    return "github" if os.environ.get("GITHUB_ACTIONS") == "true" else "table"


class Output:
    """Where and how a scan's records are written (see the module doc)."""

    def __init__(
        self,
        fmt: str | None,
        fail_on: str,
        *,
        path: str | None = None,
        quiet: bool = False,
        verbose: bool = False,
        only: frozenset[str] | None = None,
        junit: str | None = None,
        settings: dict[str, Any] | None = None,
        regression_gate: bool = False,
    ) -> None:
        self.fmt = choose_format(fmt)
        #: ``--fail-on-regression``: every writer names the regressions and
        #: counts them in the exit code it states.
        self.regression_gate = regression_gate
        self.fail_on = fail_on
        self.path = path
        self.quiet, self.verbose, self.only = quiet, verbose, only
        self.junit = junit
        self.settings = settings

    def _shown(self, batch: list[ScanRecord]) -> list[ScanRecord]:
        only = self.only
        return batch if only is None else [r for r in batch if r.verdict.value in only]

    def write(
        self,
        batches: Iterable[list[ScanRecord]],
        before_output: Any = None,
    ) -> int:
        """Write every record; returns the exit code."""
        if self.path is None:
            return self._write_to(sys.stdout, batches, before_output)
        from adapterprobe._fs import atomic_output

        with atomic_output(self.path) as out:
            return self._write_to(out, batches, before_output)

    def _write_to(self, out: IO[str], batches: Iterable[list[ScanRecord]], done: Any) -> int:
        fmt = self.fmt
        tally = Tally(regression_gate=self.regression_gate)
        junit = None
        if self.junit is not None:
            from adapterprobe.reports.junit import JUnitWriter

            junit = JUnitWriter(self.junit, self.fail_on, regression_gate=self.regression_gate)
        table = summary = None
        if fmt in ("table", "github"):
            from adapterprobe.reports.table import TableStream

            to_file = self.path is not None
            table = TableStream(
                out,
                80 if to_file else table_width(out),
                False if to_file else use_colour(out),
                quiet=self.quiet,
                verbose=self.verbose,
                only=self.only,
                regression_gate=self.regression_gate,
            )
        # github's step summary is built only where the runner reads one.
        wants_summary = fmt == "markdown" or (
            fmt == "github" and bool(os.environ.get("GITHUB_STEP_SUMMARY"))
        )
        if wants_summary:
            from adapterprobe.reports.markdown import MarkdownSummary

            summary = MarkdownSummary(
                show=self.only, fail_on=self.fail_on, regression_gate=self.regression_gate
            )
        first = True
        for batch in batches:
            if junit is not None:
                junit.add(batch)
            if table is not None:
                table.add(batch)
            if summary is not None:
                summary.add(batch)
            if fmt == "github":
                from adapterprobe.reports.github import write_annotations

                write_annotations(out, self._shown(batch), regression_gate=self.regression_gate)
            elif fmt in ("json", "jsonl", "csv"):
                for r in batch:
                    tally.add(r)
                shown = self._shown(batch)
                if fmt == "json":
                    write_in_parts(out, json_chunks(shown, first=first, last=False))
                elif fmt == "jsonl":
                    write_in_parts(out, jsonl_pieces(shown))
                else:
                    write_csv(out, shown, header=first)
                out.flush()
            first = False
        if done:
            done()
        if fmt == "json":
            out.write("[\n]\n" if first else "\n]\n")
        elif fmt == "csv" and first:
            write_csv(out, [], header=True)
        if table is not None:
            code = table.finish(self.fail_on)
        elif summary is not None:
            out.write(summary.render(self.settings))
            code = summary.tally.exit_code(self.fail_on)
        else:
            code = tally.exit_code(self.fail_on)
        if fmt == "github" and summary is not None:
            from adapterprobe.reports.github import append_step_summary

            append_step_summary(summary.render(self.settings))
        if junit is not None:
            junit.write()
        out.flush()
        return code


#: Most characters joined into one write of JSON output. A write is dear
#: per call on a text stream, but a joined text past glibc's mmap threshold
#: (128 KiB) is mapped, faulted in and unmapped on each write, which cost
#: more than the calls it saved (a tenth of the sys time of a scan of small
#: stores).
WRITE_CHARS = 64 * 1024


def write_in_parts(out: IO[str], pieces: Iterable[str]) -> None:
    """Write text `pieces` in order, joined into writes of about
    :data:`WRITE_CHARS`."""
    part: list[str] = []
    size = 0
    for piece in pieces:
        part.append(piece)
        size += len(piece)
        if size >= WRITE_CHARS:
            out.write("".join(part))
            part.clear()
            size = 0
    if part:
        out.write("".join(part))


def jsonl_pieces(records: Iterable[ScanRecord]) -> Iterator[str]:
    """`records` as JSON lines, in pieces (see :func:`write_in_parts`)."""
    for r in records:
        yield r.to_json()
        yield "\n"


def print_problems(problems: Iterable[tuple[str, str]]) -> None:
    """What could not be searched, on stderr, escaped."""
    from adapterprobe.escape import terminal

    for path, message in problems:
        print(f"adapterprobe: not searched: {terminal(path)}: {terminal(message)}", file=sys.stderr)
