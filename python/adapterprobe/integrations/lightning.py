"""GAP monitoring and the run guard for ``lightning.Trainer``.

    monitor = GAPMonitor(lit_module, interval=10, sink="gap.jsonl")
    trainer = lightning.Trainer(callbacks=[GAPCallback(monitor)], ...)

Steps are Lightning's ``trainer.global_step`` when the step starts (0 for the first).
A sampled step opens at the first micro-batch of an optimizer step and closes at
``on_before_optimizer_step``, after every backward of the step and before gradient
clipping. After each optimizer step a dlm step line goes to the monitor's sinks, with
the step's loss (the sum of the micro-batch losses Lightning hands back, which it has
already divided by ``accumulate_grad_batches``: the mean over micro-batches), the
first optimizer's learning rate and, on sampled steps, the global gradient norm.

Under ``torch.distributed`` (``torchrun``, a DDP strategy) the callback runs on every
rank and the monitor writes from rank 0 only: each record and step line once, with
the global statistics.

``GuardCallback`` judges each optimizer step's loss (and the validation loss,
``val_loss`` in ``trainer.callback_metrics``) with :class:`adapterprobe.Guard` and
stops the run with ``trainer.should_stop`` when the verdict reaches ``stop_on``.
Its steps are the ones Lightning's loggers write (:func:`logged_step`: the ``step``
column of CSVLogger's ``metrics.csv``, 0 for the first optimizer step), so what the
guard says names the same steps as a scan of that run's ``metrics.csv``.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapterprobe._fs import remove_link
from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.escape import terminal
from adapterprobe.guard import (
    GuardCallbackBase,
    base_learning_rates,
    drop_gradients,
    output_classes_of,
    say,
    scale_learning_rate,
)
from adapterprobe.monitor import GAPMonitor

if TYPE_CHECKING:
    from lightning.pytorch import Callback
else:
    Callback = require("lightning.pytorch", "lightning").Callback

__all__ = ["GAPCallback", "GuardCallback", "logged_step"]


class GAPCallback(Callback):
    """Opens the monitor's step around each optimizer step of a Lightning run."""

    def __init__(self, monitor: GAPMonitor):
        if not isinstance(monitor, GAPMonitor):
            got = type(monitor).__name__
            raise MonitorConfigError(f"GAPCallback needs a GAPMonitor, got {got}")
        self.monitor = monitor
        self._window: Any = None
        self._step: int | None = None  # the optimizer step in progress
        self._loss: Any = None

    def _close(self, exc: BaseException | None = None) -> None:
        window, self._window = self._window, None
        if window is not None:
            window.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._step is None:  # first micro-batch of an optimizer step
            self._step = trainer.global_step
            self._window = self.monitor.step(self._step)
            self._window.__enter__()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._close()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None and hasattr(loss, "detach"):
            self._loss = loss.detach() if self._loss is None else self._loss + loss.detach()
        if trainer.global_step == self._step:
            return  # still accumulating
        self._close()
        step, loss = self._step, self._loss
        self._step = self._loss = None
        if step is None or loss is None or not self.monitor.sinks:
            return
        grad_norm = None
        if self.monitor.latest_step == step:
            grad_norm = self.monitor.latest.get("gap/summary/grads/l2_norm")
        optimizers = trainer.optimizers
        lr = optimizers[0].param_groups[0]["lr"] if optimizers else None
        self.monitor.log_step(step, loss, lr=lr, grad_norm=grad_norm)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(exception)
        self._step = self._loss = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()
        self._step = self._loss = None


def _number(value: Any) -> float | None:
    """A logged scalar (a float or a 0-d tensor) as a float; None otherwise."""
    if hasattr(value, "detach"):
        value = value.detach()
        if value.numel() != 1:
            return None
        value = value.item()
    return float(value) if isinstance(value, int | float) else None


#: Attributes a LightningModule commonly keeps its wrapped model under.
_MODEL_ATTRIBUTES = ("model", "net", "backbone", "lm", "transformer")
#: ``hparams`` keys that say K, and what K counts.
# Only a vocabulary: a module with ``vocab_size`` in its hparams is trained
# on next-token cross-entropy, while ``num_classes`` also sizes detectors and
# segmenters whose loss is no softmax over K (a YOLO with 20 classes logs a
# loss of 45 when healthy). A classifier's K comes from its HF config.
_HPARAM_CLASSES = (("vocab_size", "vocabulary"),)


def _holders(pl_module: Any) -> list[Any]:
    """The module and the models it wraps (``model``, ``net``, ...)."""
    return [pl_module, *(getattr(pl_module, a, None) for a in _MODEL_ATTRIBUTES)]


def module_output_classes(pl_module: Any) -> tuple[int | None, str]:
    """``(K, kind)`` a LightningModule says: a Hugging Face config on the
    module or on the model it wraps (``model``, ``net``, ...), read as the
    HF callback reads one; else ``vocab_size``, ``num_labels`` or
    ``num_classes`` in its ``hparams`` (``save_hyperparameters``): only
    ``vocab_size`` there, since ``num_classes`` also sizes detectors whose
    loss is no cross-entropy over K.
    ``(None, "vocabulary")`` when it says nothing."""
    for holder in _holders(pl_module):
        config = getattr(holder, "config", None)
        if config is not None and not isinstance(config, Mapping):
            classes, kind = output_classes_of(config)
            if classes is not None:
                return classes, kind
    hparams = getattr(pl_module, "hparams", None)
    if isinstance(hparams, Mapping):
        for key, kind in _HPARAM_CLASSES:
            value = hparams.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 2:
                return value, kind
    return None, "vocabulary"


def logged_step(trainer: Any) -> int:
    """The step Lightning's loggers give what is logged now: the optimizer
    steps taken before the current batch's (``fit_loop.epoch_loop.
    _batches_that_stepped``, what the logger connector passes to every
    logger, CSVLogger's ``metrics.csv`` ``step`` column among them; 0 for the
    first optimizer step). The loss of optimizer step k, and a validation
    run after it, are logged at k - 1, while ``trainer.global_step`` is
    already k in ``on_train_batch_end`` and ``on_validation_end``. A Lightning
    without that counter gives ``global_step``."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    stepped = getattr(loop, "_batches_that_stepped", None)
    if isinstance(stepped, int) and not isinstance(stepped, bool):
        return stepped
    return int(trainer.global_step)


_CKPT_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
#: Most checkpoint files of one folder looked at for the last good one.
MAX_CKPTS_LOOKED_AT = 10_000


def last_ckpt_before(trainer: Any, step: int) -> str | None:
    """The newest ``*.ckpt`` that Lightning's ``ModelCheckpoint`` callbacks
    saved before ``step`` (its name's ``step=N``: weights after N optimizer
    steps, good when N is before the first step that went wrong), as a
    path; None when there is none."""
    best: tuple[int, str] | None = None
    for callback in getattr(trainer, "checkpoint_callbacks", None) or []:
        dirpath = getattr(callback, "dirpath", None)
        if not dirpath or not os.path.isdir(dirpath):
            continue
        with os.scandir(dirpath) as entries:
            for entry in itertools.islice(entries, MAX_CKPTS_LOOKED_AT):
                found = _CKPT_STEP.search(entry.name)
                if not (entry.name.endswith(".ckpt") and found):
                    continue
                n = int(found.group(1))
                if n < step and (best is None or n > best[0]):
                    best = (n, entry.path)
    return best[1] if best else None


def hold_checkpoints(trainer: Any) -> bool:
    """Keep Lightning's ``ModelCheckpoint`` callbacks from saving at this
    global step (after the batch, at the epoch's end, after validation): the
    weights are NaN/inf, and such a checkpoint would be the newest, the one a
    resume picks. Each callback skips a step it has saved at already, so each
    is told it has. False where a callback keeps that elsewhere (a Lightning
    this was not written against): nothing is held then."""
    held = True
    for callback in getattr(trainer, "checkpoint_callbacks", None) or []:
        if hasattr(callback, "_last_global_step_saved"):
            callback._last_global_step_saved = trainer.global_step
        else:
            held = False
    return held


class GuardCallback(GuardCallbackBase, Callback):
    """Judge a Lightning run online and stop it when the verdict reaches
    ``stop_on`` (``"fail"``: only what no later record can undo; ``"warn"``).

    Each finished optimizer step hands its loss (the last micro-batch's, as
    Lightning returns it) and the first optimizer's learning rate to the
    :class:`~adapterprobe.Guard`; each validation run hands ``val_loss``.
    A checkpoint is saved at the stop unless the weights are NaN/inf then;
    then no ``ModelCheckpoint`` saves at that step either
    (:func:`hold_checkpoints`).
    K, what the loss is a cross-entropy over, is ``output_classes=`` where
    given, else what the module says (:func:`module_output_classes`), so a
    loss far above ln K stops the run at its first record. On
    stopping it logs the findings and names the newest checkpoint
    ``ModelCheckpoint`` saved before the first bad step (``last_good_checkpoint``,
    also in the guard file), saves ``guard-stop-step<N>.ckpt`` in the
    trainer's ``default_root_dir`` (``save_on_stop``; not of NaN/inf weights,
    which every rank agrees on), sets
    ``trainer.should_stop`` and writes ``adapterprobe-guard.json`` there from
    global rank 0 (also at the end of a run that was not stopped). Under DDP
    each rank's loss is its own batch's: rank 0 decides, and its decision
    is broadcast at each record (one small collective per step), so every
    rank stops at the same step. Both file names are the guard's own choice in
    a folder it did not make: a symbolic link standing at either is replaced by
    the new file, never written through.

    Steps are the ones Lightning's loggers write (:func:`logged_step`, 0 for
    the first optimizer step), so the guard's findings, ``stopped_at`` and
    ``guard-stop-step<N>.ckpt`` name the steps ``metrics.csv`` shows, and its
    verdict at the end is the one a scan of that ``metrics.csv`` gives for the
    same records. Like that scan it judges no plan (``max_steps``): the
    guard's plan is counted in optimizer steps taken, which the last logged
    step of this numbering is one short of, so a finished run would read as
    stopped one step early.

    ``on_fail="recover"`` rolls a FAILed run back instead, as the HF
    callback does (see :class:`adapterprobe.integrations.transformers.GuardCallback`):
    the newest ``*.ckpt`` a ``ModelCheckpoint`` saved before the first bad
    step is loaded through the strategy (model, optimizers, schedulers; a
    Lightning checkpoint holds no RNG state), the learning rate becomes
    ``lr_factor`` times the schedule's, the optimizer step count goes back
    to the checkpoint's and training goes on from the data where it was (the
    discarded steps' batches skipped; ``skip_window`` more steps apply no
    update). The loggers then log the kept timeline's steps again, where
    the later record of a step wins. Automatic optimization only; a
    ``save_weights_only`` checkpoint cannot resume a run.
    """

    _batch_skip = (
        "Lightning does not hand a callback the step's loss before the optimizer step "
        "(return None from training_step to skip a batch)"
    )

    _recovery = "yes"

    # Set for the run in progress at ``on_train_start``.
    _base_lrs: tuple[list[float] | None, ...] = ()
    _initial_lrs: tuple[list[float], ...] = ()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        classes, kind = module_output_classes(pl_module)
        self._start(output_classes=classes, output_kind=kind)
        configs = trainer.lr_scheduler_configs
        self._base_lrs = tuple(base_learning_rates(c.scheduler) for c in configs)
        self._initial_lrs = tuple([g["lr"] for g in o.param_groups] for o in trainer.optimizers)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        # Inside the skip window after a rollback the step applies no
        # update: optimizers pass over parameters whose gradient is None.
        if logged_step(trainer) <= self._skip_until:
            drop_gradients(optimizer)

    def _recovery_plan(
        self, trainer: Any, pl_module: Any, first_fault: int
    ) -> tuple[str, int] | str:
        """The checkpoint file to roll back to and its optimizer step, or why
        there is none."""
        if not pl_module.automatic_optimization:
            return "rolling back a module with manual optimization is not supported"
        path = last_ckpt_before(trainer, self._look_before(first_fault))
        if path is None:
            return f"no checkpoint saved before step {first_fault} is left"
        found = _CKPT_STEP.search(os.path.basename(path))
        if found is None:  # last_ckpt_before only gives names with a step
            return f"{path} names no step"
        return path, int(found.group(1))

    def _recover(self, trainer: Any, pl_module: Any, share: Any) -> bool:
        """Roll the run back (see the class doc); False: it cannot be, and
        the caller stops it. Rank 0 decides; every rank loads the same
        checkpoint at the same step."""
        plan = self._agreed_plan(
            share, lambda first_fault: self._recovery_plan(trainer, pl_module, first_fault)
        )
        if plan is None:
            return False
        path, optimizer_steps = plan
        checkpoint = trainer.strategy.load_checkpoint(path)
        if not checkpoint.get("optimizer_states"):
            say(
                "adapterprobe guard: not recovering: %s holds no optimizer state "
                "(save_weights_only?)",
                terminal(path),
            )
            return False
        from_step = logged_step(trainer)
        trainer.strategy.load_model_state_dict(checkpoint, strict=True)
        trainer.strategy.load_optimizer_state_dict(checkpoint)
        schedulers = checkpoint.get("lr_schedulers") or []
        for config, state in zip(trainer.lr_scheduler_configs, schedulers, strict=False):
            config.scheduler.load_state_dict(state)
        scale = self._next_lr_scale()
        scheduled = set()
        for config, base in zip(trainer.lr_scheduler_configs, self._base_lrs, strict=False):
            optimizer = config.scheduler.optimizer
            scheduled.add(id(optimizer))
            scale_learning_rate(optimizer, config.scheduler, base, scale)
        for optimizer, initial in zip(trainer.optimizers, self._initial_lrs, strict=False):
            if id(optimizer) not in scheduled:
                for group, lr in zip(optimizer.param_groups, initial, strict=False):
                    group["lr"] = lr * scale
        # The step counts go back to the checkpoint's: the optimizer steps
        # (``global_step``), and the loggers' count, which Lightning raises
        # by one when this batch ends.
        loop = trainer.fit_loop.epoch_loop
        done = loop.automatic_optimization.optim_progress.optimizer.step.total
        done.ready = done.completed = optimizer_steps
        loop._batches_that_stepped = optimizer_steps - 1
        self._rewound(
            from_step=from_step,
            to_step=optimizer_steps - 1,  # the logged step of its last loss
            checkpoint=path,
            checkpoint_step=optimizer_steps,
            max_steps=None,
        )
        return True

    def _observe(self, trainer: Any, pl_module: Any, **values: float | None) -> None:
        step = logged_step(trainer)
        if values.get("loss") is not None and step <= self._skip_until:
            values["loss"] = None  # a batch passed over: no update came of it
        if values.get("loss") is not None:  # the LoRA factors too, a few norms
            peft = next((h for h in _holders(pl_module) if hasattr(h, "peft_config")), None)
            if peft is not None:
                self._observe_factors(step, peft)
        share = None
        if trainer.world_size > 1:  # each rank has its own loss: rank 0's decision holds

            def share(decision: Any) -> Any:
                return trainer.strategy.broadcast(decision, src=0)

        if not self._reached(step, share=share, **values):
            return
        if self._recover(trainer, pl_module, share):
            return
        self._stop_now(step)
        root = Path(trainer.default_root_dir)
        saves = self._saves_at_stop(share)
        if saves:
            checkpoint = root / f"guard-stop-step{step}.ckpt"
            if trainer.is_global_zero:  # the rank that writes it; Lightning follows a link
                remove_link(checkpoint)
            trainer.save_checkpoint(str(checkpoint))
        elif saves is False and not hold_checkpoints(trainer):
            say(
                "adapterprobe guard: a ModelCheckpoint callback may still save the NaN/inf "
                "weights at this step"
            )
        trainer.should_stop = True
        first_fault = self._first_fault_step()
        if first_fault is not None:
            self.last_good_checkpoint = last_ckpt_before(trainer, first_fault)
            say(
                "adapterprobe guard: the newest checkpoint saved before step %d, where it first "
                "went wrong: %s",
                first_fault,
                terminal(self.last_good_checkpoint or "none"),
            )
        self._write(root, main_process=trainer.is_global_zero)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        optimizers = trainer.optimizers
        lr = optimizers[0].param_groups[0]["lr"] if optimizers else None
        self._observe(trainer, pl_module, loss=_number(loss), learning_rate=_number(lr))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        value = _number(trainer.callback_metrics.get("val_loss"))
        if value is not None:
            self._observe(trainer, pl_module, eval_loss=value)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self._say_final()
        if self.stopped_at is None:
            self._write(Path(trainer.default_root_dir), main_process=trainer.is_global_zero)
