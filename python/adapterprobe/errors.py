"""The exception hierarchy, shared by the Rust core and the Python layer.

Every error adapterprobe raises is an :class:`AdapterProbeError`. Besides its
message each one carries structured fields, so callers can act on an error
without parsing text: ``path`` (the file or directory involved, or None),
``reason`` (what is wrong, without the path) and ``details`` (facts specific
to the error, also readable as attributes, e.g. ``UnsafePickleError.global_name``
or ``ExtractionError.tensor``). The Rust core raises these same classes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from types import ModuleType
from typing import Any


class AdapterProbeError(Exception):
    """Base of every error adapterprobe raises.

    ``str(error)`` is ``"<path>: <reason>"`` (just the reason when no path is
    involved). Keyword details become attributes and are kept in ``details``.
    """

    path: str | None
    reason: str
    details: dict[str, Any]

    def __init__(
        self, reason: str = "", *, path: str | os.PathLike[str] | None = None, **details: Any
    ) -> None:
        self.reason = str(reason)
        self.path = None if path is None else os.fspath(path)
        self.details = dict(details)
        for key, value in details.items():
            setattr(self, key, value)
        super().__init__(f"{self.path}: {self.reason}" if self.path else self.reason)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the structured fields when the error crosses a process (Ray tasks).
        return (_rebuild, (type(self), self.reason, self.path, self.details))


def _rebuild(
    cls: type[AdapterProbeError], reason: str, path: str | None, details: dict[str, Any]
) -> AdapterProbeError:
    return cls(reason, path=path, **details)


class HeaderError(AdapterProbeError):
    """A safetensors header is truncated, oversized or malformed."""


class LogFormatError(AdapterProbeError):
    """A training log (dlm JSONL, trainer_state.json, TensorBoard events, CSV) cannot be read."""


class LayerGroupingError(AdapterProbeError):
    """Adapter keys cannot be attributed to transformer layers."""


class TrainingStateError(AdapterProbeError):
    """An optimizer or training state file is corrupt or of an unknown shape."""


class UnsafePickleError(TrainingStateError):
    """A pickle names a global outside the allow-list (``global_name``); nothing was executed."""


class IntegrityError(TrainingStateError):
    """A file's sha256 (``actual``) disagrees with the digest recorded beside it (``expected``)."""


class MissingFileError(AdapterProbeError):
    """A file or directory the call needs does not exist."""


class UsageError(AdapterProbeError):
    """The arguments of a call are invalid (bad options, not bad data)."""


class WeightsError(AdapterProbeError):
    """Adapter weights or adapter_config.json are unreadable or disagree with each other."""


class ExtractionError(AdapterProbeError):
    """LoRA extraction cannot proceed (mismatched shapes, missing or non-finite tensors)."""


class MonitorConfigError(AdapterProbeError, ValueError):
    """Invalid options for the GAP monitor or a gradient dump."""


class MissingExtraError(AdapterProbeError, ImportError):
    """An optional dependency (torch, pandas, ray, ...) is needed but not installed."""


__all__ = [
    "AdapterProbeError",
    "ExtractionError",
    "HeaderError",
    "IntegrityError",
    "LayerGroupingError",
    "LogFormatError",
    "MissingExtraError",
    "MissingFileError",
    "MonitorConfigError",
    "TrainingStateError",
    "UnsafePickleError",
    "UsageError",
    "WeightsError",
]


def extra_packages(extra: str) -> list[str]:
    """The distributions an extra of adapterprobe names (from the installed
    package's metadata), or ``[extra]`` when the metadata cannot say."""
    try:
        requires = importlib.metadata.requires("adapterprobe") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    names = []
    for line in requires:
        spec, _, marker = line.partition(";")
        if re.search(r"""extra\s*==\s*["']""" + re.escape(extra) + r"""["']""", marker):
            name = re.match(r"[A-Za-z0-9_.\-]+", spec.strip())
            if name and name.group(0) not in names:
                names.append(name.group(0))
    return names or [extra]


def install_hint(extra: str) -> str:
    """The command that installs an extra's packages today. adapterprobe is
    not on PyPI yet, so ``pip install 'adapterprobe[extra]'`` would fail:
    the packages themselves install anywhere, the extra from a checkout."""
    packages = " ".join(extra_packages(extra))
    return f"pip install {packages} (or, in a checkout of adapterprobe: pip install '.[{extra}]')"


def require(module: str, extra: str) -> ModuleType:
    """Import an optional dependency or raise MissingExtraError saying how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module} is required for this feature: {install_hint(extra)}",
            extra=extra,
        ) from exc
