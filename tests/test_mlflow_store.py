"""MLflow file stores (``mlruns/``), written by the real ``mlflow`` client and
read by the Rust core without importing MLflow: each run is a store whose
loss, eval loss, gradient norm and learning rate series are read and judged.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import mlflow
import pytest

import adapterprobe as ap


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """A tracking URI on a file store under tmp_path (MLflow 3 refuses new
    file stores unless told to allow them)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "mlruns"
    mlflow.set_tracking_uri(root.as_uri())
    mlflow.set_experiment("probe-tests")  # the active experiment is process-wide
    yield root
    mlflow.set_tracking_uri(None)


def log_run(name: str, losses: list[float], key: str = "train/loss", every: int = 10) -> str:
    with mlflow.start_run(run_name=name) as run:
        for i, loss in enumerate(losses):
            step = i * every
            mlflow.log_metric(key, loss, step=step)
            mlflow.log_metric("learning_rate", 1e-4, step=step)
            if i % 5 == 4:
                mlflow.log_metric("eval_loss", loss * 1.05, step=step)
        return str(run.info.run_id)


def run_dir(root: Path, run_id: str) -> Path:
    (found,) = [p for p in root.glob(f"*/{run_id}") if p.is_dir()]
    return found


def test_each_run_of_a_file_store_is_a_store_judged_on_its_loss(file_store):
    mlflow.set_experiment("lora-sft")
    healthy = log_run("baseline", [2.0 * math.exp(-i / 12) + 0.4 for i in range(50)])
    diverged = log_run("lr-too-high", [1.0 + 0.08 * i for i in range(50)], key="Loss/train")
    report = ap.scan(file_store, probes=["training_drift"])
    by_store = {Path(r.store): r for r in report}
    assert set(by_store) == {run_dir(file_store, healthy), run_dir(file_store, diverged)}
    good = by_store[run_dir(file_store, healthy)]
    assert good.layout == "mlflow"
    assert good.verdict.value == "pass", good.message
    assert good.evidence["series"] == "train/loss" and good.evidence["num_steps"] == 50
    bad = by_store[run_dir(file_store, diverged)]
    assert bad.verdict.value == "fail", bad.message
    assert bad.evidence["series"] == "Loss/train"


def test_a_nan_loss_logged_to_mlflow_fails(file_store):
    losses = [2.0 * math.exp(-i / 12) + 0.4 for i in range(30)] + [float("nan")] * 3
    run_id = log_run("nan", losses)
    record = ap.training_drift(run_dir(file_store, run_id))
    assert record.verdict.value == "fail", record.message


def test_a_run_without_a_loss_metric_is_a_skip(file_store):
    with mlflow.start_run(run_name="metrics-only") as run:
        for step in range(5):
            mlflow.log_metric("accuracy", 0.5 + step / 10, step=step)
    record = ap.training_drift(run_dir(file_store, run.info.run_id))
    assert record.verdict.value == "skip", record.message
    assert "accuracy" in record.message


def test_the_reader_does_not_import_mlflow(file_store, tmp_path):
    """The scan reads the files itself: a child process with mlflow made
    unimportable reads the same run."""
    import subprocess
    import sys

    run_id = log_run("baseline", [2.0 * math.exp(-i / 12) + 0.4 for i in range(20)])
    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "import adapterprobe as ap\n"
        f"r = ap.training_drift({str(run_dir(file_store, run_id))!r})\n"
        "print(r.verdict.value, r.evidence['num_steps'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert out.stdout.split() == ["pass", "20"], out.stderr
