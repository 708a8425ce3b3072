"""PEFT adapters saved as ``adapter_model.bin`` (``save_pretrained(safe_serialization=False)``,
a ``torch.save`` zip) are judged exactly like their ``adapter_model.safetensors`` twins:
read through the allow-listed pickle interpreter, never by running the pickle.

Every adapter here is written by the real ``peft`` and ``torch`` from a tiny Llama
built from a config; the hostile ones are mutations of such real files.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

import adapterprobe as ap  # noqa: E402
from realruns.tiny import tiny_llama  # noqa: E402


def trained(steps: int = 3, mutate=None):
    """A PEFT LoRA on a tiny Llama after `steps` AdamW steps (0: B still zero)."""
    model = peft.get_peft_model(
        tiny_llama(0, hidden=16, layers=2),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, 64, (2, 8), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    if mutate is not None:
        with torch.no_grad():
            mutate(model)
    return model


def save_both(model, root: Path) -> tuple[Path, Path]:
    """The same adapter saved by PEFT both ways: (pickled dir, safetensors dir)."""
    dirs = root / "bin", root / "safetensors"
    for out, safe in zip(dirs, (False, True), strict=True):
        model.save_pretrained(out, safe_serialization=safe)
    assert sorted(p.name for p in dirs[0].iterdir() if p.name.startswith("adapter_model")) == [
        "adapter_model.bin"
    ]
    assert (dirs[1] / "adapter_model.safetensors").is_file()
    return dirs


def weights_record(adapter: Path) -> ap.ScanRecord:
    (record,) = [r for r in ap.scan(adapter) if r.probe == "adapter_weights"]
    return record


def same_numbers(a, b) -> bool:
    """Equal, with NaN equal to NaN (as the records carry non-finite statistics)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_numbers(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_numbers(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def assert_judged_alike(pickled: Path, safe: Path) -> ap.ScanRecord:
    bin_record, st_record = weights_record(pickled), weights_record(safe)
    assert bin_record.verdict == st_record.verdict, (bin_record.message, st_record.message)
    assert bin_record.score == st_record.score
    assert bin_record.message == st_record.message
    assert same_numbers(bin_record.evidence, st_record.evidence)
    # The statistics themselves, field by field.
    wb, ws = ap.read_adapter_weights(pickled), ap.read_adapter_weights(safe)
    assert Path(wb.path).name == "adapter_model.bin"
    assert [m.name for m in wb.modules] == [m.name for m in ws.modules]
    fields = ("rank", "dtype_a", "dtype_b", "scale", "norm_a", "norm_b", "max_abs_a")
    fields += ("max_abs_b", "nonfinite_a", "nonfinite_b", "delta_fro", "singular_values")
    fields += ("stable_rank", "effective_rank", "rank_used")
    for mb, ms in zip(wb.modules, ws.modules, strict=True):
        for field in fields:
            assert same_numbers(getattr(mb, field), getattr(ms, field)), (mb.name, field)
    assert (wb.tensor_bytes, wb.nonfinite_total) == (ws.tensor_bytes, ws.nonfinite_total)
    return bin_record


def test_a_trained_adapter_is_judged_alike_in_both_formats(tmp_path):
    pickled, safe = save_both(trained(), tmp_path)
    record = assert_judged_alike(pickled, safe)
    assert record.verdict.value == "pass", record.message
    assert record.evidence["num_modules"] == 4
    # The factors a comparison reads are the same too.
    result = ap.compare(pickled, safe).to_dict()
    assert result["pair_error"] is None
    assert result["similarity"] == pytest.approx(1.0)
    # similar() finds both under their root and pairs them.
    found = ap.similar(tmp_path)
    assert found["adapters"] == 2 and found["skipped"] == []
    ((pair),) = found["pairs"]
    assert {Path(pair["a"]).name, Path(pair["b"]).name} == {"bin", "safetensors"}
    assert pair["similarity"] == pytest.approx(1.0)


def test_a_dead_adapter_fails_as_bin_like_its_twin(tmp_path):
    pickled, safe = save_both(trained(steps=0), tmp_path)
    record = assert_judged_alike(pickled, safe)
    assert record.verdict.value == "fail"
    assert record.message.startswith("dead_adapter"), record.message


def test_a_nan_poisoned_bin_fails(tmp_path):
    def poison(model):
        layer = model.base_model.model.model.layers[1].self_attn
        layer.v_proj.lora_B["default"].weight[0, 0] = float("nan")

    pickled, safe = save_both(trained(mutate=poison), tmp_path)
    record = assert_judged_alike(pickled, safe)
    assert record.verdict.value == "fail"
    assert record.evidence["nonfinite_modules"] == ["model.layers.1.self_attn.v_proj"]


def rewrite_pickle(weights: Path, edit) -> None:
    """Rewrite `weights` (a torch.save zip) with its data.pkl changed by `edit`."""
    with zipfile.ZipFile(weights) as z:
        entries = [(info, z.read(info)) for info in z.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info, body in entries:
            z.writestr(info, edit(body) if info.filename.endswith("/data.pkl") else body)
    weights.write_bytes(out.getvalue())


def test_a_pickle_naming_os_system_is_an_error_and_never_runs(tmp_path):
    pickled, _ = save_both(trained(), tmp_path)
    weights = pickled / "adapter_model.bin"
    marker = tmp_path / "ran"
    command = f"touch {marker}".encode()
    # Just before STOP: os.system(command), its result dropped (POP), so the
    # state dict is still what the pickle returns.
    call = b"cos\nsystem\nX" + len(command).to_bytes(4, "little") + command + b"\x85R0"
    rewrite_pickle(weights, lambda pkl: pkl[:-1] + call + pkl[-1:])

    record = weights_record(pickled)
    assert record.verdict.value == "error", record.message
    assert "os.system" in record.message
    with pytest.raises(ap.UnsafePickleError) as info:
        ap.read_adapter_weights(pickled)
    assert info.value.global_name == "os.system"
    assert not marker.exists()

    # The payload is live: torch.load without weights_only runs it.
    load = f"import torch; torch.load({str(weights)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", load], check=True, env=dict(os.environ))
    assert marker.exists()


@pytest.mark.parametrize("keep", [0.0, 0.3, 0.9, 0.999])
def test_a_truncated_bin_is_an_error_record(tmp_path, keep):
    pickled, _ = save_both(trained(), tmp_path)
    weights = pickled / "adapter_model.bin"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    record = weights_record(pickled)
    assert record.verdict.value == "error", record.message
    with pytest.raises(ap.WeightsError):
        ap.read_adapter_weights(pickled)


def test_the_legacy_torch_save_format_is_named_and_not_read(tmp_path):
    model = trained()
    pickled, _ = save_both(model, tmp_path)
    weights = pickled / "adapter_model.bin"
    state = peft.get_peft_model_state_dict(model)
    torch.save(state, weights, _use_new_zipfile_serialization=False)
    record = weights_record(pickled)
    assert record.verdict.value == "error"
    assert "legacy" in record.message and "pre-1.6" in record.message, record.message
