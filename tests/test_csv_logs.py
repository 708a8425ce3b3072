"""Training logs kept as CSV by other frameworks than Lightning (issue 54,
item 3): Keras's ``CSVLogger`` (written here by the real Keras, on its torch
backend) under any file name, and Ultralytics' ``results.csv`` (space-padded
names, the loss in parts, a merge's conflict markers among the rows), each
found as a ``csv-log`` store and judged by meaning.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import adapterprobe as ap


def drift(root: Path) -> ap.Record:
    (record,) = list(ap.scan(root, probes=["training_drift"]))
    return record


def keras_fit(folder: Path, lr: float, epochs: int = 12) -> Path:
    """A small regression MLP fitted by the real Keras, logged by CSVLogger."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip("Keras is bound to another backend in this process")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(256, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    layers = [keras.Input((8,)), keras.layers.Dense(16, "relu"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr), loss="mse")
    folder.mkdir(parents=True)
    log = folder / "training_log.csv"
    model.fit(
        x,
        y,
        validation_split=0.25,
        epochs=epochs,
        batch_size=32,
        verbose=0,
        callbacks=[keras.callbacks.CSVLogger(str(log))],
    )
    return log


def test_a_keras_csvlogger_run_is_found_and_judged_per_epoch(tmp_path):
    log = keras_fit(tmp_path / "healthy", lr=0.05)
    header = log.read_text().splitlines()[0].split(",")
    assert "epoch" in header and "loss" in header and "val_loss" in header
    record = drift(tmp_path / "healthy")
    assert record.layout == "csv-log", record.store
    assert record.evidence["series"] == "loss"
    assert record.verdict.value == "pass", record.message
    assert record.evidence.get("eval_loss_sampled"), "val_loss is read beside the loss"


def test_a_keras_run_that_blew_up_fails(tmp_path):
    keras_fit(tmp_path / "blown", lr=5.0)
    record = drift(tmp_path / "blown")
    assert record.layout == "csv-log"
    assert record.verdict.value == "fail", record.message


def test_a_short_keras_log_is_not_a_tiny_run_of_optimizer_steps(tmp_path):
    """Four epochs can be a whole run: epochs are not optimizer steps."""
    keras_fit(tmp_path / "short", lr=0.05, epochs=4)
    record = drift(tmp_path / "short")
    rules = {f["rule"] for f in record.evidence.get("findings", [])}
    assert "tiny_run" not in rules, record.message


# Ultralytics right-aligns each name and value in a column of its own width.
NAMES = [
    "epoch",
    "train/box_loss",
    "train/cls_loss",
    "train/dfl_loss",
    "metrics/mAP50(B)",
    "val/box_loss",
    "val/cls_loss",
    "val/dfl_loss",
    "lr/pg0",
]
ULTRALYTICS = ",".join(f"{name:>23}" for name in NAMES) + "\n{rows}"


def test_an_ultralytics_results_csv_sums_its_loss_parts_and_skips_conflict_markers(tmp_path):
    rows = []
    for epoch in range(1, 31):
        box, cls, dfl = 1.4 * 0.97**epoch, 2.5 * 0.94**epoch, 1.2 * 0.99**epoch
        rows.append(
            f"{epoch:>23},{box:>23.5f},{cls:>23.5f},{dfl:>23.5f},{0.02 * epoch:>19.5f},"
            f"{box * 1.1:>19.5f},{cls * 1.1:>19.5f},{dfl * 1.1:>19.5f},{0.001:>23.6f}"
        )
        if epoch == 15:
            rows.append("<<<<<<< HEAD")
        if epoch == 16:
            rows.append("=======")
            rows.append(">>>>>>> a-branch")
    run = tmp_path / "train"
    run.mkdir()
    (run / "results.csv").write_text(ULTRALYTICS.format(rows="\n".join(rows)) + "\n")
    (run / "args.yaml").write_text("task: detect\nmode: train\nepochs: 30\n")
    record = drift(tmp_path)
    assert record.layout == "csv-log", record.store
    assert record.evidence["series"] == "train/*_loss"
    assert record.evidence["num_steps"] == 30
    assert record.verdict.value == "pass", record.message
    assert "3 of" in record.message and "CSV rows" in record.message, record.message
    assert record.evidence.get("eval_loss_sampled"), "val/*_loss is the held-out loss"
