"""Faults made by real training, judged from what the HF Trainer leaves on
disk: a run that crashed a few steps in, a loss that measures nothing, and
a LoRA learning rate far too high.

Each run is a tiny Llama trained on CPU by ``transformers.Trainer``; the
fault is produced by the training itself (an exception mid-run, a loss
weighted by zero), never written into a file by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_integrations import TokenData  # noqa: E402
from test_monitor import tiny_llama  # noqa: E402

import adapterprobe as ap  # noqa: E402
from realruns import hf  # noqa: E402


class Crash(RuntimeError):
    """What kills the run (an out-of-memory error, a lost node)."""


def train(out: Path, *, max_steps: int, crash_at: int | None = None, weight: float = 1.0):
    """Train until ``max_steps`` or until step ``crash_at`` raises, with a
    checkpoint every 5 steps and the loss multiplied by ``weight``."""

    class Dies(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if crash_at is not None and state.global_step >= crash_at:
                raise Crash(f"killed at step {state.global_step}")

    class Weighted(transformers.Trainer):
        def compute_loss(self, model, inputs, *a, **kw):
            return super().compute_loss(model, inputs, *a, **kw) * weight

    torch.manual_seed(0)
    trainer = Weighted(
        model=tiny_llama(),
        args=transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=max_steps,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=3e-3,
            save_strategy="steps",
            save_steps=5,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(64, 8, 64),
        callbacks=[Dies()],
    )
    try:
        trainer.train()
    except Crash:
        return out
    trainer.save_model()
    return out


def rules_of(result) -> set[str]:
    return {f["rule"] for f in result.evidence.get("findings", [])}


def test_a_run_that_crashed_a_few_steps_in_fails(tmp_path):
    out = train(tmp_path / "crashed", max_steps=500, crash_at=7)
    (kept,) = sorted(out.glob("checkpoint-*"))
    state = json.loads((kept / "trainer_state.json").read_text())
    assert (state["global_step"], state["max_steps"]) == (5, 500)
    result = ap.training_drift(out)
    assert result.verdict.value == "fail", result.message
    assert rules_of(result) == {"stopped_early"}
    assert "step 5 of the 500" in result.message
    # The scan's gate fails on it too.
    assert ap.scan(out, probes=["training_drift"]).exit_code() == 1
    # A checkpoint of a run that went on is no stopped run: judged alone, it
    # says how far that checkpoint got, and a later one sits beside it.
    shutil.copytree(kept, out / "checkpoint-500")
    alone = ap.training_drift(kept)
    assert "stopped_early" not in rules_of(alone), alone.message


def test_a_run_that_finished_its_short_plan_is_no_fault(tmp_path):
    out = train(tmp_path / "short", max_steps=10)
    result = ap.training_drift(out)
    assert "stopped_early" not in rules_of(result), result.message
    assert result.verdict.value in {"pass", "warn"}, result.message


def test_a_loss_weighted_by_zero_measures_nothing_and_fails(tmp_path):
    out = train(tmp_path / "zero", max_steps=20, weight=0.0)
    result = ap.training_drift(out)
    assert result.verdict.value == "fail", result.message
    assert "degenerate_loss" in rules_of(result), result.message
    assert "exactly 0 at all 20 records" in result.message


@pytest.mark.parametrize(("lr", "blown"), [(2e-3, False), (1.0, True)])
def test_a_lora_learning_rate_far_too_high_shows_in_the_factors(tmp_path, lr, blown):
    """At lr=1.0 the loss still falls 30% and then wanders at a level a sane
    run goes below: the curve passes. The A factors sit tens of times above
    PEFT's initial scale, and adapter_weights says so."""
    out = hf.train_hf_run(tmp_path / "run", steps=60, save_steps=60, lr=lr, tensorboard=False)
    result = ap.adapter_weights(out)
    assert ("factors_blown_up" in rules_of(result)) == blown, result.message
    assert result.evidence["factor_init"] == "true"
    scale = result.evidence["factor_scale_median"]
    assert scale > 20 if blown else scale < 5, scale
