"""LLaMA-Factory output directories: its ``trainer_log.jsonl`` is the run's
curve, with or without a ``trainer_state.json``, found by a scan and judged.

The log lines are written as LLaMA-Factory's LogCallback writes them: one
``json.dumps`` of ``current_steps``, ``total_steps``, ``loss``, ``lr``
(``learning_rate`` in older releases, which also write nulls), ``epoch``,
``percentage`` and the times, and an ``eval_loss`` line at each evaluation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import adapterprobe as ap


def write_log(out: Path, losses: list[float], *, old: bool = False, every: int = 10) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    total = len(losses) * every
    lines = []
    for i, loss in enumerate(losses, start=1):
        step = i * every
        line: dict[str, object] = {
            "current_steps": step,
            "total_steps": total,
            "loss": loss,
            "lr" if not old else "learning_rate": 1e-4 * (1 - step / total),
            "epoch": round(step / total * 3, 2),
            "percentage": round(step / total * 100, 2),
            "elapsed_time": f"0:00:{i % 60:02d}",
            "remaining_time": "0:00:10",
        }
        if old:
            line.update({"eval_loss": None, "predict_loss": None, "reward": None})
        lines.append(line)
        if i % 10 == 0:
            lines.append({"current_steps": step, "total_steps": total, "eval_loss": loss * 1.05})
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def falling(n: int) -> list[float]:
    return [2.2 * math.exp(-i / 15) + 0.6 for i in range(n)]


def test_a_run_with_only_its_trainer_log_is_a_store_and_judged(tmp_path):
    for old in (False, True):
        run = write_log(tmp_path / f"sft-{old}", falling(60), old=old)
        records = ap.scan(run, probes=["training_drift"]).records
        assert len(records) == 1
        (drift,) = records
        assert drift.layout == "hf-trainer"
        assert drift.verdict.value == "pass", drift.message
        assert drift.evidence["num_steps"] == 60
        assert drift.evidence["log_source"] == "trainer_log"


def test_the_trainer_log_outlives_the_last_checkpoint(tmp_path):
    """A run that diverged after its last save: the checkpoint's state ends
    healthy, the trainer_log.jsonl (every logged step) shows the climb."""
    losses = falling(40) + [0.6 * 1.15**i for i in range(1, 21)]
    run = write_log(tmp_path / "run", losses)
    ckpt = run / "checkpoint-400"
    ckpt.mkdir()
    history = [{"step": (i + 1) * 10, "loss": x} for i, x in enumerate(losses[:40])]
    (ckpt / "trainer_state.json").write_text(
        json.dumps({"global_step": 400, "max_steps": 600, "log_history": history})
    )
    drift = next(r for r in ap.scan(run) if r.probe == "training_drift")
    assert drift.verdict.value == "fail", drift.message
    assert drift.evidence["log_source"] == "trainer_log"


def test_read_loss_curve_reads_the_file_and_its_eval_series(tmp_path):
    run = write_log(tmp_path / "run", falling(30))
    curve = ap.read_loss_curve(run / "trainer_log.jsonl")
    assert len(curve) == 30 and curve.source == "trainer_log"
    evals = ap.read_loss_curve(run, tag="eval_loss")
    assert list(evals.steps) == [100, 200, 300]
