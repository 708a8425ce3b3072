"""Generate the real PEFT adapters that rust/adapter_weights.rs is tested on.

Run from the repository root with an environment that has torch,
transformers 5.x and peft 0.21 (nothing is installed by this script):

    python rust/testdata/make_weight_fixtures.py

Each fixture is a directory under rust/testdata/weights/ holding what PEFT's
`save_pretrained` wrote (adapter_model.safetensors, adapter_config.json) and
an `expected.json` with the statistics the Rust reader must reproduce,
computed here by torch in float64 from the PEFT model itself:

- per LoRA module: ||A||_F, ||B||_F, non-finite counts, max |value|, the
  module's scaling as PEFT set it (rank/alpha pattern and rsLoRA aware),
  ||scaling * B @ A||_F and its singular values (torch.linalg.svdvals);
- per other tensor (modules_to_save copies, saved embedding layers, DoRA
  magnitudes are per module): Frobenius norm and non-finite count.

NaN/inf are written as the strings "NaN", "Infinity", "-Infinity" (JSON has
no token for them). The models are tiny and built from configs, so nothing
is downloaded; seeds make reruns reproduce the same bytes on one machine.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys

# PEFT keeps target_modules as a Python set: fix string hashing so that the
# saved configs list them in the same order on every run.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

OUT = Path(__file__).resolve().parent / "weights"
ADAPTER = "default"


def tiny_llama() -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


def tiny_gpt2() -> GPT2LMHeadModel:
    cfg = GPT2Config(
        vocab_size=64,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg)


def train(model, steps: int, lr: float = 2e-2) -> None:
    """A few real AdamW steps of causal-LM loss on random tokens."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    gen = torch.Generator().manual_seed(1234)
    model.train()
    for _ in range(steps):
        ids = torch.randint(0, 64, (4, 16), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def num(x: float) -> float | str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def tensor_stats(t: torch.Tensor) -> dict:
    t64 = t.detach().to(torch.float64)
    finite = torch.isfinite(t64)
    not_nan = t64[~torch.isnan(t64)]
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "norm": num(torch.linalg.vector_norm(t64).item()),
        "nonfinite": int((~finite).sum().item()),
        "max_abs": num(not_nan.abs().max().item() if not_nan.numel() else 0.0),
    }


def module_stats(name: str, module: LoraLayer) -> dict:
    if ADAPTER in module.lora_A:
        kind = "linear"
        a = module.lora_A[ADAPTER].weight
        b = module.lora_B[ADAPTER].weight
    else:
        kind = "embedding"
        a = module.lora_embedding_A[ADAPTER]
        b = module.lora_embedding_B[ADAPTER]
    scaling = float(module.scaling[ADAPTER])
    a64 = a.detach().to(torch.float64)
    b64 = b.detach().to(torch.float64)
    delta = scaling * (b64 @ a64)
    # PEFT's own delta (in the module dtype, oriented as the base weight)
    # must agree with the float64 product: this pins the scaling.
    peft_delta = module.get_delta_weight(ADAPTER).detach().to(torch.float64)
    if kind == "embedding" or module.fan_in_fan_out:
        peft_delta = peft_delta.T
    if torch.isfinite(delta).all():
        tol = 1e-5 if a.dtype == torch.float32 else 5e-2
        scale = max(delta.abs().max().item(), 1e-30)
        assert (peft_delta - delta).abs().max().item() <= tol * scale, name
    r = a.shape[0]
    out = {
        "kind": kind,
        "r": r,
        "scale": scaling,
        "in_features": a.shape[1],
        "out_features": b.shape[0],
        "a": tensor_stats(a),
        "b": tensor_stats(b),
        "delta_fro": num(torch.linalg.matrix_norm(delta).item()),
    }
    if torch.isfinite(delta).all():
        out["singular_values"] = torch.linalg.svdvals(delta)[:r].tolist()
    else:
        out["singular_values"] = None
    if getattr(module, "lora_magnitude_vector", None) and ADAPTER in module.lora_magnitude_vector:
        out["magnitude"] = tensor_stats(module.lora_magnitude_vector[ADAPTER].weight)
    return out


def save(name: str, peft_model, notes: str) -> None:
    target = OUT / name
    if target.exists():
        shutil.rmtree(target)
    peft_model.save_pretrained(target)
    # Only the two files PEFT's loader reads; the model card is noise here.
    (target / "README.md").unlink(missing_ok=True)

    state = get_peft_model_state_dict(peft_model)
    saved = load_file(target / "adapter_model.safetensors")
    assert set(saved) == set(state), (name, set(saved) ^ set(state))
    for key, t in state.items():
        assert torch.equal(saved[key].nan_to_num(7.0), t.detach().cpu().nan_to_num(7.0)), key

    lora_model = peft_model.base_model
    modules = {}
    for mod_name, module in lora_model.model.named_modules():
        if isinstance(module, LoraLayer) and (
            ADAPTER in module.lora_A or ADAPTER in module.lora_embedding_A
        ):
            modules[mod_name] = module_stats(mod_name, module)
    lora_suffixes = (
        ".lora_A.weight",
        ".lora_B.weight",
        ".lora_embedding_A",
        ".lora_embedding_B",
        ".lora_magnitude_vector",
    )
    others = {k: tensor_stats(t) for k, t in state.items() if not k.endswith(lora_suffixes)}
    cfg = peft_model.peft_config[ADAPTER]
    expected = {
        "notes": notes,
        "generator": "rust/testdata/make_weight_fixtures.py",
        "versions": {"torch": torch.__version__, "peft": __import__("peft").__version__},
        "config": {
            "r": cfg.r,
            "lora_alpha": cfg.lora_alpha,
            "use_rslora": cfg.use_rslora,
            "use_dora": cfg.use_dora,
            "fan_in_fan_out": cfg.fan_in_fan_out,
            "target_modules": sorted(cfg.target_modules),
            "modules_to_save": sorted(cfg.modules_to_save or []),
        },
        "modules": modules,
        "other_tensors": others,
        "tensor_bytes": sum(t.numel() * t.element_size() for t in saved.values()),
        "nonfinite_total": sum(
            int((~torch.isfinite(t.to(torch.float64))).sum()) for t in saved.values()
        ),
    }
    (target / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    size = sum(p.stat().st_size for p in target.iterdir())
    print(f"{name}: {len(modules)} LoRA modules, {len(others)} other tensors, {size} bytes")


def llama_trained() -> None:
    torch.manual_seed(10)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "embed_tokens"]
    )
    pm = get_peft_model(tiny_llama(), cfg)
    train(pm, steps=6)
    save("llama_trained", pm, "f32; q/k/v/o + embedding LoRA, 6 AdamW steps: healthy")


def llama_untouched() -> None:
    torch.manual_seed(11)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    pm = get_peft_model(tiny_llama(), cfg)
    save("llama_untouched", pm, "f32; saved right after get_peft_model: every lora_B is zero")


def llama_patterns_rslora_bf16() -> None:
    torch.manual_seed(12)
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "k_proj", "v_proj"],
        # First match wins: layer 1's q_proj gets 2, the other q_proj 8.
        rank_pattern={"model.layers.1.self_attn.q_proj": 2, "q_proj": 8},
        # A regex key, matched at the end after a dot boundary.
        alpha_pattern={r"layers\.0\.self_attn\.(k|v)_proj": 32},
    )
    pm = get_peft_model(tiny_llama(), cfg)
    train(pm, steps=4)
    pm = pm.to(torch.bfloat16)
    save("llama_patterns_rslora_bf16", pm, "bf16; rank_pattern, alpha_pattern and use_rslora")


def llama_dora_f16() -> None:
    torch.manual_seed(13)
    cfg = LoraConfig(
        r=4,
        lora_alpha=4,
        use_dora=True,
        target_modules=["q_proj", "v_proj"],
        modules_to_save=["lm_head"],
    )
    pm = get_peft_model(tiny_llama(), cfg)
    train(pm, steps=4)
    pm = pm.to(torch.float16)
    save("llama_dora_f16", pm, "f16; DoRA magnitudes and a modules_to_save lm_head copy")


def llama_nan() -> None:
    torch.manual_seed(14)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    pm = get_peft_model(tiny_llama(), cfg)
    train(pm, steps=3)
    lora_model = pm.base_model
    b = lora_model.model.model.layers[1].self_attn.v_proj.lora_B[ADAPTER].weight
    with torch.no_grad():
        b[3, 1] = float("nan")
    save("llama_nan", pm, "f32; trained, then one NaN written into layer 1 v_proj lora_B")


def gpt2_fan_in_fan_out() -> None:
    torch.manual_seed(15)
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True)
    pm = get_peft_model(tiny_gpt2(), cfg)
    train(pm, steps=4)
    save(
        "gpt2_fan_in_fan_out", pm, "f32; GPT-2 Conv1D targets (fan_in_fan_out), layers under .h.N."
    )


PATTERN_MODULES = [
    "model.layers.0.self_attn.q_proj",
    "model.layers.1.self_attn.q_proj",
    "model.layers.10.self_attn.q_proj",
    "model.layers.0.self_attn.xq_proj",
    "model.layers.0.mlp.down_proj",
    "model.embed_tokens",
    "lm_head",
    "q_proj",
    "transformer.h.3.attn.c_attn",
]

PATTERN_KEYS = [
    ["q_proj"],
    ["proj"],
    [".*proj"],
    ["self_attn"],
    ["layers.1.self_attn.q_proj"],
    [r"layers\.1\..*"],
    ["model.layers.1.self_attn.q_proj", "q_proj"],
    ["q_proj", "model.layers.1.self_attn.q_proj"],
    ["(q|v)_proj", "down_proj"],
    ["layers.1"],
    ["h.3.attn.c_attn", "c_attn"],
    ["a|q_proj"],
    ["embed_tokens", "lm_head"],
    ["model.embed_tokens"],
    [r"layers\.\d+\.self_attn\.q_proj"],
    # Inserted textually by PEFT: the first alternative loses its "$".
    ["down)|(lm_head"],
    ["q_proj)|(.*xq"],
]

TARGETS = [
    ["q_proj", "v_proj"],
    ["self_attn.q_proj"],
    ["proj"],
    ["lm_head"],
    ["model.layers.0.mlp.down_proj"],
    r".*\.(q|v)_proj",
    r"model\.layers\.1\..*",
    "q_proj",
    ".*attn.*",
    "q_proj|.*down_proj",
]


def pattern_cases() -> None:
    """What PEFT itself answers for rank/alpha pattern keys and target_modules."""
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    rank = []
    for keys in PATTERN_KEYS:
        for module in PATTERN_MODULES:
            found = get_pattern_key(keys, module)
            rank.append({"keys": keys, "module": module, "match": found if found in keys else None})
    targets = []
    for target in TARGETS:
        cfg = LoraConfig(target_modules=target)
        for module in PATTERN_MODULES:
            hit = check_target_module_exists(cfg, module)
            targets.append({"target_modules": target, "module": module, "match": bool(hit)})
    path = OUT / "pattern_cases.json"
    path.write_text(json.dumps({"rank_pattern": rank, "target_modules": targets}, indent=1) + "\n")
    print(f"pattern_cases.json: {len(rank)} pattern and {len(targets)} target cases")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for make in (
        llama_trained,
        llama_untouched,
        llama_patterns_rslora_bf16,
        llama_dora_f16,
        llama_nan,
        gpt2_fan_in_fan_out,
    ):
        make()
    pattern_cases()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
