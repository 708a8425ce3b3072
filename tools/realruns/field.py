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
from pathlib import Path
from typing import Any

from adapterprobe._fs import atomic_write_text
from adapterprobe.errors import UsageError, require
from realruns.corpus import markov_dataset
from realruns.dlm import single_thread
from realruns.field_runs import (  # noqa: F401  (re-exported: the corpus's names)
    ACTIVATIONS,
    ADAM,
    ALL_LABELS,
    CHAIN_SEQS,
    EVAL_LOSS,
    FAULTS,
    FIELD,
    GRAD_NORM,
    LABELS,
    LABELS_FILE,
    LORA_B,
    LOSS,
    LR,
    OBJECTIVES,
    STEPS,
    TB_LOSS,
    VOCAB,
    WEIGHTS,
    FieldRun,
    run_named,
)
from realruns.tiny import tiny_gpt2, tiny_llama

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
    """``CHAIN_SEQS`` sequences of length ``seq_len``, a mix of easy and hard ones.

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
        [t for t in torch.randperm(VOCAB, generator=gen).tolist() if t not in used]
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
    eval_ids = chain[CHAIN_SEQS - run.eval_seqs :]
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
            run.seed, hidden=run.hidden, layers=run.layers, vocab=VOCAB, initializer_range=0.12
        )
        targets = ["c_attn", "c_proj"]
    else:
        base = tiny_llama(
            run.seed,
            hidden=run.hidden,
            layers=run.layers,
            vocab=VOCAB,
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
