"""The runs of the field corpus (:mod:`realruns.field`): what each trains,
with which knobs, and the label, mechanism and signals it is meant to show.

Specifications only; the training lives in :mod:`realruns.field`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from adapterprobe.errors import UsageError

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

VOCAB = 128
CHAIN_SEQS = 1024  # sequences markov_dataset draws per chain (length 32, cut to seq_len)

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
            (self.train_seqs + self.eval_seqs <= CHAIN_SEQS, "too many sequences"),
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
