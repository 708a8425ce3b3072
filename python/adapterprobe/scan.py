"""Scan adapter stores: every store under the given roots, every probe, one report.

Discovery and all file reading run in Rust, in parallel, with the GIL
released; the verdicts come from the same judge functions the single probes
use (``judge_drift``, ``judge_ghost``), so a scan never disagrees with
``training_drift``/``gradient_ghost`` called directly.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapterprobe import _core, drift, ghost
from adapterprobe.drift import check_options as check_drift_options
from adapterprobe.drift import judge_drift
from adapterprobe.errors import UsageError, require
from adapterprobe.ghost import check_options as check_ghost_options
from adapterprobe.ghost import judge_ghost
from adapterprobe.result import ProbeResult, Verdict, json_safe

PROBES = ("gradient_ghost", "training_drift")
FAIL_ON = ("warn", "fail", "never")
DEMO_STORE = Path(__file__).parent / "demo_store"
# Stores gathered per Rust call: big enough to keep every core busy, small
# enough for a progress bar to move.
BATCH = 256

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ScanRecord:
    """One probe's verdict on one store (drift) or adapter version (ghost)."""

    store: str
    adapter: str | None
    probe: str
    verdict: Verdict
    score: float | None
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, store: str, adapter: str | None, result: ProbeResult) -> ScanRecord:
        return cls(
            store,
            adapter,
            result.kind,
            result.verdict,
            result.score,
            result.message,
            result.evidence,
        )

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON record: NaN and infinities become null."""
        return json_safe(
            {
                "store": self.store,
                "adapter": self.adapter,
                "probe": self.probe,
                "verdict": self.verdict.value,
                "score": self.score,
                "message": self.message,
                "evidence": self.evidence,
            }
        )


def _record_json(record: ScanRecord) -> str:
    raw = {
        "store": record.store,
        "adapter": record.adapter,
        "probe": record.probe,
        "verdict": record.verdict.value,
        "score": record.score,
        "message": record.message,
        "evidence": record.evidence,
    }
    try:
        return json.dumps(raw, allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps(record.to_dict(), allow_nan=False)


def json_chunks(records: Iterable[ScanRecord], first: bool = True, last: bool = True):
    """The JSON array of `records` as text pieces, one record per line, so
    output can be streamed; `first`/`last` say whether to open/close it."""
    opened = not first
    if first:
        yield "["
    for record in records:
        yield (",\n" if opened else "\n") + _record_json(record)
        opened = True
    if last:
        yield "\n]" if opened else "]"


CSV_COLUMNS = ["store", "adapter", "probe", "verdict", "score", "message", "evidence"]


def write_csv(out: Any, records: Iterable[ScanRecord], header: bool) -> None:
    """Write `records` as CSV rows (evidence as a JSON string) to a text stream."""
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(CSV_COLUMNS)
    for record in records:
        d = record.to_dict()
        writer.writerow(
            [
                d["store"],
                d["adapter"] or "",
                d["probe"],
                d["verdict"],
                "" if d["score"] is None else d["score"],
                d["message"],
                json.dumps(d["evidence"], sort_keys=True),
            ]
        )


class ScanReport(Sequence[ScanRecord]):
    """The records of a scan, in store order, plus what could not be searched."""

    def __init__(self, records: Iterable[ScanRecord], problems: Iterable[tuple[str, str]] = ()):
        self.records: list[ScanRecord] = list(records)
        self.problems: list[tuple[str, str]] = list(problems)

    def __iter__(self) -> Iterator[ScanRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index):  # type: ignore[override]
        return self.records[index]

    def __repr__(self) -> str:
        return f"ScanReport({len(self.records)} records, {self.counts()})"

    def counts(self) -> dict[str, int]:
        """Number of records per verdict."""
        c = Counter(r.verdict.value for r in self.records)
        return {v.value: c.get(v.value, 0) for v in Verdict}

    def worst(self) -> Verdict | None:
        return max((r.verdict for r in self.records), key=lambda v: v.severity, default=None)

    def exit_code(self, fail_on: str = "fail") -> int:
        """1 when some verdict reaches ``fail_on`` (error always does), else 0."""
        if fail_on not in FAIL_ON:
            raise UsageError(f"fail_on must be one of {FAIL_ON}, got {fail_on!r}")
        if fail_on == "never":
            return 0
        floor = Verdict(fail_on).severity
        return int(any(r.verdict.severity >= floor for r in self.records))

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

    def to_pandas(self):
        """A pandas DataFrame of the records (needs pandas installed)."""
        pd = require("pandas", "pandas")
        return pd.DataFrame(self.to_dicts(), columns=list(ScanRecord.__dataclass_fields__))


def _records_for(
    inputs: Any, probes: Sequence[str], options: Mapping[str, Mapping[str, Any]]
) -> list[ScanRecord]:
    """Judge one target's gathered inputs."""
    store = str(inputs.store)
    out: list[ScanRecord] = []
    if "training_drift" in probes and inputs.drift is not None:
        r = judge_drift(inputs.drift, **options.get("training_drift", {}))
        out.append(ScanRecord.of(store, None, r))
    if "gradient_ghost" in probes:
        per_adapter = [
            (str(g.adapter), judge_ghost(g, **options.get("gradient_ghost", {})))
            for g in inputs.ghosts
        ]
        for adapter, reason in inputs.broken:
            broken = ProbeResult(
                name="gradient_ghost", kind="gradient_ghost", verdict=Verdict.ERROR, message=reason
            )
            per_adapter.append((str(adapter), broken))
        for adapter, r in sorted(per_adapter, key=lambda item: item[0]):
            out.append(ScanRecord.of(store, adapter, r))
    return out


def _check(probes: Sequence[str], options: Mapping[str, Mapping[str, Any]]) -> None:
    unknown = [p for p in probes if p not in PROBES]
    if unknown or not probes:
        raise UsageError(f"probes must be a non-empty subset of {PROBES}, got {list(probes)}")
    check_drift_options(**{**drift.DEFAULTS, **options.get("training_drift", {})})
    check_ghost_options(**{**ghost.DEFAULTS, **options.get("gradient_ghost", {})})


def judge_batch(
    targets: Sequence[Any],
    probes: Sequence[str] = PROBES,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    workers: int | None = None,
) -> list[ScanRecord]:
    """Gather (in Rust, in parallel) and judge a batch of targets, in order."""
    options = options or {}
    gathered = _core.probe_targets(
        list(targets),
        drift="training_drift" in probes,
        ghost="gradient_ghost" in probes,
        workers=workers,
    )
    return [rec for inputs in gathered for rec in _records_for(inputs, probes, options)]


def discover(*roots: str | Path, all_versions: bool = False, workers: int | None = None):
    """(targets, problems) for the roots; a root that does not exist is a UsageError."""
    if not roots:
        raise UsageError("scan needs at least one root")
    missing = [str(r) for r in roots if not Path(r).exists()]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    paths = [str(Path(r).expanduser()) for r in roots]
    targets, problems = _core.discover(paths, all_versions=all_versions, workers=workers)
    return targets, [(str(p), m) for p, m in problems]


def scan_batches(
    targets: Sequence[Any],
    *,
    probes: Sequence[str] = PROBES,
    workers: int | None = None,
    engine: str = "local",
    address: str | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Progress | None = None,
) -> Iterator[list[ScanRecord]]:
    """Records of discovered `targets`, a batch at a time and in order, so a
    caller can write them out without holding a whole large scan in memory."""
    options = dict(options or {})
    probes = tuple(probes)
    _check(probes, options)
    if workers is not None and workers < 1:
        raise UsageError(f"workers must be at least 1, got {workers}")
    if engine == "ray":
        from adapterprobe.ray_engine import run_on_ray

        yield run_on_ray(targets, probes, options, address=address, progress=progress)
        return
    if engine != "local":
        raise UsageError(f"engine must be 'local' or 'ray', got {engine!r}")
    total = len(targets)
    if progress:
        progress(0, total)
    for start in range(0, total, BATCH):
        batch = targets[start : start + BATCH]
        yield judge_batch(batch, probes, options, workers)
        if progress:
            progress(start + len(batch), total)


def scan(
    *roots: str | Path,
    probes: Sequence[str] = PROBES,
    all_versions: bool = False,
    workers: int | None = None,
    engine: str = "local",
    address: str | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Progress | None = None,
) -> ScanReport:
    """Probe every store under ``roots`` and return the records.

    ``probes``: which probes to run. ``all_versions``: every
    ``versions/vNNNN`` instead of each adapter's ``current.txt``.
    ``workers``: threads (default: one per core). ``engine``: ``"local"``
    or ``"ray"`` (``address``: a Ray cluster to join). ``options``: probe
    thresholds keyed by probe name, e.g. ``{"training_drift":
    {"min_steps": 20}}``. ``progress(done, total)`` is called as stores finish.
    """
    _check(tuple(probes), dict(options or {}))
    targets, problems = discover(*roots, all_versions=all_versions, workers=workers)
    batches = scan_batches(
        targets,
        probes=probes,
        workers=workers,
        engine=engine,
        address=address,
        options=options,
        progress=progress,
    )
    return ScanReport((r for batch in batches for r in batch), problems)
