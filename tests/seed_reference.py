"""Plain-Python reference of the seed semantics (training_drift and the
param-id -> layer mapping), used only by the tests to check the Rust kernels.

Deliberately naive and close to the behaviour spec: numpy for the statistics,
json.loads per line, a sort per point for the spike medians.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np


class ReferenceLogError(Exception):
    pass


def collect_steps(paths: list[Path]) -> dict[int, float]:
    """{step: loss}, later files and later lines winning; NaN/inf stored as inf."""
    out: dict[int, float] = {}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for number, text in enumerate(fh, start=1):
                text = text.strip()
                if not text:
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    if number == 1:
                        raise ReferenceLogError(f"first line of {path.name}") from None
                    continue
                if not isinstance(record, dict) or record.get("type") != "step":
                    continue
                try:
                    step = int(record["step"])
                    loss = float(record["loss"])
                except (KeyError, TypeError, ValueError, OverflowError):
                    continue
                # Beyond the seed, which would crash building its int64 array:
                # a step that does not fit int64 is skipped.
                if not -(2**63) <= step < 2**63:
                    continue
                out[step] = loss if math.isfinite(loss) else math.inf
    return out


def count_spikes(deltas: np.ndarray, window: int, sigma: float) -> list[int]:
    """Indices of spikes, a median recomputed from scratch for every point."""
    n = deltas.size
    if n == 0:
        return []
    magnitudes = np.abs(deltas)
    if n < window:
        base = float(np.median(magnitudes))
        if base == 0.0:
            return []
        return [i for i in range(n) if deltas[i] > 0.0 and deltas[i] > sigma * base]
    half = window // 2
    found = []
    for i in range(n):
        if deltas[i] <= 0.0:
            continue
        lo, hi = max(0, i - half), min(n, i + half + 1)
        neighbours = magnitudes[lo:hi]
        if neighbours.size > 1:
            neighbours = np.delete(neighbours, i - lo)
        base = float(np.median(neighbours))
        if base == 0.0 or float(deltas[i]) > sigma * base:
            found.append(i)
    return found


def curve_metrics(losses: np.ndarray, window: int, sigma: float) -> dict[str, float]:
    values = np.array(losses, dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.all():
        return {
            "initial_loss": math.nan,
            "final_loss": math.nan,
            "convergence_ratio": math.nan,
            "smoothness": 0.0,
            "instability_events": float(values.size),
        }
    if bad.any():
        fill = float(values[~bad][0])
        for i in range(values.size):
            if bad[i]:
                values[i] = fill
            else:
                fill = float(values[i])
    first, last = float(values[0]), float(values[-1])
    ratio = last / first if first != 0.0 else math.inf
    deltas = np.diff(values)
    var_values = float(values.var())
    var_deltas = float(deltas.var()) if deltas.size else 0.0
    smooth = max(0.0, 1.0 - var_deltas / var_values) if var_values > 0.0 else 0.0
    events = len(count_spikes(deltas, window, sigma)) + int(bad.sum())
    return {
        "initial_loss": first,
        "final_loss": last,
        "convergence_ratio": ratio,
        "smoothness": smooth,
        "instability_events": float(events),
    }


def drift_verdict(metrics: dict[str, float], smooth_gte=0.7, ratio_lte=0.7, events_lte=0):
    ok = (
        metrics["smoothness"] >= smooth_gte
        and metrics["convergence_ratio"] <= ratio_lte
        and int(metrics["instability_events"]) <= events_lte
    )
    if ok:
        return "pass", min(1.0, max(0.0, metrics["smoothness"]))
    return "warn", min(1.0, max(0.0, metrics["smoothness"] * 0.5))


_LAYER = re.compile(r"\.layers\.(\d+)\.", re.ASCII)


class ReferenceGroupingError(Exception):
    pass


def group_layers(keys: list[str], num_params: int | None):
    """(layer_indices, params_per_layer, layer_of) or ReferenceGroupingError."""
    if not keys:
        raise ReferenceGroupingError("no keys")
    counts: dict[int, int] = {}
    for key in keys:
        found = _LAYER.search(key)
        if found:
            index = int(found.group(1))
            counts[index] = counts.get(index, 0) + 1
    if not counts:
        raise ReferenceGroupingError("no layered keys")
    if len(set(counts.values())) != 1:
        raise ReferenceGroupingError("heterogeneous")
    per_layer = next(iter(counts.values()))
    layers = tuple(sorted(counts))
    expected = per_layer * len(layers)
    if num_params is not None and num_params < expected:
        raise ReferenceGroupingError("fewer params")
    return layers, per_layer, {p: layers[p // per_layer] for p in range(expected)}


def ghost_verdict(
    global_step: int,
    means: list[float],
    grouping,
    min_steps: int = 50,
    ratio: float = 2.0,
    fail_frac: float = 0.3,
):
    """(verdict, score, raw, frac, worst_layers) of the gradient_ghost ladder.

    ``means``: per-param exp_avg_sq means ordered by param id; ``grouping``:
    (layer_indices, layer_of) or None.
    """
    import statistics

    if global_step < min_steps:
        return "fail", 0.0, float(global_step), None, None
    finite = [m for m in means if math.isfinite(m)]
    if not finite:
        return "fail", 0.0, 0.0, None, None
    overall = statistics.fmean(finite)
    per_layer: dict[int, float] = {}
    flagged: list[int] = []
    floor = 0.0
    layer_count = len(grouping[0]) if grouping else 0
    if grouping and overall > 0.0:
        layers, layer_of = grouping
        collected: dict[int, list[float]] = {layer: [] for layer in layers}
        for pid, m in enumerate(means):
            if math.isfinite(m) and pid in layer_of:
                collected[layer_of[pid]].append(m)
        per_layer = {k: statistics.fmean(v) for k, v in collected.items() if v}
        if per_layer:
            floor = min(per_layer.values())
            if floor > 0.0:
                flagged = [k for k, m in per_layer.items() if m > ratio * floor]
    frac = len(flagged) / layer_count if layer_count else 0.0
    top = sorted(per_layer.items(), key=lambda kv: -kv[1])[:3]
    worst = [{"layer": k, "ratio": (m / floor) if floor > 0 else None} for k, m in top]
    if frac > fail_frac:
        return "fail", 0.3, frac, frac, worst
    if flagged:
        return "warn", 0.7, frac, frac, worst
    return "pass", 0.9, frac, frac, worst
