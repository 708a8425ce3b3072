"""Every run is found by what it has: full fine-tunes (one model.safetensors,
shards, pytorch_model.bin), log-only checkpoints and runs, last-checkpoint/,
checkpoints in numeric order. Real HF Trainer runs (tools/realruns/hf.py),
checked against torch, safetensors and transformers' own readings."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import adapterprobe as ap  # noqa: E402
from realruns import hf  # noqa: E402

ALL = ["adapter_weights", "gradient_ghost", "training_drift", "full_weights"]
SKIP_FULL = (
    "full fine-tune checkpoint (model.safetensors): no LoRA adapter to check; "
    "use --probes full_weights"
)


class Runs:
    """Real runs made on first use and kept for the module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Path] = {}

    def get(self, name: str, **kw) -> Path:
        if name not in self.made:
            self.made[name] = hf.train_hf_run(self.root / name, **kw)
        return self.made[name]

    def full(self) -> Path:
        """A full fine-tune of a Llama with a tied head, saved at 20 and 40."""
        return self.get("full", full=True, steps=40, save_steps=20, tie_embeddings=True)

    def sharded(self) -> Path:
        return self.get(
            "sharded", full=True, steps=20, save_steps=20, save="sharded", tensorboard=False
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("full-runs"))


def by_probe(records) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r.probe, []).append(r)
    return out


def names(records) -> list[str]:
    return [Path(r.adapter).name for r in records]


def trainer_order(ckpt: Path) -> list[str]:
    """The name behind each optimizer id: HF Trainer's own grouping rule on the
    model's named parameters (decay group, then no-decay group)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt)
    decay_names = transformers.Trainer.get_decay_parameter_names(None, model)
    named = [n for n, p in model.named_parameters() if p.requires_grad]
    return [n for n in named if n in decay_names] + [n for n in named if n not in decay_names]


@pytest.mark.slow
def test_a_full_fine_tune_is_scanned_not_errored(runs):
    run = runs.full()
    report = ap.scan(run, all_versions=True)
    assert report.exit_code() == 0, [r.message for r in report]
    assert {r.layout for r in report} == {"hf-trainer"}
    assert {r.checkpoint_kind for r in report} == {"full"}
    assert report.counts()["error"] == 0
    probes = by_probe(report)
    assert names(probes["adapter_weights"]) == ["checkpoint-20", "checkpoint-40"]
    for r in probes["adapter_weights"]:
        assert (r.verdict.value, r.message) == ("skip", SKIP_FULL)
    for r in probes["gradient_ghost"]:
        assert r.verdict.value == "pass", r.message
        assert "per_layer" not in r.evidence["not_checked"], r.message
        assert "per-layer check: 27 tensors in 3 layers" in r.message
    (drift,) = probes["training_drift"]
    assert drift.verdict.value == "pass", drift.message
    # Its config.json names the vocabulary the loss is judged against.
    vocab = json.loads((run / "config.json").read_text())["vocab_size"]
    assert (drift.evidence["output_classes"], drift.evidence["output_classes_kind"]) == (
        vocab,
        "vocabulary",
    )
    # The JSON a CI step reads carries the kind too.
    records = json.loads(report.to_json())
    assert {r["checkpoint_kind"] for r in records} == {"full"}


@pytest.mark.slow
def test_a_full_fine_tune_blown_up_by_its_learning_rate_fails(runs, tmp_path):
    """lr=10 with logging_steps=5: the loss is in the hundreds by the first
    record. Against ln(vocab) of the saved config.json that is a model far
    worse than a uniform guess, a FAIL whatever the curve's shape; without
    the config there is no K to judge by, and the rule stays silent."""
    run = runs.get("lr10", full=True, steps=30, save_steps=30, lr=10.0, logging_steps=5)
    drift = ap.training_drift(run)
    assert drift.verdict.value == "fail", drift.message
    assert "worse_than_uniform" in {f["rule"] for f in drift.evidence["findings"]}
    copy = tmp_path / "no-config"
    shutil.copytree(run / "checkpoint-30", copy / "checkpoint-30")
    (copy / "checkpoint-30" / "config.json").unlink()
    bare = ap.training_drift(copy)
    assert "worse_than_uniform" not in {f["rule"] for f in bare.evidence.get("findings", [])}
    assert "output_classes" not in bare.evidence


def test_full_fine_tune_ids_are_attributed_as_the_trainer_grouped_them(runs):
    check_attributed_as_the_trainer_grouped(
        runs.full() / "checkpoint-40", {"model.embed_tokens.weight", "model.norm.weight"}
    )


@pytest.mark.slow
def test_gpt2_layer_norms_are_placed_by_module_type(runs):
    """GPT-2's ln_1, ln_2 and ln_f lack 'norm' in their names; the Trainer
    puts them in the no-decay group because they are nn.LayerNorm. The
    per-layer check must still run, ids tied to the names the Trainer
    gave them."""
    run = runs.get("gpt2", model="gpt2", full=True, steps=20, save_steps=20)
    ckpt = run / "checkpoint-20"
    check_attributed_as_the_trainer_grouped(
        ckpt,
        {
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "transformer.ln_f.weight",
            "transformer.ln_f.bias",
        },
    )
    ghost = ap.gradient_ghost(ckpt)
    assert "per_layer" not in ghost.evidence["not_checked"], ghost.message
    assert "tensors in 3 layers" in ghost.message, ghost.message


def check_attributed_as_the_trainer_grouped(ckpt: Path, outside_layers: set[str]) -> None:
    inputs = ap._core.ghost_input(ckpt)
    assert inputs.checkpoint_kind == "full"
    assert inputs.attribution is not None, inputs.attribution_error
    ordered = trainer_order(ckpt)
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert len(ordered) == len(state["state"])  # the tied head appears once
    for ps in inputs.attribution.params:
        name = ordered[ps.param_id]
        assert re.search(rf"\.(layers|h)\.{ps.layer}\.", name), (ps, name)
        slot = inputs.attribution.slot_names[ps.slot]
        assert any(name.endswith((f".{s}.weight", f".{s}")) for s in slot.split(" | ")), (
            slot,
            name,
        )
    outside = {ordered[i] for i in inputs.attribution.unattributed}
    assert outside == outside_layers


@pytest.mark.slow
def test_a_sharded_full_checkpoint(runs):
    ckpt = runs.sharded() / "checkpoint-20"
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    result = ap.full_weights(ckpt)
    assert result.verdict == "pass", result.message
    assert [Path(f).name for f in result.evidence["files"]] == shards
    # Per-layer L2 norms as torch computes them from the shards.
    tensors = {}
    for shard in shards:
        tensors.update(safetensors_torch.load_file(ckpt / shard))
    want: dict[str, float] = {}
    for name, t in tensors.items():
        if ".layers." in name:
            layer = name.split(".layers.")[1].split(".")[0]
            want[layer] = want.get(layer, 0.0) + float(t.double().pow(2).sum())
    got = result.evidence["layer_l2_norm"]
    assert got.keys() == want.keys()
    for layer, sq in want.items():
        assert got[layer] == pytest.approx(math.sqrt(sq), rel=1e-9)
    assert result.evidence["num_tensors"] == len(tensors)
    ghost = ap.gradient_ghost(ckpt)
    assert ghost.verdict == "pass" and "per_layer" not in ghost.evidence["not_checked"]
    scanned = by_probe(ap.scan(ckpt.parent, probes=ALL))
    assert scanned["full_weights"][0].message == result.message
    assert scanned["adapter_weights"][0].message.startswith(
        "full fine-tune checkpoint (model.safetensors.index.json)"
    )


@pytest.mark.slow
def test_nan_weights_of_a_full_fine_tune_fail_naming_the_tensors(runs):
    run = runs.get("full-nan", full=True, steps=20, save_steps=20, nan_at=10, tensorboard=False)
    ckpt = run / "checkpoint-20"
    loaded = safetensors_torch.load_file(ckpt / "model.safetensors")
    bad = sorted(n for n, t in loaded.items() if not torch.isfinite(t).all())
    assert bad  # the NaN step reached the weights
    result = ap.full_weights(ckpt)
    assert result.verdict == "fail" and result.message.startswith("nonfinite_weights"), (
        result.message
    )
    assert sorted(result.evidence["nonfinite_tensors"]) == bad
    count = sum(int((~torch.isfinite(loaded[n])).sum()) for n in bad)
    assert result.evidence["nonfinite_total"] == count
    report = ap.scan(run, probes=ALL)
    probes = by_probe(report)
    assert probes["full_weights"][0].verdict.value == "fail"
    assert probes["adapter_weights"][0].verdict.value == "skip"
    assert report.exit_code() == 1
    # Not in the default set: a plain scan does not read the model.
    assert "full_weights" not in {r.probe for r in ap.scan(run)}


@pytest.mark.slow
def test_pickled_full_weights_are_skipped_with_a_reason(runs):
    run = runs.get("full-bin", full=True, steps=20, save_steps=20, save="bin", tensorboard=False)
    report = ap.scan(run, probes=ALL)
    assert report.exit_code() == 0
    probes = by_probe(report)
    full = probes["full_weights"][0]
    assert full.verdict.value == "skip" and "pytorch_model.bin" in full.message
    ghost = probes["gradient_ghost"][0]
    assert ghost.verdict.value == "pass", ghost.message
    assert "pytorch_model.bin" in ghost.evidence["not_checked"]["per_layer"]
    assert probes["adapter_weights"][0].message.startswith(
        "full fine-tune checkpoint (pytorch_model.bin)"
    )


@pytest.mark.slow
def test_log_only_checkpoints_are_a_store(runs, tmp_path):
    """Weights deleted or never uploaded: only trainer_state.json is left."""
    run = tmp_path / "logs-only"
    shutil.copytree(runs.full(), run)
    for path in list(run.rglob("*")):
        if path.is_file() and path.name != "trainer_state.json" and "runs" not in path.parts:
            path.unlink()
    report = ap.scan(run, all_versions=True)
    assert report.exit_code() == 0, [r.message for r in report]
    assert {r.checkpoint_kind for r in report} == {"logs"}
    probes = by_probe(report)
    assert names(probes["adapter_weights"]) == ["checkpoint-20", "checkpoint-40"]
    for r in probes["adapter_weights"]:
        assert (r.verdict.value, r.message) == ("skip", "log-only checkpoint: no weights")
    assert {r.verdict.value for r in probes["gradient_ghost"]} == {"skip"}
    (drift,) = probes["training_drift"]
    assert drift.verdict.value == "pass", drift.message
    curve = ap.read_loss_curve(run)
    assert len(curve) == 40


@pytest.mark.slow
def test_a_folder_of_tensorboard_events_is_a_store(runs, tmp_path):
    events = next((runs.full() / "runs").iterdir())
    tb = tmp_path / "tb-only"
    shutil.copytree(events, tb)
    (record,) = ap.scan(tmp_path)
    assert (record.layout, record.probe, record.checkpoint_kind) == (
        "tensorboard",
        "training_drift",
        "logs",
    )
    assert record.verdict.value == "pass", record.message
    assert record.evidence["log_format"] == "tensorboard"
    assert record.evidence["num_steps"] == len(ap.read_loss_curve(tb))


@pytest.mark.slow
def test_last_checkpoint_is_a_version_of_its_run(runs, tmp_path):
    """What push_to_hub(hub_strategy="checkpoint") leaves: the final model at
    the top and the newest checkpoint as last-checkpoint/."""
    full = runs.full()
    hub = tmp_path / "hub"
    shutil.copytree(full, hub, ignore=shutil.ignore_patterns("checkpoint-*"))
    shutil.copytree(full / "checkpoint-40", hub / "last-checkpoint")
    report = ap.scan(tmp_path)
    assert {r.store for r in report} == {str(hub)}
    probes = by_probe(report)
    assert names(probes["gradient_ghost"]) == ["last-checkpoint"]
    assert probes["gradient_ghost"][0].evidence["global_step"] == 40
    # Beside numbered checkpoints it sits at its own step: after 20, and after
    # a checkpoint-40 it copies.
    shutil.copytree(full / "checkpoint-20", hub / "checkpoint-20")
    every = by_probe(ap.scan(hub, all_versions=True))["gradient_ghost"]
    assert names(every) == ["checkpoint-20", "last-checkpoint"]
    shutil.copytree(full / "checkpoint-40", hub / "checkpoint-40")
    every = by_probe(ap.scan(hub, all_versions=True))["gradient_ghost"]
    assert names(every) == ["checkpoint-20", "checkpoint-40", "last-checkpoint"]
    # An older last-checkpoint is ordered by its step, not taken as newest.
    shutil.rmtree(hub / "last-checkpoint")
    shutil.copytree(full / "checkpoint-20", hub / "last-checkpoint")
    shutil.rmtree(hub / "checkpoint-20")
    every = by_probe(ap.scan(hub, all_versions=True))["gradient_ghost"]
    assert names(every) == ["last-checkpoint", "checkpoint-40"]
    newest = by_probe(ap.scan(hub))["gradient_ghost"]
    assert names(newest) == ["checkpoint-40"]
    # Checked alone, it is a version inside its run.
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "check", str(hub / "last-checkpoint")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    (alone,) = ap.scan(hub / "last-checkpoint", probes=["gradient_ghost"])
    assert (alone.store, alone.checkpoint_kind) == (str(hub), "full")


@pytest.mark.slow
def test_checkpoints_are_listed_in_numeric_order(runs):
    run = runs.get("lora-120", steps=120, save_steps=40, tensorboard=False)
    want = ["checkpoint-40", "checkpoint-80", "checkpoint-120"]
    assert sorted(want) != want  # text order would differ
    report = ap.scan(run, all_versions=True)
    probes = by_probe(report)
    assert names(probes["gradient_ghost"]) == want
    assert names(probes["adapter_weights"]) == want
    assert [r.evidence["global_step"] for r in probes["gradient_ghost"]] == [40, 80, 120]
    rows = [r for r in report.to_csv().splitlines()[1:] if "gradient_ghost" in r]
    assert [next(w for w in want if f"/{w}," in row) for row in rows] == want
    from adapterprobe.reports.table import TableStream

    out = io.StringIO()
    table = TableStream(out, width=200, colour=False)
    table.add(report.records)
    table.finish("fail")
    lines = [line for line in out.getvalue().splitlines() if "gradient_ghost" in line]
    shown = [line.split(" / ")[1].split()[0] for line in lines]
    assert shown == want
    assert ap.read_loss_curve(run).files[0].parent.name == "checkpoint-120"


def test_a_scan_reads_the_big_files_of_the_judged_checkpoint_only(runs, tmp_path):
    """A full fine-tune with checkpoints at 20 and 40: the big files of
    checkpoint-20 are replaced by garbage of the same size. A scan judges
    checkpoint-40 and never opens them (no record is an error); with
    --all-versions it reads them (they are then errors), and says before
    reading what it will read (issue 55, item 2)."""
    full = tmp_path / "full"
    shutil.copytree(runs.full(), full)
    old = full / "checkpoint-20"
    big = [p for p in old.iterdir() if p.suffix in (".safetensors", ".pt", ".bin")]
    assert {p.name for p in big} >= {"model.safetensors", "optimizer.pt"}
    for path in big:
        path.write_bytes(b"\x07" * path.stat().st_size)
    newest = ap.scan(full, probes=ALL)
    assert not [r for r in newest if r.verdict == "error"], [r.message for r in newest]
    judged = [r for r in newest if r.probe in ("full_weights", "gradient_ghost")]
    assert judged and set(names(judged)) == {"checkpoint-40"}
    every = ap.scan(full, probes=ALL, all_versions=True)
    errors = [r for r in every if r.verdict == "error"]
    assert errors and set(names(errors)) == {"checkpoint-20"}
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "scan", str(full), "--all-versions", "-q"],
        capture_output=True,
        text=True,
    )
    sized = sum(
        p.stat().st_size
        for version in ("checkpoint-20", "checkpoint-40")
        for p in (full / version).iterdir()
        if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")
    )
    first = done.stderr.splitlines()[0]
    assert first.startswith("adapterprobe: --all-versions: 2 versions of 1 store, "), done.stderr
    assert f"({sized:,} bytes)" in first
