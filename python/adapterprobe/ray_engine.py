"""Run a scan on Ray: discovery on the driver, batches of stores as Ray tasks.

Each task calls the same gather-and-judge code as a local scan
(``judge_batch``), so the records are identical, in the same order. Records
come back as tasks finish (the progress callback follows them). A task whose
worker dies or that raises is retried by Ray (``max_retries``); a batch that
still fails is split into one task per store, and a store that fails even
alone becomes ``error`` records naming the cause. Ctrl-C cancels the tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import adapterprobe._core as _core
from adapterprobe.errors import AdapterProbeError, require
from adapterprobe.judge import judge_batch
from adapterprobe.probes import PROBES, resolve_options
from adapterprobe.probes.options import ProbeOptions
from adapterprobe.probes.result import Verdict
from adapterprobe.records import ScanRecord

# Tasks per CPU of the cluster: enough to balance uneven stores, few enough
# that per-task overhead stays small.
TASKS_PER_CPU = 4
MAX_BATCH = 512
MAX_RETRIES = 3


def _scan_batch(targets: list, probes: tuple, options: dict) -> list[ScanRecord]:
    # One Ray task holds one CPU: read with one thread so tasks don't oversubscribe.
    return judge_batch(targets, probes, options, workers=1)


def batch_size(num_targets: int, cpus: float) -> int:
    """Stores per task for a cluster with `cpus` CPUs."""
    tasks = max(1, int(cpus) * TASKS_PER_CPU)
    return max(1, min(MAX_BATCH, math.ceil(num_targets / tasks)))


def _holds_gap_records(target: Any) -> bool:
    """Whether the store's logs hold GAP monitor records (read again here,
    on the driver, only for a batch that failed)."""
    base = target.log_root if target.log_root is not None else target.store
    try:
        return _core.gap_input(base) is not None
    except AdapterProbeError:
        return False


def failed_records(target: Any, probes: Sequence[str], cause: str) -> list[ScanRecord]:
    """The records a store would have produced (in the same order), each an
    error naming `cause`."""
    store = str(target.store)
    message = f"probing this store failed on the cluster: {cause}"
    out = []
    kind = target.checkpoint_kind
    for name in sorted(p for p in probes if PROBES[p].scope == "store"):
        if name == "gap_monitor" and not _holds_gap_records(target):
            continue  # a store answers gap_monitor only where its logs hold the monitor's
        if target.with_logs:
            out.append(
                ScanRecord(store, None, target.layout, name, Verdict.ERROR, None, message, {}, kind)
            )
    adapters = [str(v) for v in target.versions] + [str(a) for a, _ in target.broken]
    per_adapter = sorted(p for p in probes if PROBES[p].scope == "adapter")
    for adapter in adapters:  # the order judge gives them: versions, then broken
        for name in per_adapter:
            out.append(
                ScanRecord(store, adapter, target.layout, name, Verdict.ERROR, None, message)
            )
    return out


def run_on_ray(
    targets: Sequence[Any],
    probes: Sequence[str],
    options: Mapping[str, ProbeOptions | Mapping[str, Any]] | None,
    *,
    address: str | None = None,
    rules: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_retries: int = MAX_RETRIES,
) -> list[ScanRecord]:
    """Judge `targets` on a Ray cluster (a local one when `address` is None)."""
    ray = require("ray", "ray")
    resolved = resolve_options(tuple(probes), options, rules)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    try:
        return _run(ray, list(targets), tuple(probes), resolved, progress, max_retries)
    finally:
        if started_here:
            ray.shutdown()


def _run(ray, targets, probes, options, progress, max_retries) -> list[ScanRecord]:
    task = ray.remote(max_retries=max_retries, retry_exceptions=True)(_scan_batch)
    size = batch_size(len(targets), ray.cluster_resources().get("CPU", 1))
    batches = [targets[i : i + size] for i in range(0, len(targets), size)]
    results: list[list[ScanRecord] | None] = [None] * len(batches)
    # ref -> (batch index, position inside the batch or None for the whole batch)
    pending: dict[Any, tuple[int, int | None]] = {
        task.remote(b, probes, options): (i, None) for i, b in enumerate(batches)
    }
    # Batches split after failing: index -> per-store results.
    split: dict[int, list[list[ScanRecord] | None]] = {}
    total, done = len(targets), 0
    if progress:
        progress(0, total)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            index, position = pending.pop(ref)
            try:
                records = ray.get(ref)
                finished = len(batches[index]) if position is None else 1
            except ray.exceptions.RayError as exc:
                cause = _cause(exc)
                if position is None and len(batches[index]) > 1:
                    # Isolate the store that fails: one task per store of this batch.
                    split[index] = [None] * len(batches[index])
                    for j, target in enumerate(batches[index]):
                        pending[task.remote([target], probes, options)] = (index, j)
                    continue
                target = batches[index][position or 0]
                records, finished = failed_records(target, probes, cause), 1
            if position is None:
                results[index] = records
            else:
                parts = split[index]
                parts[position] = records
                if all(p is not None for p in parts):
                    results[index] = [r for p in parts for r in (p or [])]
            done += finished
            if progress:
                progress(done, total)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return [record for batch in results for record in (batch or [])]


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else 'no details'}"
