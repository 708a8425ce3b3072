"""The scan reads what teams already have: HF Trainer output dirs, Lightning
checkpoint dirs and bare PEFT adapters, made by real training runs
(tools/realruns/hf.py), checked against the libraries' own readers."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import adapterprobe as ap  # noqa: E402
from realruns import hf  # noqa: E402

ALARMS = {"warn", "fail", "error"}


class Runs:
    """Real runs made on first use and kept for the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Path] = {}

    def get(self, name: str, **kw) -> Path:
        if name not in self.made:
            out = self.root / name
            if kw.pop("lightning", False):
                self.made[name] = hf.train_lightning_run(out, **kw)
            else:
                self.made[name] = hf.train_hf_run(out, **kw)
        return self.made[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))


def hf_run(runs: Runs) -> Path:
    return runs.get("hf", steps=60, save_steps=20)


def by_probe(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in report:
        out.setdefault(r.probe, []).append(r)
    return out


@pytest.mark.slow
def test_hf_output_dir_is_scanned_newest_checkpoint_first(runs):
    run = hf_run(runs)
    report = ap.scan(run)
    assert {r.layout for r in report} == {"hf-trainer"}
    assert {r.checkpoint_kind for r in report} == {"adapter"}
    probes = by_probe(report)
    assert [Path(r.adapter).name for r in probes["gradient_ghost"]] == ["checkpoint-60"]
    assert {r.verdict.value for r in report} == {"pass"}, [r.message for r in report]
    ghost = probes["gradient_ghost"][0]
    assert ghost.evidence["global_step"] == 60
    assert "per-layer check: 12 tensors in 3 layers" in ghost.message
    every = ap.scan(run, all_versions=True, probes=["gradient_ghost"])
    assert [Path(r.adapter).name for r in every] == [
        "checkpoint-20",
        "checkpoint-40",
        "checkpoint-60",
    ]
    assert [r.evidence["global_step"] for r in every] == [20, 40, 60]


@pytest.mark.slow
def test_one_checkpoint_is_checked_alone(runs):
    run = hf_run(runs)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "adapterprobe",
            "check",
            str(run / "checkpoint-40"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    # The checkpoint's own trainer_state.json is judged too (the run up to step 40).
    assert {r["probe"] for r in records} == {"gradient_ghost", "adapter_weights", "training_drift"}
    assert all(r["verdict"] == "pass" and r["layout"] == "hf-trainer" for r in records)
    (drift,) = [r for r in records if r["probe"] == "training_drift"]
    assert drift["evidence"]["curve_sampled"][-1][0] == 40


@pytest.mark.slow
def test_readers_agree_with_the_libraries(runs):
    run = hf_run(runs)
    state_file = run / "checkpoint-60" / "trainer_state.json"
    history = json.loads(state_file.read_text())["log_history"]
    want = {h["step"]: h["loss"] for h in history if "loss" in h}
    curve = ap.read_loss_curve(state_file)
    assert curve.source == "trainer_state"
    assert dict(zip(curve.steps.tolist(), curve.losses.tolist(), strict=True)) == want

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = next((run / "runs").iterdir())
    acc = EventAccumulator(str(events))
    acc.Reload()
    tb = {e.step: e.value for e in acc.Scalars("train/loss")}
    from_tb = ap.read_loss_curve(events)
    assert from_tb.source == "tensorboard" and from_tb.series == "train/loss"
    assert dict(zip(from_tb.steps.tolist(), from_tb.losses.tolist(), strict=True)) == pytest.approx(
        tb
    )
    merged = ap.read_loss_curve(run)
    assert merged.source == "trainer_state+tensorboard"

    opt = ap.read_optimizer_state(run / "checkpoint-60")
    sd = torch.load(run / "checkpoint-60" / "optimizer.pt", weights_only=True)
    assert opt.optimizer == "adam" and opt.second_moment == "exp_avg_sq"
    assert opt.param_groups == [g["params"] for g in sd["param_groups"]]
    for stat in opt.per_param:
        v = sd["state"][stat.param_id]["exp_avg_sq"].double()
        assert stat.exp_avg_sq_mean == pytest.approx(float(v.mean()), rel=1e-9)
        assert stat.shape == list(v.shape)
    assert opt.global_step == 60


@pytest.mark.slow
def test_nan_loss_that_log_history_would_hide_is_caught(runs):
    run = runs.get("hf-nan", steps=30, save_steps=30, nan_at=20, nan_filter=False)
    curve = ap.read_loss_curve(run)
    bad = [
        s
        for s, v in zip(curve.steps.tolist(), curve.losses.tolist(), strict=True)
        if not math.isfinite(v)
    ]
    assert bad and bad[0] == 20
    drift = ap.training_drift(run)
    assert drift.verdict == "fail" and drift.message.startswith("nonfinite_loss")
    records = by_probe(ap.scan(run))
    assert records["gradient_ghost"][0].verdict.value == "fail"
    assert records["adapter_weights"][0].verdict.value == "fail"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("qwen2-bias-all", {"model": "qwen2", "bias": "all"}),
        ("llama-save-head", {"modules_to_save": ["lm_head"]}),
        ("gpt2", {"model": "gpt2"}),
    ],
)
def test_optimizer_ids_are_attributed_exactly(runs, name, kw):
    run = runs.get(name, steps=20, save_steps=20, tensorboard=False, **kw)
    ckpt = run / "checkpoint-20"
    inputs = ap._core.ghost_input(ckpt)
    assert inputs.attribution is not None, inputs.attribution_error
    # Ground truth: the name behind each optimizer id, from the Trainer's own
    # grouping rule applied to the model's named parameters.
    from peft import PeftModel

    base = hf.tiny_causal_lm(kw.get("model", "llama"), layers=3)
    model = PeftModel.from_pretrained(base, ckpt, is_trainable=True)
    decay, no_decay = [], []
    import transformers

    names = transformers.Trainer.get_decay_parameter_names(None, model)
    for n, p in model.named_parameters():
        if p.requires_grad:
            (decay if n in names else no_decay).append(n)
    ordered = [n for n in decay + no_decay]
    for ps in inputs.attribution.params:
        assert f".{ps.layer}." in ordered[ps.param_id], (ps, ordered[ps.param_id])
    ghost = ap.gradient_ghost(ckpt)
    assert ghost.verdict == "pass", ghost.message
    assert "per_layer" not in ghost.evidence["not_checked"]


@pytest.mark.slow
def test_other_optimizers(runs):
    pytest.importorskip("bitsandbytes")
    ada = runs.get("adafactor", steps=20, save_steps=20, optim="adafactor", tensorboard=False)
    result = ap.gradient_ghost(ada / "checkpoint-20")
    assert result.verdict == "pass" and result.evidence["optimizer"] == "adafactor", result.message
    sgd = runs.get("sgd", steps=20, save_steps=20, optim="sgd", tensorboard=False)
    result = ap.gradient_ghost(sgd / "checkpoint-20")
    assert result.verdict == "skip" and "sgd" in result.message
    bnb = runs.get(
        "bnb8", steps=20, save_steps=20, optim="adamw_bnb_8bit", tensorboard=False, rank=64
    )
    opt = ap.read_optimizer_state(bnb / "checkpoint-20")
    assert opt.optimizer == "bnb-8bit", opt.optimizer
    result = ap.gradient_ghost(bnb / "checkpoint-20")
    assert result.verdict == "pass", result.message


@pytest.mark.slow
def test_lightning_run(runs):
    version = runs.get("lightning", lightning=True, steps=40, every=20)
    report = ap.scan(version.parent.parent)
    assert {r.layout for r in report} == {"lightning"}
    probes = by_probe(report)
    assert Path(probes["gradient_ghost"][0].adapter).name == "last.ckpt"
    assert probes["gradient_ghost"][0].verdict.value == "pass"
    assert probes["gradient_ghost"][0].evidence["global_step"] == 40
    assert probes["adapter_weights"][0].verdict.value == "skip"
    drift = probes["training_drift"][0]
    assert drift.verdict.value == "pass", drift.message
    with open(version / "metrics.csv", newline="") as f:
        want = {
            int(r["step"]): float(r["train_loss"]) for r in csv.DictReader(f) if r["train_loss"]
        }
    curve = ap.read_loss_curve(version / "metrics.csv")
    assert dict(zip(curve.steps.tolist(), curve.losses.tolist(), strict=True)) == pytest.approx(
        want
    )
    opt = ap.read_optimizer_state(version / "checkpoints" / "last.ckpt")
    assert (opt.format, opt.global_step) == ("lightning", 40)


@pytest.mark.slow
def test_a_lightning_run_without_checkpoints_is_a_store(runs, tmp_path):
    """A CSVLogger run saved without checkpoints: only metrics.csv (and
    hparams.yaml) in lightning_logs/version_N/."""
    version = runs.get("lightning", lightning=True, steps=40, every=20)
    logs = tmp_path / "lightning_logs" / "version_0"
    shutil.copytree(version, logs, ignore=shutil.ignore_patterns("checkpoints"))
    (record,) = ap.scan(tmp_path)
    assert (record.store, record.layout, record.probe, record.checkpoint_kind) == (
        str(logs),
        "lightning",
        "training_drift",
        "logs",
    )
    assert record.verdict.value == "pass", record.message
    assert record.evidence["num_steps"] == len(ap.read_loss_curve(logs / "metrics.csv"))
    with_ckpts = by_probe(ap.scan(version))
    assert {r.checkpoint_kind for rs in with_ckpts.values() for r in rs} == {"full"}


def test_a_run_keeps_its_name_whatever_is_scanned_beside_it(runs, tmp_path):
    """Issue 56, item 3: a Lightning run was `l-diverge/lightning_logs/version_0`
    in a scan of its parent and `version_0` in a scan of its own folder, since
    rows were named from the stores' common folder. Rows are named from the
    working directory, so every scan from there, and every output, names it alike."""
    version = runs.get("lightning", lightning=True, steps=40, every=20)
    for run in ("l-diverge", "l-healthy"):
        shutil.copytree(version, tmp_path / "runs" / run / "lightning_logs" / "version_0")
    name = "runs/l-diverge/lightning_logs/version_0"
    absolute = str(tmp_path / name)

    def scan(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", "scan", *args, "--fail-on", "never"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    for roots in (["runs"], ["runs/l-diverge"], [name], [absolute], [absolute, "runs/l-healthy"]):
        table = scan(*roots)
        assert re.search(rf"^PASS +training_drift +\S+ +{re.escape(name)}$", table, re.M), table
        assert re.search(
            rf"Healthy stores \(\d\)\*\*: (.*, )?{re.escape(name)}\b",
            scan(*roots, "--format", "markdown"),
        )
    page = tmp_path / "report.html"
    subprocess.run(
        [sys.executable, "-m", "adapterprobe", "report", "runs", "-o", str(page)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    assert f'<span class="name">{name}</span>' in page.read_text(encoding="utf-8")
    # The working directory itself is named by its last part, not ".".
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "scan", ".", "--fail-on", "never"],
        capture_output=True,
        text=True,
        cwd=tmp_path / name,
    )
    assert re.search(r"^PASS +training_drift +\S+ +version_0$", done.stdout, re.M), done.stdout


@pytest.mark.slow
def test_a_pickled_adapter_is_judged_like_its_safetensors_twin(runs, tmp_path):
    """PEFT's save_pretrained(safe_serialization=False) writes adapter_model.bin:
    read through the allow-listed pickle reader, the checkpoint gets the same
    verdicts and evidence as the same adapter saved as safetensors (the
    per-layer ghost check included: the tensor names come from the pickle)."""
    from peft import PeftModel

    ckpt = hf_run(runs) / "checkpoint-60"
    model = PeftModel.from_pretrained(hf.tiny_causal_lm("llama", layers=3), ckpt)
    copies = {}
    for safe in (False, True):
        copy = tmp_path / ("safetensors" if safe else "bin") / "checkpoint-60"
        model.save_pretrained(copy, safe_serialization=safe)
        for name in ("optimizer.pt", "trainer_state.json"):
            shutil.copy(ckpt / name, copy / name)
        copies[safe] = copy
    assert (copies[False] / "adapter_model.bin").is_file()
    assert not (copies[False] / "adapter_model.safetensors").exists()
    reports = {safe: by_probe(ap.scan(copy.parent)) for safe, copy in copies.items()}
    assert reports[False].keys() == reports[True].keys()
    for probe in ("adapter_weights", "gradient_ghost"):
        (pickled,) = reports[False][probe]
        (safe,) = reports[True][probe]
        assert pickled.verdict.value == safe.verdict.value == "pass", pickled.message
        assert pickled.evidence == safe.evidence, probe
        assert not pickled.evidence.get("not_checked"), pickled.evidence["not_checked"]


@pytest.mark.slow
def test_a_bare_peft_adapter(runs, tmp_path):
    run = hf_run(runs)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy(run / name, bare / name)
    report = by_probe(ap.scan(bare))
    assert report["adapter_weights"][0].verdict.value == "pass"
    assert report["adapter_weights"][0].layout == "peft"
    assert report["adapter_weights"][0].checkpoint_kind == "adapter"
    for probe in ("gradient_ghost", "training_drift"):
        (record,) = report[probe]
        assert record.verdict.value == "skip" and "bare PEFT adapter" in record.message


def test_nothing_found_and_bad_roots_exit_differently(tmp_path):
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "adapterprobe", "scan", *args], capture_output=True, text=True
        )

    (tmp_path / "empty").mkdir()
    nothing = cli(str(tmp_path / "empty"), "--fail-on", "warn", "--format", "json")
    assert nothing.returncode == 3
    assert "HF Trainer output directories" in nothing.stderr
    assert json.loads(nothing.stdout) == []
    (tmp_path / "a-file").write_text("x")
    assert cli(str(tmp_path / "a-file")).returncode == 2
    assert cli(str(tmp_path / "missing")).returncode == 2
    assert ap.scan(tmp_path / "empty").exit_code("warn") == 3
