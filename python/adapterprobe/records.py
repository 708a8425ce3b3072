"""Scan records and their output formats (JSON, CSV, pandas).

A :class:`ScanRecord` is one probe's verdict on one store or adapter version;
a :class:`ScanReport` is the records of a scan. One field list
(``RECORD_FIELDS``) orders JSON, CSV and pandas output, so they can never
disagree on it.
Both the local scan and the Ray engine build on this module.
"""

from __future__ import annotations

import functools
import io
import json
import operator
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, overload

from adapterprobe._core import json_dumps
from adapterprobe._json import json_safe
from adapterprobe.errors import UsageError, require
from adapterprobe.escape import csv_cell
from adapterprobe.probes.result import ProbeResult, Verdict, short_repr
from adapterprobe.tally import (
    EXIT_NOTHING_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERDICTS,
    FAIL_ON,
    Tally,
    check_fail_on,
    rollup,
)

__all__ = [
    "EXIT_NOTHING_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_VERDICTS",
    "FAIL_ON",
    "RECORD_FIELDS",
    "ScanRecord",
    "ScanReport",
    "Tally",
    "rollup",
]

#: Version of the JSON record layout; saved scans (``scan`` on the command
#: line, which also records each store's root) carry it in every record;
#: ``scan --baseline`` and ``report --from`` refuse other versions.
SCHEMA_VERSION = 1


#: The record fields, in output order (JSON, CSV columns, pandas).
RECORD_FIELDS: tuple[str, ...] = (
    "store",
    "adapter",
    "layout",
    "probe",
    "verdict",
    "score",
    "message",
    "evidence",
    "checkpoint_kind",
)
#: Fields written to JSON only when set (not CSV columns).
JSON_ONLY_FIELDS = ("root", "baseline")
_ALL_FIELDS = RECORD_FIELDS + JSON_ONLY_FIELDS
_VERDICTS = {v.value: v for v in Verdict}


class ScanRecord:
    """One probe's verdict on one store (drift) or version (ghost, weights,
    full_weights).

    ``layout`` says what kind of store it is (``dlm``, ``hf-trainer``,
    ``lightning``, ``peft``, ``tensorboard``, ``mlflow``, ``wandb``); ``checkpoint_kind`` what the
    version holds: ``"adapter"`` (a LoRA adapter), ``"full"`` (a whole
    model: a full fine-tune's ``model.safetensors``, a Lightning ``.ckpt``)
    or ``"logs"`` (no weights: only ``trainer_state.json``, or a run that
    left only logs). A store-level record (``training_drift``) carries the
    store's newest version's kind (``"logs"`` for a log-only run); it is
    None when the store's versions could not be determined. ``root`` is the
    scan root the store was found under and ``baseline`` its comparison
    with a saved scan (both set by the CLI, JSON only).

    Records are values: read-only, compared by their fields, changed copies
    made with :meth:`replace`. A record made by the scan keeps its evidence
    in the Rust core until it is first read, and its JSON text ready.
    """

    __slots__ = (
        "_adapter",
        "_baseline",
        "_checkpoint_kind",
        "_core",
        "_evidence",
        "_layout",
        "_message",
        "_probe",
        "_root",
        "_score",
        "_store",
        "_verdict",
    )
    _store: str
    _adapter: str | None
    _layout: str
    _probe: str
    _verdict: Verdict
    _score: float | None
    _message: str
    _evidence: dict[str, Any] | None
    _checkpoint_kind: str | None
    _root: str | None
    _baseline: dict[str, Any] | None
    _core: Any

    def __init__(
        self,
        store: str,
        adapter: str | None,
        layout: str,
        probe: str,
        verdict: Verdict | str,
        score: float | None,
        message: str,
        evidence: dict[str, Any] | None = None,
        checkpoint_kind: str | None = None,
        root: str | None = None,
        baseline: dict[str, Any] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "_store", store)
        set_(self, "_adapter", adapter)
        set_(self, "_layout", layout)
        set_(self, "_probe", probe)
        set_(self, "_verdict", Verdict(verdict))
        set_(self, "_score", score)
        set_(self, "_message", message)
        set_(self, "_evidence", {} if evidence is None else evidence)
        set_(self, "_checkpoint_kind", checkpoint_kind)
        set_(self, "_root", root)
        set_(self, "_baseline", baseline)
        set_(self, "_core", None)

    @classmethod
    def _from_core(cls, fields: tuple[Any, ...]) -> ScanRecord:
        """A record from one tuple of ``_core.scan_records`` (evidence left
        in the core until read)."""
        self = object.__new__(cls)
        set_ = object.__setattr__
        store, adapter, layout, probe, verdict, score, message, kind, core = fields
        set_(self, "_store", store)
        set_(self, "_adapter", adapter)
        set_(self, "_layout", layout)
        set_(self, "_probe", probe)
        set_(self, "_verdict", _VERDICTS[verdict])
        set_(self, "_score", score)
        set_(self, "_message", message)
        set_(self, "_evidence", None)
        set_(self, "_checkpoint_kind", kind)
        set_(self, "_root", None)
        set_(self, "_baseline", None)
        set_(self, "_core", core)
        return self

    @classmethod
    def of(
        cls,
        store: str,
        adapter: str | None,
        result: ProbeResult,
        layout: str = "dlm",
        checkpoint_kind: str | None = None,
    ) -> ScanRecord:
        return cls(
            store,
            adapter,
            layout,
            result.kind,
            result.verdict,
            result.score,
            result.message,
            result.evidence,
            checkpoint_kind,
        )

    @property
    def store(self) -> str:
        """The store's path (or URL)."""
        return self._store

    @property
    def adapter(self) -> str | None:
        """The version's path (or URL); None for a store's own record."""
        return self._adapter

    @property
    def layout(self) -> str:
        return self._layout

    @property
    def probe(self) -> str:
        return self._probe

    @property
    def verdict(self) -> Verdict:
        return self._verdict

    @property
    def score(self) -> float | None:
        """In [0, 1], higher is healthier; None where the probe did not judge."""
        return self._score

    @property
    def message(self) -> str:
        return self._message

    @property
    def checkpoint_kind(self) -> str | None:
        return self._checkpoint_kind

    @property
    def root(self) -> str | None:
        return self._root

    @property
    def baseline(self) -> dict[str, Any] | None:
        return self._baseline

    @property
    def evidence(self) -> dict[str, Any]:
        """What the verdict rests on (a dict; made on first read)."""
        if self._evidence is None:
            made: dict[str, Any] = self._core.evidence()
            object.__setattr__(self, "_evidence", made)
            return made
        return self._evidence

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ScanRecord is read-only; use .replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("ScanRecord is read-only")

    def replace(self, **changes: Any) -> ScanRecord:
        """A copy with ``changes`` (field names) applied."""
        if self._core is not None and changes.keys() <= _JSON_ONLY:
            # Only the JSON-only fields change: the core's record stays valid
            # (a scan tags each of its records so: kept to one pass of slots).
            copy = object.__new__(ScanRecord)
            set_ = object.__setattr__
            for slot, value in zip(_SLOTS, _slot_values(self), strict=True):
                set_(copy, slot, value)
            for name, value in changes.items():
                set_(copy, "_" + name, value)
            return copy
        unknown = changes.keys() - _FIELD_SET
        if unknown:
            raise TypeError(f"ScanRecord has no field(s) {sorted(unknown)}")
        values = {f: getattr(self, f) for f in _ALL_FIELDS}
        values.update(changes)
        return ScanRecord(**values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScanRecord):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _ALL_FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Plain values only (the core's handle does not cross processes).
        return (ScanRecord, tuple(getattr(self, f) for f in _ALL_FIELDS))

    def __repr__(self) -> str:
        where = self.store if self.adapter is None else self.adapter
        head = short_repr("ScanRecord", self.probe, self.verdict, self.score, self.message)
        return f"{head}, {where!r}, evidence: {len(self.evidence)} keys)"

    def _repr_html_(self) -> str:
        from adapterprobe.reports.notebook import result_html

        where = self.store if self.adapter is None else self.adapter
        return result_html(
            self.probe, self.verdict.value, self.score, self.message, self.evidence, where
        )

    def _plain(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in RECORD_FIELDS}
        d["verdict"] = self.verdict.value
        if self.root is not None:  # a saved scan (the CLI sets the root)
            d["schema_version"] = SCHEMA_VERSION
        for extra in JSON_ONLY_FIELDS:
            if getattr(self, extra) is not None:
                d[extra] = getattr(self, extra)
        return d

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON record: NaN and infinities become null."""
        return json_safe(self._plain())

    def to_json(self) -> str:
        """One compact JSON object (NaN and infinities as null)."""
        return "".join(self._json_pieces())

    def _json_pieces(self) -> tuple[str, ...]:
        """The record's JSON text as pieces that join to it: a writer joining
        many records then copies each record's text once. Text the scan pass
        wrote gets the JSON-only fields before its closing brace."""
        made = None if self._core is None else self._core.json
        if made is not None:
            if self._root is None and self._baseline is None:
                return (made,)
            return (made[:-1], self._json_tail(), "}")
        # The common case, plain values only, is written by the Rust core
        # (the same text as json.dumps, several times faster on the float-heavy
        # evidence); anything else is cleaned by json_safe first.
        try:
            return (json_dumps(self._plain()),)
        except (ValueError, TypeError):
            return (json.dumps(self.to_dict(), allow_nan=False),)

    def _evidence_json(self) -> str:
        """The evidence as ASCII JSON (from the core when it is still there)."""
        if self._evidence is None:
            return self._core.evidence_json()  # type: ignore[no-any-return]
        return _evidence_json(self._evidence)

    def _tag_root(self, root: str) -> None:
        """Set the root in place: only for a record fresh from the scan pass
        that nothing else holds yet (see ``Gate.batches``)."""
        object.__setattr__(self, "_root", root)

    def _json_tail(self) -> str:
        tail = ""
        if self._root is not None:
            tail += _root_tail(self._root)
        if self._baseline is not None:
            try:
                text = json_dumps(self._baseline)
            except (ValueError, TypeError):
                text = json.dumps(json_safe(self._baseline), allow_nan=False)
            tail += ', "baseline": ' + text
        return tail


@functools.lru_cache(maxsize=256)
def _root_tail(root: str) -> str:
    """The JSON-only root fields of a record, the same for every record of a
    root (a scan has a few)."""
    return f', "schema_version": {SCHEMA_VERSION}, "root": ' + json_dumps(root)


_SLOTS = ScanRecord.__slots__
_slot_values = operator.attrgetter(*_SLOTS)
_JSON_ONLY = frozenset(JSON_ONLY_FIELDS)
_FIELD_SET = frozenset(_ALL_FIELDS)


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort key that orders numbers in names as numbers: ``checkpoint-40``
    before ``checkpoint-120``, layer 9 before layer 10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def json_chunks(
    records: Iterable[ScanRecord], first: bool = True, last: bool = True
) -> Iterator[str]:
    """The JSON array of `records` as text pieces, one record per line, so
    output can be streamed; `first`/`last` say whether to open/close it."""
    opened = not first
    if first:
        yield "["
    for record in records:
        yield ",\n" if opened else "\n"
        opened = True
        yield from record._json_pieces()
    if last:
        yield "\n]" if opened else "]"


def write_csv(out: IO[str], records: Iterable[ScanRecord], header: bool) -> None:
    """Write `records` as CSV rows (evidence as a JSON string) to a text stream.

    Text cells go through :func:`adapterprobe.escape.csv_cell` (formula guard,
    control characters visible); evidence is ASCII JSON. Rows are quoted as
    ``csv.writer`` quotes them (RFC 4180, minimal quoting), without its
    per-character pass over each evidence cell, which cost more than the
    rest of a scan's CSV output."""
    if header:
        out.write(csv_row(RECORD_FIELDS))
    lines = []
    for record in records:
        score = record.score
        text = {
            "store": record.store,
            "adapter": record.adapter,
            "layout": record.layout,
            "probe": record.probe,
            "message": record.message,
            "checkpoint_kind": record.checkpoint_kind,
        }
        row = {key: "" if value is None else csv_cell(value) for key, value in text.items()}
        row["verdict"] = record.verdict.value
        row["score"] = "" if score is None or score != score else str(score)
        row["evidence"] = record._evidence_json()
        lines.append(csv_row([row[f] for f in RECORD_FIELDS]))
    out.write("".join(lines))


_CSV_SPECIAL = re.compile('[",\n\r]')


def csv_row(cells: Sequence[str]) -> str:
    """One CSV line: a cell holding a comma, a quote or a line break is
    quoted, its quotes doubled; as ``csv.writer(lineterminator="\\n")``
    writes a row of several cells (for any cell without a lone carriage
    return, which ``csv_cell`` and JSON never leave)."""
    return (
        ",".join(
            '"' + cell.replace('"', '""') + '"' if _CSV_SPECIAL.search(cell) else cell
            for cell in cells
        )
        + "\n"
    )


def _evidence_json(evidence: dict[str, Any]) -> str:
    """Evidence as ASCII JSON (the Rust writer for plain values; NaN and
    infinities as null through the slow path)."""
    try:
        return json_dumps(evidence)
    except (ValueError, TypeError):
        return json.dumps(json_safe(evidence), allow_nan=False)


def verdict_exit_code(records: Iterable[ScanRecord], fail_on: str) -> int:
    """1 when a record's verdict reaches ``fail_on`` (error always does), else 0."""
    check_fail_on(fail_on)
    if fail_on == "never":
        return 0
    floor = Verdict(fail_on).severity
    return int(any(r.verdict.severity >= floor for r in records))


class ScanReport(Sequence[ScanRecord]):
    """The records of a scan, in store order, what could not be searched, and
    the settings (rule set and every probe's thresholds) the verdicts were
    made with."""

    def __init__(
        self,
        records: Iterable[ScanRecord],
        problems: Iterable[tuple[str, str]] = (),
        settings: dict[str, Any] | None = None,
    ):
        self.records: list[ScanRecord] = list(records)
        self.problems: list[tuple[str, str]] = list(problems)
        self.settings: dict[str, Any] = dict(settings or {})

    def __iter__(self) -> Iterator[ScanRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> ScanRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[ScanRecord]: ...
    def __getitem__(self, index: int | slice) -> ScanRecord | list[ScanRecord]:
        return self.records[index]

    def __repr__(self) -> str:
        stores = len({r.store for r in self.records})
        counts = ", ".join(f"{n} {v}" for v, n in self.counts().items() if n) or "no records"
        return f"ScanReport({len(self.records)} records from {stores} stores: {counts})"

    def __str__(self) -> str:
        """The table ``adapterprobe scan`` prints (80 columns, no colour)."""
        from adapterprobe.reports.table import TableStream

        out = io.StringIO()
        table = TableStream(out, 80, False)
        table.add(self.records)
        table.finish("fail")
        return out.getvalue()

    def _repr_html_(self) -> str:
        """The summary and the worst stores with the report's charts, inline
        SVG, for notebooks (no JavaScript)."""
        from adapterprobe.reports.notebook import scan_html

        return scan_html(self.records, self.settings)

    def store_verdicts(self) -> dict[str, Verdict]:
        """Each store's roll-up (:func:`rollup`), in store order."""
        by_store: dict[str, list[Verdict]] = {}
        for r in self.records:
            by_store.setdefault(r.store, []).append(r.verdict)
        return {s: v for s, vs in by_store.items() if (v := rollup(vs)) is not None}

    def counts(self) -> dict[str, int]:
        """Number of records per verdict."""
        c = Counter(r.verdict.value for r in self.records)
        return {v.value: c.get(v.value, 0) for v in Verdict}

    def worst(self) -> Verdict | None:
        return max((r.verdict for r in self.records), key=lambda v: v.severity, default=None)

    def exit_code(self, fail_on: str = "fail") -> int:
        """The process exit code a gate wants: 3 when the scan found nothing to
        probe, 1 when some verdict reaches ``fail_on`` (error always does),
        else 0."""
        if fail_on not in FAIL_ON:
            raise UsageError(f"fail_on must be one of {FAIL_ON}, got {fail_on!r}")
        if not self.records:
            return EXIT_NOTHING_FOUND
        return verdict_exit_code(self.records, fail_on)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.records]

    def to_json(self, indent: int | None = None) -> str:
        """A JSON array of the flat records (NaN and infinities as null)."""
        if indent is None:
            return "".join(json_chunks(self.records))
        return json.dumps(self.to_dicts(), indent=indent, allow_nan=False)

    def to_csv(self) -> str:
        """CSV with one row per record; evidence as a JSON string."""
        out = io.StringIO()
        write_csv(out, self.records, header=True)
        return out.getvalue()

    def to_markdown(self) -> str:
        """A compact Markdown summary (CI step summaries, PR comments)."""
        from adapterprobe.reports.markdown import render_markdown

        return render_markdown(self.to_dicts(), settings=self.settings)

    def to_html(self, path: str | os.PathLike[str], **kw: Any) -> Path:
        """Write a self-contained HTML report (plots, no network needed) to
        ``path``, atomically; keyword arguments go to ``render_html``."""
        from adapterprobe.reports.html import write_html

        return write_html(path, self.to_dicts(), settings=self.settings, **kw)

    def to_pandas(self, *, flatten_evidence: bool = True) -> Any:
        """A pandas DataFrame of the records (needs pandas installed).

        ``verdict`` is an ordered categorical (pass < skip < warn < fail <
        error), so ``df[df.verdict >= "warn"]`` and sorting work; each evidence
        key becomes its own column, ``evidence.<key>`` (nested mappings as
        ``evidence.<key>.<inner>``; lists stay lists). ``flatten_evidence=False``
        keeps one ``evidence`` column of dicts."""
        pd = require("pandas", "pandas")
        rows = self.to_dicts()
        columns = list(RECORD_FIELDS)
        if flatten_evidence:
            seen: dict[str, None] = {}
            for row in rows:
                flat = _flatten("evidence", row.pop("evidence") or {})
                row.update(flat)
                seen.update(dict.fromkeys(flat))
            columns.remove("evidence")
            columns += list(seen)
        frame = pd.DataFrame(rows, columns=columns)
        order = sorted((v.value for v in Verdict), key=lambda v: Verdict(v).severity)
        frame["verdict"] = pd.Categorical(frame["verdict"], categories=order, ordered=True)
        return frame


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(f"{prefix}.{key}", inner))
        return out
    return {prefix: value}
