"""Scan records shaped for the page: stores, verdict severities and evidence as series.

Records arrive as ``ScanRecord.to_dict()`` mappings (or objects with
``to_dict``) from any version and any probe, so everything here reads them
tolerantly: an odd or missing field gets a safe default, and evidence is
read by the rule of :mod:`adapterprobe._evidence` (a value of the wrong
shape is absent; a non-finite or non-numeric value is dropped rather than
drawn). What comes out is plain data
(:class:`Store` groups of :class:`Record`, sorted steps, ``(x, y)`` pairs, layer
values) for the page and the charts to lay out; no markup is made here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapterprobe._evidence import as_layer_numbers, as_names, as_number, as_pairs, as_steps
from adapterprobe._evidence import natural_key as natural_key  # re-exported
from adapterprobe.scan import DEMO_STORE

VERDICTS = ("error", "fail", "warn", "skip", "pass")  # worst first
SEVERITY = {v: len(VERDICTS) - 1 - i for i, v in enumerate(VERDICTS)}
GHOST_RATIO = 2.0  # gradient_ghost's default undertrained_layer_ratio


as_finite = as_number  # a finite float or None: the one rule (adapterprobe._evidence)


# ---------------------------------------------------------------------------
# Records and stores


@dataclass
class Record:
    """One scan record as the page reads it."""

    store: str
    adapter: str | None
    probe: str
    verdict: str  # one of VERDICTS (unknown verdicts count as error)
    label: str  # the verdict as written in the record
    score: float | None
    message: str
    evidence: Mapping[str, Any]
    layout: str | None

    @property
    def severity(self) -> int:
        return SEVERITY[self.verdict]


@dataclass
class Store:
    """The records of one store, worst first, and how the page names it."""

    path: str
    name: str = ""
    index: int = 0
    records: list[Record] = field(default_factory=list)
    run: str | None = None  # a W&B or MLflow run's name in its tracker

    def add(self, rec: Record) -> None:
        """Keep `rec`, and the tracker's name for the run when it says one."""
        self.records.append(rec)
        if self.run is None:
            self.run = tracker_run(rec)

    @property
    def worst(self) -> int:
        """The store's roll-up: its worst record that is not a skip, skip only
        when every record skipped."""
        judged = [r.severity for r in self.records if r.verdict != "skip"]
        return max(judged) if judged else SEVERITY["skip"]

    @property
    def verdicts(self) -> list[str]:
        present = {r.verdict for r in self.records}
        return [v for v in VERDICTS if v in present]

    @property
    def layout(self) -> str | None:
        return next((r.layout for r in self.records if r.layout), None)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(VERDICTS, 0)
        for r in self.records:
            out[r.verdict] += 1
        return out


class LazyEvidence(Mapping[str, Any]):
    """A scan record's evidence, taken from the record when first read: a
    page draws a few stores' evidence, and converting every record's (its
    loss curve, its layer values) cost more than the rest of the page."""

    __slots__ = ("_data", "_record")

    def __init__(self, record: Any) -> None:
        self._record: Any = record
        self._data: Mapping[str, Any] | None = None

    def _read(self) -> Mapping[str, Any]:
        if self._data is None:
            evidence = self._record.evidence
            self._data = evidence if isinstance(evidence, Mapping) else {}
            self._record = None
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


def read_record(raw: Any) -> Record:
    """Read one record tolerantly: missing or odd fields get safe defaults."""
    label_of = getattr(getattr(raw, "verdict", None), "value", None)
    if not isinstance(raw, Mapping) and isinstance(label_of, str):
        # A ScanRecord: read its fields as they are (the charts drop
        # non-finite values themselves), without a JSON-safe copy of the
        # evidence, and the evidence only when a page reads it.
        return Record(
            store=str(raw.store),
            adapter=None if raw.adapter is None else str(raw.adapter),
            probe=str(raw.probe),
            verdict=label_of if label_of in SEVERITY else "error",
            label=label_of,
            score=as_finite(raw.score),
            message=str(raw.message or ""),
            evidence=LazyEvidence(raw),
            layout=str(raw.layout) if raw.layout else None,
        )
    if not isinstance(raw, Mapping) and hasattr(raw, "to_dict"):
        raw = raw.to_dict()
    d: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    label = str(d.get("verdict") or "error")
    verdict = label.lower() if label.lower() in SEVERITY else "error"
    evidence = d.get("evidence")
    adapter = d.get("adapter")
    layout = d.get("layout")
    return Record(
        store=str(d.get("store") or "(no store)"),
        adapter=None if adapter is None else str(adapter),
        probe=str(d.get("probe") or "(unknown probe)"),
        verdict=verdict,
        label=label,
        score=as_finite(d.get("score")),
        message=str(d.get("message") or ""),
        evidence=evidence if isinstance(evidence, Mapping) else {},
        layout=str(layout) if layout else None,
    )


def group_stores(records: Iterable[Any]) -> list[Store]:
    """Records grouped by store, in order of first appearance, each named
    (:func:`store_name`)."""
    stores: dict[str, Store] = {}
    for raw in records:
        rec = read_record(raw)
        stores.setdefault(rec.store, Store(rec.store)).add(rec)
    return name_stores(list(stores.values()))


def badness(store: Store) -> tuple[Any, ...]:
    """Sort key putting the stores most in need of attention first."""
    worst = store.worst
    return (-worst, -store.counts()[VERDICTS[len(VERDICTS) - 1 - worst]], store.path)


class StoreCollector:
    """Stores from records that stream past, for a page that draws only its
    ``keep`` worst stores: the evidence (loss curves, layer values) of every
    other store is dropped as soon as it is known not to be drawn, so memory
    grows with the number of stores (a few records' messages each), not with
    their evidence. The evidence of the first ``healthy`` stores in that
    order for which ``healthy_run`` holds is kept too (the report's overlay
    draws a few healthy runs beside the worst)."""

    def __init__(
        self,
        keep: int,
        *,
        healthy: int = 0,
        healthy_run: Callable[[Store], bool] | None = None,
    ) -> None:
        self.keep = max(0, keep)
        self.healthy = max(0, healthy) if healthy_run is not None else 0
        self._healthy_run = healthy_run
        self._stores: dict[str, Store] = {}
        self._drawn: list[Store] = []
        self._current: Store | None = None

    def add(self, records: Iterable[Any]) -> None:
        for raw in records:
            rec = read_record(raw)
            store = self._stores.get(rec.store)
            if store is None:
                store = self._stores[rec.store] = Store(rec.store)
            if store is not self._current:
                self._settle()
                self._current = store
            store.add(rec)

    def _settle(self) -> None:
        if self._current is None:
            return
        self._drawn.append(self._current)
        self._current = None
        if len(self._drawn) > 2 * max(self.keep, 16):
            self._prune()

    def _prune(self) -> None:
        self._drawn.sort(key=badness)
        kept = self._drawn[: self.keep]
        if self.healthy and self._healthy_run is not None:
            runs = (s for s in self._drawn[self.keep :] if self._healthy_run(s))
            kept += [s for _, s in zip(range(self.healthy), runs, strict=False)]
        ids = {id(s) for s in kept}
        for store in self._drawn:
            if id(store) not in ids:
                for rec in store.records:
                    rec.evidence = {}
        self._drawn = sorted(kept, key=badness)

    def stores(self) -> list[Store]:
        """Every store, named, its records sorted (see :func:`group_stores`)."""
        self._settle()
        self._prune()
        return name_stores(list(self._stores.values()))


def name_stores(out: list[Store]) -> list[Store]:
    """Index the stores, name each (:func:`store_name`) and sort its records
    worst first."""
    here = working_dir()
    for i, s in enumerate(out):
        s.index = i
        s.name = store_name(s.path, here)
        s.records.sort(key=lambda r: (-r.severity, r.probe, natural_key(r.adapter or "")))
    return out


BUNDLED_DEMO = os.path.join(DEMO_STORE, "")  # as its records spell it, with a trailing /


def working_dir() -> str:
    """The working directory store names are shown from ("" when it is gone)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def store_name(path: str, here: str) -> str:
    """How a row names a store: its path relative to the working directory
    `here` when it lies there, else the path as scanned (a path elsewhere, a URL).

    A run so keeps its name from one scan to the next, whatever is scanned
    beside it, as a linter names its files. (Names relative to the stores'
    common directory moved with what was scanned: a Lightning run was
    ``a/lightning_logs/version_0`` beside another run and ``version_0``
    alone.) The working directory itself is named by its last component, not
    ``.``; the bundled demo's runs by their folder in it, wherever adapterprobe is
    installed (``smoke-test``). Where room is short a name is cut in the middle
    (:func:`clip_middle`).
    """
    if "://" in path:
        return path
    if path.startswith(BUNDLED_DEMO):
        return path[len(BUNDLED_DEMO) :]  # `adapterprobe scan` with no ROOT: the demo's runs
    if os.path.isabs(path):
        root = here.rstrip("/") + "/" if here else ""
        if not root or not (path + "/").startswith(root):
            return path  # elsewhere (and /work/main2 is not below /work/main)
        path = path[len(root) :]
    path = path.strip("/")
    while path.startswith("./"):
        path = path[2:]
    if path in (".", ""):
        return os.path.basename(here.rstrip("/")) or here or "."
    return path


TRACKER_LAYOUTS = frozenset({"wandb", "mlflow"})  # stores whose path holds a run id


def tracker_run(record: Any) -> str | None:
    """How a W&B or MLflow run is named in its tracker (its record's
    evidence ``run``: ``project/name (id)``), when the tracker named it: the
    store's path holds only the run's id (``offline-run-...-t203h7ly``, an
    MLflow run's hex id), so rows show both. Other layouts' evidence is not
    looked at (a report converts a record's evidence only when it draws it)."""
    if getattr(record, "layout", None) not in TRACKER_LAYOUTS:
        return None
    evidence = record.evidence
    run = evidence.get("run") if isinstance(evidence, Mapping) else None
    return run if isinstance(run, str) and run else None


def clip_middle(text: str, room: int) -> str:
    """At most `room` characters of a path, cut in the middle: its start (the
    run a row is about: two runs' rows differ there, as in
    ``a/lightning_logs/version_0`` and ``b/lightning_logs/version_0``) and
    its end (the file) are kept, each cut at a ``/`` where one is near."""
    if len(text) <= room:
        return text
    if room < 12:
        return clip_left(text, room)
    head = text[: max(room // 3, 6)]
    if "/" in head[2:]:
        head = head[: head.rindex("/") + 1]
    tail = text[len(text) - (room - len(head) - 1) :]
    cut = tail.find("/")
    if 0 < cut < len(tail) // 2:
        tail = tail[cut:]
    return head + "…" + tail


def clip_left(text: str, room: int) -> str:
    """At most `room` characters (one at least), keeping the end."""
    if len(text) <= room:
        return text
    return "…" + text[len(text) - (room - 1) :] if room > 1 else "…"


def common_base(paths: list[str]) -> str:
    """The stores' common directory ("" for none): the HTML page's "stores under"."""
    if len(paths) < 2:
        return os.path.dirname(paths[0].rstrip("/")) if paths else ""
    try:
        base = os.path.commonpath(paths)
    except ValueError:  # mixed absolute and relative paths
        return ""
    return os.path.dirname(base) if base in paths else base


def relative_to(path: str, base: str) -> str:
    """`path` below `base`, or `path` itself when it is not below it."""
    if base and path.startswith(base.rstrip("/") + "/"):
        return path[len(base.rstrip("/")) + 1 :]
    return path


def adapter_name(rec: Record) -> str:
    """The record's adapter relative to its store ("—" for a store-wide record)."""
    if rec.adapter is None:
        return "—"
    return relative_to(rec.adapter, rec.store)


# ---------------------------------------------------------------------------
# Evidence as series


# Read with the rule of :mod:`adapterprobe._evidence`: a value of the wrong
# shape is absent (an empty list), never an error.
sorted_steps = as_steps  # finite numbers of a list, sorted and deduplicated
xy_pairs = as_pairs  # [[x, y], ...] as (x, y) tuples by x; a null y only if allowed
layer_values = as_layer_numbers  # {layer: value} as (layer, value) in natural order
name_list = as_names  # names (layers, modules) of a list


def ghost_ratio(settings: Mapping[str, Any] | None) -> float:
    """The undertrained_layer_ratio gradient_ghost judged with (its default if unset)."""
    opts = (settings or {}).get("gradient_ghost")
    ratio = as_finite(opts.get("undertrained_layer_ratio")) if isinstance(opts, Mapping) else None
    return ratio if ratio is not None and ratio > 0 else GHOST_RATIO


# ---------------------------------------------------------------------------
# Settings


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Nested settings as (dotted key, text) rows."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError):
            text = str(value)
    yield prefix or "(value)", text
