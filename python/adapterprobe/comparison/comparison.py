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
    level: dict[str, Any] | None = None
    if len(curves) >= 2:
        # The highest best level of the smoothed curves (raw losses when a
        # curve has no trend): every run reaches it; when, is the comparison.
        trend = all(c["best_trend_loss"] is not None for c in curves)
        key = "best_trend_loss" if trend else "best_loss"
        bests = [c[key] for c in curves if c[key] is not None]
        if bests:
            target = max(bests)
            level = {
                "loss": target,
                "smoothed": trend,
                "steps": {
                    s.label: step_to_level(s.curve, target, trend=trend)
                    if s.curve is not None
                    else None
                    for s in sides
                },
            }
    first = pairs[0]
    return {
        "similarity": first["similarity"],
        "modules": first["modules"],
        "left_out": first["left_out"],
        "pair_error": first.get("error"),
        "items": items,
        "pairs": pairs,
        "loss_level": level,
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
