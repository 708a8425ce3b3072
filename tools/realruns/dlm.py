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
them, so importing this module does not pull in torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from adapterprobe._fs import atomic_write_text
from adapterprobe.errors import UsageError, require
from realruns.tiny import tiny_llama

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
    first_step: int = 0  # global_step when this process started (non-zero after a resume)
    lr: float = 1e-2
    use_qlora: bool = False

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
        with _single_thread(torch):
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

        val_loss = self._evaluate(torch, step, every=_EVAL_EVERY)
        tokens = int(batch.numel())
        return {
            "type": "step",
            "step": step,
            "loss": float(loss.detach()),
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens_per_sec": tokens / SECONDS_PER_STEP,
            "val_loss": val_loss,
            "timestamp": _stamp(self.clock(step)),
        }

    def clock(self, step: int) -> datetime:
        """Simulated time at which ``step`` finished (the run starts at ``started``)."""
        return self.started + timedelta(seconds=SECONDS_PER_STEP * (step - self.first_step))

    def _poisoned_loss(self, torch: Any, batch: Any) -> Any:
        """Forward a batch whose first embedding overflowed (as fp16 can): loss is NaN."""
        embeds = self.model.get_input_embeddings()(batch).clone()
        embeds[0, 0, 0] = math.inf
        return self.model(inputs_embeds=embeds, labels=batch).loss

    def _evaluate(self, torch: Any, step: int, *, every: int) -> float | None:
        """The validation loss on every `every`-th step (None between), and
        the best one so far kept in ``best_val_loss``."""
        if step % every:
            return None
        val_loss = self._val_loss(torch)
        if math.isfinite(val_loss) and (
            self.best_val_loss is None or val_loss < self.best_val_loss
        ):
            self.best_val_loss = val_loss
        return val_loss

    def _val_loss(self, torch: Any) -> float:
        self.model.eval()
        with torch.no_grad():
            value = float(self.model(input_ids=self.val_ids, labels=self.val_ids).loss)
        self.model.train()
        return value


@contextlib.contextmanager
def _single_thread(torch: Any) -> Iterator[None]:
    """Run torch on one thread: the matrices are tiny, so extra threads only spin,
    and a fixed thread count keeps float reductions (hence the stores) identical
    on machines with different core counts."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


#: Public name for corpus builders that train outside :meth:`TinyRun.train_until`.
single_thread = _single_thread


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
    peft = require("peft", "peft")
    base = tiny_llama(
        seed,
        hidden=_HIDDEN,
        layers=layers,
        vocab=_VOCAB,
        max_positions=2 * _SEQ_LEN,
        initializer_range=_INIT_RANGE,
    )
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
        lr=lr,
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
    run.first_step = run.global_step
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


def training_plan(run: TinyRun) -> dict[str, Any]:
    """The run's settings in the shape of dlm's banner ``plan`` (free-form, nested).

    ``eval`` deliberately carries a nested ``"type": "step"``: only a line's
    top-level ``type`` makes it a step record, and readers must not be fooled.
    """
    return {
        "base_model": {
            "arch": "LlamaForCausalLM",
            "hidden_size": _HIDDEN,
            "num_hidden_layers": run.layers,
            "vocab_size": _VOCAB,
            "source": "config",
        },
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": list(_TARGET_MODULES)},
        "optimizer": {"type": "adamw", "lr": run.lr, "max_grad_norm": _MAX_GRAD_NORM},
        "schedule": {"type": "linear", "warmup_steps": _WARMUP_STEPS},
        "eval": {"type": "step", "every": _EVAL_EVERY},
        "data": {"batch": _BATCH, "seq_len": _SEQ_LEN, "full_batch": True},
        "total_steps": run.total_steps,
        "amp_scaler": run.scaler is not None,
    }


def _plan_hash(plan: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


def _adapter_root(store: Path, name: str | None) -> Path:
    return store / "adapter" if name is None else store / "adapter" / name


def write_adapter_version(
    store: str | os.PathLike[str],
    version: int,
    run: TinyRun,
    *,
    name: str | None = None,
    plan: dict[str, Any] | None = None,
) -> Path:
    """Write ``adapter/[<name>/]versions/vNNNN/`` from a run and point ``current.txt`` at it.

    The directory holds PEFT's own ``save_pretrained`` output (weights and
    config; its generated README is dropped, dlm keeps none), the training
    state with its sidecar, and ``training_run.json``. It is assembled in a
    staging directory and renamed into place; an existing version is never
    overwritten. ``plan`` (default :func:`training_plan`) is the run's
    configuration whose hash goes into ``dlm_manifest_hash``.
    """
    if version < 1:
        raise UsageError(f"adapter versions start at 1, got {version}")
    root = _adapter_root(Path(store), name)
    label = f"v{version:04d}"
    final = root / "versions" / label
    if final.exists():
        raise UsageError(f"adapter version already exists, refusing to overwrite: {final}")
    plan = training_plan(run) if plan is None else plan
    with _staging_dir(final.parent) as tmp:
        staged = tmp / label
        run.model.save_pretrained(str(staged))
        (staged / "README.md").unlink(missing_ok=True)
        _sort_target_modules(staged / "adapter_config.json")
        save_training_state(
            staged / "training_state.pt",
            run.optimizer,
            global_step=run.global_step,
            epoch=run.epoch,
            best_val_loss=run.best_val_loss,
            use_qlora=run.use_qlora,
            scheduler=run.scheduler,
            scaler=run.scaler,
            dlm_manifest_hash=_plan_hash(plan),
        )
        run_info = json.dumps({"use_qlora": run.use_qlora}, sort_keys=True)
        (staged / "training_run.json").write_text(run_info + "\n", encoding="utf-8")
        os.rename(staged, final)
    atomic_write_text(root / "current.txt", f"versions/{label}")
    return final


def _sort_target_modules(config_path: Path) -> None:
    """PEFT keeps ``target_modules`` as a set, so its JSON order follows the string
    hash seed; sort it (same content, PEFT's own formatting) for reproducible bytes."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")


_FULL_BATCH_NOTES = (
    "cpu, full-batch training on a fixed synthetic dataset",
    "timestamps and tokens_per_sec come from a simulated clock",
)


def log_file_name(run_id: int, started: datetime) -> str:
    """``train-<run_id:06d>-<UTC YYYYMMDDTHHMMSS>.jsonl``: sorted names are chronological."""
    stamp = started.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"train-{run_id:06d}-{stamp}.jsonl"


def write_log(
    store: str | os.PathLike[str],
    run_id: int,
    records: Sequence[dict[str, Any]],
    *,
    started: datetime = DEFAULT_START,
    seed: int = 0,
    plan: dict[str, Any] | None = None,
    complete: bool = True,
    torn_tail: bool = False,
    notes: Sequence[str] | None = None,
) -> Path:
    """Write one run's JSONL log under ``logs/`` the way dlm does.

    A banner line, one ``json.dumps(record, sort_keys=True)`` line per record
    (a NaN loss stays the bare ``NaN`` token), then a ``run_complete`` event
    unless ``complete`` is false (a crashed run). ``torn_tail`` cuts the last
    line in half and drops its newline, as a trainer killed mid-write leaves it.
    ``notes`` replaces the banner's ``determinism_notes`` (default: full-batch).
    """
    if started.tzinfo is None:
        raise UsageError("write_log needs a timezone-aware start time (log names are UTC)")
    banner = {
        "type": "banner",
        "run_id": run_id,
        "seed": seed,
        "determinism_class": "strict",
        "determinism_notes": list(_FULL_BATCH_NOTES if notes is None else notes),
        "pinned_versions": pinned_versions(),
        "plan": plan if plan is not None else {},
    }
    lines = [json.dumps(banner, sort_keys=True)]
    lines += [json.dumps(dict(rec), sort_keys=True) for rec in records]
    if complete and records:
        last = records[-1]
        finished = datetime.strptime(last["timestamp"], "%Y-%m-%dT%H:%M:%S")
        event = {
            "type": "run_complete",
            "timestamp": _stamp(finished.replace(tzinfo=timezone.utc) + timedelta(seconds=1)),
            "global_step": last["step"],
            "final_loss": last["loss"],
        }
        lines.append(json.dumps(event, sort_keys=True))
    text = "\n".join(lines) + "\n"
    if torn_tail:
        head, last_line = "\n".join(lines[:-1]), lines[-1]
        text = head + "\n" + last_line[: len(last_line) // 2]
    path = Path(store) / "logs" / log_file_name(run_id, started)
    atomic_write_text(path, text)
    return path


# ---------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------

#: What the two probes should say on each scenario's store (current adapter).
EXPECTED_VERDICTS: dict[str, dict[str, str]] = {
    "healthy": {"training_drift": "pass", "gradient_ghost": "pass"},
    "smoke": {"training_drift": "skip", "gradient_ghost": "fail"},
    "spiky": {"training_drift": "warn", "gradient_ghost": "pass"},
    "resumed": {"training_drift": "pass", "gradient_ghost": "pass"},
    "multi": {"training_drift": "pass", "gradient_ghost": "pass"},
}

#: Demo store directory name -> scenario, as bundled in ``adapterprobe/demo_store``.
DEMO_STORES: dict[str, str] = {
    "healthy": "healthy",
    "smoke-test": "smoke",
    "spiky-nan": "spiky",
    "resumed-torn": "resumed",
}

#: Multi-adapter scenario: adapter name -> (seed offset, layers).
MULTI_ADAPTERS: dict[str, tuple[int, int]] = {"chat": (0, 2), "code": (2, 2)}

HEALTHY_STEPS = 80
SMOKE_STEPS = 5
SPIKE_STEPS = (25, 50)
NAN_STEPS = (65,)
RESUME_CHECKPOINT = 30  # run 1 saves v0001 here ...
RESUME_CRASH = 40  # ... and dies while writing this step's log line
RESUME_LR = 5e-3  # run 2 resumes from v0001 with a lower peak learning rate
_RESUME_GAP = timedelta(minutes=10)


def write_store(
    root: str | os.PathLike[str],
    scenario: str,
    *,
    seed: int = 0,
    started: datetime = DEFAULT_START,
) -> Path:
    """Train and write one complete store for ``scenario`` (see :data:`SCENARIOS`).

    - ``healthy``: 80 smooth steps; both probes pass.
    - ``smoke``: 5 steps; too short for the drift probe, far below the
      gradient probe's 50-step floor.
    - ``spiky``: 80 steps under a real grad scaler, with garbage batches at
      steps 25 and 50 (loss spikes) and an overflowing batch at step 65 (NaN
      loss, update skipped).
    - ``resumed``: run 1 checkpoints v0001 at step 30 and crashes at step 40
      with a torn last log line; run 2 resumes from v0001 at a lower learning
      rate, repeats steps 31-40 and finishes as v0002 (``current.txt``).
    - ``multi``: two named adapters (``adapter/chat``, ``adapter/code``), one
      run each.

    The store is built in a staging directory and renamed to ``root``, which
    must not exist yet.
    """
    if scenario not in SCENARIOS:
        raise UsageError(f"unknown store scenario {scenario!r}; expected one of {SCENARIOS}")
    root = Path(root)
    if root.exists():
        raise UsageError(f"store directory already exists, refusing to overwrite: {root}")
    with _staging_dir(root.parent) as tmp:
        store = tmp / root.name
        store.mkdir()
        _SCENARIO_WRITERS[scenario](store, seed, started)
        os.rename(store, root)
    return root


def _single_run(store: Path, seed: int, started: datetime, *, steps: int, **train: Any) -> TinyRun:
    run = train_tiny_lora(steps=steps, seed=seed, started=started, **train)
    write_adapter_version(store, 1, run)
    write_log(store, 1, run.records, started=started, seed=seed, plan=training_plan(run))
    return run


def _write_healthy(store: Path, seed: int, started: datetime) -> None:
    _single_run(store, seed, started, steps=HEALTHY_STEPS)


def _write_smoke(store: Path, seed: int, started: datetime) -> None:
    _single_run(store, seed, started, steps=SMOKE_STEPS)


def _write_spiky(store: Path, seed: int, started: datetime) -> None:
    _single_run(
        store,
        seed,
        started,
        steps=HEALTHY_STEPS,
        spike_steps=SPIKE_STEPS,
        nan_steps=NAN_STEPS,
        amp_scaler=True,
    )


def _write_resumed(store: Path, seed: int, started: datetime) -> None:
    first = train_tiny_lora(
        steps=RESUME_CHECKPOINT, total_steps=HEALTHY_STEPS, seed=seed, started=started
    )
    v1 = write_adapter_version(store, 1, first)
    first.train_until(RESUME_CRASH)
    write_log(
        store,
        1,
        first.records,
        started=started,
        seed=seed,
        plan=training_plan(first),
        complete=False,
        torn_tail=True,
    )
    restarted = first.clock(RESUME_CRASH) + _RESUME_GAP
    second = train_tiny_lora(
        steps=HEALTHY_STEPS,
        seed=seed,
        lr=RESUME_LR,
        resume_from=v1,
        started=restarted,
    )
    write_adapter_version(store, 2, second)
    write_log(store, 2, second.records, started=restarted, seed=seed, plan=training_plan(second))


def _write_multi(store: Path, seed: int, started: datetime) -> None:
    begin = started
    for run_id, (name, (offset, layers)) in enumerate(MULTI_ADAPTERS.items(), start=1):
        run = train_tiny_lora(steps=HEALTHY_STEPS, seed=seed + offset, layers=layers, started=begin)
        write_adapter_version(store, 1, run, name=name)
        write_log(
            store, run_id, run.records, started=begin, seed=seed + offset, plan=training_plan(run)
        )
        begin = run.clock(HEALTHY_STEPS) + _RESUME_GAP


_SCENARIO_WRITERS = {
    "healthy": _write_healthy,
    "smoke": _write_smoke,
    "spiky": _write_spiky,
    "resumed": _write_resumed,
    "multi": _write_multi,
}
