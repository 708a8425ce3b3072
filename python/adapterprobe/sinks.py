"""Where GAP statistics go: a dlm-style JSONL log, or TensorBoard.

A sink is any object with ``write_gap(step, stats)``, ``write_step(record)`` and
``close()``. The JSONL sink writes the same file format as dlm's trainer, so the
``training_drift`` reader can read a monitored run afterwards: step lines are
``{"type": "step", ...}`` and GAP records are

    {"type": "gap", "step": N, "timestamp": "...", "stats": {"gap/grads/...": 0.1, ...}}

(the statistics are nested under ``stats`` so that they can never collide with the
top-level keys a log reader dispatches on). Lines are written with
``json.dumps(obj, sort_keys=True)``; a NaN or infinite value is written as Python's
bare ``NaN``/``Infinity`` token, which the drift reader accepts.

This module does not import torch (the TensorBoard sink loads it when built).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from adapterprobe.errors import MonitorConfigError, require

__all__ = ["GapSink", "JsonlSink", "TensorBoardSink", "step_record"]

# dlm's step-line fields besides type/step/loss; absent ones are written as null.
STEP_FIELDS = ("lr", "grad_norm", "tokens_per_sec", "val_loss")


@runtime_checkable
class GapSink(Protocol):
    """What the monitor needs from a sink."""

    def write_gap(self, step: int, stats: Mapping[str, float]) -> None: ...

    def write_step(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def _timestamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _number(name: str, value: Any) -> float | None:
    """A JSON number from a Python or torch scalar; None stays None (JSON null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise MonitorConfigError(f"step field {name!r} must be a number, got a bool")
    if hasattr(value, "detach"):  # a torch scalar: no autograd warning on conversion
        value = value.detach()
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise MonitorConfigError(
            f"step field {name!r} must be a number, got {type(value).__name__}"
        ) from exc


def step_record(step: int, loss: Any, **fields: Any) -> dict[str, Any]:
    """A dlm ``{"type": "step", ...}`` record; extra fields are kept as given.

    ``loss`` may be a float or a 0-d tensor; NaN is kept as NaN (it is the signal
    the drift probe looks for).
    """
    if isinstance(step, bool) or not isinstance(step, int):
        raise MonitorConfigError(f"step must be an int, got {step!r}")
    if "type" in fields:
        raise MonitorConfigError("step field 'type' is reserved: it is always 'step'")
    record: dict[str, Any] = {"type": "step", "step": step, "loss": _number("loss", loss)}
    if record["loss"] is None:
        raise MonitorConfigError("loss must be a number, got None")
    for name in STEP_FIELDS:
        record[name] = _number(name, fields.pop(name, None))
    record["timestamp"] = fields.pop("timestamp", None) or _timestamp()
    for name, value in fields.items():
        record[name] = value if isinstance(value, (str, type(None))) else _number(name, value)
    return record


class JsonlSink:
    """Appends one JSON line per record to a file opened once, flushed per record.

    Appending (not replacing) is deliberate: a log is written while training runs,
    and a crash must leave every finished line on disk.
    """

    def __init__(self, path: str | os.PathLike[str], *, banner: Mapping[str, Any] | None = None):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise MonitorConfigError(f"cannot open GAP log {self.path}: {exc}") from exc
        if banner is not None:
            self._write({**banner, "type": "banner"})

    @classmethod
    def for_store(
        cls,
        store: str | os.PathLike[str],
        run_id: int,
        *,
        banner: Mapping[str, Any] | None = None,
    ) -> JsonlSink:
        """A new run log at ``<store>/logs/train-<run_id:06d>-<UTC time>.jsonl``, banner first."""
        if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id < 0:
            raise MonitorConfigError(f"run_id must be a non-negative int, got {run_id!r}")
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        path = Path(store) / "logs" / f"train-{run_id:06d}-{stamp}.jsonl"
        return cls(path, banner={**(banner or {}), "run_id": run_id})

    def write_gap(self, step: int, stats: Mapping[str, float]) -> None:
        self._write({"type": "gap", "step": step, "timestamp": _timestamp(), "stats": stats})

    def write_step(self, record: Mapping[str, Any]) -> None:
        self._write(record)

    def _write(self, obj: Mapping[str, Any]) -> None:
        if self._file is None:
            raise MonitorConfigError(f"GAP log {self.path} is closed")
        self._file.write(json.dumps(obj, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardSink:
    """Writes every statistic as a TensorBoard scalar under its ``gap/...`` key."""

    def __init__(self, log_dir: str | os.PathLike[str]):
        tensorboard = require("torch.utils.tensorboard", "tensorboard")
        self.log_dir = Path(log_dir)
        self._writer: Any = tensorboard.SummaryWriter(log_dir=str(self.log_dir))

    def write_gap(self, step: int, stats: Mapping[str, float]) -> None:
        for key, value in stats.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def write_step(self, record: Mapping[str, Any]) -> None:
        step = record["step"]
        for key, value in record.items():
            # Nulls, strings (timestamp) and flags are not scalars; NaN is, and TB shows it.
            if key in ("type", "step") or isinstance(value, bool):
                continue
            if not isinstance(value, (int, float)):
                continue
            self._writer.add_scalar(f"train/{key}", value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorBoardSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
