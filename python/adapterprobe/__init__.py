"""adapterprobe: fast, model-free health checks for LoRA adapters and fine-tuning runs.

Scan stores of adapters and training runs (``scan``), or probe one thing at a
time (``training_drift``, ``gradient_ghost``, ``adapter_weights``,
``full_weights``); read logs,
optimizer states and adapter weights without torch (``read_*``). Importing
this package never imports torch: the names that need it (``extract_lora``,
``GAPMonitor``, ...) load their modules on first use, and without torch they
are placeholders that say how to install it when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from adapterprobe._core import (
    AdapterWeights,
    LayerGrouping,
    LossCurve,
    OptimizerState,
    ParamStat,
    SafetensorsHeader,
    TensorInfo,
    TrainingState,
    __version__,
    count_spikes,
    curve_metrics,
    group_layers,
    read_adapter_weights,
    read_loss_curve,
    read_optimizer_state,
    read_safetensors_header,
    read_training_state,
    robust_curve,
    spike_indices,
)
from adapterprobe.errors import (
    AdapterProbeError,
    ExtractionError,
    HeaderError,
    IntegrityError,
    LayerGroupingError,
    LogFormatError,
    MissingExtraError,
    MissingFileError,
    MonitorConfigError,
    TrainingStateError,
    UnsafePickleError,
    UsageError,
    WeightsError,
    install_hint,
)
from adapterprobe.guard import Guard
from adapterprobe.probes import (
    DriftOptions,
    FullWeightsOptions,
    GapOptions,
    GhostOptions,
    ProbeResult,
    Verdict,
    WeightsOptions,
    adapter_weights,
    full_weights,
    gap_monitor,
    gradient_ghost,
    training_drift,
)
from adapterprobe.records import ScanRecord, ScanReport
from adapterprobe.scan import scan

# name -> module that defines it; imported on first attribute access.
_LAZY = {
    "extract_lora": "adapterprobe.lora.extract",
    "ExtractionReport": "adapterprobe.lora.extract",
    "ParasiticExtractor": "adapterprobe.lora.parasitic",
    "ParasiticConfig": "adapterprobe.lora.parasitic",
    "apply_adapter": "adapterprobe.lora.parasitic",
    "GAPMonitor": "adapterprobe.monitor",
    "GradientDump": "adapterprobe.monitor",
    "compare": "adapterprobe.comparison",
    "Comparison": "adapterprobe.comparison",
    "similar": "adapterprobe.comparison",
}


# Optional dependencies whose absence makes a lazy name a placeholder.
_OPTIONAL = frozenset({"torch", "safetensors", "transformers", "peft", "numpy"})


class _NeedsExtra:
    """Stands in for a name whose optional dependency is not installed, so that
    ``help(adapterprobe)``, ``dir()`` and ``hasattr()`` work without it; calling
    it, or anything else but introspection, raises MissingExtraError."""

    def __init__(self, name: str, error: ImportError) -> None:
        self._name = name
        self._error = error
        self.__doc__ = f"adapterprobe.{name} is unavailable: {error}"

    def _refuse(self) -> MissingExtraError:
        return MissingExtraError(
            f"adapterprobe.{self._name} needs torch, which is not installed: "
            + install_hint("torch"),
            extra="torch",
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise self._refuse()

    def __repr__(self) -> str:
        return f"<adapterprobe.{self._name}: needs torch ({install_hint('torch')})>"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'adapterprobe' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        missing = (getattr(exc, "name", None) or "").split(".")[0]
        if isinstance(exc, MissingExtraError) or missing in _OPTIONAL:
            return _NeedsExtra(name, exc)
        raise
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    # errors
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
    # results
    "ProbeResult",
    "Verdict",
    # readers and kernels
    "AdapterWeights",
    "LayerGrouping",
    "LossCurve",
    "OptimizerState",
    "ParamStat",
    "SafetensorsHeader",
    "TensorInfo",
    "count_spikes",
    "curve_metrics",
    "group_layers",
    "read_adapter_weights",
    "read_loss_curve",
    "read_optimizer_state",
    "read_safetensors_header",
    "read_training_state",
    "robust_curve",
    "spike_indices",
    "TrainingState",
    # probes and scans
    "DriftOptions",
    "FullWeightsOptions",
    "GapOptions",
    "GhostOptions",
    "WeightsOptions",
    "adapter_weights",
    "full_weights",
    "gap_monitor",
    "gradient_ghost",
    "training_drift",
    "Guard",
    "scan",
    "ScanRecord",
    "ScanReport",
    # torch-backed (lazy)
    *_LAZY,
]
