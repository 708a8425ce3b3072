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


# -- MLflow 3's default store: one SQLite file, mlflow.db ---------------------------------


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    """A project directory whose mlflow.db the real client wrote: four
    runs in two experiments, and a deleted one (creating the schema runs
    MLflow's migrations once, some seconds)."""
    project = tmp_path_factory.mktemp("project")
    db = project / "mlflow.db"
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    ids = {}
    try:
        mlflow.set_experiment("lora-sft")
        ids["healthy"] = log_run("baseline", [2.0 * math.exp(-i / 12) + 0.4 for i in range(50)])
        diverged = [1.0 + 0.08 * i for i in range(50)]
        ids["diverged"] = log_run("lr-too-high", diverged, key="Loss/train")
        ids["deleted"] = log_run("deleted", [1.0] * 5)
        mlflow.delete_run(ids["deleted"])
        mlflow.set_experiment("dpo")
        nan = [2.0 * math.exp(-i / 12) + 0.4 for i in range(30)] + [float("nan")] * 3
        ids["nan"] = log_run("nan", nan, key="train_loss")
        with mlflow.start_run(run_name="metrics-only") as run:
            for step in range(5):
                mlflow.log_metric("accuracy", 0.5 + step / 10, step=step)
            ids["no-loss"] = run.info.run_id
        experiments = {e.name: e.experiment_id for e in mlflow.search_experiments()}
    finally:
        mlflow.set_tracking_uri(None)
    return db, ids, experiments


def db_run_path(db: Path, experiments: dict[str, str], experiment: str, run_id: str) -> Path:
    return db / str(experiments[experiment]) / run_id


def test_each_run_of_an_sqlite_store_is_a_store_named_by_its_experiment(sqlite_store):
    db, ids, experiments = sqlite_store
    before = db.read_bytes()
    for root in (db.parent, db):
        report = ap.scan(root, probes=["training_drift"])
        by_store = {Path(r.store): r for r in report}
        where = {
            "healthy": db_run_path(db, experiments, "lora-sft", ids["healthy"]),
            "diverged": db_run_path(db, experiments, "lora-sft", ids["diverged"]),
            "nan": db_run_path(db, experiments, "dpo", ids["nan"]),
            "no-loss": db_run_path(db, experiments, "dpo", ids["no-loss"]),
        }
        assert set(by_store) == set(where.values()), "the deleted run is not a store"
        healthy = by_store[where["healthy"]]
        assert healthy.layout == "mlflow" and healthy.checkpoint_kind == "logs"
        assert healthy.verdict.value == "pass", healthy.message
        assert healthy.evidence["run"] == f"lora-sft/baseline ({ids['healthy']})"
        assert healthy.evidence["series"] == "train/loss"
        assert by_store[where["diverged"]].verdict.value == "fail"
        assert by_store[where["diverged"]].evidence["series"] == "Loss/train"
        assert by_store[where["nan"]].verdict.value == "fail"
        assert by_store[where["no-loss"]].verdict.value == "skip"
    # Read immutable: the file is as it was, and no journal was left beside it.
    assert db.read_bytes() == before
    assert sorted(p.name for p in db.parent.iterdir() if p.name.startswith("mlflow.db")) == [
        "mlflow.db"
    ]


def test_a_db_named_relative_to_the_working_directory_is_scanned(sqlite_store, monkeypatch):
    """`adapterprobe scan mlflow.db` from its folder: the file's folder is
    the working directory, resolved and confined like any root."""
    db, ids, _ = sqlite_store
    monkeypatch.chdir(db.parent)
    records = list(ap.scan("mlflow.db", probes=["training_drift"]))
    assert "error" not in {r.verdict.value for r in records}, [r.message for r in records]
    assert len(records) == len(ids) - 1  # the deleted run is no store


def test_a_store_under_another_name_is_found_by_its_tables(sqlite_store, tmp_path):
    """`tracking.db` in a folder the walk visits is MLflow's store when its
    tables say so; another SQLite file beside it (`cache.db`) is not."""
    import sqlite3

    db, ids, experiments = sqlite_store
    folder = tmp_path / "team" / "runs"
    folder.mkdir(parents=True)
    renamed = folder / "tracking.db"
    renamed.write_bytes(db.read_bytes())
    with sqlite3.connect(folder / "cache.db") as other:
        other.execute("create table runs (id text)")
    found = {Path(r.store) for r in ap.scan(tmp_path / "team", probes=["training_drift"])}
    assert found == {
        db_run_path(renamed, experiments, experiment, ids[name])
        for experiment, name in [
            ("lora-sft", "healthy"),
            ("lora-sft", "diverged"),
            ("dpo", "nan"),
            ("dpo", "no-loss"),
        ]
    }


def test_the_sqlite_reader_agrees_with_mlflows_client(sqlite_store):
    from mlflow.tracking import MlflowClient

    db, ids, experiments = sqlite_store
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    for which, experiment, key in [
        ("healthy", "lora-sft", "train/loss"),
        ("nan", "dpo", "train_loss"),
    ]:
        curve = ap.read_loss_curve(db_run_path(db, experiments, experiment, ids[which]))
        assert curve.series == key and curve.source == "mlflow"
        history = {m.step: m.value for m in client.get_metric_history(ids[which], key)}
        assert list(curve.steps) == sorted(history)
        for step, loss in zip(curve.steps, curve.losses, strict=True):
            want = history[step]
            assert loss == want or (math.isinf(loss) and math.isnan(want))
        lr = {m.step: m.value for m in client.get_metric_history(ids[which], "learning_rate")}
        assert dict(curve.learning_rate) == lr


def test_a_store_of_several_runs_names_them_to_pick_one(sqlite_store):
    db, _, _ = sqlite_store
    with pytest.raises(ap.UsageError, match="holds 4 runs; name one by its path") as info:
        ap.read_loss_curve(db)
    assert "mlflow.db/" in str(info.value)


def test_a_damaged_sqlite_store_is_an_error_record(tmp_path, sqlite_store):
    db, _, _ = sqlite_store
    data = bytearray(db.read_bytes())
    for at in range(4096, len(data), 4096):  # every page after the header's
        data[at + 100 : at + 400] = b"\xa5" * 300
    project = tmp_path / "project"
    project.mkdir()
    (project / "mlflow.db").write_bytes(bytes(data))
    report = ap.scan(project, probes=["training_drift"])
    assert report.records, "the damaged store is reported, not passed over"
    assert {r.verdict.value for r in report} <= {"error", "skip"}, [r.message for r in report]
