"""Gather probe inputs for a batch of discovered stores (Rust) and judge them.

The one place a scan turns targets into records: the local scan and each Ray
task call :func:`judge_batch`, and the verdicts come from the same judge
functions the single probes use, so no path can disagree with another.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from typing import Any

from adapterprobe import _core
from adapterprobe.probes import PROBES
from adapterprobe.probes.options import ProbeOptions
from adapterprobe.probes.result import ProbeResult, Verdict
from adapterprobe.records import ScanRecord


def guarded(name: str, judge: Any, *args: Any, **kw: Any) -> ProbeResult:
    """Run a judge; any exception it raises becomes this record's ERROR verdict
    (naming the exception), so one store can never stop a scan."""
    try:
        result: ProbeResult = judge(*args, **kw)
    except Exception as exc:
        return ProbeResult(
            name=name,
            kind=name,
            verdict=Verdict.ERROR,
            message=f"{name} failed while judging this input: {type(exc).__name__}: {exc}",
            evidence={"exception": type(exc).__name__},
        )
    return result


def _previous_versions(inputs: list[Any]) -> list[Any]:
    """For each adapter version, the version before it of the same adapter
    (same ``versions/`` dir; for a named adapter of a multi-adapter save,
    ``<version>/<name>``, the same name in the version before), or None;
    inputs are in version order."""
    paths = {str(item.adapter) for item in inputs}
    last: dict[tuple[str, str], Any] = {}
    out = []
    for item in inputs:
        path = str(item.adapter)
        parent = os.path.dirname(path)
        # A named adapter saved inside a version pairs with the same name.
        named = parent in paths
        key = (os.path.dirname(parent), os.path.basename(path)) if named else (parent, "")
        out.append(last.get(key))
        last[key] = item
    return out


#: Layouts of what the walk could not enter (see ``rust/store/scan.rs``),
#: each with the verdict of its one record: a directory that cannot be
#: listed is an error (nothing unreadable passes), a link not followed out
#: of the root a skip.
WALK_PROBLEMS = {"unreadable": Verdict.ERROR, "outside-root": Verdict.SKIP}
#: The ``probe`` of those records.
DISCOVERY = "discovery"


def _walk_problem(inputs: Any) -> list[ScanRecord]:
    verdict = WALK_PROBLEMS[inputs.layout]
    return [
        ScanRecord.of(
            str(inputs.store),
            None,
            ProbeResult(name=DISCOVERY, kind=DISCOVERY, verdict=verdict, message=why),
            inputs.layout,
        )
        for _, why in inputs.broken
    ]


def _records_for(
    inputs: Any, probes: Sequence[str], options: Mapping[str, ProbeOptions]
) -> list[ScanRecord]:
    """Judge one target's gathered inputs: store-level records first, then
    each version's records in version order (the order discovery listed
    them: by step for checkpoints, not by text)."""
    store = str(inputs.store)
    layout = inputs.layout
    if layout in WALK_PROBLEMS:
        return _walk_problem(inputs)
    out: list[ScanRecord] = []
    per_adapter: list[tuple[str, str, ProbeResult, str | None]] = []
    for name in sorted(probes, key=lambda p: (PROBES[p].scope != "store", p)):
        spec = PROBES[name]
        if spec.scope == "store":
            given = getattr(inputs, spec.inputs)
            if given is not None:
                result = guarded(name, spec.judge, given, options[name])
                out.append(ScanRecord.of(store, None, result, layout, inputs.checkpoint_kind))
            continue
        items = list(getattr(inputs, spec.inputs))
        if name == "adapter_weights":
            previous = _previous_versions(items)
            judged = [
                guarded(name, spec.judge, g, options[name], previous=p)
                for g, p in zip(items, previous, strict=True)
            ]
        else:
            judged = [guarded(name, spec.judge, g, options[name]) for g in items]
        per_adapter += [
            (str(g.adapter), name, r, g.checkpoint_kind) for g, r in zip(items, judged, strict=True)
        ]
        for adapter, reason in inputs.broken:
            broken = ProbeResult(name=name, kind=name, verdict=Verdict.ERROR, message=reason)
            per_adapter.append((str(adapter), name, broken, None))
    # Versions in the store's own order (checkpoint-40 before checkpoint-120),
    # then the adapters whose versions are unknown; each version's probes by name.
    rank: dict[str, int] = {}
    for adapter, *_ in per_adapter:
        rank.setdefault(adapter, len(rank))
    for adapter, _, r, kind in sorted(per_adapter, key=lambda item: (rank[item[0]], item[1])):
        out.append(ScanRecord.of(store, adapter, r, layout, kind))
    return out


def gather(targets: Sequence[Any], probes: Sequence[str], workers: int | None = None) -> Any:
    """Read what the probes need for each target, in Rust and in parallel
    (the GIL is released, so a thread can gather while Python judges)."""
    return _core.probe_targets(
        list(targets),
        drift="training_drift" in probes,
        ghost="gradient_ghost" in probes,
        weights="adapter_weights" in probes,
        full_weights="full_weights" in probes,
        workers=workers,
    )


def judge_gathered(
    gathered: Any, probes: Sequence[str], options: Mapping[str, ProbeOptions]
) -> list[ScanRecord]:
    """Records of what :func:`gather` returned, in target order.

    The cyclic garbage collector is paused meanwhile (and restored after):
    judging allocates many small containers that are never cyclic, and on a
    large scan the collector's passes cost more than the judging itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [rec for inputs in gathered for rec in _records_for(inputs, probes, options)]
    finally:
        if was_enabled:
            gc.enable()


def judge_batch(
    targets: Sequence[Any],
    probes: Sequence[str],
    options: Mapping[str, ProbeOptions],
    workers: int | None = None,
) -> list[ScanRecord]:
    """Gather (in Rust, in parallel) and judge a batch of targets, in order.
    ``options`` holds one resolved options object per probe."""
    return judge_gathered(gather(targets, probes, workers), probes, options)
