"""training_drift end to end on stores written to disk."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import seed_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import adapterprobe as ap


def write_log(store, name, losses, *, start=0, torn=False):
    logs = store / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"type": "banner", "run_id": 1, "plan": {"type": "step", "step": 0}})]
    for i, loss in enumerate(losses):
        rec = {"type": "step", "step": start + i, "loss": loss, "lr": 1e-4, "grad_norm": None}
        lines.append(json.dumps(rec, sort_keys=True))
    lines.append(json.dumps({"type": "run_complete"}))
    text = "\n".join(lines) + "\n"
    if torn:
        text += '{"loss": 0.1, "st'
    (logs / name).write_text(text)


def decaying(n, scale=4.0, rate=0.93):
    return [scale * rate**i + 0.05 for i in range(n)]


def test_healthy_curve_passes(tmp_path):
    write_log(tmp_path, "train-000001-20250101T000000.jsonl", decaying(60))
    r = ap.training_drift(tmp_path, rules="sway")
    assert r.verdict == "pass", r.message
    assert r.kind == "training_drift"
    assert r.score == pytest.approx(r.evidence["smoothness"])
    for key in (
        "final_loss",
        "initial_loss",
        "convergence_ratio",
        "smoothness",
        "instability_events",
        "num_steps",
        "num_log_files",
        "curve_sampled",
        "thresholds",
        "spike_steps",
    ):
        assert key in r.evidence
    assert r.evidence["spike_steps"] == []
    assert r.evidence["num_steps"] == 60
    json.dumps(r.to_dict(), allow_nan=False)


def test_spike_and_nan_warn_with_their_steps(tmp_path):
    losses = decaying(60)
    losses[30] = losses[29] + 2.0
    losses[45] = math.nan
    write_log(tmp_path, "train-000001-20250101T000000.jsonl", losses, start=100)
    r = ap.training_drift(tmp_path, rules="sway")
    assert r.verdict == "warn"
    assert 130 in r.evidence["spike_steps"]
    assert r.evidence["nonfinite_steps"] == [145]
    assert r.evidence["instability_events"] >= 2
    assert "instability" in r.message
    assert r.score == pytest.approx(max(0.0, min(1.0, r.evidence["smoothness"] * 0.5)))
    d = r.to_dict()
    assert any(point[1] is None for point in d["evidence"]["curve_sampled"])  # inf -> null
    json.dumps(d, allow_nan=False)


def test_resumed_run_keeps_the_latest_value_per_step(tmp_path):
    first = decaying(40)
    write_log(tmp_path, "train-000001-20250101T000000.jsonl", first, torn=True)
    write_log(
        tmp_path, "train-000002-20250101T010000.jsonl", [x * 0.5 for x in first[30:]], start=30
    )
    r = ap.training_drift(tmp_path, rules="sway")
    curve = ap.read_loss_curve(tmp_path)
    assert r.evidence["num_log_files"] == 2
    assert curve.losses[35] == pytest.approx(first[35] * 0.5)
    assert r.evidence["num_steps"] == 40


@pytest.mark.parametrize(
    "setup, verdict, fragment",
    [
        (lambda p: None, "skip", "no logs/"),
        (lambda p: (p / "logs").mkdir(), "skip", "no train-"),
        (lambda p: write_log(p, "train-1.jsonl", decaying(5)), "skip", "min_steps"),
        (
            lambda p: (p / "logs").mkdir() or (p / "logs" / "train-1.jsonl").write_text("{no\n"),
            "error",
            "first line",
        ),
    ],
)
def test_skip_and_error_paths(tmp_path, setup, verdict, fragment):
    setup(tmp_path)
    r = ap.training_drift(tmp_path, rules="sway")
    assert r.verdict == verdict
    assert fragment in r.message
    assert r.score is None


def test_no_store_path_skips_and_bad_options_raise():
    assert ap.training_drift(None, rules="sway").verdict == "skip"
    with pytest.raises(ap.UsageError):
        ap.training_drift(None, rolling_window=1, rules="sway")
    with pytest.raises(ap.UsageError):
        ap.training_drift(None, assert_smoothness_gte=2.0, rules="sway")


def test_curve_sample_is_capped_and_keeps_ends(tmp_path):
    write_log(tmp_path, "train-1.jsonl", decaying(2000, rate=0.999))
    sample = ap.training_drift(tmp_path, rules="sway").evidence["curve_sampled"]
    assert len(sample) <= 513
    assert sample[0][0] == 0 and sample[-1][0] == 1999


@settings(max_examples=60, deadline=None)
@given(
    losses=st.lists(st.one_of(st.floats(0.01, 10), st.just(math.nan)), min_size=10, max_size=80),
    smooth_gte=st.floats(0, 1),
    ratio_lte=st.floats(0.05, 2),
    events_lte=st.integers(0, 3),
)
def test_verdict_and_score_match_reference(
    tmp_path_factory, losses, smooth_gte, ratio_lte, events_lte
):
    store = tmp_path_factory.mktemp("s")
    write_log(store, "train-000001-20250101T000000.jsonl", losses)
    r = ap.training_drift(
        store,
        rules="sway",
        assert_smoothness_gte=smooth_gte,
        assert_convergence_ratio_lte=ratio_lte,
        assert_instability_events_lte=events_lte,
    )
    metrics = ref.curve_metrics(
        np.array([x if math.isfinite(x) else math.inf for x in losses]), 10, 3.0
    )
    verdict, score = ref.drift_verdict(metrics, smooth_gte, ratio_lte, events_lte)
    assert r.verdict == verdict
    assert r.score == pytest.approx(score, rel=1e-9, abs=0)
