"""A labelled corpus of real LoRA training runs: healthy ones and one per fault class.

Verdict rules have to be developed and checked against runs whose health is
known for a physical reason, not because someone edited a number. Every run
here really trains a tiny ``LlamaForCausalLM`` (from a config, nothing
downloaded) with PEFT LoRA and AdamW on minibatches drawn from a synthetic
Markov-chain dataset, and is written with :mod:`realruns.dlm`'s own writers.
Faults are made the way they happen in practice: a learning rate that is far
off, gradients that are dropped or blown up before the optimizer step, batches
that are corrupt or overflow, a forgotten smoke test.

Deterministic for a given seed and environment: batches come from generators
seeded by (run seed, epoch), torch runs on one thread, and the clock is
simulated.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from adapterprobe._fs import atomic_write_text
from adapterprobe.errors import UsageError, require
from realruns.dlm import (
    DEFAULT_START,
    SECONDS_PER_STEP,
    TinyRun,
    single_thread,
    write_adapter_version,
    write_log,
)
from realruns.tiny import tiny_llama

#: Fault classes, in the order the corpus lists them.
FAULTS = (
    "too_few_steps",
    "lr_too_high",
    "lr_too_low",
    "dead_adapter",
    "nan_losses",
    "loss_spikes",
    "exploded_second_moments",
    "nan_second_moments",
)

#: Every label a run can carry.
ALL_LABELS = ("healthy", *FAULTS)

QV = ("q_proj", "v_proj")
ALL_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCHEDULES = ("linear", "cosine", "constant")

# Model and data shape shared by every run. A 0.12 init range gives the frozen
# random lm_head enough logit range for rank-4..16 LoRA to learn most of the
# chain (a 0.02-0.06 base caps the reachable loss far above its entropy).
_HIDDEN = 64
_VOCAB = 128
_INIT_RANGE = 0.12
_SEQ_LEN = 32
_ALPHABET = 16  # the chain emits only these many distinct tokens
_SUCCESSORS = 3  # likely next tokens per state; the rest share a little mass
_SMOOTHING = 0.04  # probability mass spread uniformly over the alphabet
_TRAIN_SEQS = 1024
_VAL_SEQS = 32
_EVAL_EVERY = 10
_WEIGHT_DECAY = 0.01  # torch's AdamW default, spelled out for the plan
_RUN_GAP = timedelta(hours=1)  # start of run i is DEFAULT_START + i * _RUN_GAP
_RESUME_GAP = timedelta(minutes=10)


@dataclass(frozen=True)
class RunSpec:
    """One corpus run: its label, the training knobs, and the fault (if any).

    ``steps`` is how far the run trains and ``horizon`` (default ``steps``)
    where its schedule ends. Fault knobs are off by default; a healthy run
    sets none of them.
    """

    name: str
    label: str
    what: str  # one line saying what was done, for labels.json
    layers: int = 2
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = QV
    lr: float = 1e-3
    steps: int = 100
    horizon: int | None = None
    batch: int = 8
    schedule: str = "linear"
    warmup: int = 10
    grad_accum: int = 1
    seed: int = 0  # base model, LoRA init and batch order
    data_seed: int | None = None  # the Markov chain (default: seed)
    max_grad_norm: float | None = 1.0
    # History: a checkpoint, a crash and a resume; or a base that was already tuned.
    checkpoint_at: int | None = None  # run 1 saves v0001 here ...
    crash_at: int | None = None  # ... and dies at this step; run 2 resumes from v0001
    warm_start_steps: int = 0  # a LoRA trained this long on the task is merged into the base
    warm_start_lr: float = 2e-3  # ... at this (sane) learning rate, linear schedule
    # Faults.
    spike_steps: tuple[int, ...] = ()  # batches of uniformly random tokens
    nan_steps: tuple[int, ...] = ()  # batches whose activations overflow (loss NaN)
    amp_scaler: bool = False  # a real GradScaler (skips non-finite steps)
    nan_guard: bool = True  # without a scaler: skip a step with a non-finite loss or norm
    drop_lora_b_grads: bool = False  # lora_B gradients zeroed before every optimizer step
    explode_layers: tuple[int, ...] = ()  # these layers' LoRA gradients are scaled ...
    explode_from: int = 0  # ... from this step on ...
    explode_factor: float = 1e3  # ... by this factor

    def __post_init__(self) -> None:
        checks = [
            (self.label in ALL_LABELS, f"unknown label {self.label!r}"),
            (self.schedule in SCHEDULES, f"unknown schedule {self.schedule!r}"),
            (self.steps >= 1 and self.batch >= 1 and self.grad_accum >= 1, "bad sizes"),
            (self.batch >= 1 and _TRAIN_SEQS % self.batch == 0, f"batch must divide {_TRAIN_SEQS}"),
            (self.total_steps >= self.steps, "horizon is shorter than steps"),
            (set(self.targets) <= set(ALL_PROJ), f"unknown targets {self.targets}"),
            (all(0 <= i < self.layers for i in self.explode_layers), "bad explode_layers"),
            ((self.checkpoint_at is None) == (self.crash_at is None), "checkpoint needs crash"),
        ]
        if self.checkpoint_at is not None and self.crash_at is not None:
            ok = 1 <= self.checkpoint_at < self.crash_at <= self.steps
            checks.append((ok, "need 1 <= checkpoint_at < crash_at <= steps"))
        for ok, message in checks:
            if not ok:
                raise UsageError(f"run {self.name!r}: {message}")

    @property
    def total_steps(self) -> int:
        """Where the learning-rate schedule ends."""
        return self.steps if self.horizon is None else self.horizon

    @property
    def chain_seed(self) -> int:
        """Seed of the dataset's Markov chain."""
        return self.seed if self.data_seed is None else self.data_seed

    @property
    def resumed(self) -> bool:
        return self.checkpoint_at is not None


# ---------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------

_HEALTHY = (
    RunSpec(
        "healthy-qv-r8",
        "healthy",
        "2 layers, rank 8 on q/v, lr 3e-3, batch 8, 100 steps, warmup then linear decay",
        lr=3e-3,
        steps=100,
    ),
    RunSpec(
        "healthy-deep6",
        "healthy",
        "6 layers, rank 4 on q/v, lr 1e-3, batch 8, 160 steps, cosine",
        layers=6,
        rank=4,
        alpha=8,
        lr=1e-3,
        steps=160,
        schedule="cosine",
        warmup=16,
        seed=1,
    ),
    RunSpec(
        "healthy-all7-b4",
        "healthy",
        "3 layers, rank 8 on all seven projections, lr 1e-3, batch 4, 150 steps, cosine",
        layers=3,
        targets=ALL_PROJ,
        lr=1e-3,
        steps=150,
        batch=4,
        schedule="cosine",
        seed=2,
    ),
    RunSpec(
        "healthy-long-slow",
        "healthy",
        "2 layers, rank 4 on q/v, lr 3e-4, batch 16, 400 steps, constant after warmup",
        rank=4,
        alpha=8,
        lr=3e-4,
        steps=400,
        batch=16,
        schedule="constant",
        warmup=20,
        seed=3,
    ),
    RunSpec(
        "healthy-short",
        "healthy",
        "2 layers, rank 16 on q/v, lr 3e-3, batch 16, 40 steps, constant after warmup",
        rank=16,
        alpha=32,
        lr=3e-3,
        steps=40,
        batch=16,
        schedule="constant",
        warmup=5,
        seed=4,
    ),
    RunSpec(
        "healthy-grad-accum",
        "healthy",
        "3 layers, rank 8 on q/v, lr 1e-3, batch 4 x 4 accumulated, 100 steps, linear",
        layers=3,
        lr=1e-3,
        steps=100,
        batch=4,
        grad_accum=4,
        seed=5,
    ),
    RunSpec(
        "healthy-resumed",
        "healthy",
        "4 layers, rank 8 on q/v, lr 2e-3, 160 steps, cosine; v0001 saved at step 80, "
        "crashed at 95 (torn log), resumed from v0001 in a second log",
        layers=4,
        lr=2e-3,
        steps=160,
        schedule="cosine",
        checkpoint_at=80,
        crash_at=95,
        seed=6,
    ),
    RunSpec(
        "healthy-warm-base",
        "healthy",
        "2 layers, rank 8 on q/v, lr 1e-3, 120 steps, on a base already tuned on the task "
        "(100-step LoRA merged in): modest drop",
        lr=1e-3,
        steps=120,
        warm_start_steps=100,
        seed=7,
    ),
    RunSpec(
        "healthy-no-clip",
        "healthy",
        "4 layers, rank 16 on q/v, lr 1e-3, batch 8, 200 steps, linear, no gradient clipping",
        layers=4,
        rank=16,
        alpha=16,
        lr=1e-3,
        steps=200,
        max_grad_norm=None,
        seed=8,
    ),
    RunSpec(
        "healthy-all7-5l",
        "healthy",
        "5 layers, rank 4 on all seven projections, lr 5e-4, batch 8, 160 steps, cosine",
        layers=5,
        rank=4,
        alpha=8,
        targets=ALL_PROJ,
        lr=5e-4,
        steps=160,
        schedule="cosine",
        warmup=16,
        seed=9,
    ),
)

_FAULTY = (
    RunSpec(
        "too-few-steps",
        "too_few_steps",
        "the healthy-qv-r8 config with max_steps=6 left over from a smoke test",
        lr=3e-3,
        steps=6,
    ),
    RunSpec(
        "lr-too-high-diverge",
        "lr_too_high",
        "AdamW lr 3 (constant after 20 warmup steps) on a base already tuned on the task: "
        "the loss is knocked far above its start and never comes back",
        lr=3.0,
        steps=120,
        schedule="constant",
        warmup=20,
        warm_start_steps=300,
        seed=11,
    ),
    RunSpec(
        "lr-too-high-oscillate",
        "lr_too_high",
        "AdamW lr 30 (constant after 5 warmup steps): the loss keeps swinging up and down "
        "by over a nat, never converging",
        lr=30.0,
        steps=200,
        schedule="constant",
        warmup=5,
    ),
    RunSpec(
        "lr-too-low",
        "lr_too_low",
        "3 layers, rank 8 on q/v, AdamW lr 1e-7: the weights and the loss barely move",
        layers=3,
        lr=1e-7,
        steps=150,
        seed=17,
    ),
    RunSpec(
        "dead-adapter",
        "dead_adapter",
        "lora_B gradients zeroed before every optimizer step: lora_B stays at its zero init, "
        "delta W = 0",
        lr=2e-3,
        steps=120,
        drop_lora_b_grads=True,
        seed=12,
    ),
    RunSpec(
        "nan-losses",
        "nan_losses",
        "batches whose activations overflow at steps 37 and 81 give NaN losses; "
        "a GradScaler skips those updates",
        layers=3,
        lr=2e-3,
        steps=120,
        nan_steps=(37, 81),
        amp_scaler=True,
        seed=13,
    ),
    RunSpec(
        "loss-spikes",
        "loss_spikes",
        "corrupted batches of random tokens at steps 45, 90 and 120 (trained on, not skipped)",
        layers=3,
        lr=2e-3,
        steps=150,
        spike_steps=(45, 90, 120),
        seed=14,
    ),
    RunSpec(
        "exploded-second-moments",
        "exploded_second_moments",
        "5 layers, no clipping: layers 1 and 3 get their LoRA gradients scaled by 1e3 "
        "from step 60 on; the loss stays finite",
        layers=5,
        lr=2e-3,
        steps=150,
        max_grad_norm=None,
        explode_layers=(1, 3),
        explode_from=60,
        seed=15,
    ),
    RunSpec(
        "nan-second-moments",
        "nan_second_moments",
        "an overflowing batch at step 70 with no scaler or NaN guard: NaN gradients reach "
        "AdamW and every exp_avg_sq (and weight) turns NaN",
        lr=2e-3,
        steps=100,
        nan_steps=(70,),
        nan_guard=False,
        seed=16,
    ),
)

#: Every run in the corpus.
CORPUS: tuple[RunSpec, ...] = _HEALTHY + _FAULTY

#: Run name -> label.
LABELS: dict[str, str] = {spec.name: spec.label for spec in CORPUS}


def spec_named(name: str) -> RunSpec:
    """The corpus run called ``name``."""
    for spec in CORPUS:
        if spec.name == name:
            return spec
    raise UsageError(f"no corpus run named {name!r}; known: {', '.join(LABELS)}")


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def _generator(torch: Any, *parts: int) -> Any:
    """A torch generator seeded from several integers (run seed, purpose, epoch ...)."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63)
    return torch.Generator().manual_seed(seed)


def markov_dataset(torch: Any, seed: int) -> tuple[Any, Any]:
    """Train and validation sequences sampled from a small random Markov chain.

    Each of ``_ALPHABET`` states (tokens drawn from the vocabulary) has a few
    likely successors and a little mass on every other state, so the data has
    structure a LoRA adapter can learn and irreducible noise it cannot:
    minibatch losses wobble the way real small-batch fine-tuning does.
    """
    gen = _generator(torch, seed, 1)
    alphabet = torch.randperm(_VOCAB, generator=gen)[:_ALPHABET]
    probs = torch.full((_ALPHABET, _ALPHABET), _SMOOTHING / _ALPHABET)
    for state in range(_ALPHABET):
        successors = torch.randperm(_ALPHABET, generator=gen)[:_SUCCESSORS]
        weights = torch.rand(_SUCCESSORS, generator=gen) + 0.2
        probs[state, successors] += weights / weights.sum() * (1.0 - _SMOOTHING)

    def sample(n: int) -> Any:
        state = torch.randint(0, _ALPHABET, (n,), generator=gen)
        states = [state]
        for _ in range(_SEQ_LEN - 1):
            state = torch.multinomial(probs[state], 1, generator=gen).squeeze(1)
            states.append(state)
        return alphabet[torch.stack(states, dim=1)]

    return sample(_TRAIN_SEQS), sample(_VAL_SEQS)


def _lr_factor(spec: RunSpec) -> Callable[[int], float]:
    """Linear warmup, then linear decay / cosine decay to zero, or constant."""
    total, warmup = spec.total_steps, max(1, spec.warmup)

    def factor(done: int) -> float:
        warm = min(1.0, (done + 1) / warmup)
        if spec.schedule == "constant":
            return warm
        progress = min(1.0, done / total)
        if spec.schedule == "cosine":
            return warm * 0.5 * (1.0 + math.cos(math.pi * progress))
        return warm * (1.0 - progress)

    return factor


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class CorpusRun(TinyRun):
    """A :class:`~realruns.dlm.TinyRun` that trains on minibatches and can go wrong.

    ``train_ids`` holds the whole training set; each optimizer step draws
    ``grad_accum`` minibatches of ``spec.batch`` sequences from a per-epoch
    shuffle, so a resumed run sees the same batches as the run it continues.
    """

    spec: RunSpec
    lora_b: list[Any] = field(default_factory=list)  # every lora_B weight
    exploding: list[Any] = field(default_factory=list)  # LoRA weights of explode_layers
    _order_epoch: int = field(default=-1, init=False, repr=False)  # epoch of _order
    _order: Any = field(default=None, init=False, repr=False)  # that epoch's shuffle

    @property
    def epoch(self) -> float:
        """Passes over the training set so far (fractional)."""
        seen = self.global_step * self.spec.batch * self.spec.grad_accum
        return seen / _TRAIN_SEQS

    def _minibatch(self, torch: Any, step: int, micro: int) -> Any:
        spec = self.spec
        first = ((step - 1) * spec.grad_accum + micro) * spec.batch
        epoch, offset = divmod(first, _TRAIN_SEQS)
        if epoch != self._order_epoch:
            gen = _generator(torch, spec.seed, 2, epoch)
            self._order = torch.randperm(_TRAIN_SEQS, generator=gen)
            self._order_epoch = epoch
        return self.train_ids[self._order[offset : offset + spec.batch]]

    def _corrupt_batch(self, torch: Any, step: int) -> Any:
        """Uniformly random tokens over the whole vocabulary: a broken data shard."""
        gen = _generator(torch, self.spec.seed, 3, step)
        return torch.randint(0, _VOCAB, (self.spec.batch, _SEQ_LEN), generator=gen)

    def _one_step(self, torch: Any) -> dict[str, Any]:
        spec, step = self.spec, self.global_step
        lr = float(self.optimizer.param_groups[0]["lr"])
        losses = []
        for micro in range(spec.grad_accum):
            if step in self.spike_steps:
                batch = self._corrupt_batch(torch, step)
            else:
                batch = self._minibatch(torch, step, micro)
            if step in self.nan_steps:
                loss = self._poisoned_loss(torch, batch)
            else:
                loss = self.model(input_ids=batch, labels=batch).loss
            scaled = loss / spec.grad_accum
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            scaled.backward()
            losses.append(loss.detach())
        loss = torch.stack(losses).mean()

        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if spec.drop_lora_b_grads:
            for param in self.lora_b:
                param.grad.zero_()
        if self.exploding and step >= spec.explode_from:
            for param in self.exploding:
                param.grad.mul_(spec.explode_factor)
        if spec.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, spec.max_grad_norm)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self.trainable])
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif not spec.nan_guard or (torch.isfinite(loss) and torch.isfinite(grad_norm)):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

        val_loss = self._evaluate(torch, step, every=_EVAL_EVERY)
        tokens = spec.batch * spec.grad_accum * _SEQ_LEN
        return {
            "type": "step",
            "step": step,
            "loss": float(loss),
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens_per_sec": tokens / SECONDS_PER_STEP,
            "val_loss": val_loss,
            "timestamp": _stamp(self.clock(step)),
        }


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def _peft_model(torch: Any, spec: RunSpec, base: Any) -> Any:
    peft = require("peft", "peft")
    torch.manual_seed(spec.seed + 7)  # lora_A's init draws from the global generator
    config = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets))
    return peft.get_peft_model(base, config)


def _base_model(torch: Any, spec: RunSpec) -> Any:
    """The frozen base: random from a config, or already tuned on the task (warm start).

    A warm start trains a LoRA adapter of the run's shape at ``warm_start_lr``
    for ``warm_start_steps`` on another shuffle of the same chain, then merges
    it into the weights, as when one fine-tunes a model that was already tuned
    on similar data.
    """
    base = tiny_llama(
        spec.seed,
        hidden=_HIDDEN,
        layers=spec.layers,
        vocab=_VOCAB,
        max_positions=2 * _SEQ_LEN,
        initializer_range=_INIT_RANGE,
    )
    if spec.warm_start_steps == 0:
        return base
    earlier = RunSpec(
        f"{spec.name}-earlier",
        "healthy",
        "the earlier tuning merged into the base",
        layers=spec.layers,
        rank=spec.rank,
        alpha=spec.alpha,
        targets=spec.targets,
        lr=spec.warm_start_lr,
        steps=spec.warm_start_steps,
        batch=spec.batch,
        seed=spec.seed + 1000,
        data_seed=spec.chain_seed,
    )
    run = _new_run(torch, earlier, _peft_model(torch, earlier, base), DEFAULT_START)
    run.train_until(earlier.steps)
    return run.model.merge_and_unload()


def _new_run(torch: Any, spec: RunSpec, model: Any, started: datetime) -> CorpusRun:
    train_ids, val_ids = markov_dataset(torch, spec.chain_seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.lr, weight_decay=_WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(spec))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    layer_marks = tuple(f".layers.{i}." for i in spec.explode_layers)
    return CorpusRun(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler("cpu") if spec.amp_scaler else None,
        train_ids=train_ids,
        val_ids=val_ids,
        corrupt_ids=None,
        seed=spec.seed,
        layers=spec.layers,
        total_steps=spec.total_steps,
        spike_steps=frozenset(spec.spike_steps),
        nan_steps=frozenset(spec.nan_steps),
        started=started,
        lr=spec.lr,
        spec=spec,
        lora_b=[p for n, p in zip(names, params, strict=True) if ".lora_B." in n],
        exploding=[
            p for n, p in zip(names, params, strict=True) if any(m in n for m in layer_marks)
        ],
    )


def build_run(spec: RunSpec, *, started: datetime = DEFAULT_START) -> CorpusRun:
    """A fresh run for ``spec`` at step 0 (same spec, same model, data and batches)."""
    torch = require("torch", "peft")
    with single_thread(torch):
        model = _peft_model(torch, spec, _base_model(torch, spec))
        return _new_run(torch, spec, model, started)


def resume_run(spec: RunSpec, version_dir: Path, *, started: datetime) -> CorpusRun:
    """A new process picking ``spec`` up from a saved version, as a resumed trainer does."""
    torch = require("torch", "peft")
    peft = require("peft", "peft")
    safetensors_torch = require("safetensors.torch", "torch")
    run = build_run(spec, started=started)
    weights = safetensors_torch.load_file(str(version_dir / "adapter_model.safetensors"))
    peft.set_peft_model_state_dict(run.model, weights)
    state = torch.load(version_dir / "training_state.pt", weights_only=True)
    run.optimizer.load_state_dict(state["optimizer_state_dict"])
    run.scheduler.load_state_dict(state["scheduler_state_dict"])
    torch.set_rng_state(state["torch_rng_state"])
    run.global_step = run.first_step = int(state["global_step"])
    run.best_val_loss = state["best_val_loss"]
    return run


def training_plan(spec: RunSpec) -> dict[str, Any]:
    """The run's configuration as dlm's banner ``plan`` records it.

    Only what a trainer's config would say: faults (dropped or scaled
    gradients, bad batches) are never visible here, as in real life.
    """
    return {
        "base_model": {
            "arch": "LlamaForCausalLM",
            "hidden_size": _HIDDEN,
            "num_hidden_layers": spec.layers,
            "vocab_size": _VOCAB,
            "source": "config+merged-adapter" if spec.warm_start_steps else "config",
        },
        "lora": {"r": spec.rank, "lora_alpha": spec.alpha, "target_modules": list(spec.targets)},
        "optimizer": {
            "type": "adamw",
            "lr": spec.lr,
            "weight_decay": _WEIGHT_DECAY,
            "max_grad_norm": spec.max_grad_norm,
        },
        "schedule": {"type": spec.schedule, "warmup_steps": spec.warmup},
        "eval": {"every": _EVAL_EVERY, "sequences": _VAL_SEQS},
        "data": {
            "batch": spec.batch,
            "grad_accum": spec.grad_accum,
            "seq_len": _SEQ_LEN,
            "train_sequences": _TRAIN_SEQS,
            "full_batch": False,
        },
        "total_steps": spec.total_steps,
        "amp_scaler": spec.amp_scaler,
    }


_NOTES = (
    "cpu, one thread, minibatches from per-epoch shuffles of a fixed synthetic dataset",
    "timestamps and tokens_per_sec come from a simulated clock",
)


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def _start_of(spec: RunSpec) -> datetime:
    index = next(i for i, s in enumerate(CORPUS) if s.name == spec.name)
    return DEFAULT_START + index * _RUN_GAP


def write_run(store: Path, spec: RunSpec, *, started: datetime = DEFAULT_START) -> CorpusRun:
    """Train ``spec`` and write its store into the (empty) directory ``store``.

    Returns the run that wrote the current version.
    """
    plan = training_plan(spec)
    log: dict[str, Any] = {"seed": spec.seed, "plan": plan, "notes": _NOTES}
    run = build_run(spec, started=started)
    if not spec.resumed:
        run.train_until(spec.steps)
        write_adapter_version(store, 1, run, plan=plan)
        write_log(store, 1, run.records, started=started, **log)
        return run
    assert spec.checkpoint_at is not None and spec.crash_at is not None
    run.train_until(spec.checkpoint_at)
    checkpoint = write_adapter_version(store, 1, run, plan=plan)
    run.train_until(spec.crash_at)
    # Killed while writing the crash step's line: the log ends torn.
    write_log(store, 1, run.records, started=started, complete=False, torn_tail=True, **log)
    restarted = run.clock(spec.crash_at) + _RESUME_GAP
    again = resume_run(spec, checkpoint, started=restarted)
    again.train_until(spec.steps)
    write_adapter_version(store, 2, again, plan=plan)
    write_log(store, 2, again.records, started=restarted, **log)
    return again


def write_corpus(
    root: str | os.PathLike[str], *, names: Iterable[str] | None = None
) -> dict[str, Path]:
    """Write one dlm store per corpus run under ``root/<name>/`` plus ``root/labels.json``.

    ``names`` picks a subset (default: every run). A run's bytes do not depend
    on which others are written. Each store is built in a staging directory
    and renamed into place; existing stores are never overwritten.
    ``labels.json`` lists every corpus store found under ``root`` afterwards.
    """
    root = Path(root)
    chosen = list(LABELS) if names is None else list(dict.fromkeys(names))
    specs = [spec_named(name) for name in chosen]
    root.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        if (root / spec.name).exists():
            raise UsageError(f"store already exists, refusing to overwrite: {root / spec.name}")
    written: dict[str, Path] = {}
    for spec in specs:
        staging = Path(tempfile.mkdtemp(prefix=".corpus-", dir=root))
        try:
            store = staging / spec.name
            store.mkdir()
            write_run(store, spec, started=_start_of(spec))
            os.rename(store, root / spec.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        written[spec.name] = root / spec.name
    # labels.json describes every corpus store under root, also ones an earlier call wrote.
    present = [s for s in CORPUS if (root / s.name).is_dir()]
    labels = {s.name: {"label": s.label, "what": s.what} for s in present}
    atomic_write_text(root / "labels.json", json.dumps(labels, indent=2, sort_keys=True) + "\n")
    return written


def logged_steps(store: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Step -> step record over the store's logs in name order (a later file wins,
    as after a resume); a torn last line is skipped."""
    steps: dict[int, dict[str, Any]] = {}
    for path in sorted((Path(store) / "logs").glob("train-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("type") == "step":
                steps[int(record["step"])] = record
    return dict(sorted(steps.items()))


def summarize(store: str | os.PathLike[str]) -> dict[str, Any]:
    """Label, last step and first/last logged loss of a corpus store (for listings)."""
    steps = logged_steps(store)
    losses = [float(r["loss"]) for r in steps.values()]
    return {
        "name": Path(store).name,
        "label": spec_named(Path(store).name).label,
        "steps": max(steps),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
