"""What the scan cannot list or open is an error record naming it: nothing
unreadable passes. Mode 000 does not stop root, so when the tests run as
root the scan runs as nobody (uid/gid 65534) over a world-readable copy."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.attacks import fs_attacks as fa

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A root an unprivileged user can reach (pytest's tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="adapterprobe-attack-"))
    base.chmod(0o755)
    root = base / "root"
    root.mkdir()
    try:
        yield root
    finally:
        for dirpath, _, _ in os.walk(base):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(base)


def _scan(root: Path, *extra: str) -> tuple[fa.Run, list[dict]]:
    run = fa.cli("scan", root, "--format", "json", *extra, as_nobody=AS_ROOT)
    assert "Traceback" not in run.stderr, run.stderr
    return run, json.loads(run.stdout)


def test_an_unreadable_adapter_dir_is_an_error_not_a_pass(shared_root):
    locked = fa.unreadable_adapter_dir(shared_root)
    fa.world_readable(shared_root)
    run, records = _scan(shared_root)
    assert {r["verdict"] for r in records} == {"pass"}, records  # readable: healthy
    fa.lock([locked])
    run, records = _scan(shared_root)
    errors = [r for r in records if r["verdict"] == "error"]
    assert errors, records
    assert all(r["adapter"] == str(locked) for r in errors), errors
    assert all("cannot be listed" in r["message"] for r in errors), errors
    assert run.returncode == 1


def test_an_unreadable_checkpoint_is_an_error(shared_root):
    locked = fa.unreadable_checkpoint(shared_root)
    fa.world_readable(shared_root)
    fa.lock([locked])
    run, records = _scan(shared_root)
    # Nothing else marks the run as an HF output dir, so the walk reaches
    # the checkpoint itself: an error record naming it either way.
    named = [r for r in records if str(locked) in (r["store"], r["adapter"])]
    assert named and {r["verdict"] for r in named} == {"error"}, records
    assert "pass" not in {r["verdict"] for r in records}
    assert run.returncode == 1


def test_an_unreadable_directory_below_the_root_is_an_error_record(shared_root):
    fa.dlm_store(shared_root, "fine")
    locked = fa.unreadable_plain_dir(shared_root)
    fa.world_readable(shared_root)
    fa.lock([locked])
    run, records = _scan(shared_root)
    mine = [r for r in records if r["store"] == str(locked)]
    assert [(r["layout"], r["verdict"]) for r in mine] == [("unreadable", "error")], records
    assert "cannot be listed" in mine[0]["message"]
    assert run.returncode == 1
    # Every output format carries it, the HTML report too.
    for fmt in ("csv", "table", "markdown"):
        out = fa.cli("scan", shared_root, "--format", fmt, as_nobody=AS_ROOT)
        assert "team-b" in out.stdout and "Traceback" not in out.stderr, (fmt, out.stderr)
        assert out.returncode == 1


def test_an_unreadable_log_file_is_an_error(shared_root):
    store = fa.lightning_run(shared_root)
    fa.world_readable(shared_root)
    (store / "metrics.csv").chmod(0)
    _, records = _scan(shared_root)
    drift = [r for r in records if r["probe"] == "training_drift"]
    assert [r["verdict"] for r in drift] == ["error"], drift
    assert "metrics.csv" in drift[0]["message"]
