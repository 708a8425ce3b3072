"""Plain-JSON conversion shared by results, records and written reports."""

from __future__ import annotations

import enum
import math
from typing import Any


def json_safe(value: Any) -> Any:
    """Recursively turn a value into plain JSON types; NaN and infinities become None."""
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    # numpy scalars and arrays without importing numpy here.
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    return str(value)
