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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.escape import terminal
from adapterprobe.guard import GuardCallbackBase, last_checkpoint_before, output_classes_of, say
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


def _rank_zero_decides() -> Callable[[bool], bool] | None:
    """Under ``torch.distributed`` (world > 1), a collective that gives every
    rank rank 0's stop decision; None in a single process. The Trainer logs
    on every rank, so every rank takes part."""
    import sys

    torch = sys.modules.get("torch")  # the Trainer has imported it; we never do first
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() < 2:
        return None

    def share(stop: bool) -> bool:
        box = [stop]
        dist.broadcast_object_list(box, src=0)
        return bool(box[0])

    return share


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
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        classes, kind = output_classes_of(getattr(model, "config", None))
        max_steps = state.max_steps if getattr(state, "max_steps", 0) > 0 else None
        self._start(output_classes=classes, output_kind=kind, max_steps=max_steps)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs:
            return

        def number(key: str) -> float | None:
            value = logs.get(key)
            return float(value) if isinstance(value, int | float) else None

        share = _rank_zero_decides()
        stop = self._must_stop(
            state.global_step,
            share=share,
            loss=number("loss"),
            grad_norm=number("grad_norm"),
            learning_rate=number("learning_rate"),
            eval_loss=number("eval_loss"),
            reward=_reward(logs),
        )
        if not stop:
            return
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
        if self._saves_at_stop(share):
            control.should_save = True
        self._write(args.output_dir, main_process=state.is_world_process_zero)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopped_at is None:
            self._write(args.output_dir, main_process=state.is_world_process_zero)
