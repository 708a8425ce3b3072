"""Gather probe inputs for a batch of discovered stores (Rust) and judge them.

The one place a scan turns targets into records: the local scan and each Ray
task call :func:`judge_batch`, and the verdicts come from the same judge
functions the single probes use, so no path can disagree with another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from adapterprobe import _core
from adapterprobe.probes import PROBES
from adapterprobe.probes.options import ProbeOptions
from adapterprobe.probes.result import ProbeResult, Verdict
from adapterprobe.records import ScanRecord


def _records_for(
    inputs: Any, probes: Sequence[str], options: Mapping[str, ProbeOptions]
) -> list[ScanRecord]:
    """Judge one target's gathered inputs."""
    store = str(inputs.store)
    out: list[ScanRecord] = []
    if "training_drift" in probes and inputs.drift is not None:
        judge = PROBES["training_drift"].judge
        out.append(ScanRecord.of(store, None, judge(inputs.drift, options["training_drift"])))
    if "gradient_ghost" in probes:
        judge = PROBES["gradient_ghost"].judge
        per_adapter = [(str(g.adapter), judge(g, options["gradient_ghost"])) for g in inputs.ghosts]
        for adapter, reason in inputs.broken:
            broken = ProbeResult(
                name="gradient_ghost", kind="gradient_ghost", verdict=Verdict.ERROR, message=reason
            )
            per_adapter.append((str(adapter), broken))
        for adapter, r in sorted(per_adapter, key=lambda item: item[0]):
            out.append(ScanRecord.of(store, adapter, r))
    return out


def judge_batch(
    targets: Sequence[Any],
    probes: Sequence[str],
    options: Mapping[str, ProbeOptions],
    workers: int | None = None,
) -> list[ScanRecord]:
    """Gather (in Rust, in parallel) and judge a batch of targets, in order.
    ``options`` holds one resolved options object per probe."""
    gathered = _core.probe_targets(
        list(targets),
        drift="training_drift" in probes,
        ghost="gradient_ghost" in probes,
        workers=workers,
    )
    return [rec for inputs in gathered for rec in _records_for(inputs, probes, options)]
