"""The Hugging Face hub cache: snapshots are stores named ``org/name@rev``,
their links into ``blobs/`` followed inside the cache only.

The cache is laid out the way ``huggingface_hub`` writes it (files stored
once under ``blobs/`` by content hash, ``snapshots/<commit>/`` holding
relative links to them, ``refs/main`` naming the commit), from real files: a
PEFT adapter and a real HF Trainer run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import adapterprobe as ap
from adapterprobe import hf_cache, remote


def add_snapshot(cache: Path, repo: str, commit: str, source: Path, ref: str | None) -> Path:
    """Put ``source``'s files in the cache as ``repo`` at ``commit``."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
COMMIT_C = "c" * 40


@pytest.fixture
def adapter_dir(demo_store: Path, tmp_path: Path) -> Path:
    """A bare PEFT adapter (what a pushed adapter repository holds)."""
    out = tmp_path / "pushed-adapter"
    out.mkdir()
    version = demo_store / "healthy" / "adapter" / "versions" / "v0001"
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(version / name, out / name)
    return out


def _shown(record: Any, real: Path, name: str) -> dict[str, Any]:
    d = record._plain()
    for key in ("store", "adapter"):
        if d[key] == str(real):
            d[key] = name
        elif d[key] is not None and d[key].startswith(str(real) + os.sep):
            d[key] = name + "/" + d[key][len(str(real)) + 1 :]
    return d


def _plain_eq(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_snapshots_are_stores_named_by_repo_and_revision(adapter_dir, tmp_path):
    cache = tmp_path / "hub"
    snap = add_snapshot(cache, "team/lora-demo", COMMIT_A, adapter_dir, "main")
    older = add_snapshot(cache, "team/lora-demo", COMMIT_B, adapter_dir, None)
    report = ap.scan(cache)
    stores = sorted({r.store for r in report})
    assert stores == sorted(["team/lora-demo@main", f"team/lora-demo@{COMMIT_B}"])
    # Record for record what the snapshot's files give where they came from,
    # with messages naming the real files.
    direct = ap.scan(adapter_dir)
    for name, real in (("team/lora-demo@main", snap), (f"team/lora-demo@{COMMIT_B}", older)):
        got = [r._plain() for r in report if r.store == name]
        expected = [_shown(r, adapter_dir, name) for r in direct]
        assert len(got) == len(expected) > 0
        for g, e in zip(got, expected, strict=True):
            e["message"] = e["message"].replace(str(adapter_dir), str(real))
            assert _plain_eq(g, e), (g, e)
    assert not remote.active()


def test_a_trainer_run_pushed_to_the_hub(field_root, tmp_path):
    run = field_root / "lora-b2-log1"
    cache = tmp_path / "hub"
    snap = add_snapshot(cache, "team/run", COMMIT_C, run, "main")
    report = ap.scan(cache / "models--team--run")  # one repository's directory
    direct = ap.scan(run)
    assert len(report) == len(direct) > 0
    for got, mine in zip(report, direct, strict=True):
        expected = _shown(mine, run, "team/run@main")
        expected["message"] = expected["message"].replace(str(run), str(snap))
        expected["evidence"] = json.loads(
            json.dumps(expected["evidence"], default=str).replace(str(run), str(snap))
        )
        assert _plain_eq(got._plain(), expected), (got._plain(), expected)
    assert {r.store for r in report} == {"team/run@main"}
    assert any(r.adapter and r.adapter.startswith("team/run@main/checkpoint-") for r in report)


def test_links_out_of_the_cache_are_not_followed(adapter_dir, tmp_path):
    cache = tmp_path / "hub"
    add_snapshot(cache, "team/good", COMMIT_A, adapter_dir, "main")
    bad = add_snapshot(cache, "team/bad", COMMIT_B, adapter_dir, "main")
    outside = tmp_path / "secret.safetensors"
    shutil.copy(adapter_dir / "adapter_model.safetensors", outside)
    (bad / "adapter_model.safetensors").unlink()
    (bad / "adapter_model.safetensors").symlink_to(outside)
    report = ap.scan(cache)
    assert {r.store for r in report} == {"team/good@main"}
    assert [(p, m) for p, m in report.problems if "outside the Hugging Face cache" in m] == [
        (str(bad / "adapter_model.safetensors"), report.problems[0][1])
    ]


def test_default_cache_follows_hf_environment(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache.default_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_cache.default_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    assert hf_cache.default_cache() == tmp_path / "direct"
    with pytest.raises(ap.UsageError, match="no Hugging Face hub cache"):
        hf_cache.cache_root()


def test_cli_hf_cache_flag(adapter_dir, tmp_path):
    home = tmp_path / "hf-home"
    add_snapshot(home / "hub", "team/lora-demo", COMMIT_A, adapter_dir, "main")
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")
    }
    env["HF_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "scan", "--hf-cache", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    records = json.loads(done.stdout)
    assert {r["store"] for r in records} == {"team/lora-demo@main"}
    assert "demo store" not in done.stderr
    env["HF_HOME"] = str(tmp_path / "nowhere")
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "scan", "--hf-cache"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and "no Hugging Face hub cache" in done.stderr, done.stderr
