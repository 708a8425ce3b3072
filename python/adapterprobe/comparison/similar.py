"""``similar(root)``: every pair of adapters under a root whose updates are
(almost) the same, found in Rust with the GIL released (``store::similar``:
one read per adapter into a sketch, exact r×r similarity for the pairs the
sketch lets through)."""

from __future__ import annotations

import os
from typing import Any

import adapterprobe._core as _core

#: Pairs reported by default; a store of copies of one adapter has far more.
DEFAULT_MAX_PAIRS = 10_000


def similar(
    root: str | os.PathLike[str],
    *,
    threshold: float = 0.99,
    exhaustive: bool = False,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    all_checkpoints: bool = False,
) -> dict[str, Any]:
    """``{"pairs": [{"a", "b", "similarity"}...], "skipped": [...], ...}``,
    pairs most similar first; paths are the adapter directories.

    At most ``max_pairs`` pairs are listed (the most similar);
    ``pairs_found`` counts every pair at or above the threshold, so a
    store of a thousand copies answers in bounded memory.

    A run's checkpoints are near-copies of its final adapter, so by default
    one adapter per run is compared (the final one, else the newest
    checkpoint; ``checkpoint-N/`` and a dlm store's ``versions/`` are runs'
    checkpoints); ``all_checkpoints=True`` compares every one.
    ``left_out`` counts the adapters not compared."""
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 0:
        raise ValueError(f"max_pairs must be a non-negative integer, got {max_pairs!r}")
    report = _core.similar_adapters(
        os.fspath(root),
        threshold=threshold,
        exhaustive=exhaustive,
        max_pairs=max_pairs,
        all_checkpoints=all_checkpoints,
    )
    return {
        "pairs": [
            {"a": str(p.a), "b": str(p.b), "similarity": float(p.similarity)} for p in report.pairs
        ],
        "pairs_found": report.pairs_found,
        "max_pairs": report.max_pairs,
        "adapters": report.adapters,
        "groups": report.groups,
        "pairs_considered": report.pairs_considered,
        "pairs_exact": report.pairs_exact,
        "skipped": [{"path": str(s.path), "reason": s.reason} for s in report.skipped],
        "threshold": report.threshold,
        "exhaustive": report.exhaustive,
        "left_out": report.left_out,
    }
