"""The loss series a scan judges, chosen by what its name means: Lightning
``metrics.csv`` files and TensorBoard tags named freely, a CSV without a step
column, a run that logs only a held-out loss, and a trainer checkpoint that
kept its adapter config but not its weights (as public runs pushed without
their large files do). Each is judged, and none is an ``error``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import adapterprobe as ap


def lightning_run(root: Path, header: list[str], rows: list[list[object]]) -> Path:
    folder = root / "lightning_logs" / "version_0"
    folder.mkdir(parents=True)
    lines = [",".join(header)] + [",".join("" if c is None else str(c) for c in r) for r in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    return root


def falling(n: int, start: float = 2.0) -> list[float]:
    return [start * math.exp(-i / (n / 3)) + 0.05 for i in range(n)]


def drift_of(store: Path) -> ap.ProbeResult:
    records = [r for r in ap.scan(store, probes=["training_drift"])]
    assert len(records) == 1, records
    return records[0]


def test_a_loss_column_named_freely_is_read(tmp_path):
    losses = falling(60, 0.06)
    run = lightning_run(
        tmp_path / "run",
        ["epoch", "lr-Adam", "step", "train/nll_loss", "val/rmse_loss"],
        [[0, 1e-3, i * 10, x, None] for i, x in enumerate(losses)],
    )
    record = drift_of(run)
    assert record.verdict.value == "pass", record.message
    assert record.evidence["series"] == "train/nll_loss"
    assert record.evidence["log_source"] == "csv"


def test_only_a_held_out_loss_is_judged_and_said_so(tmp_path):
    run = lightning_run(
        tmp_path / "run",
        ["dev_auroc", "dev_loss", "epoch", "step"],
        [[0.5, x, i, i * 100] for i, x in enumerate(falling(30, 1.5))],
    )
    record = drift_of(run)
    assert record.verdict.value == "pass", record.message
    assert record.message.startswith('judged on the held-out loss "dev_loss"'), record.message
    assert record.evidence["series"] == "dev_loss"


def test_a_metrics_csv_without_a_step_column_is_read_in_row_order(tmp_path):
    losses = falling(40)
    run = lightning_run(
        tmp_path / "run",
        ["train_loss", "accuracy", "epoch", "created_at"],
        [[x, 0.5, i, "2024-01-01"] for i, x in enumerate(losses)],
    )
    record = drift_of(run)
    assert record.verdict.value == "pass", record.message
    assert record.evidence["num_steps"] == 40
    # A loss that climbs in row order is still judged, and fails.
    climbing = lightning_run(
        tmp_path / "climb",
        ["train_loss", "epoch"],
        [[x, i] for i, x in enumerate(reversed(losses))],
    )
    assert drift_of(climbing).verdict.value == "fail"


def test_a_checkpoint_without_its_adapter_weights_is_a_skip(tmp_path):
    ckpt = tmp_path / "run" / "checkpoint-300"
    ckpt.mkdir(parents=True)
    (ckpt / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    history = [{"step": 10 * (i + 1), "loss": x} for i, x in enumerate(falling(30))]
    (ckpt / "trainer_state.json").write_text(
        json.dumps({"global_step": 300, "max_steps": 300, "log_history": history})
    )
    by_probe = {r.probe: r for r in ap.scan(tmp_path / "run")}
    weights = by_probe["adapter_weights"]
    assert weights.verdict.value == "skip", weights.message
    assert "no adapter weights" in weights.message
    assert by_probe["training_drift"].verdict.value == "pass"


def summary_writer_run(log_dir: Path, tags: dict[str, list[float]], text: bool = False) -> Path:
    """A run that logged to TensorBoard through torch's own SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    for tag, values in tags.items():
        for step, value in enumerate(values, start=1):
            writer.add_scalar(tag, value, step)
    if text:
        writer.add_text("notes", "a run that logged only text", 1)
    writer.close()
    return log_dir


def test_a_tensorboard_loss_tag_named_freely_is_read(tmp_path):
    run = summary_writer_run(
        tmp_path / "run",
        {"Loss/train": falling(50), "Loss/val": falling(50, 2.2), "Accuracy/val": [0.5] * 50},
    )
    record = drift_of(run)
    assert record.verdict.value == "pass", record.message
    assert record.evidence["series"] == "Loss/train"


def test_event_files_without_a_loss_are_a_skip_that_says_what_is_there(tmp_path):
    only_text = summary_writer_run(tmp_path / "text", {}, text=True)
    record = drift_of(only_text)
    assert record.verdict.value == "skip", record.message
    assert "scalar tags present: none" in record.message
    metrics = summary_writer_run(tmp_path / "acc", {"accuracy": [0.5, 0.6, 0.7]})
    record = drift_of(metrics)
    assert record.verdict.value == "skip", record.message
    assert "accuracy" in record.message


def test_a_grpo_reward_of_zero_throughout_fails(tmp_path):
    """TRL logs the mean reward beside GRPO's policy loss, which sits near 0
    by construction: a reward that never left 0 is the fault, judged from
    the trainer_state.json the real TrainerState writes."""
    transformers = pytest.importorskip("transformers")

    def run(name, rewards):
        history = [
            {"step": s, "loss": (-1) ** s * 1e-4, "reward": r, "learning_rate": 1e-6}
            for s, r in enumerate(rewards, 1)
        ]
        out = tmp_path / name
        out.mkdir()
        state = transformers.TrainerState(
            global_step=len(rewards), max_steps=len(rewards), log_history=history
        )
        state.save_to_json(str(out / "trainer_state.json"))
        return ap.training_drift(out)

    dead = run("dead", [0.0] * 30)
    assert dead.verdict.value == "fail", dead.message
    assert "zero_reward" in dead.message
    mixed = run("mixed", [0.0, 0.125, 0.375, 0.0, 0.5] * 6)
    assert mixed.verdict.value == "pass", mixed.message
    curve = ap.read_loss_curve(tmp_path / "mixed")
    assert [r for _, r in curve.reward][:3] == [0.0, 0.125, 0.375]
