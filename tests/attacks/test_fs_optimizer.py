"""Optimizer states tampered with after training: values no optimizer
writes FAIL gradient_ghost as a corrupted or tampered state, under both
rule sets. The states are real AdamW states (saved by the HF Trainer)
loaded, edited and saved again with torch."""

from __future__ import annotations

import json

import pytest

import adapterprobe as ap
from adapterprobe.probes.ghost import TAMPERED
from tests.attacks import fs_attacks as fa

pytest.importorskip("torch")


@pytest.mark.parametrize("how", fa.TAMPERINGS)
@pytest.mark.parametrize("rules", ["robust", "sway"])
def test_tampered_states_fail_under_both_rule_sets(tmp_path, how, rules):
    store = fa.tampered_run(tmp_path, how)
    ghost = [r for r in ap.scan(store, rules=rules) if r.probe == "gradient_ghost"]
    assert len(ghost) == 1
    assert ghost[0].verdict == "fail", ghost[0].message
    assert ghost[0].message.startswith(TAMPERED), ghost[0].message
    assert ghost[0].evidence["implausible"]
    direct = ap.gradient_ghost(store / "checkpoint-3", rules=rules)
    assert (direct.verdict, direct.message) == ("fail", ghost[0].message)


def test_the_untampered_state_is_not_flagged(tmp_path):
    store = fa.hf_checkpoint_run(tmp_path)
    state = ap._core.read_optimizer_state(store / "checkpoint-3")
    assert state.implausible == []
    for rules in ("robust", "sway"):
        r = ap.gradient_ghost(store / "checkpoint-3", rules=rules)
        assert TAMPERED not in r.message, r.message


def test_what_each_tampering_is_called(tmp_path):
    said = {}
    for how in fa.TAMPERINGS:
        store = fa.tampered_run(tmp_path, how)
        said[how] = " ".join(ap._core.read_optimizer_state(store / "checkpoint-3").implausible)
    assert "exp_avg_sq values are negative" in said["negative_exp_avg_sq"]
    assert "exceed what exp_avg_sq allows" in said["huge_exp_avg"]
    assert "step is -5" in said["negative_step"]
    assert "which no optimizer counts to" in said["absurd_step"]


def test_the_cli_reports_it_in_json(tmp_path):
    store = fa.tampered_run(tmp_path, "negative_exp_avg_sq")
    run = fa.cli("scan", store, "--format", "json", "--rules", "sway")
    ghost = [r for r in json.loads(run.stdout) if r["probe"] == "gradient_ghost"]
    assert [r["verdict"] for r in ghost] == ["fail"]
    assert run.returncode == 1
