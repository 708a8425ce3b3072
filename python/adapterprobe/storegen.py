"""Generate real dlm-layout stores by actually training a tiny LoRA adapter.

Tests, benchmarks and the bundled demo need stores that look exactly like what
the dlm trainer writes: a PEFT adapter, a ``torch.save``'d optimizer snapshot
and JSONL loss logs.  Hand-faking those files would only test our own idea of
the format, so this module trains a tiny ``LlamaForCausalLM`` (built from a
config, nothing downloaded) with PEFT LoRA + AdamW and writes the real thing.

Everything is deterministic for a given seed and environment: full-batch
training on a fixed synthetic dataset (minibatch noise would look like loss
spikes), and timestamps/throughput come from a simulated clock rather than the
wall clock, so rerunning the generator reproduces the same bytes.

torch, transformers and peft are imported inside the functions that need
them: importing this module (or ``adapterprobe``) never pulls in torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from adapterprobe.errors import UsageError, require

#: Payload format version dlm writes into ``_state_sidecar_version``.
STATE_SIDECAR_VERSION = 2

#: Simulated wall-clock seconds per optimizer step (timestamps, tokens/s).
SECONDS_PER_STEP = 2

#: Scenarios :func:`write_store` knows, in the order the demo lists them.
SCENARIOS = ("healthy", "smoke", "spiky", "resumed", "multi")

#: Fixed start of the first run of every generated store (UTC).
DEFAULT_START = datetime(2025, 3, 1, 9, 0, 0, tzinfo=timezone.utc)

# Tiny-model and data shape. A 0.06 init range (rather than transformers'
# 0.02) gives the frozen random base enough gain for rank-4 LoRA on q/v to
# cut the loss by more than half within ~80 full-batch steps.
_HIDDEN = 64
_VOCAB = 128
_INIT_RANGE = 0.06
_SEQ_LEN = 32
_BATCH = 8
_ALPHABET = 8  # the training text uses only this many distinct tokens
_WARMUP_STEPS = 5
_EVAL_EVERY = 10
_MAX_GRAD_NORM = 1.0
_TARGET_MODULES = ("q_proj", "v_proj")


@dataclass
class TinyRun:
    """A training run in progress: model, optimizer and the log records so far.

    Kept as one object so a run can be stopped (to checkpoint, or to simulate a
    crash) and continued with :meth:`train_until`.
    """

    model: Any  # peft.PeftModel
    optimizer: Any  # torch.optim.AdamW
    scheduler: Any  # torch.optim.lr_scheduler.LambdaLR
    scaler: Any | None  # torch.amp.GradScaler when AMP-style loss scaling is on
    train_ids: Any  # LongTensor (batch, seq): the whole training set, one batch
    val_ids: Any  # LongTensor: held-out batch for val_loss
    corrupt_ids: Any  # LongTensor: the garbage batch fed on spike steps
    seed: int
    layers: int
    total_steps: int
    spike_steps: frozenset[int] = frozenset()
    nan_steps: frozenset[int] = frozenset()
    global_step: int = 0
    best_val_loss: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    started: datetime = DEFAULT_START

    @property
    def epoch(self) -> float:
        """Full-batch training: every optimizer step is one pass over the data."""
        return float(self.global_step)

    @property
    def trainable(self) -> list[Any]:
        """Trainable parameters in PEFT registration order (layer-major, A before B)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def train_until(self, step: int) -> list[dict[str, Any]]:
        """Run optimizer steps up to ``step`` (inclusive); return the new log records."""
        torch = require("torch", "peft")
        if step > self.total_steps:
            raise UsageError(
                f"cannot train to step {step}: the schedule ends at {self.total_steps}"
            )
        new: list[dict[str, Any]] = []
        self.model.train()
        while self.global_step < step:
            self.global_step += 1
            record = self._one_step(torch)
            self.records.append(record)
            new.append(record)
        return new

    def _one_step(self, torch: Any) -> dict[str, Any]:
        step = self.global_step
        lr = float(self.optimizer.param_groups[0]["lr"])
        batch = self.corrupt_ids if step in self.spike_steps else self.train_ids
        if step in self.nan_steps:
            loss = self._poisoned_loss(torch, batch)
        else:
            loss = self.model(input_ids=batch, labels=batch).loss

        if self.scaler is not None:
            # AMP-style: the scaler unscales, finds the inf/NaN gradients of a
            # poisoned step and skips optimizer.step for it.
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, _MAX_GRAD_NORM)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, _MAX_GRAD_NORM)
            if torch.isfinite(loss) and torch.isfinite(grad_norm):
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

        val_loss = None
        if step % _EVAL_EVERY == 0:
            val_loss = self._val_loss(torch)
            if math.isfinite(val_loss) and (
                self.best_val_loss is None or val_loss < self.best_val_loss
            ):
                self.best_val_loss = val_loss
        tokens = int(batch.numel())
        return {
            "type": "step",
            "step": step,
            "loss": float(loss.detach()),
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens_per_sec": tokens / SECONDS_PER_STEP,
            "val_loss": val_loss,
            "timestamp": _stamp(self.started + timedelta(seconds=SECONDS_PER_STEP * step)),
        }

    def _poisoned_loss(self, torch: Any, batch: Any) -> Any:
        """Forward a batch whose first embedding overflowed (as fp16 can): loss is NaN."""
        embeds = self.model.get_input_embeddings()(batch).clone()
        embeds[0, 0, 0] = math.inf
        return self.model(inputs_embeds=embeds, labels=batch).loss

    def _val_loss(self, torch: Any) -> float:
        self.model.eval()
        with torch.no_grad():
            value = float(self.model(input_ids=self.val_ids, labels=self.val_ids).loss)
        self.model.train()
        return value


def _stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _lr_factor(total_steps: int) -> Any:
    """Linear warmup then linear decay to zero, as transformers' default schedule."""

    def factor(done: int) -> float:
        warm = min(1.0, (done + 1) / _WARMUP_STEPS)
        return warm * max(0.0, 1.0 - done / total_steps)

    return factor


def _synthetic_batches(torch: Any, seed: int) -> tuple[Any, Any, Any]:
    """Train/val/corrupt token batches: cyclic runs over a small token alphabet.

    The pattern is learnable by a rank-4 adapter; the corrupt batch is uniform
    noise over the whole vocabulary, so a step fed with it logs a loss spike.
    """
    gen = torch.Generator().manual_seed(seed + 1)
    alphabet = torch.randperm(_VOCAB, generator=gen)[:_ALPHABET]
    offsets = torch.arange(_SEQ_LEN)

    def cyclic(n: int) -> Any:
        starts = torch.randint(0, _ALPHABET, (n, 1), generator=gen)
        return alphabet[(starts + offsets) % _ALPHABET]

    train = cyclic(_BATCH)
    val = cyclic(_BATCH)
    corrupt = torch.randint(0, _VOCAB, (_BATCH, _SEQ_LEN), generator=gen)
    return train, val, corrupt


def build_tiny_peft_model(*, seed: int = 0, layers: int = 2) -> Any:
    """The tiny Llama + LoRA(q_proj, v_proj) model; same seed, same base weights."""
    torch = require("torch", "peft")
    transformers = require("transformers", "peft")
    peft = require("peft", "peft")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=_HIDDEN,
        intermediate_size=2 * _HIDDEN,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=_VOCAB,
        max_position_embeddings=2 * _SEQ_LEN,
        initializer_range=_INIT_RANGE,
    )
    base = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(_TARGET_MODULES))
    return peft.get_peft_model(base, lora)


def train_tiny_lora(
    *,
    steps: int,
    seed: int = 0,
    lr: float = 1e-2,
    layers: int = 2,
    total_steps: int | None = None,
    spike_steps: Iterable[int] = (),
    nan_steps: Iterable[int] = (),
    amp_scaler: bool = False,
    resume_from: str | os.PathLike[str] | None = None,
    started: datetime = DEFAULT_START,
) -> TinyRun:
    """Train a tiny LoRA adapter for ``steps`` full-batch AdamW steps.

    ``total_steps`` is the schedule horizon (defaults to ``steps``): stopping
    earlier leaves a run that :meth:`TinyRun.train_until` can continue.
    ``spike_steps`` feed a batch of random tokens (the logged loss jumps);
    ``nan_steps`` feed a batch whose activations overflow (loss NaN, the
    optimizer update is skipped as a grad scaler would). ``amp_scaler`` uses a
    real ``torch.amp.GradScaler`` so the state carries a scaler dict.
    ``resume_from`` is an adapter version directory written by
    :func:`write_adapter_version`: its weights, optimizer, scheduler, scaler and
    RNG state are loaded back, as a resumed trainer does; ``lr`` then replaces
    the saved peak learning rate.
    """
    if steps < 1:
        raise UsageError(f"steps must be >= 1, got {steps}")
    torch = require("torch", "peft")
    horizon = steps if total_steps is None else total_steps
    if horizon < steps:
        raise UsageError(f"total_steps={horizon} is shorter than steps={steps}")
    model = build_tiny_peft_model(seed=seed, layers=layers)
    train_ids, val_ids, corrupt_ids = _synthetic_batches(torch, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(horizon))
    scaler = torch.amp.GradScaler("cpu") if amp_scaler else None
    run = TinyRun(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        train_ids=train_ids,
        val_ids=val_ids,
        corrupt_ids=corrupt_ids,
        seed=seed,
        layers=layers,
        total_steps=horizon,
        spike_steps=frozenset(spike_steps),
        nan_steps=frozenset(nan_steps),
        started=started,
    )
    if resume_from is not None:
        _restore(run, Path(resume_from), lr=lr)
    run.train_until(steps)
    return run


def _restore(run: TinyRun, version_dir: Path, *, lr: float) -> None:
    """Load a saved version back into a freshly built run (the resume path)."""
    torch = require("torch", "peft")
    peft = require("peft", "peft")
    safetensors_torch = require("safetensors.torch", "torch")
    weights = safetensors_torch.load_file(str(version_dir / "adapter_model.safetensors"))
    peft.set_peft_model_state_dict(run.model, weights)
    state = torch.load(version_dir / "training_state.pt", weights_only=True)
    run.optimizer.load_state_dict(state["optimizer_state_dict"])
    run.scheduler.load_state_dict(state["scheduler_state_dict"])
    if run.scaler is not None and state["scaler_state_dict"] is not None:
        run.scaler.load_state_dict(state["scaler_state_dict"])
    torch.set_rng_state(state["torch_rng_state"])
    run.global_step = int(state["global_step"])
    run.best_val_loss = state["best_val_loss"]
    # A resumed run may change its peak learning rate; re-derive the current
    # one from the schedule so the first resumed step already uses it.
    factor = _lr_factor(run.total_steps)(run.global_step)
    run.scheduler.base_lrs = [lr for _ in run.optimizer.param_groups]
    for group in run.optimizer.param_groups:
        group["initial_lr"] = lr
        group["lr"] = lr * factor
    run.scheduler._last_lr = [lr * factor for _ in run.optimizer.param_groups]


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _staging_dir(parent: Path) -> Iterator[Path]:
    """A temporary directory next to the destination, removed on the way out.

    Files are written inside it and then renamed into place, so a reader never
    sees a half-written file and a failed write leaves nothing behind.
    """
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".storegen-", dir=parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_text_atomic(path: Path, text: str) -> None:
    with _staging_dir(path.parent) as tmp:
        staged = tmp / path.name
        with staged.open("w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(staged, path)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pinned_versions() -> dict[str, str | None]:
    """Versions of the training stack, as dlm records them (None: not installed)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("torch", "transformers", "peft", "safetensors", "bitsandbytes"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def save_training_state(
    path: str | os.PathLike[str],
    optimizer: Any,
    *,
    global_step: int,
    epoch: float,
    best_val_loss: float | None,
    use_qlora: bool,
    scheduler: Any | None = None,
    scaler: Any | None = None,
    rng_state: Any | None = None,
    dlm_manifest_hash: str | None = None,
    base_model_revision: str = "tiny-llama-from-config",
    versions: dict[str, str | None] | None = None,
) -> str:
    """Write dlm's ``training_state.pt`` (format version 2) and its ``.sha256`` sidecar.

    Both files are staged in a temporary directory beside ``path`` and renamed
    into place, the state first, so an existing sidecar never vouches for a
    half-written state. The staged file already carries its final name, which
    ``torch.save`` uses as the archive's internal prefix (``training_state/``),
    just as when dlm saves it. Returns the hex digest.
    """
    torch = require("torch", "torch")
    path = Path(path)
    payload = {
        "_state_sidecar_version": STATE_SIDECAR_VERSION,
        "optimizer_state_dict": optimizer.state_dict(),
        "scheduler_state_dict": scheduler.state_dict() if scheduler is not None else {},
        "scaler_state_dict": scaler.state_dict() if scaler is not None else None,
        "torch_rng_state": torch.get_rng_state() if rng_state is None else rng_state,
        "cuda_rng_state": None,
        "global_step": int(global_step),
        "epoch": float(epoch),
        "best_val_loss": None if best_val_loss is None else float(best_val_loss),
        "dlm_manifest_hash": dlm_manifest_hash,
        "base_model_revision": base_model_revision,
        "pinned_versions": pinned_versions() if versions is None else dict(versions),
        "use_qlora": bool(use_qlora),
    }
    with _staging_dir(path.parent) as tmp:
        staged = tmp / path.name
        torch.save(payload, staged)
        digest = _sha256_file(staged)
        sidecar = tmp / (path.name + ".sha256")
        sidecar.write_text(digest + "\n", encoding="ascii")
        os.replace(staged, path)
        os.replace(sidecar, path.with_name(path.name + ".sha256"))
    return digest
