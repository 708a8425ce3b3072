"""scan(): discovery, records, formats, and agreement with the single probes."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import adapterprobe as ap
from adapterprobe.scan import DEMO_STORE

RECORD_KEYS = {
    "store",
    "adapter",
    "layout",
    "probe",
    "verdict",
    "score",
    "message",
    "evidence",
    "checkpoint_kind",
}


@pytest.fixture()
def tree(tmp_path):
    """Demo stores nested at different depths, plus a multi-adapter store."""
    shutil.copytree(DEMO_STORE / "healthy", tmp_path / "team-a" / "healthy")
    shutil.copytree(DEMO_STORE / "spiky-nan", tmp_path / "team-a" / "deep" / "er" / "spiky")
    shutil.copytree(DEMO_STORE / "smoke-test", tmp_path / "team-b" / "smoke")
    multi = tmp_path / "team-b" / "multi"
    for name, source in (("chat", "healthy"), ("code", "smoke-test")):
        shutil.copytree(DEMO_STORE / source / "adapter", multi / "adapter" / name)
    shutil.copytree(DEMO_STORE / "healthy" / "logs", multi / "logs")
    return tmp_path


def test_demo_scan_agrees_with_single_probes():
    report = ap.scan(DEMO_STORE)
    assert len(report) == 12  # 4 stores: a drift record, a weights and a ghost record each
    for record in report:
        if record.probe == "training_drift":
            assert record.adapter is None
            single = ap.training_drift(record.store)
        elif record.probe == "adapter_weights":
            Path(record.adapter).relative_to(record.store)
            single = ap.adapter_weights(record.adapter)
        else:
            Path(record.adapter).relative_to(record.store)
            single = ap.gradient_ghost(record.adapter)
        assert record.verdict == single.verdict
        assert record.score == single.score
        assert record.message == single.message


def test_tree_discovery_and_order(tree):
    report = ap.scan(tree, probes=("gradient_ghost", "training_drift"))
    stores = [r.store for r in report]
    assert stores == sorted(stores)
    by_store = {}
    for r in report:
        by_store.setdefault(Path(r.store).relative_to(tree).as_posix(), []).append(r)
    assert set(by_store) == {
        "team-a/healthy",
        "team-a/deep/er/spiky",
        "team-b/smoke",
        "team-b/multi",
    }
    multi = by_store["team-b/multi"]
    assert [r.probe for r in multi] == ["training_drift", "gradient_ghost", "gradient_ghost"]
    assert [Path(r.adapter).relative_to(r.store).parts[1] for r in multi[1:]] == ["chat", "code"]
    assert [r.verdict.value for r in multi[1:]] == ["pass", "fail"]
    assert report.exit_code("fail") == 1
    assert report.exit_code("never") == 0


def test_all_versions_and_a_version_root():
    store = DEMO_STORE / "resumed-torn"
    two = ("gradient_ghost", "training_drift")
    assert len([r for r in ap.scan(store, probes=two) if r.adapter]) == 1
    every = [r for r in ap.scan(store, all_versions=True, probes=two) if r.adapter]
    assert [Path(r.adapter).name for r in every] == ["v0001", "v0002"]
    only = ap.scan(store / "adapter" / "versions" / "v0001", probes=two)
    assert len(only) == 1
    assert only[0].probe == "gradient_ghost"
    assert Path(only[0].store) == store


def test_hostile_and_broken_stores_become_error_records(tree):
    bad = tree / "team-c" / "bad"
    shutil.copytree(DEMO_STORE / "healthy", bad)
    (bad / "logs" / sorted(os.listdir(bad / "logs"))[0]).write_bytes(b"\x00garbage\n")
    version = bad / "adapter" / "versions" / "v0001"
    (version / "training_state.pt").write_bytes(b"PK\x03\x04 not really a zip")
    broken = tree / "team-c" / "no-pointer"
    shutil.copytree(DEMO_STORE / "healthy", broken)
    (broken / "adapter" / "current.txt").unlink()
    escaping = tree / "team-c" / "escaping"
    shutil.copytree(DEMO_STORE / "healthy", escaping)
    (escaping / "adapter" / "current.txt").write_text("../../../etc")
    report = ap.scan(tree)
    verdicts = {(Path(r.store).name, r.probe): r for r in report if "team-c" in r.store}
    assert verdicts[("bad", "training_drift")].verdict == "error"
    assert verdicts[("bad", "gradient_ghost")].verdict == "error"
    assert "current.txt is missing" in verdicts[("no-pointer", "gradient_ghost")].message
    assert verdicts[("escaping", "gradient_ghost")].verdict == "error"
    assert verdicts[("no-pointer", "training_drift")].verdict == "pass"  # the scan goes on
    assert len({r.store for r in report}) == 7


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_symlink_loop_is_reported(tree):
    os.symlink(tree, tree / "team-a" / "loop")
    report = ap.scan(tree)
    assert len({r.store for r in report}) == 4
    assert any("loop" in message for _, message in report.problems)


def test_formats(tree):
    report = ap.scan(tree)
    records = json.loads(report.to_json())
    assert all(set(r) == RECORD_KEYS for r in records)
    assert all(r["verdict"] in {"pass", "warn", "fail", "skip", "error"} for r in records)
    assert {r["checkpoint_kind"] for r in records} == {"adapter"}  # dlm stores
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert [r["probe"] for r in rows] == [r["probe"] for r in records]
    assert [r["checkpoint_kind"] for r in rows] == [r["checkpoint_kind"] for r in records]
    assert json.loads(rows[0]["evidence"]) == records[0]["evidence"]
    pd = pytest.importorskip("pandas")
    frame = report.to_pandas(flatten_evidence=False)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == [
        "store",
        "adapter",
        "layout",
        "probe",
        "verdict",
        "score",
        "message",
        "evidence",
        "checkpoint_kind",
    ]
    assert len(frame) == len(records)
    flat = report.to_pandas()
    assert "evidence" not in flat.columns
    assert flat["evidence.num_steps"].dropna().tolist() == [
        r["evidence"]["num_steps"] for r in records if "num_steps" in r["evidence"]
    ]


def test_workers_give_the_same_records(tree):
    one = ap.scan(tree, workers=1).to_dicts()
    two = ap.scan(tree, workers=2).to_dicts()
    assert one == two


def test_usage_errors(tmp_path):
    with pytest.raises(ap.UsageError):
        ap.scan(tmp_path / "missing")
    with pytest.raises(ap.UsageError):
        ap.scan(tmp_path, probes=("nonsense",))
    with pytest.raises(ap.UsageError):
        ap.scan(tmp_path, workers=0)
    with pytest.raises(ap.UsageError):
        ap.scan(tmp_path, options={"training_drift": {"min_steps": 1}})


def test_probe_subset_and_options():
    drift_only = ap.scan(DEMO_STORE, probes=("training_drift",))
    assert {r.probe for r in drift_only} == {"training_drift"}
    strict = ap.scan(
        DEMO_STORE,
        probes=("gradient_ghost",),
        options={"gradient_ghost": {"min_steps_threshold": 100}},
    )
    assert {r.verdict.value for r in strict} == {"fail"}


def test_scan_without_torch(tmp_path):
    code = (
        "import sys, json; sys.modules['torch'] = None\n"
        "from adapterprobe.cli import main\n"
        f"sys.exit(main(['scan', {str(DEMO_STORE)!r}, '--format', 'json',"
        " '--probes', 'gradient_ghost,training_drift']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stderr  # the smoke-test adapter FAILs
    assert len(json.loads(out.stdout)) == 8
