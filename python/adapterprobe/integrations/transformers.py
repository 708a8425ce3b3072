"""GAP monitoring for the Hugging Face ``Trainer``.

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.monitor import GAPMonitor

if TYPE_CHECKING:
    from transformers import TrainerCallback
else:
    TrainerCallback = require("transformers", "peft").TrainerCallback

__all__ = ["GAPCallback"]


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
