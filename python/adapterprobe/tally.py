"""Verdict counts kept while records stream past, and a store's roll-up.

Every output (the table, markdown, JUnit, the exit code) counts with these,
so they agree on what a store's verdict is. Records are read by attribute
(:class:`RecordLike`), so this module depends on no output and no record
class.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from adapterprobe.errors import UsageError
from adapterprobe.probes.result import Verdict

FAIL_ON = ("warn", "fail", "never")
#: Exit codes: 0 ok, 1 verdicts at or past --fail-on, 2 usage, 3 nothing found.
EXIT_OK, EXIT_VERDICTS, EXIT_USAGE, EXIT_NOTHING_FOUND = 0, 1, 2, 3

__all__ = ["FAIL_ON", "RecordLike", "ReportedRecord", "Tally", "rollup"]


class RecordLike(Protocol):
    """What counting needs of a record (``ScanRecord`` has it)."""

    @property
    def store(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def verdict(self) -> Verdict: ...


class ReportedRecord(RecordLike, Protocol):
    """What the CI writers (annotations, JUnit) read of a record as well:
    they take records by their fields, so they need not import the records
    module, which renders through them."""

    @property
    def adapter(self) -> str | None: ...
    @property
    def probe(self) -> str: ...
    @property
    def message(self) -> str: ...


def rollup(verdicts: Iterable[Verdict | str]) -> Verdict | None:
    """A store's verdict from its records': the worst one that is not a skip,
    and skip only when every record skipped (a store whose optimizer state
    is missing but whose weights and curve pass is healthy, not "skipped").
    None for no records."""
    worst: Verdict | None = None
    skipped = False
    for v in verdicts:
        v = Verdict(v)
        if v is Verdict.SKIP:
            skipped = True
        elif worst is None or v.severity > worst.severity:
            worst = v
    return worst if worst is not None else (Verdict.SKIP if skipped else None)


_VERDICT_ORDER: tuple[Verdict, ...] = tuple(Verdict)


class Tally:
    """Counts of a scan kept while records stream past: records per verdict,
    and per store the counts its roll-up is made from (a few integers per
    store, so 100,000 stores cost megabytes, not the records)."""

    def __init__(self) -> None:
        self.records = 0
        self.shown = 0
        self.counts: Counter[str] = Counter()
        self.per_store: dict[str, list[int]] = {}
        self.layouts: dict[str, str] = {}

    def add(self, record: RecordLike, shown: bool = True) -> None:
        self.records += 1
        self.shown += shown
        self.counts[record.verdict.value] += 1
        counts = self.per_store.get(record.store)
        if counts is None:
            counts = self.per_store[record.store] = [0] * len(_VERDICT_ORDER)
            self.layouts[record.store] = record.layout
        counts[_VERDICT_ORDER.index(record.verdict)] += 1

    def store_counts(self, store: str) -> dict[str, int]:
        return {v.value: n for v, n in zip(_VERDICT_ORDER, self.per_store[store], strict=True)}

    def store_verdict(self, store: str) -> Verdict | None:
        counts = self.per_store[store]
        return rollup(v for v, n in zip(_VERDICT_ORDER, counts, strict=True) if n)

    def stores_by_verdict(self) -> dict[str, int]:
        """Number of stores per rolled-up verdict."""
        out = dict.fromkeys((v.value for v in _VERDICT_ORDER), 0)
        for store in self.per_store:
            v = self.store_verdict(store)
            if v is not None:
                out[v.value] += 1
        return out

    def exit_code(self, fail_on: str) -> int:
        if fail_on not in FAIL_ON:
            raise UsageError(f"fail_on must be one of {FAIL_ON}, got {fail_on!r}")
        if not self.records:
            return EXIT_NOTHING_FOUND
        if fail_on == "never":
            return EXIT_OK
        floor = Verdict(fail_on).severity
        return int(any(Verdict(v).severity >= floor for v, n in self.counts.items() if n))
