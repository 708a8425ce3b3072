"""The robust curve kernel (Rust) against its plain-Python reference, and on
shapes every healthy or broken run has."""

from __future__ import annotations

import math

import pytest
import robust_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import adapterprobe as ap

finite = st.floats(0.01, 20, allow_nan=False, allow_infinity=False)
loss = st.one_of(finite, finite, finite, st.sampled_from([math.nan, math.inf]))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(
    losses=st.lists(loss, min_size=1, max_size=300),
    window=st.integers(3, 31),
    z=st.floats(0.5, 10),
    rise=st.floats(0, 0.5),
    block=st.integers(8, 80),
    false_alarm=st.floats(1e-6, 0.5),
    fall_share=st.floats(0, 1),
)
def test_kernel_matches_reference(losses, window, z, rise, block, false_alarm, fall_share):
    got = ap.robust_curve(
        losses,
        trend_window=window,
        spike_z=z,
        min_spike_rise=rise,
        scale_block=block,
        spike_false_alarm=false_alarm,
        spike_fall_share=fall_share,
    )
    want = ref.analyse(losses, window, z, rise, block, false_alarm, fall_share)
    if want is None:
        assert got is None
        return
    assert got.trend == pytest.approx(want["trend"], rel=1e-12)
    assert [(s.start, s.end, s.peak) for s in got.spikes] == want["spikes"]
    assert got.nonfinite == want["nonfinite"]
    assert got.relative == want["relative"]
    for name, value in (
        ("head_level", "head"),
        ("tail_level", "tail"),
        ("best_level", "best"),
        ("noise", "noise"),
    ):
        assert _same(getattr(got, name), want[value]), name
    assert got.trend[got.best_index] == got.best_level
    assert (got.peak_index, got.peak_level) == (want["peak_index"], want["peak"])
    assert got.spike_threshold == pytest.approx(want["threshold"], rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), noise=st.floats(0.0, 0.05))
def test_gaussian_noise_on_a_decay_is_never_a_spike(seed, noise):
    import numpy as np

    rng = np.random.default_rng(seed)
    steps = np.arange(2000)
    level = 0.5 + 4.0 * np.exp(-steps / 300)
    curve = level * (1 + noise * rng.standard_normal(steps.size))
    got = ap.robust_curve(curve)
    assert got.spikes == []


def test_injected_spikes_are_found_at_their_steps():
    import numpy as np

    rng = np.random.default_rng(0)
    level = 0.5 + 4.0 * np.exp(-np.arange(2000) / 300)
    curve = level * (1 + 0.02 * rng.standard_normal(2000))
    # Each jump undoes more than a tenth of the run's 4.0 fall.
    for at in (400, 1100, 1700):
        curve[at] *= 2.0
    got = ap.robust_curve(curve)
    assert [s.peak for s in got.spikes] == [400, 1100, 1700]
    assert all(s.relative_rise > 0.8 and s.z > got.spike_threshold for s in got.spikes)


def test_parameter_domain_is_checked():
    for bad in (
        {"trend_window": 2},
        {"spike_z": 0},
        {"min_spike_rise": -1},
        {"scale_block": 4},
        {"spike_false_alarm": 0},
        {"spike_false_alarm": 1},
        {"spike_fall_share": -0.1},
    ):
        with pytest.raises(ap.UsageError):
            ap.robust_curve([1.0, 2.0], **bad)
