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

import logging
from typing import TYPE_CHECKING, Any

from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.escape import terminal
from adapterprobe.guard import Guard, check_stop_on, output_classes_of, reached
from adapterprobe.monitor import GAPMonitor
from adapterprobe.probes.drift import DriftOptions

if TYPE_CHECKING:
    from transformers import TrainerCallback
else:
    TrainerCallback = require("transformers", "peft").TrainerCallback

__all__ = ["GAPCallback", "GuardCallback"]

log = logging.getLogger("adapterprobe.guard")


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


class GuardCallback(TrainerCallback):
    """Judge the Trainer's logs online and stop the run when the verdict
    reaches ``stop_on`` (``"fail"``: only what no later record can undo;
    ``"warn"``: anything the rules flag).

    On stopping it logs the findings, asks the Trainer to save a checkpoint
    (``save_on_stop``), sets ``control.should_training_stop``, and writes the
    verdict to ``output_dir/adapterprobe-guard.json`` (from the main process;
    also written at the end of a run that was not stopped). Every rank sees
    the same logged values, so every rank stops at the same step.
    ``guard`` is the :class:`~adapterprobe.Guard`, made at ``on_train_begin``
    with the run's ``max_steps`` and its model's output count.
    """

    def __init__(
        self,
        stop_on: str = "fail",
        save_on_stop: bool = True,
        rules: str = "robust",
        options: DriftOptions | None = None,
    ) -> None:
        self.stop_on = check_stop_on(stop_on)
        self.save_on_stop = save_on_stop
        self.rules = rules
        self.options = options
        self.guard: Guard | None = None
        self.stopped_at: int | None = None
        Guard(rules, options)  # refuse bad rules or options now, not at train time

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        classes, kind = output_classes_of(getattr(model, "config", None))
        max_steps = state.max_steps if getattr(state, "max_steps", 0) > 0 else None
        self.guard = Guard(
            self.rules, self.options, output_classes=classes, output_kind=kind, max_steps=max_steps
        )
        self.stopped_at = None

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if self.guard is None or not logs or self.stopped_at is not None:
            return

        def number(key: str) -> float | None:
            value = logs.get(key)
            return float(value) if isinstance(value, int | float) else None

        verdict = self.guard.observe(
            state.global_step,
            loss=number("loss"),
            grad_norm=number("grad_norm"),
            learning_rate=number("learning_rate"),
            eval_loss=number("eval_loss"),
            reward=_reward(logs),
        )
        if not reached(verdict, self.stop_on):
            return
        self.stopped_at = state.global_step
        for finding in self.guard.findings:
            log.warning(
                "adapterprobe guard: %s at step %d: %s",
                terminal(finding["rule"]),
                finding["step"],
                terminal(finding["message"]),
            )
        log.warning(
            "adapterprobe guard: stopping the run at step %d (verdict %s)",
            state.global_step,
            verdict,
        )
        control.should_training_stop = True
        if self.save_on_stop:
            control.should_save = True
        if state.is_world_process_zero:
            self.guard.write(args.output_dir, stopped_at=self.stopped_at)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None and self.stopped_at is None and state.is_world_process_zero:
            self.guard.write(args.output_dir)
