"""Verdicts on the labelled corpus of real runs (tools/realruns/corpus.py).

rules="robust" must raise no alarm on any healthy run and flag every fault
class; rules="sway" keeps the seed's verdicts, alarms included.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

import adapterprobe as ap

ALARMS = {"warn", "fail", "error"}

# The probe that must catch each fault class under the robust rules.
CAUGHT_BY = {
    "too_few_steps": "gradient_ghost",
    "lr_too_high": "training_drift",
    "lr_too_low": "training_drift",
    "dead_adapter": "adapter_weights",
    "nan_losses": "training_drift",
    "loss_spikes": "training_drift",
    "exploded_second_moments": "gradient_ghost",
    "nan_second_moments": "gradient_ghost",
}


def verdicts_by_run(report) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for record in report:
        out[Path(record.store).name][record.probe] = record.verdict.value
    return out


@pytest.mark.slow
def test_robust_rules_on_the_corpus(corpus):
    root, labels = corpus
    report = ap.scan(root, rules="robust")
    by_run = verdicts_by_run(report)
    assert set(by_run) == set(labels)
    false_alarms = {
        run: v for run, v in by_run.items() if labels[run] == "healthy" and ALARMS & set(v.values())
    }
    assert false_alarms == {}
    for run, label in labels.items():
        if label == "healthy":
            continue
        assert by_run[run][CAUGHT_BY[label]] in ALARMS, (run, by_run[run])
    assert set(CAUGHT_BY) == {label for label in labels.values() if label != "healthy"}


@pytest.mark.slow
def test_every_alarm_names_its_rule(corpus):
    root, _ = corpus
    for record in ap.scan(root, rules="robust"):
        if record.verdict.value in ("warn", "fail"):
            rule = record.message.split(":", 1)[0]
            assert rule.replace("_", "").isalpha(), record.message
            findings = record.evidence.get("findings")
            if findings:
                assert rule in {f["rule"] for f in findings}


@pytest.mark.slow
def test_sway_keeps_the_seed_alarms(corpus):
    """The seed's fixed thresholds alarm on most healthy runs: that is exactly
    why robust is the default, and sway must keep doing it."""
    root, labels = corpus
    by_run = verdicts_by_run(ap.scan(root, rules="sway"))
    healthy_alarms = [
        r for r, v in by_run.items() if labels[r] == "healthy" and ALARMS & set(v.values())
    ]
    assert len(healthy_alarms) >= len([lab for lab in labels.values() if lab == "healthy"]) // 2
