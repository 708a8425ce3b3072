"""The pre-commit hook ``adapterprobe-scan-staged`` (``.pre-commit-hooks.yaml``)
in real git repositories: files are staged with ``git add``, the staged names
are read as pre-commit reads them (``git diff --staged --name-only -z``), and
the command the hook declares (its entry, its args, then the file names) runs
from the repository's root. The stores come from the bundled demo store (dlm
stores), a full fine-tune of the committed field corpus (an HF Trainer output
folder with checkpoints) and an MLflow database the real client writes."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapterprobe.scan import DEMO_STORE, stores_of

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOOKS = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
(HOOK,) = [h for h in HOOKS if h["id"] == "adapterprobe-scan-staged"]
FIELD = REPO / "tests" / "fixtures" / "realruns" / "field"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def staged(repo: Path) -> list[str]:
    """The staged files as pre-commit lists them for a hook (added, copied,
    modified, renamed and so on; not deleted)."""
    out = git(
        repo, "diff", "--staged", "--name-only", "--no-ext-diff", "-z", "--diff-filter=ACMRTUXB"
    )
    return [name for name in out.split("\0") if name]


def run_hook(repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The hook's command on the staged files, from the repository's root:
    its entry, its args (``extra`` put before their closing ``--``), the names."""
    entry = HOOK["entry"].split()
    args = list(HOOK["args"])
    assert args[-1] == "--"
    command = [str(BIN / entry[0]), *entry[1:], *args[:-1], *extra, "--", *staged(repo)]
    return subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)


def scanned_stores(repo: Path) -> list[str]:
    """The stores the hook's command scans, from the records it saves."""
    saved = repo.parent / f"{repo.name}-saved.json"
    done = run_hook(repo, "--save-json", str(saved))
    assert done.returncode in (0, 1), done.stderr
    if not saved.exists():
        return []
    stores = {os.path.relpath(repo / r["store"], repo) for r in json.loads(saved.read_text())}
    saved.unlink()
    return sorted(stores)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with runs in it (committed), code beside them, and a
    folder git ignores."""
    root = tmp_path / "project"
    root.mkdir()
    git(root, "init", "-q")
    shutil.copytree(DEMO_STORE, root / "runs")
    shutil.copytree(FIELD / "full-b2-log1", root / "outputs" / "full")
    (root / "src").mkdir()
    (root / "src" / "train.py").write_text("print('train')\n", encoding="utf-8")
    (root / ".gitignore").write_text(".cache/\n", encoding="utf-8")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "runs")
    return root


def test_the_hook_is_declared_to_take_the_staged_files() -> None:
    assert HOOK["pass_filenames"] is True and not HOOK.get("always_run", False)
    assert HOOK["entry"].split()[:3] == ["adapterprobe", "scan", "--stores-of"]
    assert HOOK["require_serial"] is True  # one scan at a time on a commit's files


def test_a_commit_that_touches_no_store_passes_without_a_scan(repo: Path) -> None:
    (repo / "src" / "train.py").write_text("print('train more')\n", encoding="utf-8")
    (repo / "README.md").write_text("# project\n", encoding="utf-8")
    git(repo, "add", "src/train.py", "README.md")
    assert staged(repo) == ["README.md", "src/train.py"]
    done = run_hook(repo)
    assert done.returncode == 0, done.stderr
    assert "none of the 2 files given is in a store: nothing to scan" in done.stderr
    assert done.stdout == ""


def test_a_commit_touching_a_healthy_store_scans_that_store_alone(repo: Path) -> None:
    log = next((repo / "runs" / "healthy" / "logs").iterdir())
    with log.open("a", encoding="utf-8") as f:
        f.write("\n")
    git(repo, "add", str(log.relative_to(repo)))
    done = run_hook(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "from 1 store" in " ".join(done.stdout.split())
    assert scanned_stores(repo) == ["runs/healthy"]


def test_a_commit_touching_a_failing_store_is_refused(repo: Path) -> None:
    # The 5-step smoke test FAILs; the healthy store beside it passes.
    for name in ("smoke-test", "healthy"):
        (repo / "runs" / name / "NOTES.md").write_text("notes\n", encoding="utf-8")
    (repo / "src" / "train.py").write_text("print(2)\n", encoding="utf-8")
    git(repo, "add", ".")
    assert len(staged(repo)) == 3
    done = run_hook(repo)
    assert done.returncode == 1, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert "FAIL runs/smoke-test" in text and "from 2 stores" in text
    # The two stores touched, not the other demo stores beside them.
    assert scanned_stores(repo) == ["runs/healthy", "runs/smoke-test"]


def test_each_store_is_scanned_once_whatever_the_files_touched(repo: Path) -> None:
    store = repo / "runs" / "spiky-nan"
    for path in sorted(p for p in store.rglob("*") if p.is_file())[:6]:
        path.write_bytes(path.read_bytes() + (b"\n" if path.suffix in (".jsonl", ".txt") else b""))
    new = store / "adapter" / "README.md"
    new.write_text("about this adapter\n", encoding="utf-8")
    git(repo, "add", "runs/spiky-nan")
    assert len(staged(repo)) >= 2
    done = run_hook(repo, "--format", "json")
    assert done.returncode == 0, done.stderr  # spiky-nan warns; the hook fails on fail
    records = json.loads(done.stdout)
    assert {os.path.relpath(repo / r["store"], repo) for r in records} == {"runs/spiky-nan"}
    assert len(records) == len({(r["probe"], r["adapter"]) for r in records})


def test_a_checkpoint_file_belongs_to_its_run_not_to_the_checkpoint(repo: Path) -> None:
    """The store is the topmost folder a scan of the repository stops at: the
    HF output folder, whose checkpoints are its versions (a scan of the
    checkpoint alone would judge that checkpoint only)."""
    state = repo / "outputs" / "full" / "checkpoint-150" / "trainer_state.json"
    state.write_text(state.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    git(repo, "add", str(state.relative_to(repo)))
    assert scanned_stores(repo) == ["outputs/full"]
    # ... as a scan of the whole repository names it.
    done = subprocess.run(
        [str(BIN / "adapterprobe"), "scan", ".", "--format", "json"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    whole = {os.path.relpath(repo / r["store"], repo) for r in json.loads(done.stdout)}
    assert "outputs/full" in whole and not any("checkpoint-150" in s for s in whole)


def test_files_in_hidden_or_plain_folders_and_odd_names_are_in_no_store(repo: Path) -> None:
    # A store below a hidden folder is one a scan of the repository never
    # enters; a file named like an option is still a file (the args end
    # with "--").
    shutil.copytree(repo / "runs" / "smoke-test", repo / ".cache" / "smoke-test")
    hidden = repo / ".cache" / "smoke-test" / "adapter" / "current.txt"
    odd = repo / "src" / "-q.txt"
    odd.write_text("odd\n", encoding="utf-8")
    git(repo, "add", "-f", str(hidden.relative_to(repo)), str(odd.relative_to(repo)))
    done = run_hook(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "none of the 2 files given is in a store" in done.stderr
    # A hidden folder inside a store is inside it: that store is scanned.
    inside = repo / "runs" / "smoke-test" / ".scratch" / "x.json"
    inside.parent.mkdir()
    inside.write_text("{}\n", encoding="utf-8")
    git(repo, "add", "-f", str(inside.relative_to(repo)))
    assert run_hook(repo).returncode == 1
    assert scanned_stores(repo) == ["runs/smoke-test"]


def test_stores_of_maps_each_path_to_the_store_a_scan_finds(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(repo / "runs" / "healthy", repo / ".cache" / "healthy")
    monkeypatch.chdir(repo)
    found = stores_of(
        [
            "runs/healthy/adapter/current.txt",
            "runs/healthy/logs",
            "outputs/full/checkpoint-300/trainer_state.json",
            "runs/smoke-test/deleted-file.bin",  # gone from disk: its folder still says
            "src/train.py",
            ".cache/healthy/adapter/current.txt",
            str(repo.parent / "elsewhere.txt"),
        ]
    )
    assert found.roots == [
        "runs/healthy",
        "outputs/full",
        "runs/smoke-test",
    ]
    assert found.in_none == ["src/train.py", ".cache/healthy/adapter/current.txt"]
    assert found.outside == [str(repo.parent / "elsewhere.txt")]


def test_an_mlflow_database_holds_its_runs(repo: Path) -> None:
    import mlflow

    db = repo / "tracking" / "mlflow.db"
    db.parent.mkdir()
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    try:
        mlflow.set_experiment("sft")
        with mlflow.start_run(run_name="nan"):
            for i in range(40):
                loss = 2.0 * math.exp(-i / 10) + 0.3 if i < 37 else float("nan")
                mlflow.log_metric("train_loss", loss, step=i)
    finally:
        mlflow.set_tracking_uri(None)
    git(repo, "add", "tracking/mlflow.db")
    done = run_hook(repo, "--format", "json")
    assert done.returncode == 1, done.stderr  # NaN losses at the end: FAIL
    records: list[dict[str, Any]] = json.loads(done.stdout)
    assert records and all(r["layout"] == "mlflow" for r in records)
    assert all((repo / r["store"]).is_relative_to(db) for r in records)
