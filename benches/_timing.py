"""Shared timing helpers: best-of-N wall time and one ratio line per comparison."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of `repeat` runs (the least disturbed by a noisy machine)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def report(name: str, ours: float, reference_name: str, reference: float, extra: str = "") -> float:
    """Print `name: ours X s, <reference> Y s, ratio Z x` and return the ratio."""
    ratio = reference / ours if ours > 0 else float("inf")
    tail = f"  {extra}" if extra else ""
    print(
        f"{name}: ours {ours:.4f} s, {reference_name} {reference:.4f} s, ratio {ratio:.1f}x{tail}",
        flush=True,
    )
    return ratio
