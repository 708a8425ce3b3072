"""GAP monitoring for ``lightning.Trainer``.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.monitor import GAPMonitor

if TYPE_CHECKING:
    from lightning.pytorch import Callback
else:
    Callback = require("lightning.pytorch", "lightning").Callback

__all__ = ["GAPCallback"]


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
