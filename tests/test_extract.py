"""extract_lora: rank rule, PEFT round trip, checkpoint streaming, bad input, CLI."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402

import adapterprobe  # noqa: E402
from adapterprobe import ExtractionError, MissingFileError, UsageError  # noqa: E402
from adapterprobe.lora.factorize import choose_rank, factorize_delta  # noqa: E402
from realruns.tiny import tiny_llama as build_llama  # noqa: E402

TINY = dict(vocab=96, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, max_positions=64)


def tiny_llama(seed: int = 0, **overrides):
    pytest.importorskip("transformers")
    return build_llama(seed, **{**TINY, "tie_word_embeddings": False, **overrides}).eval()


def linear_names(model) -> list[str]:
    return [
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"
    ]


def plant(model, rank: int = 4, scale: float = 0.05, seed: int = 1, only=None):
    """Add an exact rank-``rank`` delta to Linear weights; returns {module: delta}."""
    g = torch.Generator().manual_seed(seed)
    tuned = copy.deepcopy(model)
    deltas = {}
    mods = dict(tuned.named_modules())
    with torch.no_grad():
        for name in linear_names(tuned):
            if only and not any(name.endswith(o) for o in only):
                continue
            w = mods[name].weight
            d = (
                scale
                * torch.randn(w.shape[0], rank, generator=g)
                @ torch.randn(rank, w.shape[1], generator=g)
            )
            w += d
            deltas[name] = d
    return tuned, deltas


def spectrum_matrix(m: int, n: int, s, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k = len(s)
    u, _ = torch.linalg.qr(torch.randn(m, k, generator=g))
    v, _ = torch.linalg.qr(torch.randn(n, k, generator=g))
    return (u * torch.as_tensor(s, dtype=torch.float32)) @ v.T


def exact_rank(dw, ev: float) -> int:
    s = torch.linalg.svdvals(dw.double())
    kept = torch.cumsum(s**2, 0) / (dw.double() ** 2).sum()
    return int(torch.nonzero(kept >= ev)[0, 0]) + 1


# ---------------------------------------------------------------- rank rule


def test_choose_rank_uses_whole_energy():
    s = torch.tensor([3.0, 2.0, 1.0])
    # top-3 hold 14 of a total 28: half the energy; the seed's rule would say 100%
    assert choose_rank(s, 28.0, 0.5, 1, 3) == (3, True)
    assert choose_rank(s, 28.0, 0.95, 1, 3) == (3, False)
    assert choose_rank(s, 14.0, 0.6, 1, 3) == (1, True)  # 9/14 >= 0.6
    assert choose_rank(s, 14.0, 0.6, 2, 3) == (2, True)  # clamped up to min_rank


@pytest.mark.parametrize(
    "spectrum",
    [
        "pow0.3",
        "pow0.5",
        "pow1",
        "exp",
        "lowrank+noise",
    ],
)
@pytest.mark.parametrize("ev", [0.5, 0.8, 0.9, 0.95])
def test_rank_matches_exact_svd_within_one(spectrum, ev):
    i = torch.arange(1, 257, dtype=torch.float32)
    s = {
        "pow0.3": i**-0.3,
        "pow0.5": i**-0.5,
        "pow1": i**-1.0,
        "exp": torch.exp(-i / 12),
        "lowrank+noise": torch.where(i <= 12, 5.0 / i**0.3, torch.full_like(i, 0.02)),
    }[spectrum]
    dw = spectrum_matrix(384, 256, s, seed=3)
    want = exact_rank(dw, ev)
    f = factorize_delta(dw.clone(), min_rank=1, max_rank=96, explained_variance=ev)
    if want <= 96:
        assert abs(f.rank - want) <= 1, (f.rank, want)
        assert f.target_reached
        assert f.energy_kept >= ev - 1e-4
    else:
        assert f.rank == 96 and not f.target_reached
        assert f.energy_kept < ev


def test_subspace_grows_when_target_not_reached_inside_it():
    # 40 equal singular values: the first sketch (32 directions) cannot reach 95%
    s = torch.ones(40)
    dw = spectrum_matrix(400, 300, s, seed=5)
    f = factorize_delta(dw, min_rank=1, max_rank=64, explained_variance=0.95)
    assert f.rank in (38, 39, 40)
    assert f.target_reached


def test_energy_outside_subspace_counts_as_not_kept():
    i = torch.arange(1, 201, dtype=torch.float32)
    dw = spectrum_matrix(300, 200, torch.ones_like(i), seed=2)  # flat: rank 16 keeps 8%
    f = factorize_delta(dw, min_rank=4, max_rank=16, explained_variance=0.95)
    assert f.rank == 16 and not f.target_reached
    assert f.energy_kept == pytest.approx(16 / 200, rel=0.05)
    assert f.rel_error == pytest.approx((1 - 16 / 200) ** 0.5, rel=0.02)


def test_factorize_is_reproducible_and_leaves_global_rng_alone():
    dw = spectrum_matrix(300, 200, torch.arange(1, 201, dtype=torch.float32) ** -1.0)
    state = torch.get_rng_state()
    a = factorize_delta(dw, min_rank=8, max_rank=32)
    b = factorize_delta(dw, min_rank=8, max_rank=32)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.lora_A, b.lora_A) and torch.equal(a.lora_B, b.lora_B)


def test_factor_layout_and_fixed_rank_error_near_optimal():
    i = torch.arange(1, 201, dtype=torch.float32)
    dw = spectrum_matrix(320, 200, i**-0.5, seed=7)
    f = factorize_delta(dw, min_rank=32, max_rank=32)
    assert f.lora_B.shape == (320, 32) and f.lora_A.shape == (32, 200)
    s = torch.linalg.svdvals(dw.double())
    optimal = float((s[32:] ** 2).sum().sqrt() / (s**2).sum().sqrt())
    assert f.rel_error <= 1.02 * optimal
    measured = float((dw - f.lora_B @ f.lora_A).norm() / dw.norm())
    assert f.rel_error == pytest.approx(measured, rel=1e-4)
    # B = U sqrt(S), A = sqrt(S) V^T: both factors carry the same column/row norms
    assert torch.allclose(f.lora_B.norm(dim=0), f.lora_A.norm(dim=1), rtol=1e-4)


# ---------------------------------------------------------------- planted deltas, PEFT


def test_planted_low_rank_deltas_recovered(tmp_path):
    base = tiny_llama()
    tuned, deltas = plant(base, rank=4, only=("q_proj", "v_proj", "down_proj"))
    rep = adapterprobe.extract_lora(
        base, tuned, tmp_path / "lora", min_rank=1, max_rank=16, explained_variance=0.999
    )
    assert sorted(rep.ranks) == sorted(deltas)
    assert set(rep.ranks.values()) == {4}
    for m in rep.modules:
        assert m.rel_error < 1e-4 and m.energy_kept > 0.9999 and m.target_reached
    sd = load_file(tmp_path / "lora" / "adapter_model.safetensors")
    for name, d in deltas.items():
        b = sd[f"base_model.model.{name}.lora_B.weight"]
        a = sd[f"base_model.model.{name}.lora_A.weight"]
        assert torch.allclose(b @ a, d, atol=1e-5)
    unchanged = {s.name for s in rep.skipped if s.reason == "unchanged"}
    assert "model.layers.0.self_attn.k_proj.weight" in unchanged


def test_min_rank_clamps_up(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=2, only=("q_proj",))
    rep = adapterprobe.extract_lora(base, tuned, tmp_path / "o", min_rank=8, max_rank=16)
    assert set(rep.ranks.values()) == {8}


def _peft_load(base_model, out_dir):
    peft = pytest.importorskip("peft")
    return peft.PeftModel.from_pretrained(copy.deepcopy(base_model), str(out_dir)).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_peft_round_trip_reproduces_tuned_outputs(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=3)
    out = tmp_path / "lora"
    rep = adapterprobe.extract_lora(
        base, tuned, out, min_rank=1, max_rank=8, explained_variance=0.999
    )
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA"
    assert cfg["rank_pattern"] == rep.ranks == cfg["alpha_pattern"]
    assert cfg["r"] == cfg["lora_alpha"] == 3
    assert sorted(cfg["target_modules"]) == sorted(rep.ranks)
    keys = set(load_file(out / "adapter_model.safetensors"))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    report = json.loads((out / "extraction_report.json").read_text())
    assert report == json.loads(json.dumps(rep.to_dict()))

    ids = torch.randint(0, TINY["vocab"], (2, 12), generator=torch.Generator().manual_seed(0))
    pm = _peft_load(base, out)
    # PEFT loaded exactly our factors into every targeted module
    state = pm.state_dict()
    sd = load_file(out / "adapter_model.safetensors")
    for name in rep.ranks:
        got = state[f"base_model.model.{name}.lora_A.default.weight"]
        assert torch.equal(got, sd[f"base_model.model.{name}.lora_A.weight"])
    want, got, before = _logits(tuned, ids), _logits(pm, ids), _logits(base, ids)
    assert (want - before).abs().max() > 0.05
    assert torch.allclose(got, want, atol=1e-4)


def test_peft_round_trip_with_truncation_and_mixed_ranks(tmp_path):
    base = tiny_llama()
    tuned = copy.deepcopy(base)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for i, name in enumerate(linear_names(tuned)):
            w = dict(tuned.named_modules())[name].weight
            r = 2 + 3 * (i % 4)
            w += (
                0.05
                * torch.randn(w.shape[0], r, generator=g)
                @ torch.randn(r, w.shape[1], generator=g)
            )
            w += 1e-4 * torch.randn(w.shape, generator=g)  # small full-rank tail
    out = tmp_path / "lora"
    rep = adapterprobe.extract_lora(
        base, tuned, out, min_rank=1, max_rank=16, explained_variance=0.99
    )
    assert len(set(rep.ranks.values())) > 1
    ids = torch.randint(0, TINY["vocab"], (2, 12), generator=torch.Generator().manual_seed(1))
    want, got, before = _logits(tuned, ids), _logits(_peft_load(base, out), ids), _logits(base, ids)
    assert (got - want).abs().max() < 0.05 * (before - want).abs().max()


def test_embeddings_saved_as_modules_to_save(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=2, only=("o_proj",))
    with torch.no_grad():
        tuned.model.embed_tokens.weight += 0.02 * torch.randn_like(tuned.model.embed_tokens.weight)
        tuned.lm_head.weight += 0.02 * torch.randn_like(tuned.lm_head.weight)
    skipped = adapterprobe.extract_lora(base, tuned, tmp_path / "a", min_rank=1, max_rank=4)
    missed = {s.name for s in skipped.missed_changes}
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= missed
    assert not skipped.modules_to_save

    out = tmp_path / "b"
    rep = adapterprobe.extract_lora(base, tuned, out, min_rank=1, max_rank=4, embeddings="save")
    assert sorted(rep.modules_to_save) == ["lm_head", "model.embed_tokens"]
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["modules_to_save"]) == ["lm_head", "model.embed_tokens"]
    sd = load_file(out / "adapter_model.safetensors")
    assert torch.equal(sd["base_model.model.lm_head.weight"], tuned.lm_head.weight)
    ids = torch.randint(0, TINY["vocab"], (1, 10), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(_logits(_peft_load(base, out), ids), _logits(tuned, ids), atol=1e-4)


def test_changed_1d_parameters_saved_whole_unless_save_1d_is_false(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=2, only=("q_proj",))
    with torch.no_grad():
        tuned.model.norm.weight += 0.5
    rep = adapterprobe.extract_lora(base, tuned, tmp_path / "o", min_rank=1, max_rank=4)
    assert rep.modules_to_save == ["model.norm"]
    (saved,) = rep.saved
    assert saved.key == "base_model.model.model.norm.weight"
    assert saved.delta_norm == pytest.approx(0.5 * TINY["hidden"] ** 0.5, rel=1e-4)
    sd = load_file(tmp_path / "o" / "adapter_model.safetensors")
    assert torch.equal(sd["base_model.model.model.norm.weight"], tuned.model.norm.weight)
    skipped = {s.name: s for s in rep.skipped}
    assert skipped["model.layers.0.input_layernorm.weight"].delta_norm == 0.0
    assert rep.categories["1-D"].captured == 1.0

    rep = adapterprobe.extract_lora(
        base, tuned, tmp_path / "p", min_rank=1, max_rank=4, save_1d=False
    )
    by_name = {s.name: s for s in rep.skipped}
    assert by_name["model.norm.weight"].reason == "1-D (save_1d=False)"
    assert by_name["model.norm.weight"].delta_norm == pytest.approx(
        0.5 * TINY["hidden"] ** 0.5, rel=1e-4
    )
    assert "model.norm.weight" in str(rep)
    assert rep.categories["1-D"].captured == 0.0


def test_dtype_float32_by_default_never_silent_fp16(tmp_path):
    base = tiny_llama().to(torch.bfloat16)
    tuned, _ = plant(base.float(), rank=2, only=("q_proj",))
    tuned = tuned.to(torch.bfloat16)
    base = base.to(torch.bfloat16)
    adapterprobe.extract_lora(base, tuned, tmp_path / "a", min_rank=1, max_rank=4)
    assert {t.dtype for t in load_file(tmp_path / "a" / "adapter_model.safetensors").values()} == {
        torch.float32
    }
    adapterprobe.extract_lora(base, tuned, tmp_path / "b", min_rank=1, max_rank=4, dtype="base")
    assert {t.dtype for t in load_file(tmp_path / "b" / "adapter_model.safetensors").values()} == {
        torch.bfloat16
    }
    adapterprobe.extract_lora(
        base, tuned, tmp_path / "c", min_rank=1, max_rank=4, dtype=torch.float16
    )
    assert {t.dtype for t in load_file(tmp_path / "c" / "adapter_model.safetensors").values()} == {
        torch.float16
    }


def test_include_exclude_and_progress(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=2)
    calls = []
    rep = adapterprobe.extract_lora(
        base,
        tuned,
        tmp_path / "o",
        min_rank=1,
        max_rank=4,
        include=["q_proj", "v_proj"],
        exclude="model.layers.1.*",
        progress=lambda name, done, total: calls.append((name, done, total)),
    )
    assert sorted(rep.ranks) == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
    ]
    assert [c[1] for c in calls] == list(range(1, len(calls) + 1))
    assert {c[2] for c in calls} == {len(calls)} and len(calls) == 2


def test_report_to_dict_and_summary(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=2, only=("q_proj",))
    rep = adapterprobe.extract_lora(base, tuned, tmp_path / "o", min_rank=1, max_rank=4)
    d = rep.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["totals"]["modules"] == 2 and d["totals"]["mean_rank"] == 2
    assert d["settings"]["explained_variance"] == 0.95
    assert d["seconds"] > 0 and rep.seconds > 0
    text = str(rep)
    assert "model.layers.1.self_attn.q_proj" in text and "energy" in text
    assert isinstance(rep, adapterprobe.ExtractionReport)


# ---------------------------------------------------------------- checkpoints on disk


def test_single_file_and_sharded_checkpoints_match_in_memory(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=6, scale=0.02)
    with torch.no_grad():
        for p in tuned.parameters():
            p += 1e-3 * torch.randn_like(p)
    base.save_pretrained(tmp_path / "base")  # model.safetensors
    tuned.save_pretrained(tmp_path / "tuned", max_shard_size="40KB")  # sharded index
    assert (tmp_path / "base" / "model.safetensors").is_file()
    index = json.loads((tmp_path / "tuned" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3

    mem = adapterprobe.extract_lora(base, tuned, tmp_path / "mem", max_rank=16)
    disk = adapterprobe.extract_lora(
        tmp_path / "base", str(tmp_path / "tuned"), tmp_path / "disk", max_rank=16
    )
    assert disk.ranks == mem.ranks
    a = load_file(tmp_path / "mem" / "adapter_model.safetensors")
    b = load_file(tmp_path / "disk" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6)
    # a lone .safetensors file and an index path work too
    single = tmp_path / "tuned.safetensors"
    save_file({k: v.contiguous() for k, v in tuned.state_dict().items()}, single)
    rep = adapterprobe.extract_lora(
        tmp_path / "base" / "model.safetensors", single, tmp_path / "single", max_rank=16
    )
    assert rep.ranks == mem.ranks


def test_paths_are_read_lazily(tmp_path, monkeypatch):
    import safetensors.torch as st

    base = tiny_llama()
    tuned, _ = plant(base, rank=2, only=("q_proj",))
    base.save_pretrained(tmp_path / "base")
    tuned.save_pretrained(tmp_path / "tuned", max_shard_size="40KB")

    def boom(*a, **k):
        raise AssertionError("whole-file load used")

    monkeypatch.setattr(st, "load_file", boom)
    monkeypatch.setattr(st, "load", boom)
    rep = adapterprobe.extract_lora(
        tmp_path / "base", tmp_path / "tuned", tmp_path / "o", min_rank=1
    )
    assert rep.num_modules == 2


def test_paths_stream_a_few_tensors_at_a_time(tmp_path, monkeypatch):
    import gc
    import weakref

    from adapterprobe.lora import sources

    base = tiny_llama()
    tuned, _ = plant(base, rank=2)
    base.save_pretrained(tmp_path / "base", max_shard_size="40KB")
    tuned.save_pretrained(tmp_path / "tuned", max_shard_size="40KB")
    live: set[int] = set()
    peak = [0, 0]
    real_get = sources.SafetensorsSource.get

    def tracking_get(self, key):
        t = real_get(self, key)
        ident = id(t)
        live.add(ident)
        weakref.finalize(t, live.discard, ident)
        peak[0] = max(peak[0], len(live))
        peak[1] += 1
        return t

    monkeypatch.setattr(sources.SafetensorsSource, "get", tracking_get)
    gc.disable()  # only reference counting frees tensors: what the code holds is what is live
    try:
        adapterprobe.extract_lora(tmp_path / "base", tmp_path / "tuned", tmp_path / "o")
    finally:
        gc.enable()
    assert peak[1] == 2 * len(tuned.state_dict())  # every tensor read once per side
    assert peak[0] <= 2  # base and tuned of one tensor at a time


def test_missing_checkpoint_paths(tmp_path):
    base = tiny_llama()
    with pytest.raises(MissingFileError, match="does not exist"):
        adapterprobe.extract_lora(tmp_path / "nope", base, tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match=r"model\.safetensors"):
        adapterprobe.extract_lora(base, tmp_path / "empty", tmp_path / "o")
    base.save_pretrained(tmp_path / "sh", max_shard_size="40KB")
    shard = sorted((tmp_path / "sh").glob("model-0000*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(MissingFileError, match=shard.name):
        adapterprobe.extract_lora(base, tmp_path / "sh", tmp_path / "o")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- bad input


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_shape_mismatch_names_the_tensor(tmp_path):
    base = tiny_llama()
    tuned = {k: v.clone() for k, v in base.state_dict().items()}
    tuned["model.layers.1.mlp.up_proj.weight"] = torch.zeros(64, 64)
    with pytest.raises(ExtractionError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as info:
        adapterprobe.extract_lora(base, tuned, tmp_path / "o")
    assert "shape" in str(info.value)
    assert isinstance(info.value, adapterprobe.AdapterProbeError)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("side", ["tuned", "base"])
def test_missing_tensor_names_it(tmp_path, side):
    base = tiny_llama()
    sd = {k: v.clone() for k, v in base.state_dict().items()}
    del sd["model.layers.0.self_attn.o_proj.weight"]
    args = (base, sd) if side == "tuned" else (sd, base)
    with pytest.raises(
        ExtractionError, match=r"model\.layers\.0\.self_attn\.o_proj\.weight.*missing from " + side
    ):
        adapterprobe.extract_lora(*args, tmp_path / "o")


def test_non_finite_delta_names_the_tensor_and_leaves_nothing(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=2)
    with torch.no_grad():
        tuned.model.layers[1].mlp.gate_proj.weight[3, 5] = float("nan")
    with pytest.raises(ExtractionError, match=r"model\.layers\.1\.mlp\.gate_proj\.weight") as info:
        adapterprobe.extract_lora(base, tuned, tmp_path / "o")
    assert "non-finite" in str(info.value)
    assert getattr(info.value, "tensor", None) == "model.layers.1.mlp.gate_proj.weight"
    assert not (tmp_path / "o").exists()
    assert _leftovers(tmp_path) == []


def test_nothing_changed_is_an_error(tmp_path):
    base = tiny_llama()
    with pytest.raises(ExtractionError, match="nothing to extract"):
        adapterprobe.extract_lora(base, copy.deepcopy(base), tmp_path / "o")


def test_bad_arguments(tmp_path):
    base = tiny_llama()
    for kw in (
        dict(min_rank=0),
        dict(min_rank=9, max_rank=4),
        dict(explained_variance=1.5),
        dict(embeddings="lora"),
        dict(dtype="int8"),
        dict(device="cuda:99" if not torch.cuda.is_available() else "nope"),
    ):
        with pytest.raises(UsageError):
            adapterprobe.extract_lora(base, base, tmp_path / "o", **kw)
    with pytest.raises(UsageError):
        adapterprobe.extract_lora(base, 42, tmp_path / "o")
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match="safetensors"):
        adapterprobe.extract_lora(tmp_path / "f.bin", base, tmp_path / "o")


def test_out_dir_atomic_and_overwrite(tmp_path):
    base = tiny_llama()
    tuned, _ = plant(base, rank=2, only=("q_proj",))
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        adapterprobe.extract_lora(base, tuned, out, min_rank=1)
    assert (out / "keep.txt").read_text() == "mine"
    adapterprobe.extract_lora(base, tuned, out, min_rank=1, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "extraction_report.json",
    ]
    assert _leftovers(tmp_path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    adapterprobe.extract_lora(base, tuned, empty, min_rank=1)
    assert (empty / "adapter_model.safetensors").is_file()


# ---------------------------------------------------------------- CLI


def test_cli_extract(tmp_path, capsys):
    from adapterprobe.cli import main

    base = tiny_llama()
    tuned, _ = plant(base, rank=3, only=("v_proj",))
    base.save_pretrained(tmp_path / "base")
    tuned.save_pretrained(tmp_path / "tuned", max_shard_size="40KB")
    rc = main(
        [
            "extract",
            "--base",
            str(tmp_path / "base"),
            "--tuned",
            str(tmp_path / "tuned"),
            "--out",
            str(tmp_path / "lora"),
            "--min-rank",
            "2",
            "--max-rank",
            "8",
            "--explained-variance",
            "0.99",
            "--device",
            "cpu",
            "--json",
        ]
    )
    assert rc == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["totals"]["modules"] == 2
    assert {m["rank"] for m in data["modules"]} == {3}
    assert (tmp_path / "lora" / "adapter_model.safetensors").is_file()
    assert "extract" in out.err  # the progress bar went to stderr

    rc = main(
        [
            "extract",
            "--base",
            str(tmp_path / "base"),
            "--tuned",
            str(tmp_path / "tuned"),
            "--out",
            str(tmp_path / "lora"),
            "--no-progress",
        ]
    )
    assert rc == 2  # exists, not empty
    rc = main(
        [
            "extract",
            "--base",
            str(tmp_path / "nope"),
            "--tuned",
            str(tmp_path / "tuned"),
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert rc == 2
    rc = main(
        [
            "extract",
            "--base",
            str(tmp_path / "base"),
            "--tuned",
            str(tmp_path / "tuned"),
            "--out",
            str(tmp_path / "x"),
            "--min-rank",
            "9",
            "--max-rank",
            "3",
        ]
    )
    assert rc == 2
    # the spellings of earlier releases still work
    rc = main(
        [
            "extract",
            "--base",
            str(tmp_path / "base"),
            "--tuned",
            str(tmp_path / "tuned"),
            "--out",
            str(tmp_path / "old"),
            "--rank-min",
            "4",
            "--rank-max",
            "4",
            "--no-progress",
            "--json",
        ]
    )
    assert rc == 0
    assert {m["rank"] for m in json.loads(capsys.readouterr().out)["modules"]} == {4}
    with pytest.raises(SystemExit) as exc:
        main(["extract", "--base", "a", "--tuned", "b", "--out", "c", "--explained-variance", "2"])
    assert exc.value.code == 2


def test_cli_bad_checkpoint_exits_1(tmp_path):
    from adapterprobe.cli import main

    base = tiny_llama()
    tuned = {k: v.clone() for k, v in base.state_dict().items()}
    tuned["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    base.save_pretrained(tmp_path / "base")
    save_file(tuned, tmp_path / "tuned.safetensors")
    rc = main(
        [
            "extract",
            "--base",
            str(tmp_path / "base"),
            "--tuned",
            str(tmp_path / "tuned.safetensors"),
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
        ]
    )
    assert rc == 1


def test_cli_without_torch_exits_2_with_install_hint(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from adapterprobe.cli import main\n"
        "sys.exit(main(['extract', '--base', 'a', '--tuned', 'b', '--out', 'c']))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    # adapterprobe is not on PyPI: the hint names what installs today.
    assert "pip install torch safetensors" in proc.stderr
    assert "adapterprobe[" not in proc.stderr
    # --help works without torch too
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from adapterprobe.cli import main\n"
        "main(['extract', '--help'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and "--max-rank" in proc.stdout and "--min-rank" in proc.stdout
    assert "--rank-max" not in proc.stdout  # kept as a hidden alias
    assert "--verify" in proc.stdout and "--no-save-1d" in proc.stdout


# ---------------------------------------------------------------- Conv1D (GPT-2)


def test_gpt2_conv1d_round_trip_from_module_and_path(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=48, n_layer=2, n_head=4, n_positions=32, vocab_size=80)
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(cfg).eval()
    tuned = copy.deepcopy(base)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in tuned.modules():
            if type(mod).__name__ == "Conv1D":
                i, o = mod.weight.shape  # Conv1D stores (in, out)
                mod.weight += 0.05 * torch.randn(i, 3, generator=g) @ torch.randn(3, o, generator=g)
    base.save_pretrained(tmp_path / "base")
    tuned.save_pretrained(tmp_path / "tuned")
    ids = torch.randint(0, 80, (2, 10), generator=g)
    for src in ("module", "path"):
        args = (base, tuned) if src == "module" else (tmp_path / "base", tmp_path / "tuned")
        out = tmp_path / f"lora-{src}"
        rep = adapterprobe.extract_lora(
            *args, out, min_rank=1, max_rank=8, explained_variance=0.999
        )
        assert rep.num_modules == 8 and set(rep.ranks.values()) == {3}
        assert rep.ranks["transformer.h.0.mlp.c_fc"] == 3
        assert next(m for m in rep.modules if m.name.endswith("mlp.c_fc")).shape == (192, 48)
        cfg_json = json.loads((out / "adapter_config.json").read_text())
        assert cfg_json["fan_in_fan_out"] is True
        got = _logits(_peft_load(base, out), ids)
        assert torch.allclose(got, _logits(tuned, ids), atol=1e-4), src


def test_mixed_conv1d_and_linear_is_an_error(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=16, vocab_size=40)
    base = transformers.GPT2LMHeadModel(cfg)
    base.extra = torch.nn.Linear(32, 32)
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        tuned.extra.weight += 0.1
        tuned.transformer.h[0].attn.c_attn.weight += 0.1
    with pytest.raises(ExtractionError, match="Conv1D"):
        adapterprobe.extract_lora(base, tuned, tmp_path / "o")
    rep = adapterprobe.extract_lora(base, tuned, tmp_path / "o", exclude="extra", min_rank=1)
    assert list(rep.ranks) == ["transformer.h.0.attn.c_attn"]
