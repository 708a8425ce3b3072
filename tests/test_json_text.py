"""The Rust JSON writer behind scan output against the json module itself."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapterprobe._core import json_dumps

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
keys = (
    st.text()
    | st.integers()
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
)
trees = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.tuples(inner, inner)
        | st.dictionaries(keys, inner, max_size=6)
    ),
    max_leaves=40,
)


@given(trees)
@settings(max_examples=400, deadline=None)
def test_same_text_as_json_dumps(value: Any) -> None:
    assert json_dumps(value) == json.dumps(value, allow_nan=False)


@given(st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=2000, deadline=None)
def test_floats_are_python_reprs(x: float) -> None:
    assert json_dumps(x) == repr(x)
    assert float(json_dumps(x)) == x


def test_a_scan_record_reads_the_same() -> None:
    evidence = {
        "curve_sampled": [[i, 4.9 / (i + 1) + math.sin(i) * 1e-7] for i in range(600)],
        "note": 'loss fell \u2193 "fast"\n',
        "spikes": [],
        "rank": 16,
        "ok": True,
        "missing": None,
    }
    assert json_dumps(evidence) == json.dumps(evidence)


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, [1.0, -math.inf], {"x": math.nan}, {math.nan: 1}]
)
def test_non_finite_floats_are_value_errors(bad: Any) -> None:
    with pytest.raises(ValueError):
        json_dumps(bad)


@pytest.mark.parametrize("bad", [object(), {1, 2}, b"bytes", {(1, 2): 3}, [1, complex(1, 2)]])
def test_other_types_are_type_errors(bad: Any) -> None:
    with pytest.raises(TypeError):
        json_dumps(bad)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    deep: Any = 1
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ValueError, match="deeply nested"):
        json_dumps(deep)
