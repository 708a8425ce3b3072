"""Verdict counts kept while records stream past, and a store's roll-up.

Every output (the table, markdown, JUnit, the exit code) counts with these,
so they agree on what a store's verdict is. Records are read by attribute
(:class:`RecordLike`), so this module depends on no output and no record
class.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol

from adapterprobe.errors import UsageError
from adapterprobe.probes.result import Verdict

FAIL_ON = ("warn", "fail", "never")


def check_fail_on(fail_on: str) -> str:
    """``fail_on`` when it is one of :data:`FAIL_ON`, else a UsageError."""
    if fail_on not in FAIL_ON:
        raise UsageError(f"fail_on must be one of {FAIL_ON}, got {fail_on!r}")
    return fail_on


def reaches(verdict: str, fail_on: str) -> bool:
    """Whether ``verdict`` is ``fail_on`` or worse (error reaches warn and
    fail); nothing reaches ``"never"``, the gate turned off."""
    return fail_on != "never" and Verdict(verdict).severity >= Verdict(fail_on).severity


#: Exit codes: 0 ok, 1 verdicts at or past --fail-on, 2 usage, 3 nothing found.
EXIT_OK, EXIT_VERDICTS, EXIT_USAGE, EXIT_NOTHING_FOUND = 0, 1, 2, 3

__all__ = [
    "FAIL_ON",
    "RecordLike",
    "Regression",
    "ReportedRecord",
    "Tally",
    "regression_of",
    "rollup",
]

#: Regressions a tally keeps to name (it counts them all).
MAX_REGRESSIONS_NAMED = 200


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


def regression_of(record: object) -> list[str] | None:
    """Why a record regressed against the baseline it was compared with
    (``scan --baseline``), or None when it did not or was not compared."""
    entry = getattr(record, "baseline", None)
    if not isinstance(entry, dict) and isinstance(record, dict):
        entry = record.get("baseline")
    if not isinstance(entry, dict) or not entry.get("regressed"):
        return None
    why = entry.get("why")
    reasons = [str(w) for w in why] if isinstance(why, list) else []
    return reasons or ["worse than the baseline"]


class Regression(NamedTuple):
    """A record that regressed against the baseline, and why."""

    store: str
    adapter: str | None
    probe: str
    why: list[str]


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
_INDEX_OF = {v: i for i, v in enumerate(_VERDICT_ORDER)}
_VALUE_OF = {v: v.value for v in _VERDICT_ORDER}


class Tally:
    """Counts of a scan kept while records stream past: records per verdict,
    and per store the counts its roll-up is made from (a few integers per
    store, so 100,000 stores cost megabytes, not the records)."""

    def __init__(self, *, regression_gate: bool = False) -> None:
        #: ``--fail-on-regression``: a regression makes the exit code 1.
        self.regression_gate = regression_gate
        self.regressed = 0
        self.regressions: list[Regression] = []
        self.records = 0
        self.shown = 0
        self.counts: Counter[str] = Counter()
        self.per_store: dict[str, list[int]] = {}
        self.layouts: dict[str, str] = {}
        #: Tracker runs judged as the HF output folder they logged (their
        #: own record a skip naming it: ``same_run_as``).
        self.same_run: set[str] = set()

    def add(self, record: RecordLike, shown: bool = True) -> None:
        self.records += 1
        self.shown += shown
        verdict = record.verdict
        self.counts[_VALUE_OF[verdict]] += 1
        store = record.store
        counts = self.per_store.get(store)
        if counts is None:
            counts = self.per_store[store] = [0] * len(_VERDICT_ORDER)
            self.layouts[store] = record.layout
        counts[_INDEX_OF[verdict]] += 1
        if _VALUE_OF[verdict] == "skip":
            evidence = getattr(record, "evidence", None)
            if isinstance(evidence, Mapping) and evidence.get("same_run_as"):
                self.same_run.add(store)
        if getattr(record, "baseline", None) is None:
            return  # never compared: the common case, kept to one attribute read
        why = regression_of(record)
        if why is not None:
            self.regressed += 1
            if len(self.regressions) < MAX_REGRESSIONS_NAMED:
                adapter = getattr(record, "adapter", None)
                probe = str(getattr(record, "probe", ""))
                self.regressions.append(Regression(record.store, adapter, probe, why))

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

    def _verdicts_failed(self, fail_on: str) -> bool:
        check_fail_on(fail_on)
        return any(reaches(v, fail_on) for v, n in self.counts.items() if n)

    def _regressions_failed(self) -> bool:
        return self.regression_gate and self.regressed > 0

    def exit_code(self, fail_on: str) -> int:
        """0, or 1 when a verdict reached ``fail_on`` or (with the regression
        gate on) a record regressed; 3 when there were no records."""
        failed = self._verdicts_failed(fail_on)
        if not self.records:
            return EXIT_NOTHING_FOUND
        return int(failed or self._regressions_failed())

    def exit_reason(self, fail_on: str) -> str:
        """Why :meth:`exit_code` is what it is, in words."""
        if not self.records:
            return "nothing found"
        regressed = f"{self.regressed:,} record{'s' if self.regressed != 1 else ''} regressed"
        reasons = []
        if self._verdicts_failed(fail_on):
            reasons.append(f"a verdict reached --fail-on {fail_on}")
        if self._regressions_failed():
            reasons.append(f"{regressed} against the baseline (--fail-on-regression)")
        if reasons:
            return "; ".join(reasons)
        if self.regressed:
            return (
                f"nothing reached --fail-on {fail_on}; {regressed} against the baseline "
                "(--fail-on-regression makes that exit 1)"
            )
        return f"nothing reached --fail-on {fail_on}"
