"""A run cloned without `git lfs pull` holds Git LFS pointers where its files
should be; every reader says so, naming the size, the oid and the fix.

The pointers are what git-lfs writes for the real files (spec v1: version,
oid sha256 of the content, size), made from real runs (tools/realruns/hf.py,
the bundled demo store, the Lightning fixture)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

import adapterprobe as ap
from adapterprobe.scan import DEMO_STORE

ROOT = Path(__file__).resolve().parents[1]
LIGHTNING_CSV = ROOT / "rust/testdata/logs/lightning/version_0/metrics.csv"
#: What `huggingface-cli repo create` puts in .gitattributes (the weights,
#: optimizer and TensorBoard patterns among them).
HUB_LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*tfevents*")


def pointer_text(real: Path) -> str:
    data = real.read_bytes()
    oid = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n"


def without_lfs(real: Path, where: Path) -> tuple[Path, str]:
    """A copy of `real` at `where` as a clone without `git lfs pull` has it,
    and the words a reader must say about it."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(pointer_text(real))
    data = real.read_bytes()
    oid = hashlib.sha256(data).hexdigest()
    said = (
        f"{where}: is a Git LFS pointer ({len(data)} bytes in LFS, oid sha256:{oid[:12]}…), "
        "not the file: run `git lfs pull`"
    )
    return where, said


def check(read, real: Path, where: Path, error: type[Exception]) -> Exception:
    read(real)  # the real file reads
    pointer, said = without_lfs(real, where)
    with pytest.raises(error) as caught:
        read(pointer)
    assert str(caught.value) == said
    assert caught.value.lfs_pointer == "true"
    assert caught.value.lfs_size == str(real.stat().st_size)
    return caught.value


def test_dlm_store_readers(tmp_path):
    version = DEMO_STORE / "healthy" / "adapter" / "versions" / "v0001"
    check(
        ap.read_safetensors_header,
        version / "adapter_model.safetensors",
        tmp_path / "h" / "adapter_model.safetensors",
        ap.HeaderError,
    )
    # The tensor-data reader (and its config) behind adapter_weights.
    copy = tmp_path / "v"
    shutil.copytree(version, copy)
    check(
        ap.read_adapter_weights,
        version / "adapter_model.safetensors",
        copy / "adapter_model.safetensors",
        ap.HeaderError,
    )
    shutil.copy(version / "adapter_model.safetensors", copy / "adapter_model.safetensors")
    _, said = without_lfs(version / "adapter_config.json", copy / "adapter_config.json")
    with pytest.raises(ap.WeightsError) as caught:
        ap.read_adapter_weights(copy)
    assert str(caught.value) == said
    # training_state.pt keeps its .sha256 sidecar: the pointer, not "tampered".
    state = tmp_path / "s"
    shutil.copytree(version, state)
    err = check(
        ap.read_training_state,
        version / "training_state.pt",
        state / "training_state.pt",
        ap.TrainingStateError,
    )
    assert not isinstance(err, ap.IntegrityError)
    logs = DEMO_STORE / "healthy" / "logs"
    log = next(logs.iterdir())
    check(ap.read_loss_curve, log, tmp_path / "logs" / log.name, ap.LogFormatError)


def test_log_readers(tmp_path):
    check(ap.read_loss_curve, LIGHTNING_CSV, tmp_path / "metrics.csv", ap.LogFormatError)
    events = next((ROOT / "rust/testdata/logs/torch_writer").glob("events.out.tfevents.*"))
    check(ap.read_loss_curve, events, tmp_path / "tb" / events.name, ap.LogFormatError)
    state = ROOT / "rust/testdata/logs/hf_run/trainer_state.json"
    check(ap.read_loss_curve, state, tmp_path / "trainer_state.json", ap.LogFormatError)


@pytest.mark.slow
def test_hf_run_readers_and_a_scan(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from realruns import hf

    full = hf.train_hf_run(
        tmp_path / "full", full=True, steps=20, save_steps=20, save="sharded", tensorboard=False
    )
    ckpt = full / "checkpoint-20"
    check(
        ap.read_optimizer_state,
        ckpt / "optimizer.pt",
        tmp_path / "o" / "optimizer.pt",
        ap.TrainingStateError,
    )
    for name in ("model.safetensors.index.json", "model-00001-of-00003.safetensors"):
        copy = tmp_path / f"ckpt-{name}"
        shutil.copytree(ckpt, copy)
        _, said = without_lfs(ckpt / name, copy / name)
        result = ap.full_weights(copy)
        assert (result.verdict.value, result.message) == ("error", f"full_weights: {said}")

    # A LoRA run cloned from the Hub without `git lfs pull`.
    lora = hf.train_hf_run(tmp_path / "lora", steps=20, save_steps=20)
    clone = tmp_path / "clone"
    shutil.copytree(lora, clone)
    pointers = {p for pattern in HUB_LFS_PATTERNS for p in clone.rglob(pattern) if p.is_file()}
    assert any(p.name == "optimizer.pt" for p in pointers)
    for p in pointers:
        without_lfs(lora / p.relative_to(clone), p)
    report = ap.scan(clone)
    assert report.exit_code() == 1
    by_probe = {r.probe: r for r in report}
    for probe in ("adapter_weights", "gradient_ghost"):
        r = by_probe[probe]
        assert r.verdict.value == "error"
        assert "is a Git LFS pointer" in r.message and "run `git lfs pull`" in r.message
    # The curve's trainer_state.json is not an LFS pattern: the curve is judged
    # from it, and the event files, left as pointers, add nothing.
    drift = by_probe["training_drift"]
    assert drift.verdict.value == "pass", drift.message
    assert drift.evidence["log_format"] == "trainer_state"
