"""``compare`` on real HF Trainer LoRA runs: a tiny perturbation is the same
update, a reseeded run and a rerun at a higher learning rate are not, ranks
may differ; the JSON contract of the CLI and ``ap.compare`` agree; the
similarities match a float64 numpy reference on dense ΔW."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from compare_runs import dense_similarity, dense_updates, make_runs

import adapterprobe as ap
from adapterprobe.comparison import compare
from adapterprobe.errors import MissingFileError, UsageError


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_runs(tmp_path_factory.getbasetemp())


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args], capture_output=True, text=True, check=False
    )


def test_cli_json_contract_and_the_python_api_return_the_same_data(runs: Path) -> None:
    done = cli("compare", str(runs / "seed0"), str(runs / "copy"), "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    assert -1.0 <= data["similarity"] <= 1.0
    assert data["modules"] and all(
        isinstance(m["module"], str) and isinstance(m["cosine"], float) for m in data["modules"]
    )
    assert data == compare(runs / "seed0", runs / "copy").to_dict()
    assert ap.compare(runs / "seed0", runs / "copy").similarity == data["similarity"]


def test_a_tiny_perturbation_is_the_same_update(runs: Path) -> None:
    c = compare(runs / "seed0", runs / "copy").to_dict()
    assert c["similarity"] > 0.9999
    assert all(m["cosine"] > 0.999 for m in c["modules"])
    assert all(max(m["principal_angles_deg"]) < 2.0 for m in c["modules"])
    assert c["left_out"] == []


def test_reseeded_and_higher_lr_runs_differ_and_show_their_curves(runs: Path) -> None:
    same = compare(runs / "seed0", runs / "copy").similarity
    reseeded = compare(runs / "seed0", runs / "seed1").to_dict()
    hilr = compare(runs / "seed0", runs / "hilr").to_dict()
    assert same is not None
    assert reseeded["similarity"] < same
    assert hilr["similarity"] < same
    a, b = hilr["items"]
    # Ten times the learning rate moves the weights further.
    assert b["adapter"]["delta_fro"] > a["adapter"]["delta_fro"]
    for item in (a, b):
        curve = item["curve"]
        assert curve["final_step"] == 40
        assert curve["best_loss"] <= curve["final_loss"]
        assert curve["sample"]
    level = hilr["loss_level"]
    key = "best_trend_loss" if level["smoothed"] else "best_loss"
    chosen = [i for i in (a, b) if i["curve"]["training_drift"] == level["verdict"]]
    assert level["from"] == [i["label"] for i in chosen]
    assert level["loss"] == max(i["curve"][key] for i in chosen)
    assert all(level["steps"][i["label"]] is not None for i in chosen)


def test_a_final_adapter_at_the_top_of_an_output_dir_shows_its_runs_losses(
    runs: Path, tmp_path: Path
) -> None:
    # `trainer.save_model()` alone: the adapter at the top, the log only in
    # checkpoint-N/trainer_state.json (no top-level state, no TensorBoard).
    out = tmp_path / "output_dir"
    shutil.copytree(runs / "seed0", out, ignore=shutil.ignore_patterns("runs"))
    (out / "trainer_state.json").unlink(missing_ok=True)
    item = compare(out, runs / "seed1").to_dict()["items"][0]
    assert item["curve"] is not None, item
    assert item["curve"]["final_step"] == 40
    assert not any("no loss curve" in note for note in item.get("notes", []))


def test_similarities_match_dense_float64_reference(runs: Path) -> None:
    for other in ("copy", "seed1", "hilr", "rank8", "seed0/checkpoint-20"):
        got = compare(runs / "seed0", runs / other).to_dict()
        x, y = dense_updates(runs / "seed0"), dense_updates(runs / other)
        assert got["similarity"] == pytest.approx(dense_similarity(x, y), abs=1e-9)
        for m in got["modules"]:
            wx, wy = x[m["module"]], y[m["module"]]
            ref = float((wx * wy).sum() / ((wx * wx).sum() * (wy * wy).sum()) ** 0.5)  # type: ignore[operator]
            assert m["cosine"] == pytest.approx(ref, abs=1e-9)


def test_different_ranks_on_the_same_modules_are_compared(runs: Path) -> None:
    c = compare(runs / "seed0", runs / "rank8").to_dict()
    assert {(m["rank_a"], m["rank_b"]) for m in c["modules"]} == {(4, 8)}
    assert c["left_out"] == []
    assert all(len(m["principal_angles_deg"]) == 4 for m in c["modules"])
    a, b = c["items"]
    assert (a["adapter"]["rank"], b["adapter"]["rank"]) == (4, 8)


def test_modules_only_one_side_has_are_left_out_and_said(runs: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    fewer = tmp_path / "fewer"
    fewer.mkdir()
    shutil.copy(runs / "seed0" / "adapter_config.json", fewer)
    tensors = load_file(runs / "seed0" / "adapter_model.safetensors")
    kept = {k: v for k, v in tensors.items() if ".layers.1." not in k}
    assert len(kept) < len(tensors)
    save_file(kept, fewer / "adapter_model.safetensors")
    c = compare(runs / "seed0", fewer).to_dict()
    dropped = {m for m in (k.split(".lora_")[0] for k in tensors) if ".layers.1." in m}
    assert {x["module"] for x in c["left_out"]} == {
        m.removeprefix("base_model.model.") for m in dropped
    }
    assert all(x["reason"] == "only in A" for x in c["left_out"])
    assert c["similarity"] > 0.9999  # what is shared is identical
    table = compare(runs / "seed0", fewer).to_table()
    assert "left out" in table and "only in A" in table


def test_outputs_escape_names_from_files(runs: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(runs / "seed0" / "adapter_model.safetensors")
    hostile = {}
    for k, v in tensors.items():
        hostile[
            k.replace("layers.0.self_attn.q_proj", "layers.0.self_attn.q_proj<img src=x>|*")
        ] = v
    for name in ("x", "y"):
        d = tmp_path / name
        d.mkdir()
        shutil.copy(runs / "seed0" / "adapter_config.json", d)
        save_file(hostile, d / "adapter_model.safetensors")
    c = compare(tmp_path / "x", tmp_path / "y")
    assert any("<img src=x>" in m["module"] for m in c.modules)
    page = c.to_html()
    assert "<img" not in page and "&lt;img src=x&gt;" in page
    assert page.count("<svg") >= 3  # curves (none here: a note) + bars per adapter + cosine
    assert "<img" not in c._repr_html_()
    md = c.to_markdown()
    # adapterprobe.escape.markdown: HTML escaped, Markdown punctuation backslashed
    assert "<img" not in md and "&lt;img src=x&gt;" in md and "\\|\\*" in md


def test_html_overlays_the_loss_curves_of_both_runs(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.html"
    done = cli(
        "compare", str(runs / "seed0"), str(runs / "hilr"), "--format", "html", "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")
    assert page.count('stroke-width="1.4"') == 2  # one line per run
    assert "‖ΔW‖ per layer" in page and "cosine per layer" in page


def test_bad_input_gets_a_clear_error(runs: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        compare(runs / "seed0")
    with pytest.raises(MissingFileError):
        compare(runs / "seed0", tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError):
        compare(runs / "seed0", tmp_path / "empty")
    done = cli("compare", str(runs / "seed0"), str(tmp_path / "missing"))
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_hf_runs_are_also_aligned_by_epoch(runs: Path, demo_store: Path) -> None:
    c = compare(runs / "seed0", runs / "hilr").to_dict()
    assert c["aligned_by"] == ["step", "epoch"]
    state = json.loads((runs / "hilr" / "checkpoint-40" / "trainer_state.json").read_text())
    logged = [[e["step"], e["epoch"]] for e in state["log_history"] if "loss" in e]
    for item in c["items"]:
        epochs = item["curve"]["epoch"]
        assert epochs[-1] == logged[-1]
        assert [p[1] for p in epochs] == sorted(p[1] for p in epochs)
    # A dlm store logs steps only: the comparison is by step alone.
    mixed = compare(runs / "seed0", demo_store / "healthy").to_dict()
    assert mixed["aligned_by"] == ["step"]
    assert "epoch" not in mixed["items"][1]["curve"]


# Full fine-tunes of the field corpus: a healthy one, one at Adam lr=1 whose
# loss blew up, one at lr=1e-9 that never moved, one that overfits.
FULL_RUNS = [
    "full-b2-log1",
    "lr-too-high-full-adam1-log1",
    "no-progress-full-lr1e-9-b4-log1",
    "overfit-full-32seq-eval20",
]


def test_full_fine_tunes_say_each_reason_once_and_are_timed_to_a_healthy_level(
    field_root: Path,
) -> None:
    """Issue 56, item 6: four full fine-tunes printed six "not compared"
    lines and one "no adapter weights" line per store, and "step to level"
    timed the runs to the blown-up run's level, which the healthy run
    "reached" at its first step."""
    c = compare(*(field_root / n for n in FULL_RUNS))
    data = c.to_dict()
    table = c.to_table()
    lines = table.splitlines()
    assert [line for line in lines if "not compared" in line] == [
        "6 pairs not compared (A vs B, A vs C, A vs D, …): "
        "both sides need adapter weights to compare updates"
    ], table
    assert [line for line in lines if "no adapter weights" in line] == [
        "A, B, C, D: no adapter weights in this store"
    ], table
    # Each run's verdict is the scan's; the level comes from the best verdict present.
    verdicts = {
        label: ap.training_drift(field_root / name).verdict.value
        for label, name in zip("ABCD", FULL_RUNS, strict=True)
    }
    assert {i["label"]: i["curve"]["training_drift"] for i in data["items"]} == verdicts
    assert verdicts["A"] == "pass" and verdicts["B"] != "pass", verdicts
    level = data["loss_level"]
    assert level["verdict"] == "pass"
    assert level["from"] == [k for k, v in verdicts.items() if v == "pass"]
    assert level["left_out"] == {k: v for k, v in verdicts.items() if v != "pass"}
    curves = {i["label"]: i["curve"] for i in data["items"]}
    assert level["smoothed"]
    assert level["loss"] == max(curves[k]["best_trend_loss"] for k in level["from"])
    # A healthy run falls to the level; it is not there at its first record.
    for label in level["from"]:
        assert level["steps"][label] > curves[label]["first_step"], level
    assert "the runs that PASS training_drift (A); not set by B (" in " ".join(table.split())
    # A run whose trend never gets that low says so.
    for it in data["items"]:
        if level["steps"][it["label"]] is None:
            row = next(line for line in lines if line.startswith(f"{it['label']} "))
            assert "not reached" in row
    markdown, page = c.to_markdown(), c.to_html()
    assert markdown.count("not compared") == 1 and page.count("not compared") == 1
    assert page.count("no adapter weights") == 1


def test_a_diverged_run_does_not_set_the_level(corpus: tuple[Path, dict[str, str]]) -> None:
    root, labels = corpus
    assert labels["lr-too-high-diverge"] != "healthy" and labels["healthy-short"] == "healthy"
    data = compare(root / "healthy-short", root / "lr-too-high-diverge").to_dict()
    healthy, diverged = (i["curve"] for i in data["items"])
    assert diverged["training_drift"] == "fail" and healthy["training_drift"] == "pass"
    level = data["loss_level"]
    assert level["from"] == ["A"] and level["left_out"] == {"B": "fail"}
    assert level["loss"] == healthy["best_trend_loss"] != diverged["best_trend_loss"]
    assert level["steps"]["A"] > healthy["first_step"]


def test_no_level_when_every_run_fails_and_the_reason_is_said(
    corpus: tuple[Path, dict[str, str]], field_root: Path
) -> None:
    root, _ = corpus
    c = compare(field_root / "too-few-steps-full-log1", root / "lr-too-high-diverge")
    data = c.to_dict()
    assert [i["curve"]["training_drift"] for i in data["items"]] == ["fail", "fail"]
    assert data["loss_level"] is None
    assert data["loss_level_none"] == (
        "no loss level to time the runs to: none of their loss curves passes "
        "training_drift or only warns (A FAIL, B FAIL)"
    )
    table = c.to_table()
    assert data["loss_level_none"] in table and "\nloss level " not in table
    rows = table.splitlines()[1:3]
    assert all(row.split()[-5] == "-" for row in rows), table  # step to level: none
