"""Type stubs for the Rust extension module (hand-written; keep in step with rust/py.rs)."""

from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import numpy as np
import numpy.typing as npt

__version__: str

_Path = str | PathLike[str]

class AdapterProbeError(Exception): ...
class HeaderError(AdapterProbeError): ...
class LogFormatError(AdapterProbeError): ...
class LayerGroupingError(AdapterProbeError): ...
class TrainingStateError(AdapterProbeError): ...
class UnsafePickleError(TrainingStateError): ...
class IntegrityError(TrainingStateError): ...
class MissingFileError(AdapterProbeError): ...
class UsageError(AdapterProbeError): ...

class TensorInfo:
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def data_offsets(self) -> tuple[int, int]: ...

class SafetensorsHeader:
    @property
    def tensors(self) -> dict[str, TensorInfo]: ...
    @property
    def metadata(self) -> dict[str, str] | None: ...
    @property
    def data_len(self) -> int: ...

def read_safetensors_header(path: _Path) -> SafetensorsHeader:
    """Parse a safetensors header, reading only 8 + N bytes; raises HeaderError."""

class LayerGrouping:
    @property
    def layer_indices(self) -> tuple[int, ...]: ...
    @property
    def params_per_layer(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def layer_of(self) -> dict[int, int]: ...

def group_layers(adapter: _Path, num_params: int | None = None) -> LayerGrouping:
    """Attribute optimizer param ids to layers from adapter keys; raises LayerGroupingError."""

class LossCurve:
    @property
    def steps(self) -> npt.NDArray[np.int64]: ...
    @property
    def losses(self) -> npt.NDArray[np.float64]: ...
    @property
    def num_files(self) -> int: ...
    @property
    def files(self) -> list[Path]: ...
    def metrics(
        self, *, rolling_window: int = 10, spike_sigma: float = 3.0
    ) -> dict[str, float | int | list[int]]:
        """Drift metrics; spike_steps/nonfinite_steps are step numbers."""
    def sample(self, cap: int = 512) -> list[tuple[int, float | None]]:
        """About `cap` evenly strided (step, loss) points, ends kept, non-finite as None."""
    def __len__(self) -> int: ...

def read_loss_curve(source: _Path | Sequence[_Path]) -> LossCurve:
    """Read dlm JSONL logs (store dir, logs dir, file or list of files) into one curve."""

def curve_metrics(
    losses: Sequence[float] | npt.NDArray[np.floating],
    *,
    rolling_window: int = 10,
    spike_sigma: float = 3.0,
) -> dict[str, float | int | npt.NDArray[np.int64]]: ...
def count_spikes(
    deltas: Sequence[float] | npt.NDArray[np.floating], *, window: int = 10, sigma: float = 3.0
) -> int: ...
def spike_indices(
    deltas: Sequence[float] | npt.NDArray[np.floating], *, window: int = 10, sigma: float = 3.0
) -> npt.NDArray[np.int64]: ...

class ParamStat:
    @property
    def param_id(self) -> int: ...
    @property
    def numel(self) -> int: ...
    @property
    def exp_avg_sq_mean(self) -> float: ...
    @property
    def nonfinite(self) -> int: ...

class TrainingState:
    @property
    def path(self) -> Path: ...
    @property
    def global_step(self) -> int: ...
    @property
    def epoch(self) -> float | None: ...
    @property
    def best_val_loss(self) -> float: ...
    @property
    def use_qlora(self) -> bool: ...
    @property
    def per_param(self) -> list[ParamStat]: ...

def read_training_state(path: _Path) -> TrainingState:
    """Read training_state.pt (or a version dir) without torch; checks a .sha256 sidecar."""

class DriftInput:
    """What training_drift needs about one store."""

    store: Path
    logs_dir: Path
    files: list[Path]
    status: str  # "no_logs_dir" | "no_files" | "curve" | "failed"
    curve: LossCurve | None
    error: str | None

class GhostInput:
    """What gradient_ghost needs about one adapter version."""

    adapter: Path
    state: TrainingState | None
    error_kind: str | None
    error: str | None
    grouping: LayerGrouping | None
    grouping_error: str | None

class Target:
    def __init__(
        self,
        store: _Path,
        versions: Sequence[_Path],
        broken: Sequence[tuple[_Path, str]] = (),
        with_logs: bool = True,
    ) -> None: ...
    @property
    def store(self) -> Path: ...
    @property
    def versions(self) -> list[Path]: ...
    @property
    def broken(self) -> list[tuple[Path, str]]: ...
    @property
    def with_logs(self) -> bool: ...

class TargetInputs:
    store: Path
    drift: DriftInput | None
    ghosts: list[GhostInput]
    broken: list[tuple[Path, str]]

def drift_input(store: _Path) -> DriftInput: ...
def ghost_input(adapter: _Path) -> GhostInput: ...
def discover(
    roots: Sequence[_Path], *, all_versions: bool = False, workers: int | None = None
) -> tuple[list[Target], list[tuple[Path, str]]]: ...
def probe_targets(
    targets: Sequence[Target], *, drift: bool = True, ghost: bool = True, workers: int | None = None
) -> list[TargetInputs]: ...
