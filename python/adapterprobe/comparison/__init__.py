"""Comparing runs and adapters: ``compare`` (two or more paths side by side),
``similar`` (near-duplicate adapters across a store) and the ``--baseline``
regression gate of ``scan`` (``baseline``)."""

from __future__ import annotations

from adapterprobe.comparison.comparison import Comparison, compare
from adapterprobe.comparison.similar import similar

__all__ = ["Comparison", "compare", "similar"]
