"""adapterprobe: fast, model-free health checks for LoRA adapters and fine-tuning runs.

Importing this package never imports torch: the names that need torch
(extraction, the GAP monitor) load their modules on first use.
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
)
from adapterprobe.probes import (
    DriftOptions,
    GhostOptions,
    ProbeResult,
    Verdict,
    WeightsOptions,
    adapter_weights,
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
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'adapterprobe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
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
    "GhostOptions",
    "WeightsOptions",
    "adapter_weights",
    "gradient_ghost",
    "training_drift",
    "scan",
    "ScanRecord",
    "ScanReport",
    # torch-backed (lazy)
    *_LAZY,
]
