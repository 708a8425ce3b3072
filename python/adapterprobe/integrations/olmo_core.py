"""GAP monitoring for OLMo-core's ``Trainer``: a drop-in for its ``GAPMonitorCallback``.

    from adapterprobe.integrations.olmo_core import GAPCallback
    trainer = TrainerConfig(..., callbacks={"gap": GAPCallback(interval=10)}).build(...)

Steps are OLMo-core's ``trainer.global_step`` (1 for the first). A sampled step opens
at ``pre_step`` and closes at ``pre_optim_step``, after every micro-batch's backward and
before the optimizer, so gradient statistics are those the optimizer uses (before
clipping: OLMo-core clips inside ``optim_step``). The statistics are recorded as
trainer metrics under the seed callback's keys, ``gap/{kind}s/{name}/{max,mean,var}``
(``max`` is our ``max_abs``), plus the summary keys ``gap/summary/...``. Under FSDP2 or
DDP they are already global (the monitor combines the ranks), so they are recorded
without a further reduction, and the same on every rank.

``sink`` (a path or a sink object) also writes the monitor's records (rank 0 only), and
``dump`` takes a :class:`adapterprobe.GradientDump`, written on sampled steps.

The model is ``trainer.train_module.model``. The callback imports ``olmo_core``
(install ``ai2-olmo-core``); nothing else in adapterprobe does.

``GuardCallback`` judges the metrics the trainer logs with
:class:`adapterprobe.Guard` and cancels the run OLMo-core's way when the verdict
reaches ``stop_on``:

    trainer = TrainerConfig(..., callbacks={"guard": GuardCallback()}).build(...)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.guard import GuardCallbackBase
from adapterprobe.monitor import KINDS, GAPMonitor, GradientDump

if TYPE_CHECKING:
    from olmo_core.train.callbacks import Callback  # type: ignore[import-not-found, unused-ignore]
else:
    Callback = require("olmo_core.train.callbacks", "ai2-olmo-core").Callback

__all__ = ["GAPCallback", "GuardCallback"]

# our per-tensor statistics under the seed callback's names
_SEED_NAMES = {"max_abs": "max", "mean": "mean", "var": "var"}


@dataclasses.dataclass
class GAPCallback(Callback):
    """Records GAP statistics of sampled steps as OLMo-core trainer metrics."""

    enabled: bool = True
    interval: int = 1
    kinds: tuple[str, ...] = KINDS
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None
    sink: Any = None
    dump: GradientDump | None = None
    top_k: int | None = None
    timeout: float | None = None
    """Seconds to wait for the other ranks in a sampled step (None: the process group's)."""

    def __post_init__(self) -> None:
        self._monitor: GAPMonitor | None = None
        self._window: Any = None
        self._keys: dict[str, str | None] = {}

    @property
    def monitor(self) -> GAPMonitor | None:
        """The monitor, built at ``pre_train`` on the train module's model."""
        return self._monitor

    def pre_train(self) -> None:
        if not self.enabled:
            return
        model = getattr(self.trainer.train_module, "model", None)
        if model is None:
            raise MonitorConfigError("GAPCallback needs a train module with a .model")
        self._close_window()
        if self._monitor is not None:
            self._monitor.close()
        self._monitor = GAPMonitor(
            model,
            interval=self.interval,
            kinds=self.kinds,
            include=self.include,
            exclude=self.exclude,
            dump=self.dump,
            sink=self.sink,
            detail="tensors",
            top_k=self.top_k,
            timeout=self.timeout,
        )

    def pre_step(self, batch: dict[str, Any]) -> None:
        if self._monitor is None:
            return
        self._close_window()  # a step that never reached the optimizer
        window = self._monitor.step(self.step)
        window.__enter__()
        self._window = window

    def pre_optim_step(self) -> None:
        if self._monitor is None or self._window is None:
            return
        self._close_window()
        if self._monitor.latest_step != self.step:
            return
        for key, value in self._monitor.latest.items():
            name = self._metric_name(key)
            if name is not None:
                self.trainer.record_metric(name, value, reduce_type=None)

    def _metric_name(self, key: str) -> str | None:
        """The seed's key for a per-tensor statistic, the key itself for a summary one."""
        if key in self._keys:
            return self._keys[key]
        name: str | None = key
        if not key.startswith("gap/summary/"):
            head, _, stat = key.rpartition("/")
            seed = _SEED_NAMES.get(stat)
            name = None if seed is None else f"{head}/{seed}"
        self._keys[key] = name
        return name

    def _close_window(self, exc: BaseException | None = None) -> None:
        window, self._window = self._window, None
        if window is not None:
            window.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)

    def on_error(self, exc: BaseException) -> None:
        self._close_window(exc)

    def post_train(self) -> None:
        self._close_window()

    def close(self) -> None:
        self._close_window()
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None


# OLMo-core's metric names (olmo_core.train.common and its train modules)
_LOSS = "train/CE loss"
_GRAD_NORM = "optim/total grad norm"
_LR = "optim/LR (group 0)"
#: Why the guard canceled a run: the prefix of OLMo-core's cancel reason.
CANCEL_REASON = "adapterprobe guard"


def _eval_loss(metrics: dict[str, float]) -> float | None:
    """The first evaluator's cross-entropy (``eval/<name>/CE loss``), if logged."""
    for key in sorted(metrics):
        if key.startswith("eval/") and key.endswith("/CE loss"):
            return float(metrics[key])
    return None


class GuardCallback(GuardCallbackBase, Callback):
    """Judge an OLMo-core run online and cancel it when the verdict reaches
    ``stop_on`` (``"fail"``: only what no later record can undo; ``"warn"``).

    Each step's logged metrics (``train/CE loss``, ``optim/total grad norm``,
    ``optim/LR (group 0)`` and an evaluator's ``eval/.../CE loss``) go to the
    :class:`~adapterprobe.Guard` on global rank 0, which alone decides. On
    stopping it logs the findings and calls ``trainer.cancel_run``: OLMo-core
    passes the cancellation to every rank at its next check
    (``cancel_check_interval`` steps, 25 by default), so every rank stops at
    the same step. At ``post_train`` of a canceled run a checkpoint is saved
    when ``save_on_stop`` and no enabled checkpointer will save one, and the
    verdict goes to ``adapterprobe-guard.json`` in the local ``save_folder``
    (the ``work_dir`` when that is remote), also for a run not stopped.

    ``monitor`` may be this trainer's :class:`GAPCallback` (its monitor is
    built at ``pre_train``): the guard then judges its statistics too.

    OLMo-core itself raises on a non-finite ``CE loss``; the guard catches
    what comes before (a loss far worse than a uniform guess) and what OLMo-
    core does not look at.
    """

    _recovery = (
        "OLMo-core restores a checkpoint (Trainer.load_checkpoint, data loader state "
        "included) when a run starts, not from a callback mid-run; restart from the "
        "checkpoint the guard names (last_good_checkpoint) with a lower learning rate"
    )
    _batch_skip = (
        "OLMo-core has this built in: its SkipStepAdamW / SkipStepLion skip a step whose "
        "loss or gradient norm is far above the recent ones"
    )

    def __init__(
        self,
        stop_on: str = "fail",
        save_on_stop: bool = True,
        rules: str = "robust",
        options: Any = None,
        monitor: Any = None,
        *,
        on_fail: str = "stop",
        skip_batch_above: float | None = None,
    ) -> None:
        GuardCallbackBase.__init__(
            self,
            stop_on,
            save_on_stop,
            rules,
            options,
            monitor,
            on_fail=on_fail,
            skip_batch_above=skip_batch_above,
        )

    def pre_train(self) -> None:
        vocab = getattr(getattr(self.trainer.train_module, "model", None), "vocab_size", None)
        max_steps = self.trainer.max_steps
        self._start(
            output_classes=vocab if isinstance(vocab, int) and vocab >= 2 else None,
            max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
        )

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if _rank() != 0:
            return

        def number(key: str) -> float | None:
            value = metrics.get(key)
            return float(value) if isinstance(value, int | float) else None

        stop = self._must_stop(
            step,
            loss=number(_LOSS),
            grad_norm=number(_GRAD_NORM),
            learning_rate=number(_LR),
            eval_loss=_eval_loss(metrics),
        )
        if stop and self.guard is not None:
            self.trainer.cancel_run(f"{CANCEL_REASON}: verdict {self.guard.verdict} at step {step}")

    def post_train(self) -> None:
        trainer = self.trainer
        canceled = bool(trainer.is_canceled) and str(
            getattr(trainer, "_cancel_reason", "") or ""
        ).startswith(CANCEL_REASON)
        if canceled and self.save_on_stop and not _checkpointer_saves(trainer):
            trainer.save_checkpoint()  # every rank takes part, as OLMo-core's checkpointer
        if _rank() == 0:
            self._write(_local_output(trainer), main_process=True)


def _rank() -> int:
    from olmo_core.distributed.utils import get_rank  # type: ignore[import-not-found, unused-ignore]

    return int(get_rank())


def _checkpointer_saves(trainer: Any) -> bool:
    """Whether an enabled ``CheckpointerCallback`` will save at ``post_train``."""
    from olmo_core.train.callbacks import (  # type: ignore[import-not-found, unused-ignore]
        CheckpointerCallback,
    )

    if getattr(trainer, "no_checkpoints", False):
        return False
    return any(
        isinstance(cb, CheckpointerCallback) and cb.enabled for cb in trainer.callbacks.values()
    )


def _local_output(trainer: Any) -> str:
    """The run's save folder when it is a local path, else its work dir."""
    folder = str(trainer.save_folder)
    return folder if "://" not in folder else str(trainer.work_dir)
