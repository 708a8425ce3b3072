"""Nothing missed without a word: every adapter of a PEFT multi-adapter save,
TensorBoard-only runs, one checkpoint given alone (with its own
trainer_state.json), checkpoints in numeric order, ``training_drift`` on any
layout the scan finds, GPT-2 layer grouping, and the reasons discovery gives
for what it passes over. Everything is made by the real libraries: HF
Trainer + PEFT runs (tools/realruns/hf.py), PEFT ``save_pretrained`` with
several adapters, torch's TensorBoard ``SummaryWriter``."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

import adapterprobe as ap  # noqa: E402
from adapterprobe.scan import discover  # noqa: E402
from realruns import hf  # noqa: E402


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args], capture_output=True, text=True
    )


def json_records(*args: str) -> tuple[int, list[dict]]:
    done = cli(*args, "--format", "json")
    assert done.returncode in (0, 1, 3), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def multi_run(tmp_path_factory) -> Path:
    """An HF Trainer + PEFT run whose model holds a second adapter: every
    checkpoint (40, 80, 120: text order would put 120 first) saves it in
    ``second/``; TensorBoard events under ``runs/``."""
    out = tmp_path_factory.mktemp("multi") / "out"
    return hf.train_hf_run(
        out, steps=120, save_steps=40, batch=4, extra_adapters=("second",), save_final=False
    )


@pytest.fixture(scope="module")
def multi_save(tmp_path_factory) -> Path:
    """``save_pretrained`` of a PEFT model with two adapters: ``default`` as
    PEFT initialises it (B = 0: a dead adapter) at the top, ``second``
    (B initialised at random) in ``second/``."""
    base = hf.tiny_causal_lm("llama", layers=3)
    targets = ["q_proj", "v_proj"]
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=targets))
    model.add_adapter(
        "second", peft.LoraConfig(r=4, target_modules=targets, init_lora_weights=False)
    )
    out = tmp_path_factory.mktemp("save") / "two-adapters"
    model.save_pretrained(out)
    return out


def tensorboard_run(log_dir: Path, steps: int = 60) -> Path:
    """A run that logged only to TensorBoard (torch's SummaryWriter)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    for step in range(1, steps + 1):
        writer.add_scalar("train/loss", 2.5 * math.exp(-step / 20) + 0.4, step)
    writer.close()
    return log_dir


def by_probe(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["probe"], []).append(r)
    return out


@pytest.mark.slow
def test_every_adapter_of_a_multi_adapter_save_is_scanned(multi_save):
    assert (multi_save / "second" / "adapter_model.safetensors").is_file()  # PEFT's layout
    for extra in ((), ("--all-versions",)):
        _, records = json_records("scan", str(multi_save), *extra)
        weights = by_probe(records)["adapter_weights"]
        assert [Path(r["adapter"]) for r in weights] == [multi_save, multi_save / "second"]
        assert {r["store"] for r in weights} == {str(multi_save)}
        default, second = weights
        # Each adapter is judged on its own weights: PEFT's default init
        # leaves B at zero, the second adapter was initialised at random.
        assert default["verdict"] == "fail" and "dead_adapter" in default["message"]
        assert "dead_adapter" not in second["message"]
        assert second["evidence"]["num_modules"] == 6


@pytest.mark.slow
def test_multi_adapter_checkpoints_in_numeric_order(multi_run):
    _, records = json_records("scan", str(multi_run), "--all-versions")
    probes = by_probe(records)
    rel = [str(Path(r["adapter"]).relative_to(multi_run)) for r in probes["adapter_weights"]]
    assert rel == [
        "checkpoint-40",
        "checkpoint-40/second",
        "checkpoint-80",
        "checkpoint-80/second",
        "checkpoint-120",
        "checkpoint-120/second",
    ]
    # The named adapter is compared with its own earlier copy.
    last_second = probes["adapter_weights"][-1]["evidence"]
    assert last_second.get("previous_version") == str(multi_run / "checkpoint-80" / "second")
    ghosts = {str(Path(r["adapter"]).relative_to(multi_run)): r for r in probes["gradient_ghost"]}
    assert ghosts["checkpoint-120"]["verdict"] == "pass", ghosts["checkpoint-120"]["message"]
    # The optimizer state is the trained adapter's: the named one is not an error.
    named = ghosts["checkpoint-120/second"]
    assert named["verdict"] == "skip" and "several adapters" in named["message"]
    _, newest = json_records("scan", str(multi_run))
    assert [Path(r["adapter"]).name for r in by_probe(newest)["adapter_weights"]] == [
        "checkpoint-120",
        "second",
    ]
    # Checkpoints given as roots in text order come back in numeric order.
    roots = sorted(str(p) for p in multi_run.glob("checkpoint-*"))
    assert [Path(r).name for r in roots] == ["checkpoint-120", "checkpoint-40", "checkpoint-80"]
    targets, _ = discover(*roots)
    assert [t.versions[0].name for t in targets] == [
        "checkpoint-40",
        "checkpoint-80",
        "checkpoint-120",
    ]


@pytest.mark.slow
def test_one_checkpoint_is_judged_by_its_own_trainer_state(multi_run):
    checkpoint = multi_run / "checkpoint-80"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    logged = [h["step"] for h in state["log_history"] if "loss" in h]
    for command in ("check", "scan"):
        code, records = json_records(command, str(checkpoint), "--probes", "training_drift")
        assert code == 0
        (drift,) = records
        assert drift["verdict"] == "pass", drift["message"]
        assert drift["evidence"]["num_steps"] == len(logged)
        assert drift["evidence"]["curve_sampled"][-1][0] == max(logged) == 80
    _, records = json_records("check", str(checkpoint))
    probes = by_probe(records)
    assert set(probes) == {"training_drift", "adapter_weights", "gradient_ghost"}
    assert [Path(r["adapter"]).name for r in probes["adapter_weights"]] == [
        "checkpoint-80",
        "second",
    ]
    assert probes["gradient_ghost"][0]["evidence"]["global_step"] == 80
    direct = ap.training_drift(checkpoint)
    assert direct.verdict.value == "pass" and direct.evidence["num_steps"] == len(logged)


@pytest.mark.slow
def test_tensorboard_only_runs_are_stores(tmp_path):
    flat = tensorboard_run(tmp_path / "flat")
    nested_root = tmp_path / "nested"
    tensorboard_run(nested_root / "runs" / "exp1")
    for root, store in ((flat, flat), (nested_root, nested_root / "runs" / "exp1")):
        curve = ap.read_loss_curve(root)
        assert len(curve) == 60
        for command in ("scan", "check"):
            code, records = json_records(command, str(root))
            assert code == 0, records
            (drift,) = records
            assert drift["probe"] == "training_drift" and drift["layout"] == "tensorboard"
            assert drift["store"] == str(store)
            assert drift["verdict"] == "pass", drift["message"]
            assert drift["evidence"]["num_steps"] == len(curve)
        direct = ap.training_drift(root)
        assert direct.verdict.value == "pass", direct.message
        assert direct.evidence["num_steps"] == 60


@pytest.mark.slow
def test_training_drift_on_every_layout_the_scan_knows(multi_run, tmp_path):
    """ap.training_drift(path) gives the record the scan gives for that path."""
    lightning = hf.train_lightning_run(tmp_path / "lightning", steps=30)
    two_runs = tmp_path / "two"
    tensorboard_run(two_runs / "a")
    tensorboard_run(two_runs / "b")
    for path in (multi_run, multi_run / "checkpoint-40", lightning):
        _, records = json_records("scan", str(path), "--probes", "training_drift")
        (scanned,) = records
        direct = ap.training_drift(path)
        assert direct.verdict.value == scanned["verdict"] == "pass", direct.message
        assert direct.message == scanned["message"]
    several = ap.training_drift(two_runs)
    assert several.verdict.value == "skip"
    assert "holds 2 runs" in several.message and "name the one" in several.message
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = ap.training_drift(empty)
    assert nothing.verdict.value == "skip" and "no other training log" in nothing.message
    assert "has no logs/ directory" not in nothing.message


@pytest.mark.slow
def test_group_layers_reads_gpt2_keys_under_robust_rules(tmp_path):
    run = hf.train_hf_run(tmp_path / "gpt2", model="gpt2", steps=20, save_steps=20, batch=4)
    adapter = run / "checkpoint-20"
    weights = ap.adapter_weights(adapter)
    attributed = sorted(int(k) for k in weights.evidence["layer_delta_energy"])
    state = ap.read_optimizer_state(adapter)
    grouping = ap.group_layers(adapter, num_params=len(state.per_param))
    assert list(grouping.layer_indices) == attributed == [0, 1, 2]
    header = ap.read_safetensors_header(adapter / "adapter_model.safetensors")
    names = sorted(header.tensors)
    assert all(".transformer.h." in n for n in names)
    per_layer = len(names) // 3
    assert grouping.params_per_layer == per_layer
    assert grouping.layer_of == {p: p // per_layer for p in range(len(names))}
    assert ap.group_layers(adapter, rules="robust").layer_of == grouping.layer_of
    # dlm-sway's rule reads `.layers.N.` only, as the seed does.
    with pytest.raises(ap.LayerGroupingError, match=r"\.layers\.N\."):
        ap.group_layers(adapter, rules="sway")
    with pytest.raises(ap.UsageError, match="rules"):
        ap.group_layers(adapter, rules="loose")


def test_skipped_directories_say_why(multi_save, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(multi_save, root / "team" / "bot")
    (root / "team" / "bot" / "exports").mkdir()
    (root / ".cache" / "x").mkdir(parents=True)
    (root / "half").mkdir()
    shutil.copy(multi_save / "adapter_config.json", root / "half")
    (root / "empty").mkdir()
    assert discover(root).skipped is None  # only when asked: it costs a listing per store
    found = discover(root, explain=True)
    targets, problems = found  # still unpacks as before
    assert [t.store for t in targets] == [root / "team" / "bot"]
    assert problems == []
    why = {Path(p).relative_to(root).as_posix(): w for p, w in found.skipped}
    assert set(why) == {".cache", "empty", "half", "team/bot/exports"}
    assert why[".cache"] == "hidden directory: not searched"
    assert why["empty"] == "empty directory"
    assert "adapter_config.json without adapter weights" in why["half"]
    assert "no part of its layout" in why["team/bot/exports"]


def test_training_drift_on_dlm_stores_agrees_with_the_scan(demo_store):
    report = ap.scan(demo_store, probes=["training_drift"])
    scanned = {Path(r.store): r for r in report}
    assert len(scanned) >= 2
    for store, record in scanned.items():
        direct = ap.training_drift(store)
        assert (direct.verdict, direct.message) == (record.verdict, record.message)
    # The folder holding them is several runs: named, not merged.
    several = ap.training_drift(demo_store)
    assert several.verdict.value == "skip" and f"holds {len(scanned)} runs" in several.message
