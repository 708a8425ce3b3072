"""``similar(root)``: every pair of adapters under a root whose updates are
(almost) the same, found in Rust with the GIL released (``store::similar``:
one read per adapter into a sketch, exact r×r similarity for the pairs the
sketch lets through)."""

from __future__ import annotations

import os
from typing import Any

import adapterprobe._core as _core


def similar(
    root: str | os.PathLike[str], *, threshold: float = 0.99, exhaustive: bool = False
) -> dict[str, Any]:
    """``{"pairs": [{"a", "b", "similarity"}...], "skipped": [...], ...}``,
    pairs most similar first; paths are the adapter directories."""
    report = _core.similar_adapters(os.fspath(root), threshold=threshold, exhaustive=exhaustive)
    return {
        "pairs": [
            {"a": str(p.a), "b": str(p.b), "similarity": float(p.similarity)} for p in report.pairs
        ],
        "adapters": report.adapters,
        "groups": report.groups,
        "pairs_considered": report.pairs_considered,
        "pairs_exact": report.pairs_exact,
        "skipped": [{"path": str(s.path), "reason": s.reason} for s in report.skipped],
        "threshold": report.threshold,
        "exhaustive": report.exhaustive,
    }
