"""rules="robust" on runs made the way the field makes them: the real
transformers.Trainer, logging every step or every few hundred, LoRA and full
fine-tunes, small noisy batches, RL objectives, and faults produced by the
training itself (tools/realruns/field.py; conftest.FIELD_SUBSET).

A healthy run gets no training_drift alarm; each fault is named by the rule
that sees its mechanism. The whole field corpus is judged, with counts per
logging cadence, by benches/bench_field_verdicts.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import adapterprobe as ap

pytestmark = pytest.mark.slow

#: The training_drift rule that must name each fault class's mechanism.
RULE_FOR = {
    "lr_too_high": {"diverged", "unstable"},
    "nan_poisoned": {"nan_masked", "nonfinite_loss"},
    "frozen_lora_b": {"no_progress", "zero_gradients"},
    "overfit_eval_rising": {"eval_rising"},
    "dead_relu_collapse": {"no_progress", "loss_spikes", "zero_gradients", "unstable"},
    "no_progress": {"no_progress", "zero_learning_rate"},
}


def labels(root: Path) -> dict[str, str]:
    data = json.loads((root / "labels.json").read_text(encoding="utf-8"))
    return {name: info["label"] for name, info in data.items()}


def drift(root: Path, name: str):
    return ap.training_drift(root / name)


def test_healthy_field_runs_raise_no_drift_alarm(field_root):
    for name, label in labels(field_root).items():
        if label != "healthy":
            continue
        r = drift(field_root, name)
        assert r.verdict == "pass", (name, r.message)


def test_each_fault_is_named_by_the_rule_that_sees_it(field_root):
    for name, label in labels(field_root).items():
        if label not in RULE_FOR:
            continue
        r = drift(field_root, name)
        rules = {f["rule"] for f in r.evidence.get("findings", [])}
        assert r.verdict in ("warn", "fail"), (name, r.message)
        assert rules & RULE_FOR[label], (name, r.message)


def test_nan_masked_runs_fail_and_say_why(field_root):
    r = drift(field_root, "nan-empty-batch-b2-log1")
    assert r.verdict == "fail"
    assert r.message.startswith("nan_masked:"), r.message
    # The Trainer logged 0.0 losses: the summary must not call that a fall to 0.
    assert "-100%" not in r.message


def test_side_series_are_evidence(field_root, tmp_path):
    r = drift(field_root, "overfit-full-32seq-eval20")
    ev = r.evidence
    assert len(ev["eval_loss_sampled"]) >= 3 and ev["grad_norm_sampled"]
    assert ev["eval_final_loss"] > ev["eval_best_loss"]
    report = ap.scan(field_root / "overfit-full-32seq-eval20", probes=["training_drift"])
    page = report.to_html(tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'class="eval"' in page and "Gradient norm" in page


def test_rl_objectives_are_not_judged_as_losses(field_root):
    r = drift(field_root, "rl-reinforce-b8-log1")
    assert r.verdict == "pass", r.message
    assert r.evidence["objective"] == "not_positive"


def test_a_run_shorter_than_its_logging_steps_is_skipped_not_an_error(field_root):
    r = drift(field_root, "too-few-steps-lora-log10")
    assert r.verdict == "skip", r.message
