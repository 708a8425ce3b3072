"""Statistics tables and summaries, on the host, from what the reductions returned.

A sampled step ends with a few NumPy arrays per kind; this module folds them into
one :class:`StatsTable` per kind (a row per tensor or module, every hook call of
the step merged) and turns a table into the summary keys: global, per layer and
the ``top_k`` offenders. Plain NumPy and floats, no torch kernels: everything
here runs once per sampled step, after the only copy from the device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

# kind, module name, instances, elements per instance, statistics of one hook call
HookRow = tuple[str, str, int, int, tuple[Any, ...]]


@dataclasses.dataclass
class StatsTable:
    """One kind's statistics per tensor name, on the host (the unit summaries are made of)."""

    names: list[str]
    sumsq: np.ndarray  # sum of squares over every element recorded (all calls)
    numel: np.ndarray  # elements recorded
    max_abs: np.ndarray
    nonfinite: np.ndarray
    stats: np.ndarray | None = None  # [n, len(STATS)], detail="tensors" only
    count: np.ndarray | None = None  # instances averaged over (activations, detail="tensors")


def _max(a: float, b: float) -> float:
    """max() that lets NaN win, so a NaN anywhere shows in the maximum."""
    return math.nan if (a != a or b != b) else max(a, b)


def _rank(value: float) -> float:
    return math.inf if value != value else value


def layer_of(name: str) -> str | None:
    """``model.layers.3.mlp.up_proj.weight`` -> ``model.layers.3``; None without a number."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: index + 1])
    return None


def _fold(acc: list[float], sumsq: float, numel: float, top: float, bad: float) -> None:
    """Fold one tensor into [sum of squares, elements, max_abs, nonfinite, nonfinite tensors]."""
    acc[0] += sumsq
    acc[1] += numel
    acc[2] = _max(acc[2], top)
    acc[3] += bad
    acc[4] += bad > 0


def summarize(
    kind: str,
    table: StatsTable,
    *,
    top_k: int,
    layers: Mapping[str, str | None] | None = None,
) -> dict[str, float]:
    """The summary keys of one kind: global, per layer, and the ``top_k`` offenders.

    ``layers`` maps names to layers when known (a cache); others go through
    :func:`layer_of`.
    """
    prefix = f"gap/summary/{kind}s"
    whole = kind in ("param", "grad")
    total = [0.0, 0.0, 0.0, 0.0, 0.0]
    groups: dict[str, list[float]] = {}
    columns = (
        table.sumsq.tolist(),
        table.numel.tolist(),
        table.max_abs.tolist(),
        table.nonfinite.tolist(),
    )
    for name, sumsq, numel, top, bad in zip(table.names, *columns, strict=True):
        _fold(total, sumsq, numel, top, bad)
        layer = layers.get(name) if layers is not None and name in layers else layer_of(name)
        if layer is not None:
            group = groups.get(layer)
            if group is None:
                group = groups[layer] = [0.0, 0.0, 0.0, 0.0, 0.0]
            _fold(group, sumsq, numel, top, bad)
    out: dict[str, float] = {}
    size_stat = "l2_norm" if whole else "rms"
    for where, acc in [("", total), *((f"layers/{k}/", v) for k, v in groups.items())]:
        if whole:
            size = math.sqrt(acc[0]) if acc[0] == acc[0] else math.nan
        else:
            size = math.sqrt(acc[0] / acc[1]) if acc[1] and acc[0] == acc[0] else math.nan
        out[f"{prefix}/{where}{size_stat}"] = size
        out[f"{prefix}/{where}max_abs"] = acc[2]
        if not where:
            out[f"{prefix}/nonfinite"] = acc[3]
            out[f"{prefix}/nonfinite_tensors"] = acc[4]
        elif acc[3]:  # per layer only where NaN/inf showed up: the record stays small
            out[f"{prefix}/{where}nonfinite"] = acc[3]
    if top_k:
        with np.errstate(invalid="ignore"):
            ranking = (np.sqrt(table.sumsq) if whole else table.max_abs).tolist()
        stat = "l2_norm" if whole else "max_abs"
        order = sorted(range(len(ranking)), key=lambda i: _rank(ranking[i]), reverse=True)
        for i in order[:top_k]:
            out[f"{prefix}/top_{stat}/{table.names[i]}"] = ranking[i]
    return out


def _moments(sums: np.ndarray, norms: np.ndarray, n: Any) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased variance from sums and L2 norms over ``n`` elements each."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mean = sums / n
        var = np.maximum((norms * norms - sums * mean) / (n - 1), 0.0)  # NaN stays NaN
    return mean, var


def _max_abs(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(lows), np.abs(highs))  # NaN stays NaN


def whole_tensor_table(
    named: list[tuple[str, torch.Tensor]], values: np.ndarray, with_sums: bool
) -> tuple[StatsTable, list[int]]:
    """A table for params or grads from ``_whole_tensor_stats`` output; also the rows
    whose NaN/inf still need counting (a non-finite norm or extreme says there are some)."""
    n = len(named)
    norms, lows, highs = values[:n], values[n : 2 * n], values[2 * n : 3 * n]
    sizes = np.array([tensor.numel() for _, tensor in named], dtype=np.float64)
    max_abs = _max_abs(lows, highs)
    with np.errstate(over="ignore", invalid="ignore"):
        table = StatsTable([name for name, _ in named], norms * norms, sizes, max_abs, np.zeros(n))
    suspects = np.nonzero(~(np.isfinite(max_abs) & np.isfinite(norms)))[0].tolist()
    if with_sums:
        means, variances = _moments(values[3 * n :], norms, sizes)
        table.stats = np.stack([means, variances, max_abs, norms, table.nonfinite], axis=1)
    return table, suspects


def activation_tables(
    rows: list[HookRow], values: list[Any], with_stats: bool
) -> dict[str, StatsTable]:
    """Fold every hook call of the step into one row per (kind, module).

    ``values[i]`` is row i's host values: ``[min, max, sum of squares, nonfinite]``, or
    with ``with_stats`` an array ``[sums (B), norms (B), min, max, nonfinite]``.
    """
    if not rows:
        return {}
    if with_stats:
        return _instance_tables(rows, values)
    totals: dict[tuple[str, str], list[float]] = {}  # sumsq, numel, max, nonfinite
    for (kind, name, instances, size, _), row in zip(rows, values, strict=True):
        low, high, sumsq, bad = row.tolist() if isinstance(row, np.ndarray) else row
        acc = totals.get((kind, name))
        if acc is None:
            acc = totals[(kind, name)] = [0.0, 0.0, 0.0, 0.0]
        acc[0] += sumsq
        acc[1] += instances * size
        acc[2] = _max(acc[2], _max(abs(low), abs(high)))
        acc[3] += bad
    return _tables_from(totals, None)


def _tables_from(
    totals: dict[tuple[str, str], list[float]],
    stats: dict[tuple[str, str], list[float]] | None,
    counts: dict[tuple[str, str], float] | None = None,
) -> dict[str, StatsTable]:
    by_kind: dict[str, list[tuple[str, list[float]]]] = {}
    for (kind, name), acc in totals.items():
        by_kind.setdefault(kind, []).append((name, acc))
    tables = {}
    for kind, entries in by_kind.items():
        array = np.array([acc for _, acc in entries], dtype=np.float64).reshape(-1, 4)
        names = [name for name, _ in entries]
        table = StatsTable(names, array[:, 0], array[:, 1], array[:, 2], array[:, 3])
        if stats is not None:
            table.stats = np.array([stats[(kind, name)] for name in names], dtype=np.float64)
        if counts is not None:
            table.count = np.array([counts[(kind, name)] for name in names], dtype=np.float64)
        tables[kind] = table
    return tables


def _instance_tables(rows: list[HookRow], values: list[np.ndarray]) -> dict[str, StatsTable]:
    """Per-instance statistics averaged over every call of a module in the step.

    Vectorised over all rows at once: a sampled step has a row per hook call, and
    numpy calls on a handful of numbers each would cost more than the arithmetic.
    """
    counts = np.array([row[2] for row in rows])
    sizes = np.array([row[3] for row in rows], dtype=np.float64)
    sums = np.concatenate([v[:b] for v, b in zip(values, counts.tolist(), strict=True)])
    norms = np.concatenate([v[b : 2 * b] for v, b in zip(values, counts.tolist(), strict=True)])
    tails = np.stack([v[-3:] for v in values])  # min, max, nonfinite per row
    means, variances = _moments(sums, norms, np.repeat(sizes, counts))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    with np.errstate(over="ignore", invalid="ignore"):
        squares = np.add.reduceat(norms * norms, starts)
    per_row = zip(
        rows,
        np.add.reduceat(means, starts).tolist(),
        np.add.reduceat(variances, starts).tolist(),
        np.add.reduceat(norms, starts).tolist(),
        squares.tolist(),
        _max_abs(tails[:, 0], tails[:, 1]).tolist(),
        tails[:, 2].tolist(),
        strict=True,
    )
    # instances, mean, var, l2, sumsq, numel, max, nonfinite
    merged: dict[tuple[str, str], list[float]] = {}
    for (kind, name, instances, size, _), mean, var, l2, sumsq, top, bad in per_row:
        acc = merged.get((kind, name))
        if acc is None:
            acc = merged[(kind, name)] = [0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        acc[0] += instances
        acc[1] += mean
        acc[2] += var
        acc[3] += l2
        acc[4] += sumsq
        acc[5] += instances * size
        acc[6] = _max(acc[6], top)
        acc[7] += bad
    totals = {key: [acc[4], acc[5], acc[6], acc[7]] for key, acc in merged.items()}
    stats = {
        key: [acc[1] / acc[0], acc[2] / acc[0], acc[6], acc[3] / acc[0], acc[7]]
        for key, acc in merged.items()
    }
    instances = {key: float(acc[0]) for key, acc in merged.items()}
    return _tables_from(totals, stats, instances)


def concat_tables(tables: list[StatsTable]) -> StatsTable:
    """One table from several (params of different dtypes or devices)."""
    if len(tables) == 1:
        return tables[0]
    stats = [t.stats for t in tables]
    return StatsTable(
        [name for t in tables for name in t.names],
        np.concatenate([t.sumsq for t in tables]),
        np.concatenate([t.numel for t in tables]),
        np.concatenate([t.max_abs for t in tables]),
        np.concatenate([t.nonfinite for t in tables]),
        None if any(s is None for s in stats) else np.concatenate(stats),  # type: ignore[arg-type]
    )
