"""GAP monitoring and the run guard for the Hugging Face ``Trainer``.

    monitor = GAPMonitor(model, interval=10, sink=JsonlSink.for_store(store, run_id=1))
    trainer = Trainer(model=model, args=args, callbacks=[GAPCallback(monitor)], ...)

Steps are numbered as the Trainer numbers them in its logs: the step that ends with
``state.global_step == N`` is step ``N``. A sampled step opens at ``on_step_begin``
(before the first micro-batch) and closes at ``on_pre_optimizer_step``, so gradient
statistics are those of the accumulated gradient the optimizer is about to use (after
clipping, when ``max_grad_norm`` clips). Each Trainer log with a training loss also
becomes a dlm step line in the monitor's sinks.

Under ``torch.distributed`` (``torchrun``, a DDP strategy) the callback runs on every
rank and the monitor writes from rank 0 only: each record and step line once, with
the global statistics.

``GuardCallback`` judges the Trainer's logs with :class:`adapterprobe.Guard` and
stops the run the Trainer's own way when the verdict reaches ``stop_on``:

    trainer = Trainer(model=model, args=args, callbacks=[GuardCallback()], ...)
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import adapterprobe._core as _core
from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.escape import terminal
from adapterprobe.guard import (
    GuardCallbackBase,
    base_learning_rates,
    drop_gradients,
    last_checkpoint_before,
    output_classes_of,
    say,
    scale_learning_rate,
)
from adapterprobe.monitor import GAPMonitor

if TYPE_CHECKING:
    from transformers import TrainerCallback
else:
    TrainerCallback = require("transformers", "peft").TrainerCallback

__all__ = ["GAPCallback", "GuardCallback"]


class GAPCallback(TrainerCallback):
    """Opens the monitor's step around each optimizer step of the HF Trainer."""

    def __init__(self, monitor: GAPMonitor):
        if not isinstance(monitor, GAPMonitor):
            got = type(monitor).__name__
            raise MonitorConfigError(f"GAPCallback needs a GAPMonitor, got {got}")
        self.monitor = monitor
        self._window: Any = None

    def _close(self) -> None:
        window, self._window = self._window, None
        if window is not None:
            window.__exit__(None, None, None)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()  # a step that never reached the optimizer
        window = self.monitor.step(state.global_step + 1)
        window.__enter__()
        self._window = window

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs or "loss" not in logs or not self.monitor.sinks:
            return
        self.monitor.log_step(
            state.global_step,
            logs["loss"],
            lr=logs.get("learning_rate"),
            grad_norm=logs.get("grad_norm"),
            val_loss=logs.get("eval_loss"),
        )


def _reward(logs: dict[str, Any]) -> float | None:
    """TRL's mean reward (``reward``; ``rewards/<name>/mean`` summed when only those)."""
    value = logs.get("reward")
    if isinstance(value, int | float):
        return float(value)
    parts = [v for k, v in logs.items() if k.startswith("rewards/") and k.endswith("/mean")]
    return float(sum(parts)) if parts and all(isinstance(v, int | float) for v in parts) else None


def _rank_zero_decides() -> Callable[[Any], Any] | None:
    """Under ``torch.distributed`` (world > 1), a collective that gives every
    rank rank 0's decision (a stop, a rollback's plan); None in a single
    process. The Trainer logs on every rank, so every rank takes part."""
    import sys

    torch = sys.modules.get("torch")  # the Trainer has imported it; we never do first
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() < 2:
        return None

    def share(decision: Any) -> Any:
        box = [decision]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return share


#: Frames looked up from ``on_train_begin`` for the Trainer that calls it.
_FRAMES_LOOKED_AT = 12


def _calling_trainer(callback: Any) -> Any:
    """The Trainer whose callbacks hold ``callback`` and that is calling it
    now (``on_train_begin`` runs inside ``Trainer.train``), found among the
    calling frames; None when there is none."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES_LOOKED_AT):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        handler = getattr(candidate, "callback_handler", None)
        if callback in getattr(handler, "callbacks", ()) and hasattr(
            candidate, "_load_from_checkpoint"
        ):
            return candidate
        frame = frame.f_back
    return None


def _checkpoint_step(name: str) -> int | None:
    """N of a ``checkpoint-N`` folder name."""
    _, _, number = name.rpartition("-")
    return int(number) if number.isdigit() else None


def _data_budget(args: Any, train_dataloader: Any, max_steps: int) -> int | None:
    """The optimizer steps the Trainer's data loop runs (its epochs times
    its updates per epoch), where the data loader has a length; the run
    ends there or at ``max_steps``, whichever comes first. None: unknown
    (a streaming dataset runs to ``max_steps``)."""
    try:
        batches = len(train_dataloader)
    except TypeError:
        return None
    accumulation = max(int(args.gradient_accumulation_steps), 1)
    per_epoch = max(batches // accumulation + int(batches % accumulation > 0), 1)
    if args.max_steps > 0:
        epochs = max_steps // per_epoch + int(max_steps % per_epoch > 0)
    else:
        epochs = math.ceil(args.num_train_epochs)
    return epochs * per_epoch


class GuardCallback(GuardCallbackBase, TrainerCallback):
    """Judge the Trainer's logs online and stop the run when the verdict
    reaches ``stop_on`` (``"fail"``: only what no later record can undo;
    ``"warn"``: anything the rules flag).

    On stopping it logs the findings, asks the Trainer to save a checkpoint
    (``save_on_stop``), sets ``control.should_training_stop``, and writes the
    verdict to ``output_dir/adapterprobe-guard.json`` (from the main process;
    also written at the end of a run that was not stopped). Under DDP/FSDP
    rank 0 decides and broadcasts its decision at each log, so every rank
    stops at the same step.
    ``guard`` is the :class:`~adapterprobe.Guard`, made at ``on_train_begin``
    with the run's ``max_steps`` and its model's output count.

    ``on_fail="recover"``: a FAIL (NaN, a loss far above ln K: what no later
    record can undo) rolls the run back instead of stopping it, up to
    ``max_recoveries`` times. The newest ``checkpoint-N`` saved before the
    step the finding was first seen at is restored through the Trainer's
    own resume path (model, optimizer, scheduler, RNG); the learning rate
    becomes ``lr_factor`` times what it was (compounding with each rollback;
    the schedule keeps its shape); the global step goes back to N and
    training goes on from the data where it was, so the batches of the
    discarded steps are skipped, and ``skip_window`` more optimizer steps
    after the failure apply no update (their batches are passed over too).
    ``trainer_state.json``'s ``log_history`` keeps the discarded records
    under an ``adapterprobe_rollback`` entry, out of the loss curve a scan
    reads, and the guard judges the run as a continuation of what it kept.
    It stops as ``on_fail="stop"`` does when no such checkpoint is left
    (``save_total_limit`` may have deleted it), when the checkpoint holds no
    optimizer state (``save_only_model``), under DeepSpeed or FSDP, or after
    ``max_recoveries``. See docs/guard.md.
    """

    _batch_skip = "yes"
    _recovery = "yes"

    # Set for the run in progress at ``on_train_begin`` (``_trainer`` also
    # by :meth:`attach`).
    _trainer: Any = None
    _base_lrs: list[float] | None = None
    _planned_steps = 0
    _discarded_steps = 0
    _gate: Any = None  # skip_batch_above's gate (a _core.BatchGate)
    _loss_before = 0.0  # the Trainer's loss accumulator after the previous step
    _gated: set[int] | None = None  # steps the gate skipped

    def attach(self, trainer: Any) -> GuardCallback:
        """Add this callback to ``trainer`` and remember the trainer, for a
        caller whose Trainer runs the callback outside ``train()``'s own
        frames (``on_fail="recover"`` finds it there otherwise)."""
        trainer.add_callback(self)
        self._trainer = trainer
        return self

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        classes, kind = output_classes_of(getattr(model, "config", None))
        max_steps = state.max_steps if getattr(state, "max_steps", 0) > 0 else None
        self._start(output_classes=classes, output_kind=kind, max_steps=max_steps)
        self._planned_steps = int(state.max_steps)
        self._discarded_steps = 0
        self._gated = set()
        self._loss_before = 0.0
        self._gate = None
        if self.on_fail != "recover" and self.skip_batch_above is None:
            return
        if self._trainer is None:
            self._trainer = _calling_trainer(self)
        if self._trainer is None:
            raise MonitorConfigError(
                "GuardCallback(on_fail='recover' or skip_batch_above=) could not find the "
                "Trainer that runs it; add it with GuardCallback(...).attach(trainer)"
            )
        if self.skip_batch_above is not None:
            self._gate = _core.BatchGate(float(self.skip_batch_above))
        self._base_lrs = base_learning_rates(getattr(self._trainer, "lr_scheduler", None))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Inside the skip window after a rollback, or when the gate finds
        # the step's loss far above the recent level, the step applies no
        # update: optimizers pass over parameters whose gradient is None.
        step = state.global_step + 1
        skip = step <= self._skip_until
        if self._gate is not None:
            loss = self._step_loss()
            if not skip and not self._gate.admit(loss):
                skip = True
                self._gated = (self._gated or set()) | {step}
                say(
                    "adapterprobe guard: skipped step %d: its loss %.4g is above %s "
                    "(skip_batch_above=%g robust sigmas over the recent steps applied)",
                    step,
                    loss,
                    "a finite value" if self._gate.bar is None else f"{self._gate.bar:.4g}",
                    self.skip_batch_above,
                )
        if skip:
            drop_gradients(self._trainer.optimizer)

    def _step_loss(self) -> float:
        """The loss of the step about to be applied: what the Trainer's loss
        accumulator gained since the previous step (it is emptied at each
        log), averaged over the ranks under DDP so every rank decides alike.
        One host sync per step, paid only with ``skip_batch_above``."""
        accumulated = self._trainer._tr_loss
        total = accumulated.detach().clone()
        dist: Any = getattr(sys.modules.get("torch"), "distributed", None)
        distributed = dist is not None and dist.is_available() and dist.is_initialized()
        if distributed and dist.get_world_size() > 1:
            dist.all_reduce(total)
            total /= dist.get_world_size()
        value = float(total.item())
        loss, self._loss_before = value - self._loss_before, value
        return loss

    def _recovery_plan(self, args: Any, first_fault: int) -> tuple[str, int] | str:
        """The checkpoint to roll back to and its step, or why there is none."""
        trainer = self._trainer
        if getattr(trainer, "is_deepspeed_enabled", False) or getattr(
            trainer, "is_fsdp_enabled", False
        ):
            return "rolling back under DeepSpeed or FSDP is not supported"
        before = self._look_before(first_fault)
        name = last_checkpoint_before(args.output_dir, before)
        if name is None:
            limit = getattr(args, "save_total_limit", None)
            kept = f" (save_total_limit={limit} deletes older ones)" if limit else ""
            return f"no checkpoint saved before step {before} is left{kept}"
        path = os.path.join(args.output_dir, name)
        step = _checkpoint_step(name)
        has_optimizer = any(
            os.path.isfile(os.path.join(path, f)) for f in ("optimizer.pt", "optimizer.bin")
        )
        if (
            step is None
            or not has_optimizer
            or not os.path.isfile(os.path.join(path, "scheduler.pt"))
        ):
            return f"{name} holds no optimizer and scheduler state (save_only_model?)"
        return path, step

    def _recover(
        self,
        args: Any,
        state: Any,
        control: Any,
        share: Callable[[Any], Any] | None,
        train_dataloader: Any,
    ) -> bool:
        """Roll the run back (see the class doc); False: it cannot be, and
        the caller stops it. Rank 0 decides and every rank restores the
        same checkpoint at the same step."""
        plan = self._agreed_plan(share, lambda first_fault: self._recovery_plan(args, first_fault))
        if plan is None:
            return False
        path, to_step = plan
        trainer = self._trainer
        from_step = int(state.global_step)
        trainer._load_from_checkpoint(path)
        trainer._load_optimizer_and_scheduler(path)
        trainer._load_rng_state(path)
        scheduler = getattr(trainer, "lr_scheduler", None)
        scale_learning_rate(trainer.optimizer, scheduler, self._base_lrs, self._next_lr_scale())
        state.global_step = to_step
        trainer._globalstep_last_logged = to_step
        # The data loop goes on where it was, so the run ends as many steps
        # sooner as it discarded, where the data sets its end.
        self._discarded_steps += from_step - to_step
        budget = _data_budget(args, train_dataloader, self._planned_steps)
        if budget is not None:
            state.max_steps = min(self._planned_steps, budget - self._discarded_steps)
        control.should_save = False
        control.should_evaluate = False
        control.should_training_stop = False
        record = self._rewound(
            from_step=from_step,
            to_step=to_step,
            checkpoint=os.path.basename(path),
            checkpoint_step=to_step,
            max_steps=state.max_steps if state.max_steps > 0 else None,
        )
        # The log keeps both timelines: the discarded records move under
        # one rollback entry, out of the curve the scan reads.
        discarded = [r for r in state.log_history if _after(r, to_step)]
        state.log_history[:] = [r for r in state.log_history if not _after(r, to_step)]
        state.log_history.append(
            {"step": to_step, "adapterprobe_rollback": {**record, "discarded": discarded}}
        )
        return True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs:
            return

        def number(key: str) -> float | None:
            value = logs.get(key)
            return float(value) if isinstance(value, int | float) else None

        share = _rank_zero_decides()
        loss = number("loss")
        if loss is not None:
            self._loss_before = 0.0  # the Trainer emptied its accumulator for this log
        if loss is not None and (
            state.global_step <= self._skip_until or state.global_step in (self._gated or ())
        ):
            # The loss of batches passed over: no update came of them. The
            # scan reads it as skipped, not as the run's loss.
            loss = None
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                record = state.log_history[-1]
                record["adapterprobe_skipped_loss"] = record.pop("loss", None)
        if loss is not None:  # a training log: the LoRA factors too, a few norms
            self._observe_factors(state.global_step, kwargs.get("model"))
        reached = self._reached(
            state.global_step,
            share=share,
            loss=loss,
            grad_norm=number("grad_norm"),
            learning_rate=number("learning_rate"),
            eval_loss=number("eval_loss"),
            reward=_reward(logs),
        )
        if not reached:
            return
        finished = "train_runtime" in logs  # train() is closing: nothing to go on with
        if not finished and self._recover(
            args, state, control, share, kwargs.get("train_dataloader")
        ):
            return
        self._stop_now(state.global_step)
        control.should_training_stop = True
        first_fault = self._first_fault_step()
        if first_fault is not None:
            self.last_good_checkpoint = last_checkpoint_before(args.output_dir, first_fault)
            say(
                "adapterprobe guard: the newest checkpoint saved before step %d, where it first "
                "went wrong: %s",
                first_fault,
                terminal(self.last_good_checkpoint or "none"),
            )
        saves = self._saves_at_stop(share)
        if saves is not None:  # False also calls off a save the Trainer has due now
            control.should_save = saves
        self._write(args.output_dir, main_process=state.is_world_process_zero)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._say_final()
        if self.stopped_at is None:
            self._write(args.output_dir, main_process=state.is_world_process_zero)


def _after(record: Any, step: int) -> bool:
    """Whether a ``log_history`` record is of a step after ``step``."""
    at = record.get("step") if isinstance(record, dict) else None
    return isinstance(at, int) and at > step
