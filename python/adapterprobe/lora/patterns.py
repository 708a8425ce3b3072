"""Module selection by glob pattern (``include``/``exclude`` of extraction)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from adapterprobe.errors import UsageError


def matches(module: str, patterns: Sequence[str]) -> bool:
    """True when a pattern matches the module path or its tail (``q_proj`` matches ``*.q_proj``)."""
    return any(
        fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, "*." + p) for p in patterns
    )


def as_patterns(value: str | Iterable[str] | None, name: str) -> tuple[str, ...]:
    """One pattern or a list of them, as a tuple; UsageError for anything else."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(str(v) for v in value)
    except TypeError as exc:
        raise UsageError(f"{name} must be a pattern or a list of patterns") from exc
