"""Typed reads of a record's evidence that came from outside this process.

A scan's own records hold evidence of the shapes the probes write, but a
saved scan (``scan --baseline``, ``report --from``) and any mapping handed
to the renderers may hold any JSON under any key: a list where an object
was written, a string where a number was, ``true`` where a list of pairs
was. Every read of such evidence goes through these accessors, which share
one rule: **a value of the wrong shape is absent** (``None``, an empty list
or an empty mapping), never an exception, and never coerced into another
shape. What "the right shape" is:

- a *number* is an ``int`` or ``float`` that is finite and not a ``bool``;
- a *mapping* is a JSON object (a ``Mapping``);
- *pairs* are a list of ``[x, y]`` lists (or tuples) whose ``x`` is a number
  and whose ``y`` is a number (or, where allowed, ``null``: a non-finite
  value the scan wrote as null); other items are dropped;
- *steps* are the numbers of a list; *names* the strings (and integers, as
  layer indices) of a list; *objects* the mappings of a list.

Whether a record as a whole is usable (its evidence an object at all, its
verdict known) is the loader's business
(:func:`adapterprobe.comparison.baseline.load_saved_scan` refuses such a
record with a usage error naming it); these read inside a record it let
through. The ``as_*`` functions read a value; the others read ``ev[key]``
of an evidence mapping (which itself may be anything).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "as_layer_numbers",
    "as_names",
    "as_number",
    "as_pairs",
    "as_steps",
    "layer_numbers",
    "mapping",
    "names",
    "natural_key",
    "number",
    "objects",
    "pairs",
    "steps",
    "text",
]

_EMPTY: Mapping[str, Any] = {}


def _get(ev: Any, key: str) -> Any:
    return ev.get(key) if isinstance(ev, Mapping) else None


def as_number(value: Any) -> float | None:
    """A finite float, or None for anything else (bools, strings, NaN, inf,
    lists, objects)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        f = float(value)
    except OverflowError:  # an int beyond the float range
        return None
    return f if math.isfinite(f) else None


def as_pairs(value: Any, allow_null: bool = False) -> list[tuple[float, float | None]]:
    """``[[x, y], ...]`` as (x, y) tuples sorted by x; an item that is not a
    list of at least two, or whose x is not a number, is dropped, as is one
    whose y is not a number (kept as None only with ``allow_null``)."""
    if not isinstance(value, list | tuple):
        return []
    out: list[tuple[float, float | None]] = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) < 2:
            continue
        x, y = as_number(item[0]), as_number(item[1])
        if x is None or (y is None and not allow_null):
            continue
        out.append((x, y))
    out.sort(key=lambda p: p[0])
    return out


def as_steps(value: Any) -> list[float]:
    """The numbers of a list, sorted and deduplicated (anything else: [])."""
    if not isinstance(value, list | tuple):
        return []
    return sorted({f for v in value if (f := as_number(v)) is not None})


def as_names(value: Any) -> list[str]:
    """The strings and integers (layer indices) of a list, as text."""
    if not isinstance(value, list | tuple):
        return []
    return [str(v) for v in value if isinstance(v, str | int) and not isinstance(v, bool)]


def as_layer_numbers(value: Any) -> list[tuple[str, float]]:
    """A ``{layer: value}`` object as (layer, value) pairs in natural layer
    order; values that are not numbers are dropped (not an object: [])."""
    if not isinstance(value, Mapping):
        return []
    items = [(str(k), f) for k, v in value.items() if (f := as_number(v)) is not None]
    return sorted(items, key=lambda kv: natural_key(kv[0]))


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort key that puts layer "10" after layer "9". A run of digits sorts
    by its length, then its text (never ``int()`` of it: a saved scan's name
    may hold 5,000 digits, which Python refuses to convert)."""
    parts = re.split(r"(\d+)", text)
    return tuple(
        p if i % 2 == 0 else (len(p.lstrip("0")), p.lstrip("0"), len(p))
        for i, p in enumerate(parts)
    )


# ---------------------------------------------------------------------------
# ev[key], by shape


def number(ev: Any, key: str) -> float | None:
    """``ev[key]`` as a finite number, else None."""
    return as_number(_get(ev, key))


def text(ev: Any, key: str) -> str | None:
    """``ev[key]`` when it is a string, else None."""
    value = _get(ev, key)
    return value if isinstance(value, str) else None


def mapping(ev: Any, key: str) -> Mapping[str, Any]:
    """``ev[key]`` when it is an object, else an empty mapping."""
    value = _get(ev, key)
    return value if isinstance(value, Mapping) else _EMPTY


def objects(ev: Any, key: str) -> list[Mapping[str, Any]]:
    """The objects of the list ``ev[key]`` (``findings``, ``top_modules``);
    other items, or a value that is not a list, give nothing."""
    value = _get(ev, key)
    if not isinstance(value, list | tuple):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def pairs(ev: Any, key: str, *, allow_null: bool = False) -> list[tuple[float, float | None]]:
    """``ev[key]`` as (step, value) pairs by step (:func:`as_pairs`)."""
    return as_pairs(_get(ev, key), allow_null)


def steps(ev: Any, key: str) -> list[float]:
    """``ev[key]`` as sorted distinct numbers (:func:`as_steps`)."""
    return as_steps(_get(ev, key))


def names(ev: Any, key: str) -> list[str]:
    """``ev[key]`` as a list of names (:func:`as_names`)."""
    return as_names(_get(ev, key))


def layer_numbers(ev: Any, key: str) -> list[tuple[str, float]]:
    """``ev[key]`` as (layer, value) pairs (:func:`as_layer_numbers`)."""
    return as_layer_numbers(_get(ev, key))
