"""The human table: what a terminal and a CI log show.

One header line per record (verdict, probe, score, where) with its message
wrapped beneath, worst first; then one line per store (its roll-up and the
counts behind it) and the summary. Records stream through: each is written
as a compact row to a temporary file per verdict as it arrives and the rows
are read back in order at the end, so a scan of 100,000 stores holds a few
integers per store in memory, never the records.

Every string from a scanned tree (paths, messages that quote files) goes
through :func:`adapterprobe.escape.terminal`; colour comes only from here.
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
from collections.abc import Iterable, Iterator
from typing import IO, Any

from adapterprobe.escape import terminal
from adapterprobe.probes.result import Verdict
from adapterprobe.reports.shaping import (
    clip_middle,
    natural_key,
    store_name,
    tracker_run,
    working_dir,
)
from adapterprobe.tally import Tally

COLOURS = {
    Verdict.ERROR: "\x1b[1;35m",
    Verdict.FAIL: "\x1b[1;31m",
    Verdict.WARN: "\x1b[33m",
    Verdict.SKIP: "\x1b[2m",
    Verdict.PASS: "\x1b[32m",
}
RESET = "\x1b[0m"
WORST_FIRST = (Verdict.ERROR, Verdict.FAIL, Verdict.WARN, Verdict.SKIP, Verdict.PASS)
PROBLEMS = frozenset({Verdict.WARN, Verdict.FAIL, Verdict.ERROR})
INDENT = " " * 7
# Evidence values shown by -v: scalars, and the length of anything longer.
EVIDENCE_CHARS = 60


def short_path(path: str | None, base: str) -> str:
    """`path` relative to `base` when below it; its last component when it is
    `base` itself (a store checked alone is named, not shown as '.')."""
    if path is None:
        return "-"
    # Below `base`, both normalized (records' paths are): the suffix, which
    # is what relpath gives, without its getcwd calls.
    if (
        base
        and path.startswith(base)
        and not base.endswith("/")
        and path[len(base) : len(base) + 1] == "/"
        and os.path.normpath(path) == path
        and os.path.normpath(base) == base
        and not path[len(base) + 1 :].startswith("..")
    ):
        return path[len(base) + 1 :]
    try:
        rel = os.path.relpath(path, base) if base else path
    except ValueError:
        return path
    if rel in (".", ""):
        return os.path.basename(os.path.normpath(path)) or path
    return path if rel.startswith("..") else rel


def _evidence_text(evidence: dict[str, Any]) -> str:
    parts = []
    for key, value in evidence.items():
        if isinstance(value, (list, tuple, dict)):
            parts.append(f"{key}=[{len(value)} values]")
            continue
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > EVIDENCE_CHARS:
            text = text[: EVIDENCE_CHARS - 1] + "…"
        parts.append(f"{key}={text}")
    return " ".join(parts)


def wrap(text: str, width: int) -> list[str]:
    """``textwrap.wrap(text, width, break_long_words=False,
    break_on_hyphens=False) or [""]``: greedy filling, a word longer than
    the width on a line of its own; then such a word (a long path) is cut
    before its ``/`` separators so that it keeps to the width where it can
    (:func:`split_path`). Done by hand for text whose words are separated
    by single spaces (every message), which is several times faster on a
    table of 100,000 rows; anything else goes to textwrap."""
    if "  " in text or text.startswith(" ") or not text.isprintable():
        lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
        return [part for line in lines for part in split_path(line, width)] or [""]
    lines = []
    line = ""
    for word in text.split(" "):
        if not word:
            continue
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.extend(split_path(line, width))
            line = word
    if line:
        lines.extend(split_path(line, width))
    return lines or [""]


def split_path(line: str, width: int) -> list[str]:
    """A line wider than ``width`` (one long word: a path) cut before its
    ``/`` separators, each piece as wide as fits; a piece with no ``/`` to
    cut at stays whole. A path that fits is never cut, and no piece ends in
    a ``/``, so the parts read as one path continued."""
    if len(line) <= width or "/" not in line[1:]:
        return [line]
    pieces: list[str] = []
    rest = line
    while len(rest) > width:
        # Cut only before the first '/' of a run of them ('a//b' before
        # '//'), so that no piece ends in a '/'.
        starts = [i for i in range(1, len(rest)) if rest[i] == "/" and rest[i - 1] != "/"]
        within = [i for i in starts if i <= width]
        cut = within[-1] if within else next((i for i in starts if i > width), -1)
        if cut <= 0:
            break
        pieces.append(rest[:cut])
        rest = rest[cut:]
    pieces.append(rest)
    return pieces


class TableStream:
    """Writes the table for records given batch by batch (see the module doc).

    ``quiet``: only warn/fail/error records, the stores that have them, and the
    summary. ``verbose``: every record (skips too) with its evidence. By default
    a skip is folded into its store's line when the store has other records
    (a bare adapter has no log or optimizer state to probe: one line, not
    three).
    """

    def __init__(
        self,
        out: IO[str],
        width: int = 80,
        colour: bool = False,
        *,
        quiet: bool = False,
        verbose: bool = False,
        only: frozenset[str] | None = None,
        regression_gate: bool = False,
    ) -> None:
        self.out = out
        self.width = max(40, width)
        self.colour = colour
        self.quiet = quiet
        self.verbose = verbose
        self.only = only
        self.tally = Tally(regression_gate=regression_gate)
        self.folded = 0
        # Closed by _rows() as each is read back in finish().
        self._runs: dict[str, str] = {}  # a tracker run's name, by store
        self._spill = {
            v: tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
            for v in WORST_FIRST
        }
        self._pending: list[Any] = []

    # -- input

    def add(self, records: Iterable[Any]) -> None:
        for r in records:
            if self._pending and self._pending[0].store != r.store:
                self._flush_store()
            self._pending.append(r)

    def _flush_store(self) -> None:
        pending, self._pending = self._pending, []
        fold = not self.verbose and any(r.verdict is not Verdict.SKIP for r in pending)
        for r in pending:
            visible = self._visible(r) and not (fold and r.verdict is Verdict.SKIP)
            if fold and r.verdict is Verdict.SKIP and self._visible(r):
                self.folded += 1
            self.tally.add(r, self._visible(r))
            run = tracker_run(r)
            if run is not None:
                self._runs.setdefault(r.store, run)
            if visible:
                row = [r.probe, r.store, r.adapter, r.score, r.message]
                row.append(_evidence_text(r.evidence) if self.verbose else None)
                row.append(run)
                self._spill[r.verdict].write(json.dumps(row) + "\n")

    def _visible(self, r: Any) -> bool:
        if self.only is not None and r.verdict.value not in self.only:
            return False
        return not (self.quiet and r.verdict not in PROBLEMS)

    # -- output

    def _label(self, v: Verdict) -> str:
        label = v.value.upper().ljust(5)
        return f"{COLOURS[v]}{label}{RESET}" if self.colour else label

    def _rows(self, v: Verdict) -> Iterator[list[Any]]:
        f = self._spill[v]
        f.seek(0)
        for line in f:
            yield json.loads(line)
        f.close()

    def _wrap(self, text: str) -> list[str]:
        return wrap(terminal(text), self.width - len(INDENT))

    def finish(self, fail_on: str) -> int:
        """Write everything; returns the exit code."""
        if self._pending:
            self._flush_store()
        here = working_dir()
        write = self.out.write
        room = self.width - 7
        for v in WORST_FIRST:
            for row in self._rows(v):
                probe, store, adapter, score, message = row[:5]
                where = store_name(store, here)
                if adapter:
                    where += f" / {short_path(adapter, store)}"
                if len(row) > 6 and row[6]:
                    where += f" [{row[6]}]"  # a tracker's run by its name, not only its id
                lead = f"{probe:<15} " + ("     " if score is None else f"{score:.2f} ") + " "
                where = clip_middle(terminal(where), max(10, room - len(lead)))
                write(f"{self._label(v)}  {lead}{where}\n")
                for line in self._wrap(message):
                    write(f"{INDENT}{line}\n")
                if len(row) > 5 and row[5]:
                    for line in self._wrap(row[5]):
                        write(f"{INDENT}{line}\n")
        self._store_lines(here)
        self._regression_lines(here)
        write("\n" + summary_text(self.tally, fail_on, self.width, self.folded) + "\n")
        return self.tally.exit_code(fail_on)

    def _regression_lines(self, here: str) -> None:
        """The records that regressed against the baseline, and why."""
        tally = self.tally
        if not tally.regressed:
            return
        write = self.out.write
        write("\nregressed against the baseline:\n")
        for reg in tally.regressions:
            where = store_name(reg.store, here)
            if reg.adapter:
                where += f" / {short_path(reg.adapter, reg.store)}"
            write(f"{reg.probe:<15} {clip_middle(terminal(where), max(10, self.width - 16))}\n")
            for line in self._wrap("; ".join(reg.why)):
                write(f"{INDENT}{line}\n")
        if tally.regressed > len(tally.regressions):
            more = tally.regressed - len(tally.regressions)
            write(f"{INDENT}... and {more:,} more (--json lists each)\n")

    def _store_lines(self, here: str) -> None:
        tally = self.tally
        stores = list(tally.per_store)
        if len(stores) < 2 and not self.folded:
            return
        rows = []
        for store in stores:
            verdict = tally.store_verdict(store)
            if verdict is None or (self.quiet and verdict not in PROBLEMS):
                continue
            rows.append((-verdict.severity, natural_key(store), store, verdict))
        if not rows:
            return
        rows.sort()
        self.out.write("\nper store:\n")
        room = self.width - 7
        for _, _, store, verdict in rows:
            counts = tally.store_counts(store)
            parts = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
            tail = f"  ({tally.layouts[store]}: {parts})"
            name = store_name(store, here)
            if store in self._runs:
                name += f" [{self._runs[store]}]"
            name = clip_middle(terminal(name), max(10, room - len(tail)))
            self.out.write(f"{self._label(verdict)}  {name}{tail}\n")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def summary_text(tally: Tally, fail_on: str, width: int = 80, folded: int = 0) -> str:
    """The final summary: records per verdict, stores per rolled-up verdict,
    and the exit code with its reason, wrapped to `width`."""
    records = ", ".join(f"{n:,} {v.value}" for v in WORST_FIRST if (n := tally.counts[v.value]))
    stores = ", ".join(f"{n:,} {v}" for v, n in _worst_first(tally.stores_by_verdict()) if n)
    code = tally.exit_code(fail_on)
    reason = tally.exit_reason(fail_on)
    hidden = tally.records - tally.shown
    notes = []
    if hidden:
        notes.append(f"{hidden:,} not shown by -q/--only")
    if folded:
        notes.append(
            f"{_plural(folded, 'skipped record')} folded into "
            f"{'its store' if folded == 1 else 'their stores'} (-v shows them)"
        )
    same_run = sum(tally.store_verdict(s) == Verdict.SKIP for s in tally.same_run)
    if same_run:
        notes.append(
            f"{_plural(same_run, 'tracker run')} judged as the output folder "
            f"{'it' if same_run == 1 else 'they'} logged"
        )
    extra = f" ({'; '.join(notes)})" if notes else ""
    unjudged = tally.stores_by_verdict().get("skip", 0) - same_run
    skipped = (
        f" {_plural(unjudged, 'store')} had nothing judged (every record skipped): not a pass."
        if unjudged
        else ""
    )
    text = (
        f"{_plural(tally.records, 'record')} from {_plural(len(tally.per_store), 'store')}: "
        f"{records or 'none'}{extra}. Stores by their worst record: {stores or 'none'}."
        f"{skipped} Exit {code}: {reason}."
    )
    return "\n".join(textwrap.wrap(text, max(40, width), break_on_hyphens=False))


def _worst_first(counts: dict[str, int]) -> Iterator[tuple[str, int]]:
    for v in WORST_FIRST:
        yield v.value, counts.get(v.value, 0)
