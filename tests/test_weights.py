"""adapter_weights on real PEFT adapters: numbers against torch, verdicts per fault."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

import adapterprobe as ap  # noqa: E402
from realruns.tiny import tiny_llama  # noqa: E402


def train_adapter(
    out: Path,
    *,
    steps: int = 4,
    layers: int = 2,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
    mutate=None,
) -> Path:
    """Save a PEFT LoRA adapter after `steps` real AdamW steps (0: untouched)."""
    model = peft.get_peft_model(
        tiny_llama(seed, layers=layers),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)),
    )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 64, (4, 16), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    if mutate is not None:
        with torch.no_grad():
            mutate(model)
    model.save_pretrained(out)
    return out


def lora_modules(model):
    return {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {})
    }


def test_numbers_match_torch(tmp_path):
    captured = {}

    def keep(model):
        for name, m in lora_modules(model).items():
            key = name.removeprefix("base_model.model.")
            captured[key] = (
                m.lora_A["default"].weight.double().norm().item(),
                m.lora_B["default"].weight.double().norm().item(),
                m.get_delta_weight("default").double().norm().item(),
                torch.linalg.svdvals(m.get_delta_weight("default").double()).tolist(),
            )

    adapter = train_adapter(tmp_path / "a", mutate=keep)
    w = ap.read_adapter_weights(adapter)
    assert {m.name for m in w.modules} == set(captured)
    for m in w.modules:
        norm_a, norm_b, delta, sigma = captured[m.name]
        assert m.norm_a == pytest.approx(norm_a, rel=1e-6)
        assert m.norm_b == pytest.approx(norm_b, rel=1e-6)
        assert m.delta_fro == pytest.approx(delta, rel=1e-6)
        assert m.singular_values == pytest.approx(sigma[: m.rank], rel=1e-5, abs=1e-9)
        assert m.scale == pytest.approx(2.0)
    total = math.fsum(layer.delta_fro_sq for layer in w.layers)
    assert total == pytest.approx(math.fsum(v[2] ** 2 for v in captured.values()), rel=1e-6)
    r = ap.adapter_weights(adapter)
    assert r.verdict == "pass", r.message
    assert r.evidence["total_delta_fro"] == pytest.approx(math.sqrt(total), rel=1e-9)
    assert sum(float(v) for v in r.evidence["layer_delta_energy"].values()) == pytest.approx(total)


def test_untouched_adapter_is_dead(tmp_path):
    r = ap.adapter_weights(train_adapter(tmp_path / "a", steps=0))
    assert r.verdict == "fail"
    assert r.message.startswith("dead_adapter")
    assert len(r.evidence["dead_modules"]) == r.evidence["num_modules"] == 4


def test_some_dead_modules_warn_by_name(tmp_path):
    def kill(model):
        model.base_model.model.model.layers[1].self_attn.v_proj.lora_B["default"].weight.zero_()

    r = ap.adapter_weights(train_adapter(tmp_path / "a", mutate=kill))
    assert r.verdict == "warn"
    assert r.evidence["dead_modules"] == ["model.layers.1.self_attn.v_proj"]
    assert "model.layers.1.self_attn.v_proj" in r.message


def test_nonfinite_weights_fail(tmp_path):
    def poison(model):
        model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight[0, 1] = (
            float("nan")
        )

    r = ap.adapter_weights(train_adapter(tmp_path / "a", mutate=poison))
    assert r.verdict == "fail"
    assert r.evidence["nonfinite_modules"] == ["model.layers.0.self_attn.q_proj"]


def test_energy_in_one_module_warns(tmp_path):
    def boost(model):
        model.base_model.model.model.layers[2].self_attn.q_proj.lora_B["default"].weight.mul_(1e3)

    adapter = train_adapter(tmp_path / "a", layers=4, mutate=boost)
    r = ap.adapter_weights(adapter)
    assert r.verdict == "warn", r.message
    assert "concentrated" in r.message and "model.layers.2.self_attn.q_proj" in r.message
    assert r.evidence["top_modules"][0]["module"] == "model.layers.2.self_attn.q_proj"
    healthy = ap.adapter_weights(train_adapter(tmp_path / "b", layers=4))
    assert healthy.verdict == "pass", healthy.message


@pytest.mark.parametrize(
    "damage",
    ["no_config", "config_not_json", "config_rank_lies", "no_weights", "random_weights", "torn"],
)
def test_broken_adapters_are_errors_not_passes(tmp_path, damage):
    adapter = train_adapter(tmp_path / "a")
    weights = adapter / "adapter_model.safetensors"
    config = adapter / "adapter_config.json"
    if damage == "no_config":
        config.unlink()
    elif damage == "config_not_json":
        config.write_text("{not json")
    elif damage == "config_rank_lies":
        cfg = json.loads(config.read_text())
        cfg["r"] = 16
        config.write_text(json.dumps(cfg))
    elif damage == "no_weights":
        weights.unlink()
    elif damage == "random_weights":
        weights.write_bytes(bytes(range(256)) * 8)
    else:
        weights.write_bytes(weights.read_bytes()[:-100])
    before = {p.name: p.read_bytes() for p in adapter.iterdir()}
    r = ap.adapter_weights(adapter)
    assert r.verdict == "error", (damage, r.message)
    # The result is the probe's; its message does not repeat the name.
    assert r.message
    assert not r.message.startswith("adapter_weights")
    assert {p.name: p.read_bytes() for p in adapter.iterdir()} == before
    if damage not in ("no_config", "no_weights"):
        with pytest.raises((ap.WeightsError, ap.HeaderError)):
            ap.read_adapter_weights(adapter)


def test_an_unchanged_version_warns_with_all_versions(tmp_path):
    store = tmp_path / "store"
    v1 = train_adapter(store / "adapter" / "versions" / "v0001")
    shutil.copytree(v1, store / "adapter" / "versions" / "v0002")
    (store / "adapter" / "current.txt").write_text("versions/v0002")
    report = ap.scan(store, all_versions=True, probes=["adapter_weights"])
    by_version = {Path(r.adapter).name: r for r in report}
    assert by_version["v0001"].verdict == "pass"
    assert by_version["v0002"].verdict == "warn"
    assert "unchanged" in by_version["v0002"].message
    assert by_version["v0002"].evidence["previous_version"].endswith("v0001")
    # Without --all-versions only current.txt's version is judged, alone.
    (only,) = ap.scan(store, probes=["adapter_weights"])
    assert only.verdict == "pass"


def test_scan_runs_the_weights_probe_on_every_version(demo_store):
    report = ap.scan(demo_store)
    weights = [r for r in report if r.probe == "adapter_weights"]
    ghosts = [r for r in report if r.probe == "gradient_ghost"]
    assert [r.adapter for r in weights] == [r.adapter for r in ghosts]
    assert all(r.verdict == "pass" for r in weights), [r.message for r in weights]
