"""The Python-facing kernels and the dlm reader at the extremes of their inputs.

Hypothesis drives huge and tiny floats, subnormals, signed zeros, NaN and
the infinities, empty, one-point and long inputs, and Unicode strings into
``robust_curve``, ``curve_metrics``, ``count_spikes``/``spike_indices`` and
``read_loss_curve`` on generated dlm lines. Only shape is asserted here: no
panic, no exception other than an AdapterProbeError, results of the
documented types and lengths, indices inside the input. Exact values are
checked against references in tests/test_curves.py and friends.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapterprobe as ap

EXTREMES = [
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    1e-300,
    1e300,
    math.nan,
    math.inf,
    -math.inf,
]

floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from(EXTREMES),
    st.floats(min_value=0.0, max_value=10.0),
)
# Short, and now and then long, sequences; as lists or float64 arrays.
sequences = st.one_of(
    st.lists(floats, max_size=40),
    st.lists(floats, min_size=500, max_size=3000),
    st.lists(st.sampled_from(EXTREMES), min_size=1, max_size=20),
).flatmap(lambda xs: st.sampled_from([xs, np.asarray(xs, dtype=np.float64)]))
# Windows and blocks: any non-negative size (0 and 1 are refused or trivial;
# negative sizes are a known bug, see test_negative_window_is_a_usage_error).
# Mostly valid settings, so that most calls get past the argument checks.
sizes = st.one_of(
    st.integers(3, 70),
    st.integers(3, 70).map(lambda n: n | 1),
    st.integers(0, 70),
    st.sampled_from([2**31, 2**63 - 1, 2**64 - 1]),
)
positive = st.one_of(st.floats(min_value=1e-3, max_value=50.0), st.just(3.0), floats)

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The result, or None for an AdapterProbeError (anything else propagates)."""
    try:
        return fn(*args, **kwargs)
    except ap.AdapterProbeError:
        return None


def _check_indices(indices: Any, n: int) -> None:
    values = list(indices)
    assert all(isinstance(int(i), int) and 0 <= int(i) < n for i in values), (values, n)


@SETTINGS
@given(losses=sequences, trend_window=sizes, spike_z=positive, rise=positive, block=sizes)
def test_robust_curve_at_the_extremes(
    losses: Any, trend_window: int, spike_z: float, rise: float, block: int
) -> None:
    n = len(losses)
    r = _call(
        ap.robust_curve,
        losses,
        trend_window=trend_window,
        spike_z=spike_z,
        min_spike_rise=rise,
        scale_block=block,
    )
    if r is None:
        return
    assert isinstance(r, ap._core.RobustCurve)
    assert len(r.trend) == n and all(isinstance(x, float) for x in r.trend)
    _check_indices(r.nonfinite, n)
    assert 0 <= r.best_index < n
    assert 0 < r.level_points <= n
    for x in (r.head_level, r.tail_level, r.best_level, r.noise):
        assert isinstance(x, float)
    assert isinstance(r.relative, bool)
    assert isinstance(r.relative_drop(), float) and isinstance(r.relative_regression(), float)
    for s in r.spikes:
        assert 0 <= s.start <= s.peak <= s.end < n
        assert all(isinstance(x, float) for x in (s.rise, s.relative_rise, s.z))
    repr(r)


@SETTINGS
@given(losses=sequences, window=sizes, sigma=positive)
def test_curve_metrics_at_the_extremes(losses: Any, window: int, sigma: float) -> None:
    m = _call(ap.curve_metrics, losses, rolling_window=window, spike_sigma=sigma)
    if m is None:
        return
    assert isinstance(m, dict)
    for key in ("initial_loss", "final_loss", "convergence_ratio", "smoothness"):
        assert m[key] is None or isinstance(m[key], float), (key, m[key])
    assert isinstance(m["instability_events"], int) and m["instability_events"] >= 0
    _check_indices(m["spike_points"], len(losses))
    _check_indices(m["nonfinite_points"], len(losses))


@SETTINGS
@given(deltas=sequences, window=sizes, sigma=positive)
def test_spike_counts_at_the_extremes(deltas: Any, window: int, sigma: float) -> None:
    count = _call(ap.count_spikes, deltas, window=window, sigma=sigma)
    indices = _call(ap.spike_indices, deltas, window=window, sigma=sigma)
    assert (count is None) == (indices is None)
    if count is None:
        return
    assert isinstance(count, int) and 0 <= count <= len(deltas)
    assert isinstance(indices, np.ndarray) and indices.dtype == np.int64 and indices.ndim == 1
    assert len(indices) == count
    _check_indices(indices, len(deltas))


@SETTINGS
@given(
    values=st.lists(
        st.one_of(st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)), max_size=5
    )
)
def test_kernels_refuse_non_numbers_cleanly(values: list[Any]) -> None:
    for fn in (ap.robust_curve, ap.curve_metrics, ap.count_spikes, ap.spike_indices):
        _call(fn, values)


# ---------------------------------------------------------------------------
# read_loss_curve on generated dlm lines

UNICODE_DIGITS = "٠١٢٣٤٥٦٧٨٩０１２３４５６７８９"
steps = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2**53, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1]),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(
        alphabet=st.sampled_from("0123456789_ +-.e" + UNICODE_DIGITS + "\u00a0\u2028"), max_size=8
    ),
    st.none(),
)
losses = st.one_of(
    floats,
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.text(max_size=8),
    st.sampled_from(["nan", "-inf", "Infinity", "1_0.5", " 2.5 ", "1e999", "١.٥", "\u2028"]),
    st.none(),
)
record = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["step", "step", "banner", "Step", ""]),
        "step": steps,
        "loss": losses,
    },
    optional={"val_loss": losses, "note": st.text(max_size=20)},
)


def _line(rec: dict[str, Any], raw: bool) -> str:
    if raw:  # a line written by hand: keys unsorted, Unicode kept, odd spacing
        return (
            "{"
            + " ,\t".join(
                f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False)}" for k, v in rec.items()
            )
            + "}"
        )
    return json.dumps(rec, sort_keys=True)


@SETTINGS
@given(
    records=st.lists(st.tuples(record, st.booleans()), max_size=30),
    banner=st.booleans(),
    ending=st.sampled_from(["\n", "\r\n", ""]),
)
def test_read_loss_curve_on_generated_dlm_lines(
    tmp_path: Path, records: list[tuple[dict[str, Any], bool]], banner: bool, ending: str
) -> None:
    lines = ['{"type": "banner", "run_id": 1}'] if banner else []
    lines += [_line(rec, raw) for rec, raw in records]
    path = tmp_path / "train-000001-20250301T090000.jsonl"
    path.write_text(ending.join(lines) + ending, encoding="utf-8")
    curve = _call(ap.read_loss_curve, path)
    if curve is None:
        return
    assert isinstance(curve.steps, np.ndarray) and curve.steps.dtype == np.int64
    assert isinstance(curve.losses, np.ndarray) and curve.losses.dtype == np.float64
    assert curve.steps.ndim == curve.losses.ndim == 1
    assert len(curve.steps) == len(curve.losses) == len(curve) <= len(records)
    assert curve.source == "dlm" and curve.series == "loss"
    m = curve.metrics()
    assert isinstance(m, dict)
    assert set(np.asarray(m["spike_steps"]).tolist()) <= set(curve.steps.tolist())
    sample = curve.sample(cap=4)
    assert isinstance(sample, list) and len(sample) <= len(curve)
    for step, loss in sample:
        assert isinstance(step, int) and (loss is None or isinstance(loss, float))
    r = curve.robust()
    assert r is None or len(r.trend) == len(curve)


_SIZE_ARGUMENTS = [
    ("count_spikes", lambda n: ap.count_spikes([1.0, 2.0], window=n)),
    ("spike_indices", lambda n: ap.spike_indices([1.0, 2.0], window=n)),
    ("curve_metrics", lambda n: ap.curve_metrics([1.0, 2.0], rolling_window=n)),
    ("robust_curve trend_window", lambda n: ap.robust_curve([1.0, 2.0], trend_window=n)),
    ("robust_curve scale_block", lambda n: ap.robust_curve([1.0, 2.0], scale_block=n)),
]


@pytest.mark.parametrize("name,call", _SIZE_ARGUMENTS, ids=[n for n, _ in _SIZE_ARGUMENTS])
@pytest.mark.parametrize("value", [-1, -(2**70)])
def test_negative_size_argument_is_a_usage_error(name: str, call: Any, value: int) -> None:
    # Found by the fuzzer: PyO3's integer conversion raised OverflowError.
    with pytest.raises(ap.UsageError, match="non-negative integer"):
        call(value)


@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=40))
@settings(max_examples=30, deadline=None)
def test_huge_size_argument_is_no_overflow(values: list[float]) -> None:
    # Beyond 64 bits means "as large as you like", not OverflowError.
    assert ap.count_spikes(values, window=2**70) == ap.count_spikes(values, window=2**62)
