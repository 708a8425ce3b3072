"""What a GAPMonitor can be asked for, and the checks of every argument.

``KINDS``, ``STATS`` and ``DETAILS`` name the choices; the checks turn a bad
argument into a :class:`MonitorConfigError` that says what was expected, before
anything is hooked or written. Kept apart from the monitor so that
:class:`GradientDump` checks its arguments the same way without importing it.
"""

from __future__ import annotations

import os
from typing import Any

from adapterprobe.errors import MonitorConfigError

KINDS = ("param", "grad", "activation", "activation_grad")
STATS = ("mean", "var", "max_abs", "l2_norm", "nonfinite")
DETAILS = ("summary", "tensors")
MEAN, VAR, MAX_ABS, L2_NORM, NONFINITE = range(len(STATS))


def int_option(name: str, value: Any, minimum: int) -> int:
    """`value` if it is an int (not a bool) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MonitorConfigError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise MonitorConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def patterns_option(name: str, value: Any) -> tuple[str, ...]:
    """Glob patterns from None, one string, or an iterable of strings."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    try:
        patterns = tuple(items)
    except TypeError:
        raise MonitorConfigError(f"{name} must be a glob string or a list of them") from None
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise MonitorConfigError(f"{name} patterns must be non-empty strings, got {pattern!r}")
    return patterns


def kinds_option(value: Any) -> tuple[str, ...]:
    """The chosen kinds, in the order of KINDS."""
    chosen = patterns_option("kinds", value)
    unknown = sorted(set(chosen) - set(KINDS))
    if unknown:
        raise MonitorConfigError(f"unknown kinds {unknown}; choose from {list(KINDS)}")
    return tuple(kind for kind in KINDS if kind in chosen)


def detail_option(value: Any) -> str:
    """One of DETAILS."""
    if value not in DETAILS:
        raise MonitorConfigError(f"detail must be one of {list(DETAILS)}, got {value!r}")
    return str(value)


def sinks_option(value: Any) -> list[Any]:
    """Checked sink arguments (a path or a sink object each); opened by the caller."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            continue
        if not all(callable(getattr(item, m, None)) for m in ("write_gap", "write_step", "close")):
            raise MonitorConfigError(
                f"sink must be a path or have write_gap/write_step/close, got {type(item).__name__}"
            )
    return items
