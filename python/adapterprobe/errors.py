"""The exception hierarchy. The classes are declared in the Rust core so that
errors raised there and here share one base; this module re-exports them and
adds the ones only the Python layer raises."""

from adapterprobe._core import (
    AdapterProbeError,
    HeaderError,
    IntegrityError,
    LayerGroupingError,
    LogFormatError,
    MissingFileError,
    TrainingStateError,
    UnsafePickleError,
    UsageError,
)


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
]


def require(module: str, extra: str):
    """Import an optional dependency or raise MissingExtraError saying how to get it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module} is required for this feature: pip install 'adapterprobe[{extra}]'"
        ) from exc
