"""``compare(A, B, ...)``: runs, checkpoints or adapters side by side.

Per side: the loss curve (best and final loss and where they were reached,
eval loss, the step at which a common loss level was first reached) and the
adapter (rank, rank used, ‖ΔW‖ per module and per layer). Per pair of
adapters: the cosine of their updates per module and over all shared modules
(energy-weighted), and the principal angles between the column spaces, all
computed in Rust in r×r space (``_core.compare_adapter_updates``).

The top-level ``"similarity"``, ``"modules"`` and ``"left_out"`` describe the
first pair (A against B); ``"pairs"`` holds every pair when more than two
paths are given. Curves are aligned by optimizer step (the one axis every log
format carries), and ``"aligned_by"`` also lists ``"epoch"`` / ``"tokens"``
when every curve has them (HF ``trainer_state.json``: each curve then carries
``"epoch"`` / ``"tokens"`` as ``[step, value]`` points).
"""

from __future__ import annotations

import copy
import json
import os
from itertools import combinations
from typing import Any

import adapterprobe._core as _core
from adapterprobe._json import json_safe
from adapterprobe.comparison.sources import (
    Side,
    adapter_summary,
    curve_summary,
    other_axes,
    resolve,
    step_to_level,
)
from adapterprobe.errors import AdapterProbeError, UsageError
from adapterprobe.probes.drift import DriftOptions, judge_drift
from adapterprobe.probes.options import resolve as resolve_options
from adapterprobe.probes.result import Verdict

LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _pair(x: Side, y: Side, angles: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"a": x.label, "b": y.label, "similarity": None, "modules": []}
    out["left_out"] = []
    if x.adapter is None or y.adapter is None:
        out["error"] = "both sides need adapter weights to compare updates"
        return out
    try:
        found = _core.compare_adapter_updates(x.adapter, y.adapter, angles=angles)
    except AdapterProbeError as exc:
        out["error"] = str(exc)
        return out
    out.update(
        path_a=str(found["path_a"]),
        path_b=str(found["path_b"]),
        similarity=found["similarity"],
        modules=found["modules"],
        left_out=found["left_out"],
        shared_modules=len(found["modules"]),
        scaled=found["scaled"],
    )
    return out


def _item(side: Side) -> dict[str, Any]:
    item: dict[str, Any] = {
        "label": side.label,
        "path": str(side.path),
        "kind": side.kind,
        "adapter": None,
        "curve": None,
        "notes": list(side.notes),
    }
    if side.adapter is not None:
        try:
            item["adapter"] = adapter_summary(side.adapter)
        except AdapterProbeError as exc:
            item["notes"].append(f"adapter not read: {exc}")
    if side.curve is not None:
        item["curve"] = curve_summary(side.curve)
        item["curve"].update(other_axes(side))
    return item


#: The verdicts a run's loss curve may have to set the level the others are
#: timed to, best first.
LEVEL_VERDICTS = (Verdict.PASS, Verdict.WARN)


def _loss_level(
    sides: list[Side], items: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, str | None]:
    """The loss level every run is timed to, and the step each first reached
    it; or None and why there is none.

    The level is the highest best loss (of the smoothed trend, where every
    curve has one) among the runs whose training_drift verdict is the best
    one present, PASS before WARN: a run that FAILs (diverged, NaN, too few
    steps) or that stalled high would set a level the healthy runs "reach"
    at their first step. Each curve's verdict is in its item
    (``curve["training_drift"]``)."""
    options = resolve_options(DriftOptions, None, None, {})
    verdicts: dict[str, Verdict] = {}
    for side, item in zip(sides, items, strict=True):
        if item["curve"] is None:
            continue
        verdict = judge_drift(side.drift, options).verdict if side.drift is not None else None
        item["curve"]["training_drift"] = None if verdict is None else verdict.value
        if verdict is not None:
            verdicts[side.label] = verdict
    chosen = next((v for v in LEVEL_VERDICTS if v in verdicts.values()), None)
    if chosen is None:
        judged = ", ".join(f"{label} {v.value.upper()}" for label, v in verdicts.items())
        return None, (
            "no loss level to time the runs to: none of their loss curves passes "
            "training_drift or only warns" + (f" ({judged})" if judged else "")
        )
    curves = {i["label"]: i["curve"] for i in items if verdicts.get(i["label"]) is chosen}
    # The smoothed trend where every curve has one, else the raw losses.
    trend = all(c["best_trend_loss"] is not None for c in curves.values())
    key = "best_trend_loss" if trend else "best_loss"
    bests = [c[key] for c in curves.values() if c[key] is not None]
    if not bests:
        return None, "no loss level to time the runs to: no finite best loss"
    target = max(bests)
    return {
        "loss": target,
        "smoothed": trend,
        "verdict": chosen.value,
        "from": sorted(curves),
        "left_out": {label: v.value for label, v in verdicts.items() if label not in curves},
        "steps": {
            s.label: step_to_level(s.curve, target, trend=trend) if s.curve is not None else None
            for s in sides
        },
    }, None


def build(paths: list[str | os.PathLike[str]], *, angles: bool = True) -> dict[str, Any]:
    """The comparison of `paths` as plain data (see the module doc)."""
    if len(paths) < 2:
        raise UsageError("compare needs at least two paths")
    if len(paths) > len(LABELS):
        raise UsageError(f"compare takes at most {len(LABELS)} paths, got {len(paths)}")
    sides = [resolve(p, LABELS[i]) for i, p in enumerate(paths)]
    items = [_item(s) for s in sides]
    pairs = [_pair(x, y, angles) for x, y in combinations(sides, 2)]
    curves = [i["curve"] for i in items if i["curve"] is not None]
    level, no_level = _loss_level(sides, items) if len(curves) >= 2 else (None, None)
    first = pairs[0]
    return {
        "similarity": first["similarity"],
        "modules": first["modules"],
        "left_out": first["left_out"],
        "pair_error": first.get("error"),
        "items": items,
        "pairs": pairs,
        "loss_level": level,
        "loss_level_none": no_level,
        "aligned_by": ["step"]
        + [axis for axis in ("epoch", "tokens") if curves and all(axis in c for c in curves)],
    }


class Comparison:
    """The result of :func:`compare`: ``to_dict()`` is the JSON the CLI prints."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = json_safe(data)

    @property
    def similarity(self) -> float | None:
        """Energy-weighted cosine of A's and B's updates over shared modules."""
        value = self._data["similarity"]
        return None if value is None else float(value)

    @property
    def modules(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._data["modules"])

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self._data, indent=indent, allow_nan=False)

    def to_markdown(self) -> str:
        from adapterprobe.comparison.render import render_markdown

        return render_markdown(self._data)

    def to_table(self) -> str:
        from adapterprobe.comparison.render import render_table

        return render_table(self._data)

    def to_html(self) -> str:
        """A standalone page: overlaid loss curves, per-layer bars side by side."""
        from adapterprobe.comparison.render_html import render_page

        return render_page(self._data)

    def _repr_html_(self) -> str:
        from adapterprobe.comparison.render_html import render_fragment

        return render_fragment(self._data)

    def __repr__(self) -> str:
        labels = ", ".join(f"{i['label']}={i['path']}" for i in self._data["items"])
        return f"Comparison({labels}, similarity={self.similarity})"


def compare(*paths: str | os.PathLike[str], angles: bool = True) -> Comparison:
    """Compare runs, checkpoints or adapters (at least two paths)."""
    return Comparison(build(list(paths), angles=angles))
