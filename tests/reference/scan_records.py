"""The scan's records built the way they were before the Rust scan pass:
``_core.probe_targets`` gathers, the plain-Python reference rules judge, and
this module orders the records (what ``judge._records_for`` did).

``tests/test_scan_pass.py`` compares the Rust pass with it record for
record and JSON text for text; ``benches/bench_scan.py`` times it beside
the pass in the same run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adapterprobe import _core
from adapterprobe.probes.result import ProbeResult, Verdict
from adapterprobe.records import ScanRecord

#: Each probe's scope and the field of ``TargetInputs`` holding its inputs.
SPECS = {
    "adapter_weights": ("adapter", "weights"),
    "full_weights": ("adapter", "full_weights"),
    "gradient_ghost": ("adapter", "ghosts"),
    "training_drift": ("store", "drift"),
    "gap_monitor": ("store", "gap"),
}
WALK_PROBLEMS = {"unreadable": Verdict.ERROR, "outside-root": Verdict.SKIP}

Judge = Callable[..., ProbeResult]


def previous_versions(inputs: list[Any]) -> list[Any]:
    paths = {str(item.adapter) for item in inputs}
    last: dict[tuple[str, str], Any] = {}
    out = []
    for item in inputs:
        path = str(item.adapter)
        parent = os.path.dirname(path)
        named = parent in paths
        key = (os.path.dirname(parent), os.path.basename(path)) if named else (parent, "")
        out.append(last.get(key))
        last[key] = item
    return out


def records_for(
    inputs: Any,
    probes: Sequence[str],
    options: Mapping[str, Any],
    judges: Mapping[str, Judge],
) -> list[ScanRecord]:
    """One target's records: the store's first, then each version's in the
    store's version order, each version's probes by name."""
    store = str(inputs.store)
    layout = inputs.layout
    if layout in WALK_PROBLEMS:
        verdict = WALK_PROBLEMS[layout]
        return [
            ScanRecord(store, None, layout, "discovery", verdict, None, why, {}, None)
            for _, why in inputs.broken
        ]
    out: list[ScanRecord] = []
    per_adapter: list[tuple[str, str, ProbeResult, str | None]] = []
    for name in sorted(probes, key=lambda p: (SPECS[p][0] != "store", p)):
        scope, field = SPECS[name]
        if scope == "store":
            given = getattr(inputs, field)
            if given is not None:
                result = judges[name](given, options[name])
                out.append(ScanRecord.of(store, None, result, layout, inputs.checkpoint_kind))
            continue
        items = list(getattr(inputs, field))
        if name == "adapter_weights":
            judged = [
                judges[name](g, options[name], previous=p)
                for g, p in zip(items, previous_versions(items), strict=True)
            ]
        else:
            judged = [judges[name](g, options[name]) for g in items]
        per_adapter += [
            (str(g.adapter), name, r, g.checkpoint_kind) for g, r in zip(items, judged, strict=True)
        ]
        for adapter, reason in inputs.broken:
            broken = ProbeResult(name=name, kind=name, verdict=Verdict.ERROR, message=reason)
            per_adapter.append((str(adapter), name, broken, None))
    rank: dict[str, int] = {}
    for adapter, *_ in per_adapter:
        rank.setdefault(adapter, len(rank))
    for adapter, _, r, kind in sorted(per_adapter, key=lambda item: (rank[item[0]], item[1])):
        out.append(ScanRecord.of(store, adapter, r, layout, kind))
    return out


def reference_records(
    targets: Sequence[Any],
    probes: Sequence[str],
    options: Mapping[str, Any],
    judges: Mapping[str, Judge],
    workers: int | None = None,
) -> list[ScanRecord]:
    """Every target's records, gathered by the core and judged in Python."""
    gathered = _core.probe_targets(
        list(targets),
        drift="training_drift" in probes,
        ghost="gradient_ghost" in probes,
        weights="adapter_weights" in probes,
        full_weights="full_weights" in probes,
        gap="gap_monitor" in probes,
        workers=workers,
    )
    return [r for inputs in gathered for r in records_for(inputs, probes, options, judges)]
