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
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.monitor import KINDS, GAPMonitor, GradientDump

if TYPE_CHECKING:
    from olmo_core.train.callbacks import Callback  # type: ignore[import-not-found, unused-ignore]
else:
    Callback = require("olmo_core.train.callbacks", "ai2-olmo-core").Callback

__all__ = ["GAPCallback"]

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
