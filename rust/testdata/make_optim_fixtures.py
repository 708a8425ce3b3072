"""Generate the real optimizer states that rust/optimizer_state.rs and
rust/attribution.rs are tested on.

Run from the repository root with an environment that has torch,
transformers 5.x, peft 0.21 and lightning 2.x, plus bitsandbytes >= 0.50 on
PYTHONPATH (nothing is installed by this script):

    PYTHONPATH=/path/to/bitsandbytes python rust/testdata/make_optim_fixtures.py

Every file is written by the real library that teams use, on tiny models
built from configs (nothing is downloaded):

- hf_lora, hf_bias_all, hf_modules_to_save, hf_gpt2, hf_gpt2_bias_all: a
  `transformers.Trainer` + PEFT run; its `checkpoint-N/` keeps the files the
  readers need (optimizer.pt, adapter_model.safetensors, adapter_config.json).
- lightning: a `lightning.Trainer` checkpoint whose `hyper_parameters` hold
  a user-defined class (which a strict unpickler must refuse).
- bnb_adamw8bit, bnb_adamw32bit: bitsandbytes AdamW8bit/AdamW32bit states
  (`torch.save(optimizer.state_dict())`); dlm_bnb8: the 8-bit state inside a
  dlm `training_state.pt` with its sha256 sidecar.
- adafactor_hf, adafactor_torch: transformers' and torch's Adafactor.
- sgd: torch SGD with momentum (no second moment).

Each fixture directory has an `expected.json` with what the Rust reader must
report, computed here from the saved file with torch in float64:
per-parameter second-moment means (bitsandbytes' own `dequantize_blockwise`
for 8-bit states, and the exact `qmap[code] * absmax[block]` in float64; the
mean of Adafactor's rank-1 reconstruction V = R Cᵀ / mean(R) built
explicitly), param groups, steps, and for the Trainer runs the name of the
parameter behind every optimizer id.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import warnings

# PEFT keeps target_modules as a Python set: fix string hashing so that the
# saved configs list them in the same order on every run.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])
from pathlib import Path

import torch
from torch import nn

warnings.filterwarnings("ignore")

OUT = Path(__file__).resolve().parent / "optim"


def jnum(x: float) -> float | str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def write_expected(dest: Path, data: dict) -> None:
    (dest / "expected.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def fresh(name: str) -> Path:
    dest = OUT / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    return dest


# ---- reading a saved state_dict back, in float64 ----


def step_value(s) -> float | None:
    if s is None:
        return None
    if torch.is_tensor(s):
        return float(s.item())
    return float(s)


def nonfinite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum().item())


def second_moment(slot: dict) -> tuple | None:
    """(kind, values in float64, non-finite count, param shape, bitsandbytes'
    own dequantization or None) of one param's second moment as each
    optimizer defines it; None without one."""
    quant = slot.get("__bnb_optimizer_quant_state__", slot)
    if "state2" in quant:
        s2 = quant["state2"]
        if s2.dtype == torch.uint8:
            import bitsandbytes.functional as F

            qmap, absmax = quant["qmap2"], quant["absmax2"]
            n = s2.numel()
            block = torch.arange(n) // 256
            exact = qmap.double()[s2.reshape(-1).long()] * absmax.double()[block]
            bnb = F.dequantize_blockwise(s2, absmax=absmax, code=qmap, blocksize=256)
            return ("bnb8", exact, nonfinite(exact), list(s2.shape), bnb.double())
        return ("bnb32", s2.double(), nonfinite(s2), list(s2.shape), None)
    if "exp_avg_sq_row" in slot:  # transformers Adafactor, factored
        r, c = slot["exp_avg_sq_row"].double(), slot["exp_avg_sq_col"].double()
        v = (r / r.mean(dim=-1, keepdim=True)).unsqueeze(-1) * c.unsqueeze(-2)
        return ("adafactor", v, nonfinite(r) + nonfinite(c), list(v.shape), None)
    if "row_var" in slot:  # torch Adafactor, factored (without its eps1 clamp)
        r, c = slot["row_var"].double(), slot["col_var"].double()
        v = (r @ c) / r.mean(dim=-2, keepdim=True)
        return ("adafactor", v, nonfinite(r) + nonfinite(c), list(v.shape), None)
    for key in ("exp_avg_sq", "variance"):
        if key in slot:
            t = slot[key]
            return (key, t.double(), nonfinite(t), list(t.shape), None)
    return None


def describe_state(sd: dict) -> dict:
    per_param = []
    steps = []
    for pid in sorted(sd["state"]):
        slot = sd["state"][pid]
        if "step" in slot:
            steps.append(step_value(slot["step"]))
        sm = second_moment(slot)
        if sm is None:
            continue
        kind, values, bad, shape, bnb = sm
        entry = {
            "param_id": pid,
            "numel": values.numel(),
            "shape": shape,
            "mean": jnum(values.mean().item()),
            "nonfinite": bad,
            "kind": kind,
        }
        if bnb is not None:
            entry["bnb_dequantize_blockwise_mean"] = jnum(bnb.mean().item())
        per_param.append(entry)
    return {
        "param_groups": [list(g["params"]) for g in sd["param_groups"]],
        "per_param": per_param,
        "max_step": int(max(steps)) if steps else None,
    }


# ---- tiny models ----


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

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


def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

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


class Tokens(torch.utils.data.Dataset):
    """Random token sequences for causal-LM loss."""

    def __init__(self, n: int = 16, length: int = 12) -> None:
        gen = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, 64, (n, length), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


# ---- HF Trainer + PEFT ----

LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")


def adapter_key(param_name: str) -> str:
    """The adapter_model.safetensors key PEFT saves for a trainable parameter."""
    key = param_name.replace(".modules_to_save.default.", ".")
    return re.sub(r"\.(lora_[AB])\.default\.", r".\1.", key)


def hf_run(name: str, model, lora_kwargs: dict, steps: int = 3) -> None:
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    dest = fresh(name)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, **lora_kwargs))
    with tempfile.TemporaryDirectory() as work:
        args = TrainingArguments(
            output_dir=work,
            max_steps=steps,
            save_steps=steps,
            save_strategy="steps",
            per_device_train_batch_size=4,
            learning_rate=2e-2,
            weight_decay=0.01,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        )
        trainer = Trainer(model=peft_model, args=args, train_dataset=Tokens())
        trainer.train()
        ckpt = Path(work) / f"checkpoint-{steps}"
        out = dest / ckpt.name
        out.mkdir()
        for f in ("optimizer.pt", "adapter_model.safetensors", "adapter_config.json"):
            shutil.copy(ckpt / f, out / f)
        # The name of the parameter behind each optimizer id: ids run
        # through the groups in order, each group in its list order.
        names = {id(p): n for n, p in peft_model.named_parameters()}
        param_names = [names[id(p)] for g in trainer.optimizer.param_groups for p in g["params"]]
    sd = torch.load(out / "optimizer.pt", weights_only=True)
    with safe_open(out / "adapter_model.safetensors", "pt") as f:
        saved = set(f.keys())
    ids = [pid for g in sd["param_groups"] for pid in g["params"]]
    assert ids == list(range(len(param_names))), ids
    params = []
    for pid, pname in enumerate(param_names):
        key = adapter_key(pname)
        assert key in saved, (key, sorted(saved))
        m = LAYER.search(key)
        suffix = key[m.end() :].removesuffix(".weight") if m else None
        params.append(
            {
                "param_id": pid,
                "name": pname,
                "key": key,
                "layer": int(m.group(1)) if m else None,
                "suffix": suffix,
            }
        )
    layer_major = sorted(params, key=lambda p: (p["layer"] is None, p["layer"] or 0))
    expected = {
        "format": "optimizer_state_dict",
        "optimizer": "adam",
        "second_moment": "exp_avg_sq",
        "global_step": steps,
        "epoch": None,
        "params": params,
        # How many ids a layer-major reading would attribute to the wrong
        # parameter (the bug the grouped attribution fixes).
        "wrong_if_layer_major": sum(
            a["param_id"] != b["param_id"] for a, b in zip(params, layer_major, strict=True)
        ),
        **describe_state(sd),
    }
    write_expected(dest, expected)


# ---- Lightning ----


class TinyConfig:
    """A user-defined class: Lightning pickles it into hyper_parameters."""

    def __init__(self, width: int, note: str) -> None:
        self.width = width
        self.note = note


def lightning_run() -> None:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self, config: TinyConfig) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(
                nn.Linear(6, config.width), nn.ReLU(), nn.Linear(config.width, 1)
            )

        def training_step(self, batch, _i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
            return {"optimizer": opt, "lr_scheduler": sched}

    torch.manual_seed(0)
    dest = fresh("lightning")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(20, 6, generator=gen)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4
    )
    trainer = L.Trainer(
        max_steps=4,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Module(TinyConfig(8, "user class in hparams")), data)
    path = dest / "last.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    expected = {
        "format": "lightning",
        "optimizer": "adam",
        "second_moment": "exp_avg_sq",
        "global_step": ckpt["global_step"],
        "epoch": float(ckpt["epoch"]),
        "user_class": f"{TinyConfig.__module__}.{TinyConfig.__qualname__}",
        **describe_state(ckpt["optimizer_states"][0]),
    }
    write_expected(dest, expected)


# ---- plain optimizers on a small module ----


class Small(nn.Module):
    """Tensors of the shapes the optimizers treat differently: 2-D, 3-D,
    a vector, and (for bitsandbytes) a matrix whose size is not a multiple
    of its 256-element quantization block."""

    def __init__(self) -> None:
        super().__init__()
        self.square = nn.Parameter(torch.randn(64, 64) * 0.1)  # 4096: 8-bit, 16 blocks
        self.odd = nn.Parameter(torch.randn(41, 100) * 0.1)  # 4100: 8-bit, 17 blocks
        self.stack = nn.Parameter(torch.randn(2, 8, 12) * 0.1)
        self.bias = nn.Parameter(torch.zeros(64))  # below min_8bit_size: fp32

    def loss(self, gen: torch.Generator) -> torch.Tensor:
        a = torch.randn(64, generator=gen)
        b = torch.randn(100, generator=gen)
        c = torch.randn(12, generator=gen)
        return (
            (self.square @ a + self.bias).square().mean()
            + (self.odd @ b).square().mean()
            + (self.stack @ c).square().mean()
        )


def run_plain(make_opt, steps: int = 3):
    torch.manual_seed(0)
    model = Small()
    opt = make_opt(model.parameters())
    gen = torch.Generator().manual_seed(5)
    for _ in range(steps):
        opt.zero_grad()
        model.loss(gen).backward()
        opt.step()
    return opt.state_dict()


def plain_fixture(name: str, make_opt, optimizer: str, second: str | None, steps: int = 3) -> dict:
    dest = fresh(name)
    sd = run_plain(make_opt, steps)
    torch.save(sd, dest / "optimizer.pt")
    back = torch.load(dest / "optimizer.pt", weights_only=False)
    expected = {
        "format": "optimizer_state_dict",
        "optimizer": optimizer,
        "second_moment": second,
        "epoch": None,
        **describe_state(back),
    }
    expected["global_step"] = expected["max_step"]
    write_expected(dest, expected)
    return sd


def dlm_fixture(sd: dict) -> None:
    dest = fresh("dlm_bnb8")
    payload = {
        "_state_sidecar_version": 2,
        "optimizer_state_dict": sd,
        "scheduler_state_dict": {},
        "scaler_state_dict": None,
        "torch_rng_state": torch.get_rng_state()[:16],
        "cuda_rng_state": None,
        "global_step": 30,
        "epoch": 1.5,
        "best_val_loss": 2.25,
        "dlm_manifest_hash": None,
        "base_model_revision": "tiny",
        "pinned_versions": {"torch": str(torch.__version__)},
        "use_qlora": True,
    }
    path = dest / "training_state.pt"
    torch.save(payload, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (dest / "training_state.pt.sha256").write_text(f"{digest}  training_state.pt\n")
    back = torch.load(path, weights_only=False)
    write_expected(
        dest,
        {
            "format": "dlm",
            "optimizer": "bnb-8bit",
            "second_moment": "bnb state2 (dequantized)",
            "global_step": 30,
            "epoch": 1.5,
            "best_val_loss": 2.25,
            "use_qlora": True,
            **describe_state(back["optimizer_state_dict"]),
        },
    )


def main() -> None:
    import bitsandbytes as bnb
    from transformers.optimization import Adafactor

    OUT.mkdir(exist_ok=True)
    hf_run("hf_lora", tiny_llama(), {"target_modules": ["q_proj", "v_proj"]})
    hf_run("hf_bias_all", tiny_qwen2(), {"target_modules": ["q_proj", "v_proj"], "bias": "all"})
    hf_run(
        "hf_modules_to_save",
        tiny_llama(),
        {"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["embed_tokens", "lm_head"]},
    )
    hf_run("hf_gpt2", tiny_gpt2(), {"target_modules": ["c_attn", "c_proj"], "fan_in_fan_out": True})
    hf_run(
        "hf_gpt2_bias_all",
        tiny_gpt2(),
        {"target_modules": ["c_attn"], "fan_in_fan_out": True, "bias": "all"},
    )
    lightning_run()
    sd8 = plain_fixture(
        "bnb_adamw8bit",
        lambda p: bnb.optim.AdamW8bit(p, lr=1e-2),
        "bnb-8bit",
        "bnb state2 (dequantized)",
    )
    plain_fixture(
        "bnb_adamw32bit",
        lambda p: bnb.optim.AdamW32bit(p, lr=1e-2),
        "bnb-32bit",
        "bnb state2 (dequantized)",
    )
    dlm_fixture(sd8)
    plain_fixture(
        "adafactor_hf",
        lambda p: Adafactor(
            p, lr=1e-2, relative_step=False, scale_parameter=False, warmup_init=False
        ),
        "adafactor",
        "adafactor row/col",
    )
    plain_fixture(
        "adafactor_torch",
        lambda p: torch.optim.Adafactor(p, lr=1e-2),
        "adafactor",
        "adafactor row/col",
    )
    plain_fixture("sgd", lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9), "sgd", None)
    for d in sorted(OUT.iterdir()):
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        print(f"{d.name}: {size} bytes")


if __name__ == "__main__":
    main()
