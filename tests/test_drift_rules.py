"""training_drift under rules="robust": logging cadence, few records, objectives
that are not positive losses, and messages that agree with their numbers.

The curves are written in dlm's own log format and read back by the Rust
reader, so the whole path is exercised. Field-like runs made by real training
are judged in tests/test_field_verdicts.py.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapterprobe as ap


def write_log(store, losses, steps=None):
    logs = store / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    steps = list(range(len(losses))) if steps is None else steps
    lines = [json.dumps({"type": "banner", "run_id": 1})]
    for step, loss in zip(steps, losses, strict=True):
        lines.append(json.dumps({"type": "step", "step": step, "loss": loss}, sort_keys=True))
    (logs / "train-000001-20250101T000000.jsonl").write_text("\n".join(lines) + "\n")
    return store


def rule_of(result):
    return [f["rule"] for f in result.evidence.get("findings", [])]


series = st.lists(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=64),
        st.sampled_from([0.0, -0.0, 1e-300, -1e-300, 1e300, math.nan, math.inf]),
    ),
    min_size=1,
    max_size=80,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(losses=series, rules=st.sampled_from(["robust", "sway"]))
def test_any_series_gets_a_verdict_never_an_exception(tmp_path_factory, losses, rules):
    store = write_log(tmp_path_factory.mktemp("s"), losses)
    r = ap.training_drift(store, rules=rules)
    assert r.verdict in ("pass", "warn", "fail", "skip"), r.message
    json.dumps(r.to_dict(), allow_nan=False)


@pytest.mark.parametrize("rules", ["robust", "sway"])
@pytest.mark.parametrize(
    "losses",
    [
        [0.0] * 30,  # identically zero
        [0.0] + [0.5] * 29,  # an RL policy loss that starts at 0
        [5.0] * 40,  # constant
        [2.0],  # a single record
        [math.nan] * 25,  # all NaN
    ],
)
def test_degenerate_curves_are_judged_without_dividing_by_zero(tmp_path, losses, rules):
    r = ap.training_drift(write_log(tmp_path, losses), rules=rules)
    assert r.verdict in ("pass", "warn", "fail", "skip"), r.message


def test_a_few_records_that_climb_thirty_fold_fail(tmp_path):
    # logging_steps=500: five records over 2,001 steps.
    steps = [1, 500, 1000, 1500, 2001]
    r = ap.training_drift(write_log(tmp_path, [1.0, 2.5, 8.0, 17.0, 29.6], steps))
    assert r.verdict == "fail", r.message
    assert "diverged" in rule_of(r)
    assert "over 2,001 steps (5 logged records)" in r.message
    # Too few records for spikes: the message says so instead of skipping the run.
    healthy = ap.training_drift(write_log(tmp_path, [3.0, 2.2, 1.7, 1.5, 1.4], steps))
    assert healthy.verdict == "pass", healthy.message
    assert "spikes not judged" in healthy.message


def test_too_few_records_skip_and_say_records_not_steps(tmp_path):
    r = ap.training_drift(write_log(tmp_path, [3.0, 2.0], [500, 1000]))
    assert r.verdict == "skip"
    assert "2 logged records over 501 steps" in r.message
    # Three records of logging_steps=500 are enough to see a run blow up.
    r = ap.training_drift(write_log(tmp_path, [1.0, 9.0, 29.6], [500, 1000, 1500]))
    assert r.verdict == "fail" and "diverged" in rule_of(r), r.message


def test_a_flat_curve_is_no_progress_with_a_consistent_sign(tmp_path):
    rng = np.random.default_rng(0)
    flat = (2.25 + 0.03 * np.arange(1000) / 1000 + 0.01 * rng.standard_normal(1000)).tolist()
    r = ap.training_drift(write_log(tmp_path, flat))
    assert r.verdict == "warn", r.message
    assert "no_progress" in rule_of(r)
    change = re.search(r"([+-]\d+\.\d)%", r.message)
    assert change is not None and change.group(1).startswith("+"), r.message
    head, tail = r.evidence["head_loss"], r.evidence["tail_loss"]
    assert tail > head  # the sign shown is the direction the loss moved


def test_negative_objectives_are_not_judged_as_relative_losses(tmp_path):
    rng = np.random.default_rng(1)
    # A GRPO-like objective: hovers around zero and changes sign.
    objective = (0.02 * rng.standard_normal(300) - 0.01).tolist()
    r = ap.training_drift(write_log(tmp_path, objective))
    assert r.verdict == "pass", r.message
    assert r.evidence["objective"] == "not_positive"
    assert "%" not in r.message.split(";")[0]
    objective[-1] = math.nan
    r = ap.training_drift(write_log(tmp_path, objective))
    assert r.verdict == "fail" and "nonfinite_loss" in rule_of(r)


def test_small_batch_noise_is_not_a_spike_but_a_real_jump_is(tmp_path):
    rng = np.random.default_rng(2)
    n = 3000
    level = 1.0 + 2.0 * np.exp(-np.arange(n) / 400)
    # Batch-of-2 noise: heavy-tailed, skewed (a hard batch now and then).
    noise = 0.12 * rng.standard_t(4, n) + np.where(rng.random(n) < 0.05, 0.3, 0.0)
    curve = np.maximum(level * (1 + noise), 0.05)
    r = ap.training_drift(write_log(tmp_path, curve.tolist()))
    assert "loss_spikes" not in rule_of(r), r.message
    assert r.evidence["noise"] > 0.1  # the scale sees the scatter
    # 8x the level: 44 noise scales at this run's 16% noise, above the
    # 32.3 a 3,000-record curve needs at the default 0.5% false-alarm rate
    # (6x, 31 scales, sits inside what t4-tailed batch noise can do).
    curve[2000] = level[2000] * 8.0
    r = ap.training_drift(write_log(tmp_path, curve.tolist()))
    assert "loss_spikes" in rule_of(r), r.message
    assert r.evidence["spike_steps"] == [2000]


def test_the_spike_threshold_accounts_for_the_records_judged():
    short = ap.robust_curve([1.0] * 30).spike_threshold
    long = ap.robust_curve([1.0] * 3000).spike_threshold
    assert 6 < short < long / 2
