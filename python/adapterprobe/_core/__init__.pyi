"""Type stubs for the Rust extension module (hand-written; keep in step with rust/py.rs).

Errors raised here are the classes of :mod:`adapterprobe.errors`.
"""

from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, ClassVar, TypeAlias, final

import numpy as np
import numpy.typing as npt

from adapterprobe._core import _testing as _testing
from adapterprobe.errors import AdapterProbeError

__all__ = [
    "AdapterWeights",
    "Attribution",
    "BatchGate",
    "ConfigSummary",
    "CoreRecord",
    "Discovery",
    "DriftInput",
    "FullWeights",
    "FullWeightsInput",
    "GapInput",
    "GhostInput",
    "Guard",
    "GuardNote",
    "LayerEnergy",
    "LayerGrouping",
    "LayerWeights",
    "LogsStatus",
    "LoraModuleStats",
    "LossCurve",
    "OptimizerState",
    "OutputClasses",
    "ParamSlot",
    "ParamStat",
    "Problem",
    "RobustCurve",
    "SafetensorsHeader",
    "SimilarPair",
    "SimilarReport",
    "SkippedAdapter",
    "SpikeEvent",
    "Target",
    "TargetInputs",
    "TensorInfo",
    "TensorStats",
    "TrainingState",
    "WeightsInput",
    "__version__",
    "compare_adapter_updates",
    "count_spikes",
    "curve_metrics",
    "discover",
    "drift_input",
    "excerpt",
    "find_adapters",
    "full_weights_input",
    "gap_input",
    "ghost_input",
    "ghost_input_of",
    "group_layers",
    "is_lora_file",
    "json_dumps",
    "judge_drift",
    "judge_full_weights",
    "judge_gap",
    "judge_ghost",
    "judge_weights",
    "probe_targets",
    "read_adapter_weights",
    "read_gap_records",
    "read_loss_curve",
    "read_optimizer_state",
    "read_safetensors_header",
    "read_training_state",
    "read_tree",
    "remote_checksums_verified",
    "remote_fetched",
    "remote_release",
    "remote_stage",
    "remote_supported",
    "robust_curve",
    "scan_records",
    "similar_adapters",
    "spike_indices",
    "weights_input",
]

__version__: str

_Path = str | PathLike[str]
_Floats = Sequence[float] | npt.NDArray[np.floating[Any]]

@final
class TensorInfo:
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def data_offsets(self) -> tuple[int, int]: ...

@final
class SafetensorsHeader:
    @property
    def tensors(self) -> dict[str, TensorInfo]: ...
    @property
    def metadata(self) -> dict[str, str] | None: ...
    @property
    def data_len(self) -> int: ...

def read_safetensors_header(path: _Path) -> SafetensorsHeader:
    """Parse a safetensors header, reading only 8 + N bytes; raises HeaderError."""

@final
class LayerGrouping:
    @property
    def layer_indices(self) -> tuple[int, ...]: ...
    @property
    def params_per_layer(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def layer_of(self) -> dict[int, int]: ...

def group_layers(
    adapter: _Path, num_params: int | None = None, *, rules: str = "robust"
) -> LayerGrouping:
    """Attribute optimizer param ids to layers from adapter keys; raises LayerGroupingError.

    ``rules="robust"`` reads the layer markers ``adapter_weights`` reads
    (``layers.N``, GPT-2's ``h.N``, ``layer.N``, ``block.N``, ``blocks.N``);
    ``rules="sway"`` only dlm-sway's ``.layers.N.``."""

@final
class LossCurve:
    @property
    def steps(self) -> npt.NDArray[np.int64]: ...
    @property
    def losses(self) -> npt.NDArray[np.float64]: ...
    @property
    def num_files(self) -> int: ...
    @property
    def files(self) -> list[Path]: ...
    @property
    def source(self) -> str: ...
    @property
    def series(self) -> str: ...
    @property
    def torn_files(self) -> list[Path]: ...
    @property
    def eval_loss(self) -> list[tuple[int, float]]:
        """(step, eval loss) pairs logged beside the training loss, by step."""
    @property
    def grad_norm(self) -> list[tuple[int, float]]:
        """(step, gradient norm before clipping) pairs, by step; NaN kept."""
    @property
    def learning_rate(self) -> list[tuple[int, float]]:
        """(step, learning rate) pairs, by step."""
    @property
    def reward(self) -> list[tuple[int, float]]:
        """(step, mean reward) pairs of an RL objective, by step."""
    @property
    def progress(self) -> tuple[int, int] | None:
        """(global_step, max_steps) where the log says how far the run got
        against its plan (trainer_state.json, LLaMA-Factory's log)."""
    @property
    def run(self) -> str:
        """The tracker's name of the run (W&B project/name (id), MLflow
        experiment/run name (id)); empty for plain log files."""
    def metrics(self, *, rolling_window: int = 10, spike_sigma: float = 3.0) -> dict[str, Any]:
        """Drift metrics; spike_steps/nonfinite_steps are step numbers."""
    def robust(
        self,
        *,
        trend_window: int = 11,
        spike_z: float = 6.0,
        min_spike_rise: float = 0.1,
        scale_block: int = 64,
        spike_false_alarm: float = 0.01,
        spike_fall_share: float = 0.1,
    ) -> RobustCurve | None:
        """The robust analysis of this curve (see robust_curve); None if no loss is finite."""
    def sample(self, cap: int = 512) -> list[tuple[int, float | None]]:
        """About `cap` evenly strided (step, loss) points, ends kept, non-finite as None."""
    def side_summary(self, cap: int = 512) -> dict[str, dict[str, Any]]:
        """Per side series present: len, sampled, nonfinite_steps, zeros."""
    def __len__(self) -> int: ...

def read_loss_curve(source: _Path | Sequence[_Path], *, tag: str | None = None) -> LossCurve:
    """A loss curve from dlm JSONL, HF trainer_state.json (or an HF output dir),
    LLaMA-Factory's trainer_log.jsonl, an MLflow or W&B run, TensorBoard events
    or CSV; a list of paths is read as dlm JSONL files."""

def curve_metrics(
    losses: _Floats,
    *,
    rolling_window: int = 10,
    spike_sigma: float = 3.0,
) -> dict[str, Any]: ...
def count_spikes(deltas: _Floats, *, window: int = 10, sigma: float = 3.0) -> int: ...
def spike_indices(
    deltas: _Floats, *, window: int = 10, sigma: float = 3.0
) -> npt.NDArray[np.int64]: ...

@final
class SpikeEvent:
    """A run of adjacent points above the robust spike threshold (curve indices)."""

    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def peak(self) -> int: ...
    @property
    def rise(self) -> float: ...
    @property
    def relative_rise(self) -> float: ...
    @property
    def z(self) -> float: ...

@final
class RobustCurve:
    """Rolling-median trend, noise scale, spike events and levels of a loss curve."""

    @property
    def trend(self) -> list[float]: ...
    @property
    def spikes(self) -> list[SpikeEvent]: ...
    @property
    def nonfinite(self) -> list[int]: ...
    @property
    def head_level(self) -> float: ...
    @property
    def tail_level(self) -> float: ...
    @property
    def best_level(self) -> float: ...
    @property
    def best_index(self) -> int: ...
    @property
    def peak_level(self) -> float: ...
    @property
    def peak_index(self) -> int: ...
    @property
    def noise(self) -> float: ...
    @property
    def relative(self) -> bool: ...
    @property
    def level_points(self) -> int: ...
    @property
    def spike_threshold(self) -> float: ...
    def relative_drop(self) -> float: ...
    def relative_regression(self) -> float: ...

def robust_curve(
    losses: _Floats,
    *,
    trend_window: int = 11,
    spike_z: float = 6.0,
    min_spike_rise: float = 0.1,
    scale_block: int = 64,
    spike_false_alarm: float = 0.01,
    spike_fall_share: float = 0.1,
) -> RobustCurve | None:
    """Robust trend, noise and spike events of a loss sequence (None if no loss is finite)."""

@final
class ParamStat:
    @property
    def param_id(self) -> int: ...
    @property
    def numel(self) -> int: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def exp_avg_sq_mean(self) -> float: ...
    @property
    def nonfinite(self) -> int: ...

@final
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
    @property
    def implausible(self) -> list[str]:
        """Values no optimizer writes, one sentence each; empty when plausible."""

@final
class OptimizerState:
    """An optimizer state read without torch (HF optimizer.pt, Lightning .ckpt, dlm)."""

    @property
    def path(self) -> Path: ...
    @property
    def format(self) -> str: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def second_moment(self) -> str | None: ...
    @property
    def per_param(self) -> list[ParamStat]: ...
    @property
    def no_second_moment(self) -> str | None: ...
    @property
    def param_groups(self) -> list[list[int]]: ...
    @property
    def global_step(self) -> int | None: ...
    @property
    def epoch(self) -> float | None: ...
    @property
    def implausible(self) -> list[str]:
        """Values no optimizer writes, one sentence each; empty when plausible."""

def read_optimizer_state(path: _Path) -> OptimizerState:
    """Read optimizer.pt, a Lightning .ckpt or training_state.pt with the allow-listed reader."""

def read_training_state(path: _Path) -> TrainingState:
    """Read training_state.pt (or a version dir) without torch; checks a .sha256 sidecar."""

@final
class LogsStatus:
    """What reading a store's logs gave."""

    NoLogsDir: ClassVar[LogsStatus]
    NoFiles: ClassVar[LogsStatus]
    Curve: ClassVar[LogsStatus]
    Failed: ClassVar[LogsStatus]
    def __int__(self) -> int: ...

@final
class DriftInput:
    """What training_drift needs about one store."""

    @property
    def store(self) -> Path: ...
    @property
    def layout(self) -> str: ...
    @property
    def logs_dir(self) -> Path: ...
    @property
    def files(self) -> list[Path]: ...
    @property
    def status(self) -> LogsStatus: ...
    @property
    def curve(self) -> LossCurve | None: ...
    @property
    def error(self) -> AdapterProbeError | None: ...
    @property
    def note(self) -> str | None: ...
    @property
    def output_classes(self) -> OutputClasses | None: ...
    @property
    def guard(self) -> GuardNote | None: ...

@final
class BatchGate:
    """Whether to apply an optimizer step, from its loss (``skip_batch_above``)."""

    def __new__(cls, sigmas: float) -> BatchGate: ...
    def admit(self, loss: float) -> bool:
        """Whether to apply the step whose loss is ``loss`` (False: skip it)."""
    @property
    def bar(self) -> float | None: ...
    @property
    def skipped(self) -> int: ...

@final
class Guard:
    """The drift rules judged online (``verdicts::guard``); see adapterprobe.Guard."""

    def __new__(
        cls,
        options: Any,
        *,
        output_classes: int | None = None,
        output_kind: str | None = None,
        max_steps: int | None = None,
    ) -> Guard: ...
    def copy(self) -> Guard:
        """An independent guard with this one's records and findings so far."""
    def observe(
        self,
        step: int,
        loss: float | None = None,
        grad_norm: float | None = None,
        learning_rate: float | None = None,
        eval_loss: float | None = None,
        reward: float | None = None,
    ) -> str: ...
    def observe_gap(self, step: int, stats: Mapping[str, float]) -> str:
        """The GAP monitor's statistics of one sampled step; the verdict so far."""
    def observe_factors(
        self, step: int, init: str, modules: Sequence[tuple[int, int, float]]
    ) -> str:
        """The live model's LoRA A factors at ``step``; the verdict so far."""
    def rewind(self, step: int) -> str:
        """Forget every record after ``step``; the verdict of what is kept."""
    def set_max_steps(self, max_steps: int | None) -> None:
        """The plan the run is now set for; None: no plan."""
    @property
    def verdict(self) -> str: ...
    @property
    def num_records(self) -> int: ...
    @property
    def findings(self) -> list[dict[str, Any]]: ...
    def result(self) -> tuple[str, float | None, float | None, str, dict[str, Any]]:
        """Every record seen, judged as a logged run:
        ``(verdict, score, raw, message, evidence)``."""
        ...

@final
class OutputClasses:
    """What a model's loss is a cross-entropy over, and where that was read
    (its ``config.json``, a base model's, a tracker's record of it,
    TensorBoard's ``model_config`` text, Lightning's ``hparams.yaml``)."""

    @property
    def count(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def source(self) -> str: ...

@final
class ParamSlot:
    @property
    def param_id(self) -> int: ...
    @property
    def layer(self) -> int: ...
    @property
    def slot(self) -> int: ...

@final
class Attribution:
    """Exact attribution of optimizer param ids to (layer, slot)."""

    @property
    def layer_indices(self) -> list[int]: ...
    @property
    def params(self) -> list[ParamSlot]: ...
    @property
    def slot_names(self) -> list[str]: ...
    @property
    def unattributed(self) -> list[int]: ...

@final
class GhostInput:
    """What gradient_ghost needs about one adapter version."""

    @property
    def adapter(self) -> Path: ...
    @property
    def layout(self) -> str: ...
    @property
    def checkpoint_kind(self) -> str: ...
    @property
    def state(self) -> TrainingState | None: ...
    @property
    def error(self) -> AdapterProbeError | None: ...
    @property
    def grouping(self) -> LayerGrouping | None: ...
    @property
    def grouping_error(self) -> AdapterProbeError | None: ...
    @property
    def attribution(self) -> Attribution | None: ...
    @property
    def attribution_error(self) -> str | None: ...
    @property
    def weights_error(self) -> AdapterProbeError | None: ...
    @property
    def optimizer(self) -> str | None: ...
    @property
    def note(self) -> str | None: ...

@final
class Target:
    def __new__(
        cls,
        store: _Path,
        versions: Sequence[_Path],
        broken: Sequence[tuple[_Path, str]] = ...,
        with_logs: bool = True,
        layout: str = ...,
        checkpoint_kind: str | None = None,
        log_root: _Path | None = None,
        root: _Path | None = None,
    ) -> Target: ...
    @property
    def store(self) -> Path: ...
    @property
    def layout(self) -> str: ...
    @property
    def versions(self) -> list[Path]: ...
    @property
    def broken(self) -> list[tuple[Path, str]]: ...
    @property
    def with_logs(self) -> bool: ...
    @property
    def log_root(self) -> Path | None:
        """Where the loss curve is read when not the store (a checkpoint given alone)."""
    @property
    def checkpoint_kind(self) -> str | None:
        """What the newest version holds: "adapter", "full" or "logs"."""
    @property
    def root(self) -> Path | None:
        """The resolved scan root the readers stay inside; None to follow links anywhere."""

@final
class TargetInputs:
    @property
    def store(self) -> Path: ...
    @property
    def layout(self) -> str: ...
    @property
    def checkpoint_kind(self) -> str | None: ...
    @property
    def drift(self) -> DriftInput | None: ...
    @property
    def ghosts(self) -> list[GhostInput]: ...
    @property
    def weights(self) -> list[WeightsInput]: ...
    @property
    def full_weights(self) -> list[FullWeightsInput]: ...
    @property
    def gap(self) -> GapInput | None: ...
    @property
    def broken(self) -> list[tuple[Path, str]]: ...

@final
class Problem:
    """A path the walk could not search, and why."""

    @property
    def path(self) -> Path: ...
    @property
    def message(self) -> str: ...

@final
class Discovery:
    @property
    def targets(self) -> list[Target]: ...
    @property
    def problems(self) -> list[Problem]: ...
    @property
    def skipped(self) -> list[Problem]:
        """With ``explain=True``: directories passed over on purpose (hidden, nothing
        recognisable, no part of a store's layout), each with why; else empty."""

@final
class LoraModuleStats:
    """Statistics of one LoRA module (norms, dW spectrum, non-finite counts)."""

    @property
    def name(self) -> str: ...
    @property
    def layer(self) -> int | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    @property
    def dtype_a(self) -> str: ...
    @property
    def dtype_b(self) -> str: ...
    @property
    def alpha(self) -> float | None: ...
    @property
    def scale(self) -> float | None: ...
    @property
    def norm_a(self) -> float: ...
    @property
    def norm_b(self) -> float: ...
    @property
    def max_abs_a(self) -> float: ...
    @property
    def max_abs_b(self) -> float: ...
    @property
    def nonfinite_a(self) -> int: ...
    @property
    def nonfinite_b(self) -> int: ...
    @property
    def delta_fro(self) -> float | None: ...
    @property
    def singular_values(self) -> list[float]: ...
    @property
    def stable_rank(self) -> float: ...
    @property
    def effective_rank(self) -> float: ...
    @property
    def rank_used(self) -> int | None: ...
    @property
    def magnitude_norm(self) -> float | None: ...
    @property
    def magnitude_nonfinite(self) -> int: ...

@final
class TensorStats:
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def numel(self) -> int: ...
    @property
    def norm(self) -> float: ...
    @property
    def max_abs(self) -> float: ...
    @property
    def nonfinite(self) -> int: ...

@final
class LayerEnergy:
    @property
    def layer(self) -> int: ...
    @property
    def modules(self) -> int: ...
    @property
    def delta_fro_sq(self) -> float: ...

@final
class ConfigSummary:
    @property
    def path(self) -> Path: ...
    @property
    def peft_type(self) -> str | None: ...
    @property
    def r(self) -> int: ...
    @property
    def lora_alpha(self) -> float: ...
    @property
    def use_rslora(self) -> bool: ...
    @property
    def use_dora(self) -> bool: ...
    @property
    def fan_in_fan_out(self) -> bool: ...
    @property
    def target_modules(self) -> list[str]: ...
    @property
    def target_modules_is_regex(self) -> bool: ...
    @property
    def modules_to_save(self) -> list[str]: ...
    @property
    def base_model_name_or_path(self) -> str | None: ...
    @property
    def rank_pattern(self) -> list[tuple[str, int]]: ...
    @property
    def alpha_pattern(self) -> list[tuple[str, float]]: ...
    @property
    def init_lora_weights(self) -> str: ...
    @property
    def merged_linear(self) -> bool: ...
    @property
    def format(self) -> str: ...

@final
class AdapterWeights:
    """What read_adapter_weights found in an adapter's weights and config."""

    @property
    def path(self) -> Path: ...
    @property
    def config(self) -> ConfigSummary | None: ...
    @property
    def modules(self) -> list[LoraModuleStats]: ...
    @property
    def other_tensors(self) -> list[TensorStats]: ...
    @property
    def layers(self) -> list[LayerEnergy]: ...
    @property
    def tensor_bytes(self) -> int: ...
    @property
    def nonfinite_total(self) -> int: ...
    @property
    def unformed_modules(self) -> list[str]: ...

def read_adapter_weights(path: _Path) -> AdapterWeights:
    """Read a PEFT adapter's weights and config (bounded memory); raises WeightsError."""

@final
class WeightsInput:
    @property
    def adapter(self) -> Path: ...
    @property
    def layout(self) -> str: ...
    @property
    def checkpoint_kind(self) -> str: ...
    @property
    def weights(self) -> AdapterWeights | None: ...
    @property
    def error(self) -> AdapterProbeError | None: ...
    @property
    def note(self) -> str | None: ...

def weights_input(adapter: _Path) -> WeightsInput: ...

@final
class LayerWeights:
    """The weights of one transformer layer of a full model, together."""

    @property
    def layer(self) -> int: ...
    @property
    def tensors(self) -> int: ...
    @property
    def numel(self) -> int: ...
    @property
    def norm(self) -> float: ...
    @property
    def nonfinite(self) -> int: ...

@final
class FullWeights:
    """Every float tensor of a full checkpoint's model.safetensors (or shards)."""

    @property
    def path(self) -> Path: ...
    @property
    def files(self) -> list[Path]: ...
    @property
    def tensors(self) -> list[TensorStats]: ...
    @property
    def layers(self) -> list[LayerWeights]: ...
    @property
    def skipped(self) -> list[tuple[str, str]]: ...
    @property
    def other_norm(self) -> float: ...
    @property
    def total_norm(self) -> float: ...
    @property
    def tensor_bytes(self) -> int: ...
    @property
    def nonfinite_total(self) -> int: ...

@final
class FullWeightsInput:
    """What full_weights needs about one checkpoint."""

    @property
    def adapter(self) -> Path: ...
    @property
    def layout(self) -> str: ...
    @property
    def checkpoint_kind(self) -> str: ...
    @property
    def model_file(self) -> Path | None: ...
    @property
    def weights(self) -> FullWeights | None: ...
    @property
    def error(self) -> AdapterProbeError | None: ...
    @property
    def note(self) -> str | None: ...

def full_weights_input(version: _Path) -> FullWeightsInput: ...
def drift_input(store: _Path) -> DriftInput: ...
def ghost_input(adapter: _Path) -> GhostInput: ...
def ghost_input_of(obj: object) -> GhostInput:
    """A ``GhostInput`` from any object with its attributes (plain data shaped
    like one); a ``GhostInput`` comes back as a copy."""

def judge_ghost(
    inputs: GhostInput, options: Any
) -> tuple[str, float | None, float | None, str, dict[str, Any]]:
    """gradient_ghost's verdict: (verdict, score, raw, message, evidence)."""

@final
class GuardNote:
    """A run's ``adapterprobe-guard.json``: the guard's verdict and stop step."""

    @property
    def verdict(self) -> str: ...
    @property
    def stopped_at(self) -> int | None: ...

@final
class GapInput:
    """What gap_monitor reads of one store: the GAP monitor's records."""

    @property
    def steps(self) -> list[int]:
        """The sampled steps whose records were read (after thinning)."""
    @property
    def files(self) -> list[Path]:
        """The log files read."""

def judge_gap(
    inputs: GapInput, options: Any
) -> tuple[str, float | None, float | None, str, dict[str, Any]]:
    """gap_monitor's verdict: (verdict, score, raw, message, evidence)."""

def gap_input(store: _Path) -> GapInput | None:
    """The GAP monitor's records in ``<store>/logs/train-*.jsonl``; None when none."""

def read_gap_records(path: _Path) -> list[tuple[int, dict[str, float]]]:
    """Every gap record of one log file as ``(step, {key: value})``, with the
    keys the rules read."""

def discover(
    roots: Sequence[_Path],
    *,
    all_versions: bool = False,
    workers: int | None = None,
    follow_symlinks: bool = False,
    explain: bool = False,
    bounds: Sequence[_Path] | None = None,
    exclude: Sequence[str] | None = None,
) -> Discovery: ...
def excerpt(text: str) -> str:
    """``text`` as a short printable-ASCII excerpt (other characters as
    visible escapes, capped): how every message quotes a file's content."""

def is_lora_file(path: str | PathLike[str]) -> bool:
    """Whether the file is a LoRA ``.safetensors`` of another tool than PEFT
    (kohya, LyCORIS, diffusers or mlx-lm naming): a store given alone."""

def read_tree(
    root: _Path, *, skip: Sequence[str] | None = None, workers: int | None = None
) -> tuple[int, int]:
    """Files and bytes a plain walk of ``root`` reads: every regular file
    whose name is not in ``skip``, read once. The floor a scan is measured
    against in ``benches/bench_scan.py``."""

def probe_targets(
    targets: Sequence[Target],
    *,
    drift: bool = True,
    ghost: bool = True,
    weights: bool = True,
    full_weights: bool = False,
    gap: bool = True,
    workers: int | None = None,
) -> list[TargetInputs]: ...
def json_dumps(value: object) -> str:
    """``json.dumps(value)`` (default separators, ``ensure_ascii``, floats as
    ``repr``) for plain trees of dict, list, tuple, str, int, float, bool and
    None, written in Rust. Other types raise TypeError; NaN and infinities
    ValueError."""

# ---- comparing adapters (analysis::update_similarity, store::similar) ----

def compare_adapter_updates(a: _Path, b: _Path, *, angles: bool = True) -> dict[str, Any]:
    """Cosine of two adapters' updates per shared module and over all of them
    (energy-weighted), principal angles, modules left out; NaN as None."""

def find_adapters(root: _Path) -> list[Path]:
    """Adapter directories (holding adapter_model.safetensors or .bin) under `root`."""

@final
class SimilarPair:
    @property
    def a(self) -> Path: ...
    @property
    def b(self) -> Path: ...
    @property
    def similarity(self) -> float: ...

@final
class SkippedAdapter:
    @property
    def path(self) -> Path: ...
    @property
    def reason(self) -> str: ...

@final
class SimilarReport:
    @property
    def pairs(self) -> list[SimilarPair]: ...
    @property
    def pairs_found(self) -> int: ...
    @property
    def max_pairs(self) -> int: ...
    @property
    def adapters(self) -> int: ...
    @property
    def groups(self) -> int: ...
    @property
    def pairs_considered(self) -> int: ...
    @property
    def pairs_exact(self) -> int: ...
    @property
    def skipped(self) -> list[SkippedAdapter]: ...
    @property
    def threshold(self) -> float: ...
    @property
    def exhaustive(self) -> bool: ...
    @property
    def left_out(self) -> int: ...

def similar_adapters(
    root: _Path | None = None,
    *,
    paths: Sequence[_Path] | None = None,
    threshold: float = 0.99,
    exhaustive: bool = False,
    max_pairs: int = 10000,
    all_checkpoints: bool = False,
) -> SimilarReport:
    """Pairs of adapters (under `root`, or among `paths`) whose similarity is
    at least `threshold`, most similar first: the `max_pairs` most similar,
    all of them counted in `pairs_found`. Under a root, one adapter per run
    (its final or newest) unless `all_checkpoints`; `left_out` counts the rest."""

def remote_checksums_verified() -> bool:
    """Whether sha256 sidecars of remote files are checked
    (``ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS``), as the readers decide it."""

def remote_stage(url: str, dir: _Path) -> tuple[int, int, int, list[tuple[str, str]]]:
    """List the remote root ``url`` (``s3://``, ``gs://``, ``az://``) and lay
    its objects out as sparse files under the empty directory ``dir``, fetched
    by range on first read: (objects, bytes listed, LIST requests, problems as
    (URL, why)). A bad URL, credentials, bucket or empty prefix raises
    UsageError, as does any root in a build without object stores."""
    ...

def remote_fetched(dir: _Path) -> list[tuple[Path, int, int]]:
    """(path, bytes, requests) fetched so far for each file read under the
    staged ``dir``."""
    ...

def remote_release(dir: _Path) -> None:
    """Stop fetching for the staged ``dir`` (the caller removes it)."""
    ...

def remote_supported() -> bool:
    """Whether this build reads object stores (the cargo feature
    ``object-store``, on in release wheels). Without it
    :func:`remote_stage` raises UsageError saying how to rebuild."""

# ---- verdict kernels (verdicts) and the scan pass (records) ----

_Judged: TypeAlias = tuple[str, float | None, float | None, str, dict[str, Any]]

def judge_weights(
    inputs: WeightsInput, options: Any, previous: WeightsInput | None = None
) -> _Judged:
    """adapter_weights' verdict on gathered inputs under ``WeightsOptions``
    (``previous``: the version before this one)."""

def judge_full_weights(inputs: FullWeightsInput, options: Any) -> _Judged:
    """full_weights' verdict on gathered inputs under ``FullWeightsOptions``."""

@final
class CoreRecord:
    """A record made by the scan pass: evidence kept in Rust until asked for."""

    def evidence(self) -> dict[str, Any]: ...
    def evidence_json(self) -> str: ...
    @property
    def raw(self) -> float | None: ...
    @property
    def json(self) -> str | None: ...

def scan_records(
    targets: Sequence[Target],
    options: dict[str, Any],
    *,
    workers: int | None = None,
    json: bool = False,
) -> list[tuple[str, str | None, str, str, str, float | None, str, str | None, CoreRecord]]:
    """Gather, judge and assemble the records of ``targets`` (GIL released):
    (store, adapter, layout, probe, verdict, score, message, checkpoint_kind,
    core) per record, in order."""

# ---- training_drift's kernel (rust/py/verdicts.rs) ----

def judge_drift(
    inputs: DriftInput, options: Any
) -> tuple[str, float | None, float | None, str, dict[str, Any]]:
    """training_drift's verdict on gathered inputs (``options``: a resolved
    ``DriftOptions``): ``(verdict, score, raw, message, evidence)``."""
    ...
