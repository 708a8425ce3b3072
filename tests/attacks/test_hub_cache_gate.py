"""The hub-cache detection cannot be used to pass a gate: a root that holds
one ``models--x--y/snapshots/`` folder beside ordinary stores still scans
those stores, and a ``snapshots`` folder (or a snapshot, or a repo) that is a
link out of the cache is a problem, never a list of outside folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.attacks import fs_attacks as fa


def healthy_adapter(demo_store: Path, out: Path) -> Path:
    version = demo_store / "healthy" / "adapter" / "versions" / "v0001"
    out.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(version / name, out / name)
    return out


def scan(root: Path) -> tuple[int, list[dict], str]:
    run = fa.cli("scan", root, "--format", "json", timeout=120)
    assert "Traceback" not in run.stderr, run.stderr
    return run.returncode, json.loads(run.stdout or "[]"), run.stderr


def test_a_repo_folder_beside_failing_stores_does_not_hide_them(tmp_path, demo_store):
    root = tmp_path / "root"
    shutil.copytree(demo_store / "smoke-test", root / "smoke-test")  # fails
    before, records, _ = scan(root)
    assert before == 1 and any(r["verdict"] == "fail" for r in records)
    # an attacker adds a "cache repo" holding a healthy adapter ...
    healthy_adapter(demo_store, root / "models--x--y" / "snapshots" / ("a" * 40))
    after, records, _ = scan(root)
    assert after == 1, records
    assert any(r["verdict"] == "fail" and "smoke-test" in r["store"] for r in records)
    # ... or an empty one
    shutil.rmtree(root / "models--x--y" / "snapshots" / ("a" * 40))
    empty, records, _ = scan(root)
    assert empty == 1, records


def test_a_snapshots_folder_linked_out_of_the_cache_is_a_problem(tmp_path, demo_store):
    outside = tmp_path / "outside"
    healthy_adapter(demo_store, outside / "secret-store")
    cache = tmp_path / "hub"
    repo = cache / "models--x--y"
    repo.mkdir(parents=True)
    (repo / "snapshots").symlink_to(outside)
    _, records, stderr = scan(cache)
    assert not any("secret-store" in r["store"] for r in records), records
    assert "outside the Hugging Face cache" in stderr
