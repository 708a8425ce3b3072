"""Hostile MLflow stores (issue 51, items 3-6), written by the real ``mlflow``
client and then mutated as someone who controls a pull request or a shared
bucket could: a legal metric file of 240 MiB is streamed under a memory
limit, a run whose ``meta.yaml`` does not read still gets a record, metric
files that are links follow the root rule, and an ``mlflow.db`` with run ids
that are paths, cells of the wrong type or a recursive view is read run by
run, each run's trouble its own."""

from __future__ import annotations

import json
import math
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

import adapterprobe as ap
from tests.attacks import fs_attacks as fa

HEALTHY = [2.0 * math.exp(-i / 12) + 0.4 for i in range(50)]
DIVERGED = [1.0 + 0.08 * i for i in range(50)]
LIMIT = 1536 << 20  # 1.5 GB of address space


def log_run(name: str, losses: list[float], key: str = "train/loss") -> str:
    with mlflow.start_run(run_name=name) as run:
        for i, loss in enumerate(losses):
            mlflow.log_metric(key, loss, step=i * 10)
            mlflow.log_metric("learning_rate", 1e-4, step=i * 10)
        return str(run.info.run_id)


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """``<tmp>/root/mlruns``: a healthy run and a diverging one, written by
    MLflow's file store (MLflow 3 makes one only when told to)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlruns = tmp_path / "root" / "mlruns"
    mlflow.set_tracking_uri(mlruns.as_uri())
    try:
        mlflow.set_experiment("hostile")
        runs = {"healthy": log_run("baseline", HEALTHY), "diverged": log_run("boom", DIVERGED)}
    finally:
        mlflow.set_tracking_uri(None)
    dirs = {name: next(mlruns.glob(f"*/{run_id}")) for name, run_id in runs.items()}
    return mlruns.parent, dirs


def scan(root: Path, *extra: str) -> tuple[fa.Run, dict[str, dict]]:
    run = fa.cli("scan", root, "--probes", "training_drift", "--format", "json", *extra)
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    return run, {r["store"]: r for r in json.loads(run.stdout)}


# ---- item 3: a metric file is streamed, its points capped ----


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux applies it")
def test_a_legal_240_mib_metric_file_is_read_under_a_memory_limit(file_store):
    root, dirs = file_store
    loss = dirs["diverged"] / "metrics" / "train" / "loss"
    # The run goes on for 20 million more steps, in short legal lines. Read
    # whole and kept whole this took 1.37 GB and died by SIGABRT.
    step = 500
    with loss.open("ab") as f:
        while f.tell() < 240 << 20:
            f.write("".join(f"1 1 {s}\n" for s in range(step, step + (1 << 20))).encode())
            step += 1 << 20
    args = ["scan", str(root), "--probes", "training_drift", "--format", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_limit,
        env={**os.environ, "RAYON_NUM_THREADS": "2"},
    )
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr[-800:]}"
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    records = {r["store"]: r for r in json.loads(done.stdout)}
    diverged = records[str(dirs["diverged"])]
    assert diverged["verdict"] != "error", diverged["message"]
    assert diverged["evidence"]["series"] == "train/loss"
    assert records[str(dirs["healthy"])]["verdict"] == "pass"


# ---- item 4: a run whose meta.yaml does not read is still a record ----


def _not_utf8(meta: Path, _: Path) -> None:
    meta.write_bytes(meta.read_bytes().replace(b"run_name: boom", b"run_name: caf\xe9 \xff"))


def _fifo(meta: Path, _: Path) -> None:
    meta.unlink()
    os.mkfifo(meta)


def _link_out(meta: Path, outside: Path) -> None:
    fa.replace_with_link(meta, fa.outside_secret(outside))


def _link_in(meta: Path, _: Path) -> None:
    kept = meta.parent.parent / "meta-of-boom.yaml"  # inside the root
    kept.write_bytes(meta.read_bytes())
    fa.replace_with_link(meta, kept)


@pytest.mark.parametrize(
    "mutate,want",
    [(_not_utf8, "fail"), (_fifo, "error"), (_link_out, "error"), (_link_in, "fail")],
    ids=["not-utf8", "fifo", "link-out", "link-in"],
)
def test_a_run_whose_meta_yaml_does_not_read_is_never_passed_over(
    file_store, tmp_path, mutate, want
):
    root, dirs = file_store
    meta = dirs["diverged"] / "meta.yaml"
    mutate(meta, tmp_path / "elsewhere")
    run, records = scan(root)
    assert run.returncode == 1, (run.returncode, run.stdout[-1500:])
    assert records[str(dirs["healthy"])]["verdict"] == "pass"
    diverged = records[str(dirs["diverged"])]
    assert diverged["layout"] == "mlflow"
    assert diverged["verdict"] == want, diverged["message"]
    if want == "error":
        assert "meta.yaml" in diverged["message"], diverged["message"]
    assert fa.SECRET not in run.output


# ---- item 5: metric files that are links follow the root rule ----


def test_a_metric_link_inside_the_root_is_followed(file_store):
    root, dirs = file_store
    loss = dirs["diverged"] / "metrics" / "train" / "loss"
    kept = root / "kept-loss"
    loss.rename(kept)
    fa.replace_with_link(loss, kept)
    _, records = scan(root)
    diverged = records[str(dirs["diverged"])]
    assert diverged["verdict"] == "fail", diverged["message"]
    assert diverged["evidence"]["series"] == "train/loss"


def test_a_metric_link_out_of_the_root_is_an_error_naming_it(file_store, tmp_path):
    root, dirs = file_store
    loss = dirs["diverged"] / "metrics" / "train" / "loss"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    real = outside / "loss"
    real.write_bytes(loss.read_bytes())
    fa.replace_with_link(loss, real)
    run, records = scan(root)
    assert run.returncode == 1
    diverged = records[str(dirs["diverged"])]
    assert diverged["verdict"] == "error", diverged["message"]
    assert "outside the scanned root" in diverged["message"]
    assert str(loss) in diverged["message"] or diverged.get("path") == str(loss), diverged
    # A side series linked out is no less an error than the loss.
    lr = dirs["healthy"] / "metrics" / "learning_rate"
    fa.replace_with_link(lr, fa.outside_secret(tmp_path / "secret"))
    run, records = scan(root)
    healthy = records[str(dirs["healthy"])]
    assert healthy["verdict"] == "error", healthy["message"]
    assert fa.SECRET not in run.output
    # Followed on request, for trees one trusts.
    _, records = scan(root, "--follow-symlinks")
    assert records[str(dirs["diverged"])]["verdict"] == "fail"


# ---- item 6: mlflow.db, read run by run ----


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    """An ``mlflow.db`` the real client wrote: a healthy run, a diverging
    one and two more healthy ones (the schema's migrations take seconds)."""
    db = tmp_path_factory.mktemp("db") / "mlflow.db"
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    try:
        mlflow.set_experiment("hostile-db")
        ids = {
            "healthy": log_run("baseline", HEALTHY),
            "diverged": log_run("boom", DIVERGED),
            "other": log_run("other", HEALTHY),
            "third": log_run("third", HEALTHY),
        }
    finally:
        mlflow.set_tracking_uri(None)
    return db, ids


def mutated(sqlite_store, tmp_path: Path, sql: str) -> Path:
    """A copy of the store in its own project folder, `sql` run on it."""
    db, _ = sqlite_store
    project = tmp_path / "project"
    project.mkdir()
    copy = project / "mlflow.db"
    copy.write_bytes(db.read_bytes())
    conn = sqlite3.connect(copy)
    conn.executescript(sql)
    conn.commit()
    conn.close()
    return copy


def by_run(records: dict[str, dict]) -> dict[str, dict]:
    """Records by the last part of their store path (the run's name there)."""
    return {Path(store).name: r for store, r in records.items()}


def test_run_ids_that_are_paths_never_become_store_paths(sqlite_store, tmp_path):
    _, ids = sqlite_store
    renames = {ids["other"]: "/etc/passwd", ids["third"]: "../../x"}
    sql = "".join(
        f"UPDATE runs SET run_uuid = '{new}' WHERE run_uuid = '{old}';"
        f"UPDATE metrics SET run_uuid = '{new}' WHERE run_uuid = '{old}';"
        f"UPDATE latest_metrics SET run_uuid = '{new}' WHERE run_uuid = '{old}';"
        for old, new in renames.items()
    )
    db = mutated(sqlite_store, tmp_path, sql)
    _, records = scan(db.parent)
    assert len(records) == 4, list(records)
    for store in records:
        assert store.startswith(str(db) + os.sep), store
        assert Path(store).parent.parent == db, store
        assert ".." not in Path(store).parts and store != "/etc/passwd", store
    named = by_run(records)
    assert named["%2Fetc%2Fpasswd"]["verdict"] == "pass", named["%2Fetc%2Fpasswd"]["message"]
    assert named["..%2F..%2Fx"]["verdict"] == "pass"
    assert named[ids["diverged"]]["verdict"] == "fail"
    # The path a record names reads that run again.
    store = next(s for s in records if s.endswith("%2Fetc%2Fpasswd"))
    assert ap.read_loss_curve(store).run.endswith("(/etc/passwd)")


def test_a_cell_of_the_wrong_type_spoils_only_its_own_run(sqlite_store, tmp_path):
    _, ids = sqlite_store
    db = mutated(
        sqlite_store,
        tmp_path,
        f"UPDATE runs SET experiment_id = 'x' WHERE run_uuid = '{ids['other']}';"
        f"UPDATE metrics SET value = 'oops' WHERE run_uuid = '{ids['third']}'"
        " AND key = 'train/loss' AND step = 20;",
    )
    _, records = scan(db.parent)
    named = by_run(records)
    assert set(named) == set(ids.values()), list(records)
    assert named[ids["healthy"]]["verdict"] == "pass", named[ids["healthy"]]["message"]
    assert named[ids["diverged"]]["verdict"] == "fail"
    assert named[ids["other"]]["verdict"] == "error"
    assert "experiment_id" in named[ids["other"]]["message"]
    assert named[ids["third"]]["verdict"] == "error"
    assert "train/loss" in named[ids["third"]]["message"]


def test_a_recursive_view_costs_the_file_its_budget_once(sqlite_store, tmp_path):
    """``experiments`` made an endless recursive view: read through a query
    per run, every run spent the whole step budget (about a minute a file).
    It is no table, so it is never queried: the runs read, their experiment
    unnamed."""
    _, ids = sqlite_store
    db = mutated(
        sqlite_store,
        tmp_path,
        "PRAGMA foreign_keys = OFF; ALTER TABLE experiments RENAME TO old_experiments;"
        "CREATE VIEW experiments AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL"
        " SELECT x + 1 FROM c) SELECT x AS experiment_id, 'e' AS name FROM c;",
    )
    _, records = scan(db.parent)
    named = by_run(records)
    assert named[ids["healthy"]]["verdict"] == "pass", named[ids["healthy"]]["message"]
    assert named[ids["diverged"]]["verdict"] == "fail"
