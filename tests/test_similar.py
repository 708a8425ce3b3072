"""``adapterprobe similar`` on real HF Trainer runs and their checkpoints:
exactly the pairs a float64 numpy reference on dense ΔW puts at or above the
threshold, the screened search agrees with the exhaustive one, and broken
adapters are skipped without stopping the search."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest
from compare_runs import dense_similarity, dense_updates, make_runs

from adapterprobe.comparison import similar


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_runs(tmp_path_factory.getbasetemp())


def adapters_under(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("adapter_model.safetensors"))


def reference_pairs(root: Path) -> dict[tuple[str, str], float]:
    dense = {p: dense_updates(p) for p in adapters_under(root)}
    return {
        (str(a), str(b)): dense_similarity(dense[a], dense[b])
        for a, b in combinations(sorted(dense), 2)
    }


def run_similar(root: Path, threshold: float, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "adapterprobe",
            "similar",
            str(root),
            "--threshold",
            str(threshold),
            "--format",
            "json",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("threshold", [0.999, 0.9, 0.3, -1.0])
def test_the_pairs_are_those_of_a_dense_reference(runs: Path, threshold: float) -> None:
    ref = reference_pairs(runs)
    assert len(ref) == 13 * 12 // 2  # 4 runs x (final + 2 checkpoints) + the copy
    done = run_similar(runs, threshold, "--all-checkpoints")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    got = {(p["a"], p["b"]): p["similarity"] for p in found}
    want = {k for k, v in ref.items() if v >= threshold + 1e-9}
    near = {k for k, v in ref.items() if abs(v - threshold) <= 1e-9}
    assert want <= set(got) <= want | near
    for key, value in got.items():
        assert value == pytest.approx(ref[key], abs=1e-9)
    sims = [p["similarity"] for p in found]
    assert sims == sorted(sims, reverse=True)


def test_the_copy_and_the_final_checkpoints_are_the_near_duplicates(runs: Path) -> None:
    found = similar(runs, threshold=0.999, all_checkpoints=True)
    pairs = {
        (Path(p["a"]).relative_to(runs), Path(p["b"]).relative_to(runs)) for p in found["pairs"]
    }
    # Each run's final adapter is its last checkpoint's; the copy is seed0's.
    for run in ("seed0", "seed1", "hilr", "rank8"):
        assert (Path(run), Path(run) / "checkpoint-40") in pairs
    assert (Path("copy"), Path("seed0")) in pairs
    assert not any("seed1" in str(a) and "seed0" in str(b) for a, b in pairs)
    exhaustive = similar(runs, threshold=0.999, exhaustive=True, all_checkpoints=True)
    assert exhaustive["pairs"] == found["pairs"]
    assert found["pairs_exact"] < exhaustive["pairs_exact"] == exhaustive["pairs_considered"]


def test_by_default_a_run_is_its_final_adapter_not_its_checkpoints(runs: Path) -> None:
    # A run's own checkpoints flooded the list: every pair at 0.999 was a
    # final adapter against its last checkpoint. One adapter per run leaves
    # the real near-duplicate, the copy of seed0.
    found = similar(runs, threshold=0.999)
    assert [(Path(p["a"]).name, Path(p["b"]).name) for p in found["pairs"]] == [("copy", "seed0")]
    assert found["adapters"] == 5 and found["left_out"] == 8  # 4 runs x 2 checkpoints
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "similar", str(runs), "--threshold", "0.999"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["similarity", "adapter", "A", "adapter", "B"]
    assert len(rows) == 1 and rows[0].endswith("seed0")
    assert "8 checkpoints left out" in done.stderr and "--all-checkpoints" in done.stderr


def test_broken_adapters_are_skipped_and_the_search_goes_on(runs: Path, tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(
        runs / "seed0", root / "a", ignore=shutil.ignore_patterns("checkpoint-*", "runs")
    )
    shutil.copytree(runs / "copy", root / "b")
    shutil.copytree(runs / "copy", root / "broken")
    weights = root / "broken" / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    done = run_similar(root, 0.99)
    assert done.returncode == 0, done.stderr
    pairs = json.loads(done.stdout)
    assert [(Path(p["a"]).name, Path(p["b"]).name) for p in pairs] == [("a", "b")]
    assert "skipped" in done.stderr and "broken" in done.stderr


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    done = run_similar(tmp_path, 1.5)
    assert done.returncode == 2 and "[-1, 1]" in done.stderr
    done = run_similar(tmp_path / "missing", 0.9)
    assert done.returncode == 2, done.stderr
    done = run_similar(tmp_path, 0.9)
    assert done.returncode == 3 and "no adapters" in done.stderr
