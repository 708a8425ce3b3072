"""Stubs of ``adapterprobe._core._testing``: the kernels' inputs built from
plain values, the same structs the readers produce, so the property tests
can judge curves and adapters no reader would meet. Not public API.
"""

from collections.abc import Sequence
from os import PathLike

from adapterprobe._core import (
    AdapterWeights,
    ConfigSummary,
    DriftInput,
    FullWeights,
    FullWeightsInput,
    LayerEnergy,
    LayerWeights,
    LogsStatus,
    LoraModuleStats,
    LossCurve,
    TensorStats,
    WeightsInput,
)

__all__ = [
    "drift_input_from",
    "loss_curve_from_records",
    "make_adapter_weights",
    "make_config_summary",
    "make_full_weights",
    "make_full_weights_input",
    "make_layer_energy",
    "make_layer_weights",
    "make_lora_module_stats",
    "make_tensor_stats",
    "make_weights_input",
]

_Path = str | PathLike[str]

# ---- training_drift's inputs ----

def loss_curve_from_records(
    records: Sequence[tuple[int, float]],
    *,
    eval_loss: Sequence[tuple[int, float]] = ...,
    grad_norm: Sequence[tuple[int, float]] = ...,
    learning_rate: Sequence[tuple[int, float]] = ...,
    reward: Sequence[tuple[int, float]] = ...,
    progress: tuple[int, int] | None = None,
    files: Sequence[_Path] = ...,
    source: str = ...,
) -> LossCurve:
    """A loss curve from ``(step, loss)`` records in reading order, built as
    the log readers build it, with the side series logged beside it and the
    run's ``(global_step, max_steps)`` where a trainer state would give it."""
    ...

def drift_input_from(
    store: _Path,
    status: LogsStatus,
    *,
    logs_dir: _Path | None = None,
    files: Sequence[_Path] = ...,
    curve: LossCurve | None = None,
    error: str | None = None,
    error_path: _Path | None = None,
    note: str | None = None,
    layout: str = ...,
) -> DriftInput:
    """A ``DriftInput`` in any state (``curve`` exactly with ``Curve``,
    ``error`` exactly with ``Failed``)."""
    ...

# ---- the weights probes' inputs ----

def make_lora_module_stats(
    name: str,
    *,
    layer: int | None = None,
    rank: int = 0,
    norm_a: float = 0.0,
    norm_b: float = 0.0,
    nonfinite_a: int = 0,
    nonfinite_b: int = 0,
    delta_fro: float | None = None,
    stable_rank: float = 0.0,
    effective_rank: float = 0.0,
    rank_used: int | None = None,
    magnitude_norm: float | None = None,
    magnitude_nonfinite: int = 0,
    singular_values: Sequence[float] = ...,
) -> LoraModuleStats:
    """A ``LoraModuleStats`` with these fields (the rest plain defaults)."""

def make_tensor_stats(
    name: str,
    *,
    dtype: str = ...,
    shape: Sequence[int] = ...,
    numel: int = 0,
    norm: float = 0.0,
    max_abs: float = 0.0,
    nonfinite: int = 0,
) -> TensorStats:
    """A ``TensorStats`` (``dtype`` ``"F32"``, ``shape`` empty unless given)."""

def make_layer_energy(layer: int, modules: int, delta_fro_sq: float) -> LayerEnergy: ...
def make_config_summary(
    path: _Path,
    r: int,
    lora_alpha: float,
    *,
    use_rslora: bool = False,
    use_dora: bool = False,
    target_modules: Sequence[str] = ...,
    modules_to_save: Sequence[str] = ...,
    init_lora_weights: str = ...,
) -> ConfigSummary: ...
def make_adapter_weights(
    path: _Path,
    config: ConfigSummary | None,
    modules: Sequence[LoraModuleStats],
    other_tensors: Sequence[TensorStats],
    layers: Sequence[LayerEnergy],
    *,
    tensor_bytes: int = 0,
    nonfinite_total: int = 0,
) -> AdapterWeights: ...
def make_weights_input(
    adapter: _Path,
    *,
    weights: AdapterWeights | None = None,
    error: str | None = None,
    error_path: _Path | None = None,
    note: str | None = None,
    layout: str = ...,
    checkpoint_kind: str = ...,
) -> WeightsInput:
    """A ``WeightsInput``: the weights, or a ``WeightsError`` with reason
    ``error`` (and ``error_path``), or a note; ``layout`` is ``"dlm"`` and
    ``checkpoint_kind`` ``"adapter"`` unless given."""

def make_layer_weights(
    layer: int, *, tensors: int = 1, numel: int = 0, norm: float = 0.0, nonfinite: int = 0
) -> LayerWeights: ...
def make_full_weights(
    path: _Path,
    files: Sequence[_Path],
    tensors: Sequence[TensorStats],
    layers: Sequence[LayerWeights],
    *,
    skipped: Sequence[tuple[str, str]] = ...,
    other_norm: float = 0.0,
    total_norm: float = 0.0,
    tensor_bytes: int = 0,
    nonfinite_total: int = 0,
) -> FullWeights: ...
def make_full_weights_input(
    adapter: _Path,
    *,
    model_file: _Path | None = None,
    weights: FullWeights | None = None,
    error: str | None = None,
    error_path: _Path | None = None,
    note: str | None = None,
    layout: str = ...,
    checkpoint_kind: str = ...,
) -> FullWeightsInput:
    """A ``FullWeightsInput`` (``layout`` ``"hf"``, ``checkpoint_kind``
    ``"full"`` unless given)."""
