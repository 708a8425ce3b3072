"""A labelled corpus of real ``transformers.Trainer`` runs, as the field writes them.

The verdict rules must hold on runs that look like what people actually
upload: Trainer output directories (TRL and axolotl write the same layout)
with ``checkpoint-N/`` folders (``trainer_state.json``, ``optimizer.pt``,
``scheduler.pt``, model or adapter files) and ``runs/`` TensorBoard events,
logged every 1, 10, 50 or 500 steps, per-device batches from 2 to 64, LoRA
and full fine-tunes, several epochs over a small dataset, evaluation on a
cadence, gradient accumulation, bf16 autocast, a resumed run, RL-style
objectives whose "loss" is negative or hovers at zero.

Every run here really trains a tiny model built from a config (nothing is
downloaded) on sequences from a synthetic Markov chain, under the real
``transformers.Trainer`` with its own optimizer, scheduler, logging and
checkpointing. Faults come from training itself: a learning rate that is far
off or zero, a schedule that ends early, batches whose labels are all masked
(0/0 = NaN), LoRA B factors left frozen, a tiny training set trained for too
long, a smoke test left in. A run whose fault had to be injected says so in
its label (none does today).

    python -m realruns.field OUT_DIR [--only NAME ...]

writes ``OUT_DIR/<run>/`` (the Trainer's ``output_dir``, untouched) and
``OUT_DIR/labels.json``: per run its label, the mechanism in words, the
training knobs (logging_steps, batch size, max_steps, epochs, full or LoRA,
eval cadence) and which signals show the fault, plus a few facts measured on
what the Trainer wrote. Deterministic for a given environment: seeds
everywhere and torch on one thread (the files still hold wall-clock times).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adapterprobe._fs import atomic_write_text
from adapterprobe.errors import UsageError, require
from realruns.corpus import markov_dataset
from realruns.dlm import single_thread
from realruns.tiny import tiny_gpt2, tiny_llama

#: Fault classes, in the order the corpus lists them.
FAULTS = (
    "lr_too_high",
    "nan_poisoned",
    "frozen_lora_b",
    "overfit_eval_rising",
    "dead_relu_collapse",
    "no_progress",
    "too_few_steps",
)
ALL_LABELS = ("healthy", *FAULTS)
#: lm: the model's own loss; token_mean: a hand-written completion-only token mean;
#: reinforce, grpo and expected_reward: RL-style objectives (see _Objective).
OBJECTIVES = ("lm", "token_mean", "reinforce", "grpo", "expected_reward")
LABELS_FILE = "labels.json"

_VOCAB = 128
_CHAIN_SEQS = 1024  # sequences markov_dataset draws per chain (length 32, cut to seq_len)

# What a run's label says shows it. The names are where a reader finds them.
LOSS = "log_history loss"
TB_LOSS = "tensorboard train/loss"
GRAD_NORM = "log_history grad_norm"
EVAL_LOSS = "log_history eval_loss"
LR = "log_history learning_rate"
STEPS = "trainer_state global_step / max_steps"
LORA_B = "adapter lora_B weights (all zero)"
ADAM = "optimizer.pt exp_avg / exp_avg_sq"
WEIGHTS = "checkpoint weights"
ACTIVATIONS = "MLP activations (needs the model run)"


@dataclass(frozen=True)
class FieldRun:
    """One run: the Trainer's knobs, the model, the data and the fault (if any)."""

    name: str
    label: str
    mechanism: str  # what was done and why the label holds, in words
    signals: tuple[str, ...] = ()  # where the fault shows (healthy: empty)
    # Model
    model: str = "llama"  # llama | gpt2
    hidden: int = 32
    layers: int = 2
    act: str = "silu"  # llama's hidden_act
    finetune: str = "lora"  # lora | full
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] | None = None  # LoRA target modules (None: attention q/v)
    mlp_bias: bool = False
    lora_bias: str = "none"  # peft LoraConfig.bias: none | lora_only | all
    modules_to_save: tuple[str, ...] = ()  # trained in full beside the LoRA factors
    # Optimisation (TrainingArguments)
    lr: float = 1e-3
    schedule: str = "linear"  # lr_scheduler_type
    warmup_steps: int = 0
    max_steps: int = -1  # -1: num_train_epochs decides
    epochs: float = 1.0
    batch: int = 8  # per_device_train_batch_size
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    bf16: bool = False
    optim: str = "adamw_torch"
    logging_steps: int = 10
    nan_filter: bool = True  # logging_nan_inf_filter
    save_steps: int = 100
    eval_steps: int | None = None  # eval_strategy="steps" every this many steps
    save_final: bool = False  # trainer.save_model(output_dir) at the end
    # Data
    train_seqs: int = 960
    eval_seqs: int = 32
    seq_len: int = 16
    prompt_len: int = 0  # labels -100 on these first tokens (completion-only SFT)
    masked_fraction: float = 0.0  # examples whose labels are all -100 (prompt only)
    # Objective and faults
    objective: str = "lm"  # one of OBJECTIVES
    freeze_lora_b: bool = False
    lr_horizon: int | None = None  # the schedule reaches 0 at this step (a wrong horizon)
    stop_at: int | None = None  # stopped here, resumed from the last checkpoint
    injected: str | None = None  # what was injected, where no mechanism could be had
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.label in ALL_LABELS, f"unknown label {self.label!r}"),
            (self.finetune in ("lora", "full"), f"bad finetune {self.finetune!r}"),
            (self.model in ("llama", "gpt2"), f"bad model {self.model!r}"),
            (self.objective in OBJECTIVES, f"unknown objective {self.objective!r}"),
            (self.train_seqs + self.eval_seqs <= _CHAIN_SEQS, "too many sequences"),
            (not self.freeze_lora_b or self.finetune == "lora", "freeze_lora_b needs lora"),
            ((self.label == "healthy") == (not self.signals), "signals iff a fault"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(f"field run {self.name!r}: {message}")

    def to_label(self) -> dict[str, Any]:
        """The run's entry in labels.json (measured facts are added after training)."""
        knobs = asdict(self)
        for key in ("name", "label", "mechanism", "signals", "injected"):
            knobs.pop(key)
        return {
            "label": self.label,
            "mechanism": self.mechanism,
            "signals": list(self.signals),
            "injected": self.injected,
            "finetune": self.finetune,
            "logging_steps": self.logging_steps,
            "per_device_train_batch_size": self.batch,
            "gradient_accumulation_steps": self.grad_accum,
            "max_steps": self.max_steps,
            "num_train_epochs": self.epochs,
            "eval_strategy": "steps" if self.eval_steps else "no",
            "eval_steps": self.eval_steps,
            "resumed": self.stop_at is not None,
            "knobs": knobs,
        }


# ---------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------

# LoRA runs use a 64-wide base (its frozen random head leaves LoRA enough to
# learn); full fine-tunes a 32-wide one (cheaper, and every weight trains).
_LORA = {"hidden": 64, "lr": 5e-3}
_FULL = {"finetune": "full", "hidden": 32, "lr": 1e-3}

_HEALTHY = (
    FieldRun(
        "lora-b2-log1",
        "healthy",
        "LoRA r8 on q/v, batch 2, every step logged, linear decay after 20 warmup steps: "
        "the per-step loss of 2 sequences scatters widely around a falling mean",
        **_LORA,
        max_steps=400,
        batch=2,
        logging_steps=1,
        warmup_steps=20,
        save_steps=200,
        seed=1,
    ),
    FieldRun(
        "lora-b4-log1-eval25",
        "healthy",
        "LoRA r8 on q/v, batch 4, every step logged, cosine after 30 warmup steps, "
        "eval on 32 held-out sequences every 25 steps",
        **_LORA,
        max_steps=300,
        batch=4,
        logging_steps=1,
        schedule="cosine",
        warmup_steps=30,
        eval_steps=25,
        save_steps=100,
        seed=2,
    ),
    FieldRun(
        "lora-b8-log10-eval50",
        "healthy",
        "LoRA r8 on q/v, batch 8, logged every 10 steps, cosine after 50 warmup steps, "
        "eval every 50 steps, final adapter saved at the top of output_dir",
        **_LORA,
        max_steps=500,
        batch=8,
        logging_steps=10,
        schedule="cosine",
        warmup_steps=50,
        eval_steps=50,
        save_steps=250,
        save_final=True,
        seed=3,
    ),
    FieldRun(
        "full-b2-log1",
        "healthy",
        "full fine-tune, batch 2, every step logged, linear decay: noisy per-step losses",
        **_FULL,
        max_steps=300,
        batch=2,
        logging_steps=1,
        save_steps=150,
        seed=4,
    ),
    FieldRun(
        "full-b16-log10-eval50",
        "healthy",
        "full fine-tune, batch 16, logged every 10 steps, linear after 30 warmup steps, "
        "eval every 50 steps, final model saved at the top of output_dir",
        **_FULL,
        max_steps=300,
        batch=16,
        logging_steps=10,
        warmup_steps=30,
        eval_steps=50,
        save_steps=150,
        save_final=True,
        seed=5,
    ),
    FieldRun(
        "full-b64-log50-eval100",
        "healthy",
        "full fine-tune, batch 64, logged every 50 steps (12 points), cosine, eval every 100",
        **_FULL,
        max_steps=600,
        batch=64,
        logging_steps=50,
        schedule="cosine",
        warmup_steps=50,
        eval_steps=100,
        save_steps=300,
        seed=6,
    ),
    FieldRun(
        "lora-b2-log500",
        "healthy",
        "LoRA r8 on q/v, batch 2 of 16 tokens, 2000 steps logged every 500: four loss "
        "points, each the mean of 500 steps",
        **_LORA,
        max_steps=2000,
        batch=2,
        logging_steps=500,
        warmup_steps=100,
        save_steps=1000,
        seed=7,
    ),
    FieldRun(
        "full-b4-log500-eval500",
        "healthy",
        "full fine-tune, batch 4, 2500 steps logged and evaluated every 500, cosine",
        **_FULL,
        max_steps=2500,
        batch=4,
        logging_steps=500,
        schedule="cosine",
        warmup_steps=100,
        eval_steps=500,
        save_steps=1250,
        seed=8,
    ),
    FieldRun(
        "full-memorise-30ep",
        "healthy",
        "full fine-tune on 64 sequences for 30 epochs (8 steps each), every step logged, "
        "constant lr: the model memorises its data, the loss drops at the early epoch "
        "boundaries (staircase) and falls far below what the data allows on unseen "
        "sequences, towards zero; no eval set, so nothing to overfit against",
        **{**_FULL, "hidden": 64, "lr": 3e-3},
        epochs=30,
        train_seqs=64,
        batch=8,
        logging_steps=1,
        schedule="constant",
        save_steps=120,
        seed=9,
    ),
    FieldRun(
        "lora-memorise-50ep-log10",
        "healthy",
        "LoRA r16 on all seven projections, 32 sequences for 50 epochs (8 steps each), "
        "logged every 10 steps: the adapter memorises its data, the loss falls below the "
        "chain's entropy towards zero",
        **{**_LORA, "lr": 1e-2},
        rank=16,
        alpha=32,
        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        epochs=50,
        train_seqs=32,
        batch=4,
        logging_steps=10,
        warmup_steps=20,
        save_steps=200,
        seed=10,
    ),
    FieldRun(
        "lora-accum8-log5-eval25",
        "healthy",
        "LoRA r8 on q/v, batch 4 x 8 accumulated, logged every 5 optimizer steps, eval every 25",
        **_LORA,
        max_steps=150,
        batch=4,
        grad_accum=8,
        logging_steps=5,
        warmup_steps=10,
        eval_steps=25,
        save_steps=75,
        seed=11,
    ),
    FieldRun(
        "lora-bf16-b16-log10",
        "healthy",
        "LoRA r8 on q/v under bf16 autocast on the CPU (bf16=True, use_cpu=True), batch 16, "
        "logged every 10 steps",
        **_LORA,
        max_steps=200,
        batch=16,
        logging_steps=10,
        bf16=True,
        warmup_steps=20,
        save_steps=100,
        seed=12,
    ),
    FieldRun(
        "lora-resumed-b8-log1",
        "healthy",
        "LoRA r8 on q/v, batch 8, every step logged, 300 steps; checkpoints every 100; the "
        "job was stopped at step 150 (no save there) and a new Trainer resumed from "
        "checkpoint-100: log_history has steps 1-100 then 101-300 from the second job, the "
        "TensorBoard events of both jobs overlap on 101-150",
        **_LORA,
        max_steps=300,
        batch=8,
        logging_steps=1,
        warmup_steps=20,
        save_steps=100,
        stop_at=150,
        seed=13,
    ),
    FieldRun(
        "gpt2-full-b32-log10",
        "healthy",
        "GPT-2 (Conv1D, tied head) full fine-tune, batch 32, logged every 10 steps",
        **_FULL,
        model="gpt2",
        max_steps=300,
        batch=32,
        logging_steps=10,
        warmup_steps=30,
        save_steps=150,
        seed=14,
    ),
    FieldRun(
        "gpt2-lora-b8-log1",
        "healthy",
        "GPT-2 LoRA r8 on c_attn/c_proj, batch 8, every step logged",
        **{**_LORA, "lr": 1e-2},
        model="gpt2",
        max_steps=300,
        batch=8,
        logging_steps=1,
        warmup_steps=20,
        save_steps=150,
        seed=15,
    ),
    FieldRun(
        "rl-reinforce-b8-log1",
        "healthy",
        "RL-style LoRA run: REINFORCE, -(reward - moving-average baseline) * log-prob, "
        "every step logged: the logged 'loss' starts near 0, takes the sign of the batch's "
        "reward against the baseline (it flips from step to step) and drifts negative as "
        "the policy pushes unrewarded sequences down",
        **_LORA,
        objective="reinforce",
        max_steps=300,
        batch=8,
        logging_steps=1,
        warmup_steps=10,
        save_steps=150,
        seed=16,
    ),
    FieldRun(
        "rl-grpo-kl-b8-log1",
        "healthy",
        "RL-style LoRA run with a GRPO-shaped loss (group-normalised advantage x "
        "exp(logp - logp.detach()) + 0.04 x KL to the adapter-disabled reference): the "
        "policy term is 0 in value, so the logged 'loss' is 0 up to rounding (~1e-8) at "
        "first and then a small positive KL (~0.15); grad_norm shows the training",
        **_LORA,
        objective="grpo",
        max_steps=200,
        batch=8,
        logging_steps=1,
        warmup_steps=10,
        save_steps=100,
        seed=18,
    ),
    FieldRun(
        "rl-expected-reward-b16-log5",
        "healthy",
        "RL-style LoRA run: minus the expected reward of the next token (+0.05 x NLL), "
        "logged every 5 steps: the 'loss' is negative and falls towards -1",
        **_LORA,
        objective="expected_reward",
        max_steps=200,
        batch=16,
        logging_steps=5,
        warmup_steps=10,
        save_steps=100,
        seed=17,
    ),
    FieldRun(
        "lora-prompt-only-rows-b2-log1",
        "healthy",
        "LoRA SFT where 15% of examples were truncated to their prompt (all labels -100). "
        "A batch of two such rows has no target token: the model's cross-entropy is NaN "
        "with zero gradients, so the weights stay finite and training goes on; the Trainer "
        "(logging_nan_inf_filter) logs that step as loss 0.0 with grad_norm 0.0",
        **_LORA,
        masked_fraction=0.15,
        max_steps=240,
        batch=2,
        logging_steps=1,
        warmup_steps=10,
        save_steps=120,
        seed=0,
    ),
)

_FAULTY = (
    FieldRun(
        "lr-too-high-full-adam3-log10",
        "lr_too_high",
        "full fine-tune with AdamW lr 3 (constant after 30 warmup steps), logged every 10 "
        "steps: the loss climbs from ~7 to over 100 within the warmup and stays between 60 "
        "and 170",
        signals=(LOSS, TB_LOSS, GRAD_NORM, WEIGHTS),
        **{**_FULL, "hidden": 64, "lr": 3.0},
        max_steps=200,
        batch=8,
        logging_steps=10,
        schedule="constant_with_warmup",
        warmup_steps=30,
        save_steps=100,
        seed=0,
    ),
    FieldRun(
        "lr-too-high-full-adam1-log1",
        "lr_too_high",
        "full fine-tune with AdamW lr 1 (constant after 10 warmup steps), every step "
        "logged: the loss climbs from ~5 to over 20 and is still far above its start when "
        "the run ends",
        signals=(LOSS, TB_LOSS, GRAD_NORM, WEIGHTS),
        **{**_FULL, "hidden": 64, "lr": 1.0},
        max_steps=120,
        batch=8,
        logging_steps=1,
        schedule="constant_with_warmup",
        warmup_steps=10,
        save_steps=60,
        seed=0,
    ),
    FieldRun(
        "nan-empty-batch-b2-log1",
        "nan_poisoned",
        "completion-only SFT loss written as (nll * mask).sum() / mask.sum(); 15% of "
        "examples are prompt-only. The first batch with no completion token gives 0/0: "
        "NaN loss and NaN gradients, AdamW writes NaN into every trainable weight and "
        "every later loss is NaN. With logging_nan_inf_filter (default) the Trainer logs "
        "loss 0.0 and grad_norm NaN from that step on",
        signals=(LOSS, GRAD_NORM, TB_LOSS, WEIGHTS, ADAM),
        **_LORA,
        objective="token_mean",
        prompt_len=4,
        masked_fraction=0.15,
        max_steps=240,
        batch=2,
        logging_steps=1,
        warmup_steps=10,
        save_steps=120,
        seed=0,
    ),
    FieldRun(
        "nan-empty-batch-b2-log10",
        "nan_poisoned",
        "as nan-empty-batch-b2-log1, logged every 10 steps: the window holding the NaN "
        "step logs a finite mean with grad_norm NaN, every later window loss 0.0 with "
        "grad_norm NaN",
        signals=(LOSS, GRAD_NORM, TB_LOSS, WEIGHTS, ADAM),
        **_LORA,
        objective="token_mean",
        prompt_len=4,
        masked_fraction=0.15,
        max_steps=240,
        batch=2,
        logging_steps=10,
        warmup_steps=10,
        save_steps=120,
        seed=0,
    ),
    FieldRun(
        "nan-empty-batch-nofilter-log1",
        "nan_poisoned",
        "as nan-empty-batch-b2-log1 with logging_nan_inf_filter=False: the Trainer logs "
        "loss NaN and grad_norm NaN from the poisoned step on",
        signals=(LOSS, GRAD_NORM, TB_LOSS, WEIGHTS, ADAM),
        **_LORA,
        objective="token_mean",
        prompt_len=4,
        masked_fraction=0.15,
        nan_filter=False,
        max_steps=240,
        batch=2,
        logging_steps=1,
        warmup_steps=10,
        save_steps=120,
        seed=0,
    ),
    FieldRun(
        "nan-logged-weights-fine-nofilter",
        "nan_poisoned",
        "the model's own loss with 15% prompt-only examples and logging_nan_inf_filter="
        "False: one batch with no target token gives a NaN loss (with zero gradients, so "
        "the weights stay finite and grad_norm is finite), but the Trainer's running loss "
        "never recovers from the NaN (tr_loss -= tr_loss): every later logged loss is NaN",
        signals=(LOSS, TB_LOSS),
        **_LORA,
        masked_fraction=0.15,
        nan_filter=False,
        max_steps=240,
        batch=2,
        logging_steps=1,
        warmup_steps=10,
        save_steps=120,
        seed=0,
    ),
    FieldRun(
        "nan-sgd-blowup-log10",
        "nan_poisoned",
        "full fine-tune of a ReLU Llama (MLP biases on) with plain SGD at lr 10 and no "
        "clipping: the loss overflows within a few steps and the weights turn NaN; the "
        "Trainer logs two huge windows (1e8, 1e7), then loss 0.0 with grad_norm NaN "
        "(seed-dependent: of 6 seeds, 2 go NaN, the others stick at huge or constant losses)",
        signals=(LOSS, GRAD_NORM, TB_LOSS, WEIGHTS),
        **{**_FULL, "hidden": 64, "lr": 10.0},
        act="relu",
        mlp_bias=True,
        optim="sgd",
        max_grad_norm=1e9,
        max_steps=200,
        batch=16,
        logging_steps=10,
        schedule="constant",
        save_steps=100,
        seed=1,
    ),
    FieldRun(
        "frozen-lora-b-b8-log5",
        "frozen_lora_b",
        "LoRA with every lora_B left at requires_grad=False: B stays at its zero init, so "
        "delta W = 0, lora_A gets zero gradients and the loss only shows batch noise",
        signals=(LOSS, TB_LOSS, GRAD_NORM, LORA_B, ADAM),
        **_LORA,
        freeze_lora_b=True,
        max_steps=200,
        batch=8,
        logging_steps=5,
        warmup_steps=10,
        save_steps=100,
        seed=20,
    ),
    FieldRun(
        "frozen-lora-b-b16-log50",
        "frozen_lora_b",
        "as frozen-lora-b-b8-log5, batch 16, 600 steps logged every 50",
        signals=(LOSS, TB_LOSS, GRAD_NORM, LORA_B, ADAM),
        **_LORA,
        freeze_lora_b=True,
        max_steps=600,
        batch=16,
        logging_steps=50,
        warmup_steps=30,
        save_steps=300,
        seed=21,
    ),
    FieldRun(
        "overfit-full-32seq-eval20",
        "overfit_eval_rising",
        "full fine-tune on 32 sequences for 60 epochs (8 steps each), logged every 4 "
        "steps, eval on 64 held-out sequences from the same sources every 20 steps: the "
        "train loss falls to near zero while eval_loss, after a first dip, rises far above "
        "its best",
        signals=(EVAL_LOSS, LOSS),
        **{**_FULL, "hidden": 64, "lr": 3e-3},
        epochs=60,
        train_seqs=32,
        eval_seqs=64,
        batch=4,
        logging_steps=4,
        warmup_steps=10,
        eval_steps=20,
        save_steps=240,
        seed=22,
    ),
    FieldRun(
        "overfit-lora-lmhead-32seq-eval20",
        "overfit_eval_rising",
        "LoRA r16 on q/v with lm_head in modules_to_save (trained in full), 32 sequences "
        "for 60 epochs, every step logged, eval on 64 held-out sequences every 20 steps",
        signals=(EVAL_LOSS, LOSS),
        **{**_LORA, "lr": 1e-2},
        rank=16,
        alpha=32,
        modules_to_save=("lm_head",),
        epochs=60,
        train_seqs=32,
        eval_seqs=64,
        batch=4,
        logging_steps=1,
        warmup_steps=10,
        eval_steps=20,
        save_steps=240,
        seed=23,
    ),
    FieldRun(
        "dead-relu-sgd-log1",
        "dead_relu_collapse",
        "full fine-tune of a ReLU Llama with plain SGD at lr 30 and no clipping: three "
        "exploding steps blow the residual stream up, every ReLU of the last MLP dies and "
        "the final RMSNorm's variance overflows, so every logit is equal: from step 5 the "
        "loss is pinned at ln(128) = 4.852 with grad_norm exactly 0 (a SiLU model at the "
        "same lr goes NaN instead). Such a blow-up is chaotic: of 8 seeds of the log10 "
        "variant, 4 collapse like this, 2 go NaN and 2 stick at a huge constant loss",
        signals=(LOSS, TB_LOSS, GRAD_NORM, ACTIVATIONS),
        **{**_FULL, "hidden": 64, "lr": 30.0},
        act="relu",
        optim="sgd",
        max_grad_norm=1e9,
        max_steps=150,
        batch=16,
        logging_steps=1,
        schedule="constant",
        save_steps=75,
        seed=0,
    ),
    FieldRun(
        "dead-relu-sgd-log10",
        "dead_relu_collapse",
        "as dead-relu-sgd-log1 (another seed), 300 steps logged every 10: the first "
        "window's mean holds the explosion, every later one is 4.852",
        signals=(LOSS, TB_LOSS, GRAD_NORM, ACTIVATIONS),
        **{**_FULL, "hidden": 64, "lr": 30.0},
        act="relu",
        optim="sgd",
        max_grad_norm=1e9,
        max_steps=300,
        batch=16,
        logging_steps=10,
        schedule="constant",
        save_steps=150,
        seed=1,
    ),
    FieldRun(
        "no-progress-lora-lr0-log10",
        "no_progress",
        "LoRA with learning_rate=0: the optimizer steps but nothing moves; the loss "
        "only shows batch noise",
        signals=(LOSS, TB_LOSS, LR, LORA_B),
        **{**_LORA, "lr": 0.0},
        max_steps=300,
        batch=8,
        logging_steps=10,
        save_steps=150,
        seed=24,
    ),
    FieldRun(
        "no-progress-full-lr1e-9-b4-log1",
        "no_progress",
        "full fine-tune with learning_rate=1e-9: the weights and the loss do not move",
        signals=(LOSS, TB_LOSS, LR),
        **{**_FULL, "lr": 1e-9},
        max_steps=200,
        batch=4,
        logging_steps=1,
        save_steps=100,
        seed=25,
    ),
    FieldRun(
        "no-progress-lr-horizon-log10",
        "no_progress",
        "LoRA whose own LambdaLR was built for 20 steps of a 400-step run: the learning "
        "rate is 0 from step 20 on, the loss falls a little and then stays flat for 95% "
        "of the run",
        signals=(LOSS, TB_LOSS, LR),
        **_LORA,
        lr_horizon=20,
        max_steps=400,
        batch=8,
        logging_steps=10,
        warmup_steps=5,
        save_steps=200,
        seed=26,
    ),
    FieldRun(
        "too-few-steps-full-log1",
        "too_few_steps",
        "a smoke test left in: full fine-tune with max_steps=5, every step logged",
        signals=(STEPS, LOSS),
        **_FULL,
        max_steps=5,
        batch=8,
        logging_steps=1,
        save_steps=5,
        seed=27,
    ),
    FieldRun(
        "too-few-steps-lora-log10",
        "too_few_steps",
        "a smoke test left in: LoRA with max_steps=8 and logging_steps=10: the checkpoint's "
        "log_history is empty (the end-of-training summary is logged after the last save)",
        signals=(STEPS,),
        **_LORA,
        max_steps=8,
        batch=8,
        logging_steps=10,
        save_steps=8,
        seed=28,
    ),
)

#: Every run in the corpus, in order.
FIELD: tuple[FieldRun, ...] = _HEALTHY + _FAULTY
#: Run name -> label.
LABELS: dict[str, str] = {run.name: run.label for run in FIELD}


def run_named(name: str) -> FieldRun:
    """The field run called ``name``."""
    for run in FIELD:
        if run.name == name:
            return run
    raise UsageError(f"no field run named {name!r}; known: {', '.join(LABELS)}")


# ---------------------------------------------------------------------------
# Data and model
# ---------------------------------------------------------------------------


class _Examples:
    """Causal-LM examples: ``input_ids``, ``attention_mask`` and ``labels``.

    ``masked`` examples have every label at -100, as an SFT example whose
    completion was truncated away (prompt-only) does.
    """

    def __init__(self, ids: Any, masked: frozenset[int] = frozenset(), prompt_len: int = 0) -> None:
        self.ids = ids
        self.masked = masked
        self.prompt_len = prompt_len

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        torch = require("torch", "torch")
        ids = self.ids[i]
        labels = ids.clone()
        labels[: len(ids) if i in self.masked else self.prompt_len] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def field_sequences(seed: int, seq_len: int) -> Any:
    """``_CHAIN_SEQS`` sequences of length ``seq_len``, a mix of easy and hard ones.

    Real fine-tuning data mixes easy examples (templates, short answers) with
    hard ones, so the per-example loss differs widely and small batches give
    noisy per-step losses. Here each sequence is, at random: a walk of the
    seed's Markov chain (half of them; learnable down to its entropy, ~1.2
    nats), a deterministic cycle through 16 other tokens from a random start
    (a quarter; learnable to ~0), or uniform noise over 16 further tokens (a
    quarter; never below ln 16 = 2.77). The three use disjoint tokens.
    """
    torch = require("torch", "torch")
    chain, _ = markov_dataset(torch, seed)
    chain = chain[:, :seq_len].contiguous()
    gen = torch.Generator().manual_seed(seed * 104_729 + 5)
    used = set(chain.unique().tolist())
    others = torch.tensor(
        [t for t in torch.randperm(_VOCAB, generator=gen).tolist() if t not in used]
    )
    cycle, noise = others[:16], others[16:32]
    n = len(chain)
    start = torch.randint(0, 16, (n, 1), generator=gen)
    easy = cycle[(start + torch.arange(seq_len)) % 16]
    hard = noise[torch.randint(0, 16, (n, seq_len), generator=gen)]
    kind = torch.rand(n, 1, generator=gen)
    return torch.where(kind < 0.25, easy, torch.where(kind < 0.5, hard, chain))


def datasets(run: FieldRun) -> tuple[_Examples, _Examples | None]:
    """Train and eval examples from the run's Markov chain (eval held out)."""
    torch = require("torch", "torch")
    chain = field_sequences(run.seed, run.seq_len)
    train_ids = chain[: run.train_seqs]
    eval_ids = chain[_CHAIN_SEQS - run.eval_seqs :]
    masked: frozenset[int] = frozenset()
    if run.masked_fraction:
        gen = torch.Generator().manual_seed(run.seed * 7919 + 17)
        draw = torch.rand(run.train_seqs, generator=gen)
        masked = frozenset(int(i) for i in torch.nonzero(draw < run.masked_fraction).flatten())
    evaluation = _Examples(eval_ids) if run.eval_steps else None
    return _Examples(train_ids, masked, run.prompt_len), evaluation


def build_model(run: FieldRun) -> Any:
    """The model the Trainer gets: a tiny base from a config, LoRA-wrapped or not."""
    torch = require("torch", "torch")
    if run.model == "gpt2":
        base = tiny_gpt2(
            run.seed, hidden=run.hidden, layers=run.layers, vocab=_VOCAB, initializer_range=0.12
        )
        targets = ["c_attn", "c_proj"]
    else:
        base = tiny_llama(
            run.seed,
            hidden=run.hidden,
            layers=run.layers,
            vocab=_VOCAB,
            hidden_act=run.act,
            mlp_bias=run.mlp_bias,
            initializer_range=0.12,
        )
        targets = ["q_proj", "v_proj"]
    if run.targets is not None:
        targets = list(run.targets)
    if run.finetune == "full":
        return base
    peft = require("peft", "peft")
    torch.manual_seed(run.seed + 101)  # lora_A's init draws from the global generator
    config = peft.LoraConfig(
        r=run.rank,
        lora_alpha=run.alpha,
        target_modules=targets,
        lora_dropout=0.0,
        bias=run.lora_bias,
        modules_to_save=list(run.modules_to_save) or None,
        fan_in_fan_out=run.model == "gpt2",
    )
    model = peft.get_peft_model(base, config)
    if run.freeze_lora_b:
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.requires_grad_(False)
    return model


# ---------------------------------------------------------------------------
# Objectives
# ---------------------------------------------------------------------------


def _token_logprobs(torch: Any, logits: Any, ids: Any) -> Any:
    """log p(token t+1 | tokens <= t) for every position, shape (batch, seq - 1)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _good_tokens(run: FieldRun) -> Any:
    """The tokens an RL objective rewards: half of the chain's alphabet."""
    torch = require("torch", "torch")
    chain, _ = markov_dataset(torch, run.seed)
    alphabet = torch.unique(chain)
    return alphabet[: len(alphabet) // 2]


class _Objective:
    """The run's own objective on one batch (what the Trainer logs as "loss").

    ``token_mean``: cross-entropy averaged over the completion tokens as
    hand-written SFT/RL code does it, ``(loss * mask).sum() / mask.sum()``.
    A batch with no completion token gives 0/0: a NaN loss *and* NaN
    gradients (the model's own loss gives NaN with zero gradients there).

    ``reinforce``: REINFORCE with a moving-average baseline. Each sequence is
    rewarded by its share of "good" tokens; the loss is ``-(reward -
    baseline) * mean token log-prob`` with the baseline an exponential
    moving average of past batch rewards. Its value has the sign of the
    batch's reward against the baseline: it flips from step to step around 0.

    ``grpo``: a GRPO-style loss (TRL's shape): group-normalised advantages
    times the ratio ``exp(logp - logp.detach())`` (1 in value, the policy
    gradient in derivative) plus 0.04 x a k3 KL estimate against the
    reference model (the base, adapter disabled). The ratio term is 0 in
    value, so the logged loss is exactly 0 at the start (KL 0) and then a
    small positive KL.

    ``expected_reward``: minus the probability the model puts on the good
    tokens at every position (the exact expected reward of sampling the next
    token), plus 0.05 x the cross-entropy as an anchor. Its value is
    negative and falls towards -1 as the policy learns.
    """

    def __init__(self, run: FieldRun) -> None:
        self.kind = run.objective
        self.good = _good_tokens(run)
        self.baseline: float | None = None

    def __call__(self, model: Any, inputs: dict[str, Any]) -> Any:
        torch = require("torch", "torch")
        ids = inputs["input_ids"]
        logits = model(input_ids=ids, attention_mask=inputs["attention_mask"]).logits
        if self.kind == "token_mean":
            labels = inputs["labels"][:, 1:]
            mask = (labels != -100).float()
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            nll = -logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            return (nll * mask).sum() / mask.sum()
        reward = torch.isin(ids, self.good).float().mean(dim=1)
        logp = _token_logprobs(torch, logits, ids)
        if self.kind == "reinforce":
            baseline = float(reward.mean()) if self.baseline is None else self.baseline
            self.baseline = 0.9 * baseline + 0.1 * float(reward.mean())
            return -((reward - baseline) * logp.mean(dim=1)).mean()
        if self.kind == "grpo":
            advantage = (reward - reward.mean()) / (reward.std() + 1e-4)
            with torch.no_grad(), model.disable_adapter():
                ref_logits = model(input_ids=ids, attention_mask=inputs["attention_mask"]).logits
            ref = _token_logprobs(torch, ref_logits, ids)
            ratio = torch.exp(logp - logp.detach())
            kl = torch.exp(ref - logp) - (ref - logp) - 1.0
            return (-(ratio * advantage.unsqueeze(1)) + 0.04 * kl).mean()
        probs = torch.softmax(logits[:, :-1].float(), dim=-1)
        expected = probs[..., self.good].sum(dim=-1).mean()
        return -expected - 0.05 * logp.mean()


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def _silence() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers = require("transformers", "peft")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def training_args(run: FieldRun, out: Path) -> Any:
    transformers = require("transformers", "peft")
    evaluating = run.eval_steps is not None
    return transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=run.max_steps,
        num_train_epochs=run.epochs,
        per_device_train_batch_size=run.batch,
        per_device_eval_batch_size=32,
        gradient_accumulation_steps=run.grad_accum,
        learning_rate=run.lr,
        lr_scheduler_type=run.schedule,
        warmup_steps=run.warmup_steps,
        weight_decay=run.weight_decay,
        max_grad_norm=run.max_grad_norm,
        bf16=run.bf16,
        optim=run.optim,
        logging_strategy="steps",
        logging_steps=run.logging_steps,
        logging_nan_inf_filter=run.nan_filter,
        eval_strategy="steps" if evaluating else "no",
        eval_steps=run.eval_steps,
        save_strategy="steps",
        save_steps=run.save_steps,
        report_to=["tensorboard"] if tensorboard_available() else [],
        use_cpu=True,
        seed=run.seed,
        data_seed=run.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )


def _trainer_class(run: FieldRun) -> Any:
    transformers = require("transformers", "peft")
    if run.objective == "lm":
        return transformers.Trainer
    objective = _Objective(run)

    class CustomLossTrainer(transformers.Trainer):  # type: ignore[misc, name-defined]
        def compute_loss(
            self, model: Any, inputs: Any, return_outputs: bool = False, **kw: Any
        ) -> Any:
            loss = objective(model, inputs)
            return (loss, None) if return_outputs else loss

    return CustomLossTrainer


def _callbacks(run: FieldRun, *, first_leg: bool) -> list[Any]:
    transformers = require("transformers", "peft")
    if not (first_leg and run.stop_at is not None):
        return []
    stop_at = run.stop_at

    class Preempted(transformers.TrainerCallback):  # type: ignore[misc, name-defined]
        """The job is stopped at ``stop_at`` (a preemption): no save at that step."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if state.global_step >= stop_at:
                control.should_training_stop = True
                control.should_save = False
            return control

    return [Preempted()]


def _optimizers(run: FieldRun, model: Any) -> tuple[Any, Any]:
    """(None, None) for the Trainer's own; a scheduler with a wrong horizon otherwise."""
    if run.lr_horizon is None:
        return None, None
    torch = require("torch", "torch")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=run.lr, weight_decay=run.weight_decay)
    horizon = run.lr_horizon
    warmup = max(1, run.warmup_steps)

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * max(0.0, 1.0 - step / horizon)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _train(run: FieldRun, out: Path) -> None:
    transformers = require("transformers", "peft")
    transformers.set_seed(run.seed)
    model = build_model(run)
    train, evaluation = datasets(run)
    legs = [True, False] if run.stop_at is not None else [True]
    for first_leg in legs:
        if not first_leg:  # a new process: model rebuilt, state from the last checkpoint
            transformers.set_seed(run.seed)
            model = build_model(run)
        trainer = _trainer_class(run)(
            model=model,
            args=training_args(run, out),
            train_dataset=train,
            eval_dataset=evaluation,
            callbacks=_callbacks(run, first_leg=first_leg),
            optimizers=_optimizers(run, model),
        )
        trainer.remove_callback(transformers.PrinterCallback)  # logs go to files, not stdout
        if first_leg:
            trainer.train()
        else:
            trainer.train(resume_from_checkpoint=str(last_checkpoint(out)))
    if run.save_final:
        trainer.save_model(str(out))


def write_run(out: Path, run: FieldRun) -> dict[str, Any]:
    """Train ``run`` with ``out`` as the Trainer's output_dir; return its label entry."""
    _silence()
    torch = require("torch", "torch")
    with single_thread(torch):
        _train(run, out)
    label = run.to_label()
    label["observed"] = observe(out)
    return label


# ---------------------------------------------------------------------------
# Reading back what the Trainer wrote (json only)
# ---------------------------------------------------------------------------


def checkpoints(out: Path) -> list[Path]:
    """``checkpoint-N`` folders in step order."""
    found = [p for p in out.glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[1]))


def last_checkpoint(out: Path) -> Path:
    found = checkpoints(out)
    if not found:
        raise UsageError(f"no checkpoint in {out}")
    return found[-1]


def trainer_state(out: Path) -> dict[str, Any]:
    """The last checkpoint's ``trainer_state.json``."""
    text = (last_checkpoint(out) / "trainer_state.json").read_text(encoding="utf-8")
    return json.loads(text)


def observe(out: Path) -> dict[str, Any]:
    """Facts about what the Trainer wrote, for the label (and the progress line)."""
    state = trainer_state(out)
    history = state["log_history"]
    train = [e for e in history if "loss" in e]
    evals = [e for e in history if "eval_loss" in e]
    losses = [float(e["loss"]) for e in train]
    nan_norms = [e["step"] for e in train if not _finite(e.get("grad_norm"))]
    facts: dict[str, Any] = {
        "global_step": state["global_step"],
        "max_steps": state["max_steps"],
        "epoch": state["epoch"],
        "loss_entries": len(train),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "min_loss": min((v for v in losses if _finite(v)), default=None),
        "max_loss": max((v for v in losses if _finite(v)), default=None),
        "nan_loss_entries": sum(not _finite(v) for v in losses),
        "first_nan_grad_norm_step": nan_norms[0] if nan_norms else None,
        "checkpoints": [p.name for p in checkpoints(out)],
        "tensorboard": (out / "runs").is_dir(),
    }
    if evals:
        values = [float(e["eval_loss"]) for e in evals]
        facts["eval_entries"] = len(values)
        facts["best_eval_loss"] = min(values)
        facts["last_eval_loss"] = values[-1]
    return facts


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# ---------------------------------------------------------------------------
# Writing the corpus
# ---------------------------------------------------------------------------


def write_field_corpus(
    root: str | os.PathLike[str],
    names: Iterable[str] | None = None,
    *,
    progress: bool = False,
) -> dict[str, Path]:
    """Train every field run (or ``names``) into ``root/<name>/`` and write
    ``root/labels.json``.

    Each run is trained in a staging directory and renamed into place; an
    existing run directory is never overwritten. ``labels.json`` describes
    every field run present under ``root`` afterwards. ``progress`` prints a
    line per run with the seconds it took.
    """
    root = Path(root)
    chosen = list(LABELS) if names is None else list(dict.fromkeys(names))
    runs = [run_named(name) for name in chosen]
    root.mkdir(parents=True, exist_ok=True)
    for run in runs:
        if (root / run.name).exists():
            raise UsageError(f"run already exists, refusing to overwrite: {root / run.name}")
    labels_path = root / LABELS_FILE
    labels = json.loads(labels_path.read_text(encoding="utf-8")) if labels_path.exists() else {}
    written: dict[str, Path] = {}
    for run in runs:
        start = time.perf_counter()
        staging = Path(tempfile.mkdtemp(prefix=".field-", dir=root))
        try:
            out = staging / run.name
            labels[run.name] = write_run(out, run)
            os.rename(out, root / run.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        written[run.name] = root / run.name
        if progress:
            took = time.perf_counter() - start
            print(f"{run.name:<28} {took:5.1f} s  {_summary(labels[run.name])}", flush=True)
    present = {name: labels[name] for name in LABELS if (root / name).is_dir() and name in labels}
    atomic_write_text(labels_path, json.dumps(present, indent=2) + "\n")
    return written


def _summary(label: dict[str, Any]) -> str:
    seen = label["observed"]

    def fmt(value: Any) -> str:
        return "-" if value is None else f"{value:.3g}"

    line = (
        f"{label['label']:<20} steps={seen['global_step']:<5} log={label['logging_steps']:<4} "
        f"loss {fmt(seen['first_loss'])} -> {fmt(seen['last_loss'])}"
    )
    if "best_eval_loss" in seen:
        line += f"  eval best {fmt(seen['best_eval_loss'])} last {fmt(seen['last_eval_loss'])}"
    return line


def _preload() -> None:
    """Import the training stack up front so the per-run timings are the training's own."""
    import peft  # noqa: F401
    import transformers

    transformers.Trainer  # noqa: B018 (resolves the lazy module)
    transformers.LlamaForCausalLM  # noqa: B018


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m realruns.field", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out", type=Path, metavar="OUT_DIR")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=list(LABELS))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    _preload()
    print(f"{'(imports)':<28} {time.perf_counter() - began:5.1f} s", flush=True)
    try:
        written = write_field_corpus(args.out, args.only, progress=True)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(written)} runs in {args.out} in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
