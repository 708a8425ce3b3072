"""Where GAP statistics go: a dlm-style JSONL log, or TensorBoard.

A sink is any object with ``write_gap(step, stats)``, ``write_step(record)`` and
``close()``. The JSONL sink writes the same file format as dlm's trainer, so the
``training_drift`` reader can read a monitored run afterwards: step lines are
``{"type": "step", ...}`` and GAP records are

    {"type": "gap", "step": N, "timestamp": "...", "stats": {"gap/summary/grads/...": 0.1}}

(the statistics are nested under ``stats`` so that they can never collide with the
top-level keys a log reader dispatches on). Lines are written with
``json.dumps(obj, sort_keys=True)``; a NaN or infinite value is written as Python's
bare ``NaN``/``Infinity`` token, which the drift reader accepts. Values are rounded to
``digits`` significant digits (7 by default: the statistics are of float32 or narrower
tensors, and the 17 digits of a float64 repr would more than double the line).

Per-tensor statistics (``GAPMonitor(detail="tensors")``, keys ``gap/{kind}s/{name}/
{stat}``) are thousands of keys per step, so by default the JSONL sink writes them to a
side file, one safetensors file per sampled step beside the log
(``<log stem>.tensors/step00000010.safetensors``: a float32 ``[n, 5]`` table per kind,
the names in its metadata), and names that file in the record's ``tensors_file``.
:func:`read_tensor_stats` reads one back as the same flat dict. ``tensors="inline"``
keeps them in the JSON line instead.

The side files' names, the ``<log stem>.tensors`` folder and a store's
``logs/train-*.jsonl`` are names this module chooses inside folders it did not
make (a store may be shared, or downloaded), so a symbolic link standing at one
is never followed: a side file (written whole) replaces the link itself, and
the log and the side-file folder (added to) refuse it with a
:class:`MonitorConfigError` naming the link. A log path the caller names
(``JsonlSink(path)``) is theirs: a link there is appended through.

This module does not import torch (the TensorBoard sink loads it when built).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Literal, Protocol, runtime_checkable

from adapterprobe._fs import atomic_write_bytes, open_append
from adapterprobe.errors import LogFormatError, MonitorConfigError, UsageError, require

__all__ = ["GapSink", "JsonlSink", "TensorBoardSink", "read_tensor_stats", "step_record"]

# dlm's step-line fields besides type/step/loss; absent ones are written as null.
STEP_FIELDS = ("lr", "grad_norm", "tokens_per_sec", "val_loss")

# Per-tensor keys are gap/{kind}s/{name}/{stat}; their side-file layout.
TENSOR_KINDS = ("params", "grads", "activations", "activation_grads")
TENSOR_STATS = ("mean", "var", "max_abs", "l2_norm", "nonfinite")
SIDE_FILE_FORMAT = "adapterprobe.gap-tensors/1"


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


def _split_tensor_key(key: str) -> tuple[str, str, str] | None:
    """``gap/grads/model.x.weight/var`` -> ("grads", "model.x.weight", "var"); None otherwise."""
    head, _, rest = key.partition("/")
    kind, _, rest = rest.partition("/")
    name, _, stat = rest.rpartition("/")
    if head != "gap" or kind not in TENSOR_KINDS or not name or stat not in TENSOR_STATS:
        return None
    return kind, name, stat


def _side_file_bytes(step: int, per_tensor: Mapping[tuple[str, str, str], float]) -> bytes:
    import numpy as np  # a core dependency; imported here to keep this module light

    st = require("safetensors.numpy", "torch")
    rows: dict[str, dict[str, int]] = {}
    for kind, name, _ in per_tensor:
        names = rows.setdefault(kind, {})
        names.setdefault(name, len(names))
    tables = {
        kind: np.full((len(names), len(TENSOR_STATS)), np.nan, np.float32)
        for kind, names in rows.items()
    }
    for (kind, name, stat), value in per_tensor.items():
        tables[kind][rows[kind][name], TENSOR_STATS.index(stat)] = value
    metadata = {
        "format": SIDE_FILE_FORMAT,
        "step": str(step),
        "columns": json.dumps(TENSOR_STATS),
        **{f"names/{kind}": json.dumps(list(names)) for kind, names in rows.items()},
    }
    return bytes(st.save(tables, metadata=metadata))


def read_tensor_stats(path: str | os.PathLike[str]) -> dict[str, float]:
    """The per-tensor statistics of one side file, as ``{"gap/{kind}s/{name}/{stat}": value}``.

    Raises :class:`LogFormatError` for a file that is not a GAP side file.
    """
    safe_open = require("safetensors", "torch").safe_open
    out: dict[str, float] = {}
    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != SIDE_FILE_FORMAT:
                raise ValueError(f"not a GAP side file (format {meta.get('format')!r})")
            columns = json.loads(meta["columns"])
            for kind in f.keys():  # noqa: SIM118 - a safetensors handle
                if kind not in TENSOR_KINDS:
                    raise ValueError(f"unknown table {kind!r}")
                names = json.loads(meta[f"names/{kind}"])
                table = f.get_tensor(kind)
                if table.shape != (len(names), len(columns)):
                    raise ValueError(f"table {kind!r} does not match its {len(names)} names")
                for name, values in zip(names, table.tolist(), strict=True):
                    for stat, value in zip(columns, values, strict=True):
                        if value == value:  # NaN marks a statistic that was not recorded
                            out[f"gap/{kind}/{name}/{stat}"] = value
    except Exception as exc:  # OSError, bad JSON or shapes, and safetensors' own error types
        raise LogFormatError(f"cannot read GAP side file: {exc}", path=path) from exc
    return out


def _rounder(digits: int | None) -> Any:
    if digits is None:
        return None
    spec = f".{digits}g"

    def round_value(value: Any) -> Any:
        return float(format(value, spec)) if isinstance(value, float) else value

    return round_value


class JsonlSink:
    """Appends one JSON line per record to a file opened once, flushed per record.

    Appending (not replacing) is deliberate: a log is written while training runs,
    and a crash must leave every finished line on disk. ``tensors`` says where
    per-tensor statistics go (``"sidecar"``: a safetensors file per step beside the log;
    ``"inline"``: the JSON line); ``digits`` rounds values (None keeps all 17).
    ``_name_chosen`` (:meth:`for_store`'s): the log's name was chosen here, so a
    symbolic link (or any non-regular file) at ``path`` is refused, not appended
    through.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        banner: Mapping[str, Any] | None = None,
        tensors: Literal["sidecar", "inline"] = "sidecar",
        digits: int | None = 7,
        _name_chosen: bool = False,
    ):
        if tensors not in ("sidecar", "inline"):
            raise MonitorConfigError(f"tensors must be 'sidecar' or 'inline', got {tensors!r}")
        if digits is not None and (
            isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 17
        ):
            raise MonitorConfigError(f"digits must be None or an int in [1, 17], got {digits!r}")
        self.path = Path(path)
        self.tensors = tensors
        self.digits = digits
        self._round = _rounder(digits)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if _name_chosen:
                self._file: IO[str] | None = open_append(self.path)
            else:
                self._file = self.path.open("a", encoding="utf-8")
        except UsageError as exc:
            raise MonitorConfigError(f"cannot open GAP log: {exc.reason}", path=exc.path) from exc
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
        **options: Any,
    ) -> JsonlSink:
        """A new run log at ``<store>/logs/train-<run_id:06d>-<UTC time>.jsonl``, banner first.

        ``options`` (``tensors``, ``digits``) go to the constructor. A symbolic
        link already at the log's name is refused (:class:`MonitorConfigError`
        naming it), never appended through.
        """
        if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id < 0:
            raise MonitorConfigError(f"run_id must be a non-negative int, got {run_id!r}")
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        path = Path(store) / "logs" / f"train-{run_id:06d}-{stamp}.jsonl"
        return cls(path, banner={**(banner or {}), "run_id": run_id}, _name_chosen=True, **options)

    @property
    def tensors_dir(self) -> Path:
        """Where per-tensor side files go: ``<log stem>.tensors/`` beside the log."""
        return self.path.with_name(self.path.stem + ".tensors")

    def write_gap(self, step: int, stats: Mapping[str, float]) -> None:
        record: dict[str, Any] = {"type": "gap", "step": step, "timestamp": _timestamp()}
        if self.tensors == "sidecar":
            per_tensor: dict[tuple[str, str, str], float] = {}
            kept: dict[str, float] = {}
            for key, value in stats.items():
                parts = _split_tensor_key(key) if not key.startswith("gap/summary/") else None
                if parts is None:
                    kept[key] = value
                else:
                    per_tensor[parts] = value
            if per_tensor:
                side = self.tensors_dir / f"step{step:08d}.safetensors"
                self._check_tensors_dir()
                try:
                    atomic_write_bytes(side, _side_file_bytes(step, per_tensor), replace_link=True)
                except (OSError, UsageError) as exc:
                    raise MonitorConfigError(f"cannot write GAP side file {side}: {exc}") from exc
                record["tensors_file"] = f"{self.tensors_dir.name}/{side.name}"
            stats = kept
        if self._round is not None:
            stats = {key: self._round(value) for key, value in stats.items()}
        record["stats"] = stats
        self._write(record)

    def _check_tensors_dir(self) -> None:
        """The side-file folder is added to, so a link at its name is refused
        (files would land wherever it points)."""
        folder = self.tensors_dir
        if folder.is_symlink():
            raise MonitorConfigError(
                "refusing to write GAP side files through a symbolic link at the "
                "side-file folder (remove the link)",
                path=folder,
            )

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
