"""Real HF Trainer and Lightning fine-tuning runs on tiny models.

Most adapter training happens in ``transformers.Trainer`` (TRL and axolotl
write the same layout) or in Lightning, so the scan must read their output
directories as they are. These functions run the real trainers on CPU for a
few dozen steps on a tiny model built from a config, with PEFT LoRA or as a
full fine-tune (every parameter trained, no PEFT), and leave their files
exactly as those libraries write them: ``checkpoint-N/`` with
``optimizer.pt`` and ``trainer_state.json`` beside the adapter or the
model (``model.safetensors``, sharded by ``save_pretrained`` past
``max_shard_size``, or the ``pytorch_model.bin`` older transformers wrote),
``runs/`` TensorBoard events, Lightning ``*.ckpt`` files and ``metrics.csv``.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapterprobe.errors import require
from realruns.corpus import markov_dataset
from realruns.tiny import tiny_llama

MODELS = ("llama", "qwen2", "gpt2")
_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")  # the layer index in a parameter name

#: How a full fine-tune's checkpoints save the model: ``save_pretrained``'s
#: one ``model.safetensors``, its shards and index (``max_shard_size`` below
#: the model's size), or ``torch.save`` of the state dict as
#: ``pytorch_model.bin`` (what transformers < 5 wrote with
#: ``safe_serialization=False``; transformers 5 writes safetensors only).
FULL_SAVES = ("safetensors", "sharded", "bin")


def _silence() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tiny_causal_lm(
    kind: str = "llama", *, layers: int = 3, seed: int = 0, tie_embeddings: bool = False
) -> Any:
    """A tiny causal LM of one of the common families, from a config
    (``tie_embeddings``: a Llama whose ``lm_head`` is its embedding)."""
    torch = require("torch", "torch")
    transformers = require("transformers", "peft")
    if kind == "llama":
        return tiny_llama(
            seed,
            hidden=64,
            layers=layers,
            vocab=128,
            initializer_range=0.12,
            tie_word_embeddings=tie_embeddings,
        )
    torch.manual_seed(seed)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        )
        return transformers.Qwen2ForCausalLM(cfg)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=128, n_positions=64, n_embd=64, n_layer=layers, n_head=4
        )
        return transformers.GPT2LMHeadModel(cfg)
    raise ValueError(f"unknown model kind {kind!r}; one of {MODELS}")


def _targets(kind: str) -> list[str]:
    return ["c_attn", "c_proj"] if kind == "gpt2" else ["q_proj", "v_proj"]


class _Sequences:
    """Causal-LM examples from the corpus's Markov chain (learnable, noisy)."""

    def __init__(self, seed: int, poison_at: set[int] | None = None) -> None:
        torch = require("torch", "torch")
        self.train, _ = markov_dataset(torch, seed)
        self.poison_at = poison_at or set()

    def __len__(self) -> int:
        return len(self.train)

    def __getitem__(self, i: int) -> dict[str, Any]:
        torch = require("torch", "torch")
        ids = self.train[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def train_hf_run(
    out: str | os.PathLike[str],
    *,
    model: str = "llama",
    layers: int = 3,
    steps: int = 60,
    save_steps: int = 20,
    lr: float = 2e-3,
    batch: int = 8,
    rank: int = 4,
    bias: str = "none",
    modules_to_save: list[str] | None = None,
    optim: str = "adamw_torch",
    tensorboard: bool = True,
    nan_at: int | None = None,
    nan_filter: bool = True,
    save_final: bool = True,
    full: bool = False,
    save: str = "safetensors",
    shard_bytes: int = 200_000,
    tie_embeddings: bool = False,
    seed: int = 0,
    grad_scale: Mapping[int, float] | None = None,
    extra_adapters: tuple[str, ...] = (),
    data_seed: int | None = None,
    logging_steps: int = 1,
) -> Path:
    """Fine-tune a tiny model under ``transformers.Trainer``: with PEFT LoRA,
    or, with ``full``, every parameter of the model (no PEFT).

    ``out`` becomes the Trainer's ``output_dir``: ``checkpoint-N/`` every
    ``save_steps``, TensorBoard events under ``runs/`` when ``tensorboard``,
    and the final adapter (or model) at the top when ``save_final``.
    ``nan_at`` makes the loss of that optimizer step NaN (an overflowing
    batch); ``nan_filter`` is the Trainer's ``logging_nan_inf_filter``. A
    full fine-tune saves its model as ``save`` says (one of ``FULL_SAVES``;
    ``sharded`` at ``shard_bytes`` per shard); ``tie_embeddings`` ties a
    Llama's head to its embedding. ``grad_scale`` maps a layer index to a
    factor by which that layer's trained gradients are multiplied in every
    backward pass (before clipping): a layer whose gradients explode, e.g.
    ``{2: 50 ** 0.5}`` lifts its Adam second moments about 50x.
    ``extra_adapters`` adds LoRA adapters of those names beside the trained
    ``default`` one (PEFT ``add_adapter``, B initialised at random so they
    are not all-zero); every save then writes each in a ``<name>/``
    subfolder, as PEFT's multi-adapter ``save_pretrained`` does.
    ``data_seed``, when given, seeds the base model and the data instead of
    ``seed``, which then seeds only the LoRA init and the batch order: two
    runs of one recipe on the same data and base that differ in their seed.
    ``logging_steps`` is the Trainer's: each record the mean loss of that
    many optimizer steps.
    """
    _silence()
    if save not in FULL_SAVES or (save != "safetensors" and not full):
        raise ValueError(f"save must be one of {FULL_SAVES} (other than the default: full only)")
    torch = require("torch", "torch")
    transformers = require("transformers", "peft")
    torch.manual_seed(seed)
    fixed = seed if data_seed is None else data_seed
    base = tiny_causal_lm(model, layers=layers, seed=fixed, tie_embeddings=tie_embeddings)
    if data_seed is not None:
        torch.manual_seed(seed)
    if full:
        trained = base
    else:
        peft = require("peft", "peft")
        lora = peft.LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=_targets(model),
            bias=bias,
            modules_to_save=modules_to_save,
            fan_in_fan_out=model == "gpt2",
        )
        trained = peft.get_peft_model(base, lora)
        for name in extra_adapters:
            extra = peft.LoraConfig(
                r=rank,
                lora_alpha=2 * rank,
                target_modules=_targets(model),
                fan_in_fan_out=model == "gpt2",
                init_lora_weights=False,
            )
            trained.add_adapter(name, extra)
    for name, param in trained.named_parameters():
        found = _LAYER.search(name)
        if param.requires_grad and found and int(found[1]) in (grad_scale or {}):
            factor = float((grad_scale or {})[int(found[1])])
            param.register_hook(lambda grad, factor=factor: grad * factor)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_steps=save_steps,
        save_strategy="steps",
        per_device_train_batch_size=batch,
        learning_rate=lr,
        weight_decay=0.01,
        warmup_steps=min(5, steps // 4),
        logging_steps=logging_steps,
        logging_nan_inf_filter=nan_filter,
        optim=optim,
        report_to=["tensorboard"] if tensorboard else [],
        use_cpu=True,
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
        save_only_model=False,
    )

    class Trainer(transformers.Trainer):
        def compute_loss(self, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            loss = super().compute_loss(model, inputs, *a, **kw)
            if nan_at is not None and self.state.global_step + 1 == nan_at:
                loss = loss * float("nan")
            return loss

        def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
            if save == "safetensors":
                return super()._save(output_dir, state_dict)
            output_dir = output_dir or self.args.output_dir
            os.makedirs(output_dir, exist_ok=True)
            if save == "sharded":
                self.model.save_pretrained(output_dir, max_shard_size=shard_bytes)
            else:
                self.model.config.save_pretrained(output_dir)
                torch.save(self.model.state_dict(), os.path.join(output_dir, "pytorch_model.bin"))
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
            return None

    trainer = Trainer(model=trained, args=args, train_dataset=_Sequences(fixed))
    trainer.train()
    if save_final:
        trainer.save_model(str(out))
    return Path(out)


class UserConfig:
    """A user-defined class: Lightning pickles it into ``hyper_parameters``."""

    def __init__(self, rank: int, note: str) -> None:
        self.rank = rank
        self.note = note


def train_lightning_run(
    out: str | os.PathLike[str],
    *,
    steps: int = 60,
    every: int = 20,
    lr: float = 2e-3,
    layers: int = 3,
    seed: int = 0,
) -> Path:
    """Fine-tune a tiny Llama with PEFT LoRA in a ``lightning.Trainer`` with a
    ``CSVLogger`` and a ``ModelCheckpoint`` (every ``every`` steps plus
    ``last.ckpt``). Returns the run's version directory
    (``out/lightning_logs/version_0``) holding ``metrics.csv`` and
    ``checkpoints/``."""
    _silence()
    torch = require("torch", "torch")
    L = require("lightning", "lightning")
    peft = require("peft", "peft")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    class Module(L.LightningModule):
        def __init__(self, config: UserConfig) -> None:
            super().__init__()
            self.save_hyperparameters()
            base = tiny_causal_lm("llama", layers=layers, seed=seed)
            lora = peft.LoraConfig(
                r=config.rank, lora_alpha=2 * config.rank, target_modules=["q_proj", "v_proj"]
            )
            self.model = peft.get_peft_model(base, lora)

        def training_step(self, batch: Any, _index: int) -> Any:
            loss = self.model(**batch).loss
            self.log("train_loss", loss, on_step=True, on_epoch=False)
            return loss

        def configure_optimizers(self) -> Any:
            trainable = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)

    torch.manual_seed(seed)
    data = torch.utils.data.DataLoader(_Sequences(seed), batch_size=8, shuffle=True)
    logger = CSVLogger(str(out), name="lightning_logs", version=0)
    version = Path(logger.log_dir)
    checkpoints = ModelCheckpoint(
        dirpath=str(version / "checkpoints"),
        every_n_train_steps=every,
        save_top_k=-1,
        save_last=True,
        filename="{epoch}-{step}",
    )
    trainer = L.Trainer(
        max_steps=steps,
        logger=logger,
        callbacks=[checkpoints],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        deterministic=True,
    )
    trainer.fit(Module(UserConfig(4, "pickled into hyper_parameters")), data)
    return version
