"""Parasitic LoRA extraction: snapshot adapters out of a running full fine-tune.

At training start :meth:`ParasiticExtractor.snapshot_base` copies the weights
``W0`` of every Linear module. At interesting points (periodic, loss plateau,
validation improvement; see :meth:`ParasiticExtractor.should_extract`) the
delta ``W_t - W0`` of each changed module is factored into LoRA matrices with
the same randomized SVD and rank rule as :func:`adapterprobe.extract_lora`
(:func:`adapterprobe.lora.factorize.factorize_delta`). The adapters go into an
:class:`AdapterLibrary` that saves as safetensors + JSON (never pickle) and
can export any adapter as a PEFT adapter directory.

Extraction runs under ``torch.no_grad`` with a private RNG stream, so it does
not change the training run's random numbers or autograd state.

Under ``torch.distributed`` every rank calls ``snapshot_base`` and ``extract``: with
FSDP2 each rank keeps only its shard of ``W0`` and the deltas are gathered one layer
at a time (:mod:`adapterprobe.lora.sharded`); rank 0 alone factors them (its adapter
holds the factors, under the single-process names; the other ranks' adapters have
no layers) and ``save_library`` writes from rank 0 only.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from adapterprobe._fs import atomic_dir, write_json
from adapterprobe._json import json_safe
from adapterprobe.errors import ExtractionError, MissingFileError, UsageError, require
from adapterprobe.lora.factorize import (
    DEFAULT_NITER,
    DEFAULT_OVERSAMPLE,
    LowRankFactors,
    factorize_delta,
    resolve_factor_dtype,
)
from adapterprobe.lora.patterns import as_patterns, matches
from adapterprobe.lora.peft_writer import (
    ADAPTER_FILE,
    CONFIG_FILE,
    SafetensorsWriter,
    peft_config,
    peft_key,
)
from adapterprobe.lora.sharded import (
    ShardLayout,
    base_shape,
    factors_here,
    full_delta,
    snapshot,
    unwrap,
)
from adapterprobe.lora.sources import contained, read_json_file

torch = require("torch", "torch")

__all__ = [
    "AdapterLibrary",
    "ExtractedAdapter",
    "ParasiticConfig",
    "ParasiticExtractor",
    "apply_adapter",
]

LIBRARY_FILE = "library.json"
LIBRARY_FORMAT = "adapterprobe.parasitic-library/1"


@dataclass(frozen=True)
class ParasiticConfig:
    """Settings of :class:`ParasiticExtractor` (the seed's ``QLoRAConfig``).

    Rank rule (as :func:`adapterprobe.extract_lora`): ``min_rank``,
    ``max_rank``, ``explained_variance`` (of the whole ``||dW||_F^2``).

    Triggers: every ``interval_steps`` steps (0 disables; never at step 0,
    where the delta is zero); when ``detect_triggers``, also on a loss plateau
    (the last ``plateau_window`` finite losses span less than
    ``plateau_threshold`` of their mean; at most once per window) and on a
    validation score beating the best so far by more than
    ``val_improvement``.

    ``include``/``exclude``: glob patterns on module paths. ``snapshot_device``:
    where ``W0`` is kept ("cpu"; None keeps it beside each parameter).
    ``factor_dtype``: dtype of stored factors (None: float32). ``quantize_int8``
    rounds factors to a per-row absmax int8 grid (stored dequantized).
    """

    min_rank: int = 8
    max_rank: int = 64
    explained_variance: float = 0.95
    interval_steps: int = 50
    detect_triggers: bool = True
    plateau_window: int = 10
    plateau_threshold: float = 0.005
    val_improvement: float = 0.01
    quantize_int8: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    snapshot_device: str | None = "cpu"
    factor_dtype: Any = None
    niter: int = DEFAULT_NITER
    oversample: int = DEFAULT_OVERSAMPLE
    seed: int | None = 0

    def __post_init__(self) -> None:
        if not (1 <= self.min_rank <= self.max_rank):
            raise UsageError(
                f"need 1 <= min_rank <= max_rank, got {self.min_rank} and {self.max_rank}"
            )
        if not (0.0 < self.explained_variance <= 1.0):
            raise UsageError(f"explained_variance must be in (0, 1], got {self.explained_variance}")
        if self.interval_steps < 0 or self.plateau_window < 2:
            raise UsageError("interval_steps must be >= 0 and plateau_window >= 2")
        object.__setattr__(self, "include", as_patterns(self.include, "include"))
        object.__setattr__(self, "exclude", as_patterns(self.exclude, "exclude"))
        dt = resolve_factor_dtype(self.factor_dtype)
        if self.factor_dtype is not None and dt != "base":  # canonical name: JSON round trip
            object.__setattr__(self, "factor_dtype", str(dt).replace("torch.", ""))

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["include"] = list(self.include)
        d["exclude"] = list(self.exclude)
        return json_safe(d)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParasiticConfig:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("include", "exclude"):
            if k in known:
                known[k] = tuple(known[k] or ())
        return cls(**known)


@dataclass
class ExtractedAdapter:
    """One adapter taken from a training run: factors per parameter name
    (``model.layers.0.self_attn.q_proj.weight``) plus the step's metrics."""

    adapter_id: str
    step: int
    trigger: str = "manual"
    loss: float | None = None
    val_score: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    layers: dict[str, LowRankFactors] = field(default_factory=dict)
    seconds: float = 0.0
    created_at: float = 0.0

    @property
    def ranks(self) -> dict[str, int]:
        return {name: f.rank for name, f in self.layers.items()}

    @property
    def mean_rank(self) -> float:
        return sum(self.ranks.values()) / len(self.layers) if self.layers else 0.0

    @property
    def energy_kept(self) -> float:
        """Energy kept over all layers, weighted by each delta's energy."""
        total = sum(f.delta_norm**2 for f in self.layers.values())
        if total <= 0:
            return 1.0
        return sum(f.energy_kept * f.delta_norm**2 for f in self.layers.values()) / total

    def total_params(self) -> int:
        return sum(f.num_params() for f in self.layers.values())

    def compression_ratio(self, original_params: int) -> float:
        n = self.total_params()
        return float("inf") if n == 0 else original_params / n

    def meta(self) -> dict[str, Any]:
        """JSON-safe description (no tensors)."""
        return json_safe(
            {
                "adapter_id": self.adapter_id,
                "step": self.step,
                "trigger": self.trigger,
                "loss": self.loss,
                "val_score": self.val_score,
                "metrics": self.metrics,
                "tags": self.tags,
                "seconds": self.seconds,
                "created_at": self.created_at,
                "mean_rank": self.mean_rank,
                "energy_kept": self.energy_kept,
                "params": self.total_params(),
                "layers": {
                    name: {
                        "rank": f.rank,
                        "shape": list(f.shape),
                        "energy_kept": f.energy_kept,
                        "rel_error": f.rel_error,
                        "delta_norm": f.delta_norm,
                        "target_reached": f.target_reached,
                    }
                    for name, f in self.layers.items()
                },
            }
        )

    def save_peft(self, out_dir: str | Path, *, overwrite: bool = False) -> Path:
        """Write this adapter as a PEFT LoRA directory (alpha = rank, scaling 1)."""
        ranks: dict[str, int] = {}
        with atomic_dir(out_dir, overwrite=overwrite) as tmp:
            writer = SafetensorsWriter(tmp / ADAPTER_FILE)
            try:
                for name, f in self.layers.items():
                    module = name[: -len(".weight")] if name.endswith(".weight") else name
                    writer.add(peft_key(module, "lora_A"), f.lora_A)
                    writer.add(peft_key(module, "lora_B"), f.lora_B)
                    ranks[module] = f.rank
                writer.finish(
                    {"format": "pt", "adapter_id": self.adapter_id, "step": str(self.step)}
                )
            except BaseException:
                writer.abort()
                raise
            write_json(tmp / CONFIG_FILE, peft_config(ranks))
        return Path(out_dir)


class AdapterLibrary:
    """The adapters a run produced, in extraction order."""

    def __init__(
        self,
        adapters: Iterable[ExtractedAdapter] = (),
        *,
        config: ParasiticConfig | None = None,
        stats: Mapping[str, Any] | None = None,
    ) -> None:
        self.adapters: list[ExtractedAdapter] = list(adapters)
        self.config = config
        self.stats: dict[str, Any] = dict(stats or {})

    def __len__(self) -> int:
        return len(self.adapters)

    def __iter__(self):
        return iter(self.adapters)

    def __getitem__(self, key: int | str) -> ExtractedAdapter:
        if isinstance(key, str):
            for a in self.adapters:
                if a.adapter_id == key:
                    return a
            raise KeyError(key)
        return self.adapters[key]

    def add(self, adapter: ExtractedAdapter) -> None:
        self.adapters.append(adapter)

    def best(self, by: Literal["loss", "val_score"] = "loss") -> ExtractedAdapter | None:
        """The adapter with the lowest loss (``by="loss"``) or the highest
        validation score (``by="val_score"``); None when none has that metric."""
        if by not in ("loss", "val_score"):
            raise UsageError(f"best(by=...) must be 'loss' or 'val_score', got {by!r}")
        scored = [
            a for a in self.adapters if getattr(a, by) is not None and math.isfinite(getattr(a, by))
        ]
        if not scored:
            return None
        if by == "loss":
            return min(scored, key=lambda a: cast(float, a.loss))
        return max(scored, key=lambda a: cast(float, a.val_score))

    def summary(self) -> dict[str, Any]:
        return json_safe(
            {
                "count": len(self.adapters),
                **self.stats,
                "adapters": [
                    {
                        "id": a.adapter_id,
                        "step": a.step,
                        "trigger": a.trigger,
                        "loss": a.loss,
                        "val_score": a.val_score,
                        "n_layers": len(a.layers),
                        "mean_rank": a.mean_rank,
                        "energy_kept": a.energy_kept,
                        "params": a.total_params(),
                        "seconds": a.seconds,
                    }
                    for a in self.adapters
                ],
            }
        )

    def save_library(self, path: str | Path, *, overwrite: bool = True) -> Path:
        """Save to a directory: ``library.json`` plus one safetensors file per adapter.
        Written atomically; replaces an existing library at ``path``."""
        with atomic_dir(path, overwrite=overwrite) as tmp:
            entries = []
            for i, a in enumerate(self.adapters):
                fname = f"adapter-{i:04d}.safetensors"
                writer = SafetensorsWriter(tmp / fname)
                try:
                    for name, f in a.layers.items():
                        writer.add(f"{name}::lora_A", f.lora_A)
                        writer.add(f"{name}::lora_B", f.lora_B)
                        writer.add(f"{name}::singular_values", f.singular_values)
                    writer.finish({"format": "pt", "adapter_id": a.adapter_id})
                except BaseException:
                    writer.abort()
                    raise
                entries.append({"file": fname, **a.meta()})
            write_json(
                tmp / LIBRARY_FILE,
                {
                    "format": LIBRARY_FORMAT,
                    "config": self.config.to_dict() if self.config else None,
                    "stats": self.stats,
                    "adapters": entries,
                },
            )
        return Path(path)

    @classmethod
    def load_library(cls, path: str | Path) -> AdapterLibrary:
        """Load a library saved by :meth:`save_library` (no pickle involved).

        A malformed ``library.json`` (wrong types, missing fields, numbers out of
        range, deep nesting) or adapter file is an :class:`ExtractionError`; an entry
        may only name a file inside the library's directory.
        """
        root = Path(path)
        index = root / LIBRARY_FILE
        if not index.is_file():
            raise MissingFileError(f"{root} is not an adapter library (no {LIBRARY_FILE})")
        data = read_json_file(index, "adapter library")
        if not isinstance(data, dict):
            raise ExtractionError(
                f"bad adapter library: a {type(data).__name__}, not an object", path=index
            )
        if data.get("format") != LIBRARY_FORMAT:
            raise ExtractionError(
                f"bad adapter library: unknown format {data.get('format')!r}", path=index
            )
        entries = data.get("adapters")
        if not isinstance(entries, list):
            raise ExtractionError("bad adapter library: 'adapters' is not a list", path=index)
        adapters = []
        for i, entry in enumerate(entries):
            try:
                adapters.append(_adapter_from_entry(root, entry))
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
                raise ExtractionError(
                    f"bad adapter library: entry {i}: {type(exc).__name__}: {exc}", path=index
                ) from exc
        try:
            config = data.get("config")
            cfg = ParasiticConfig.from_dict(_object(config, "config")) if config else None
            stats = _object(data.get("stats") or {}, "stats")
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, UsageError) as exc:
            raise ExtractionError(f"bad adapter library: config: {exc}", path=index) from exc
        return cls(adapters, config=cfg, stats=stats)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is a {type(value).__name__}, not an object")
    return value


def _number(value: Any, what: str, default: float | None = 0.0) -> float | None:
    """A finite-or-not float from JSON (None -> ``default``); TypeError for anything else."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} is not a number: {value!r}")
    return float(value)


def _adapter_from_entry(root: Path, entry: Any) -> ExtractedAdapter:
    """One ``library.json`` entry and its safetensors file, checked field by field."""
    load_file = require("safetensors.torch", "torch").load_file
    e = _object(entry, "the entry")
    name = e["file"]
    if not isinstance(name, str) or not contained(name):
        raise ValueError(f"file {name!r} is not a file name inside the library")
    fpath = root / name
    if not fpath.is_file():
        raise MissingFileError(f"adapter library {root}: {name} is missing")
    try:
        tensors = load_file(str(fpath))
    except Exception as exc:  # safetensors raises its own error types
        raise ExtractionError(f"adapter library: cannot read {name}: {exc}", path=fpath) from exc
    step = e["step"]
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        raise TypeError(f"step is not a number: {step!r}")
    adapter_id = e["adapter_id"]
    if not isinstance(adapter_id, str):
        raise TypeError(f"adapter_id is not a string: {adapter_id!r}")
    trigger = e.get("trigger", "manual")
    if not isinstance(trigger, str):
        raise TypeError(f"trigger is not a string: {trigger!r}")
    tags = e.get("tags") or []
    if not isinstance(tags, list):
        raise TypeError("tags is not a list")
    layers = {}
    for layer, meta in _object(e.get("layers") or {}, "layers").items():
        meta = _object(meta, f"layer {layer!r}")
        try:
            a, b = tensors[f"{layer}::lora_A"], tensors[f"{layer}::lora_B"]
            singular = tensors[f"{layer}::singular_values"]
        except KeyError as exc:
            raise ExtractionError(
                f"adapter library {root}: {name} lacks {exc}", tensor=layer
            ) from exc
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0]:
            raise ExtractionError(
                f"adapter library {root}: {name}: {layer} has factors of shapes "
                f"{list(b.shape)} and {list(a.shape)}, which do not multiply",
                tensor=layer,
            )
        layers[layer] = LowRankFactors(
            name=layer,
            lora_A=a,
            lora_B=b,
            singular_values=singular,
            energy_kept=_number(meta.get("energy_kept"), "energy_kept") or 0.0,
            rel_error=_number(meta.get("rel_error"), "rel_error") or 0.0,
            target_reached=bool(meta.get("target_reached", True)),
            delta_norm=_number(meta.get("delta_norm"), "delta_norm") or 0.0,
        )
    return ExtractedAdapter(
        adapter_id=adapter_id,
        step=int(step),  # OverflowError for inf, ValueError for NaN
        trigger=trigger,
        loss=_number(e.get("loss"), "loss", None),
        val_score=_number(e.get("val_score"), "val_score", None),
        metrics=dict(_object(e.get("metrics") or {}, "metrics")),
        tags=[str(t) for t in tags],
        layers=layers,
        seconds=_number(e.get("seconds"), "seconds") or 0.0,
        created_at=_number(e.get("created_at"), "created_at") or 0.0,
    )


def _scalar(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if hasattr(v, "item"):
        try:
            return v.item()
        except (ValueError, RuntimeError):
            pass
    return str(v)


def _quantize_int8(t: Any) -> Any:
    """Per-row absmax int8 rounding, returned dequantized in the input dtype."""
    x = t.float()
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 127.0
    return ((x / scale).round().clamp(-127, 127) * scale).to(t.dtype)


class ParasiticExtractor:
    """Extract LoRA adapters during full fine-tuning.

    Typical loop::

        px = ParasiticExtractor(ParasiticConfig(interval_steps=100))
        px.snapshot_base(model)
        for step in ...:
            loss = train_step()
            if px.should_extract(step, loss, val_score):
                px.extract(model, step, {"loss": loss, "val_score": val_score})
        px.update_training_time(total_seconds)
        px.save_library("adapters/")
    """

    def __init__(self, config: ParasiticConfig | None = None) -> None:
        self.config = config or ParasiticConfig()
        self.base_weights: dict[str, Any] = {}  # a rank's shard under FSDP2
        self._layouts: dict[str, ShardLayout | None] = {}
        self.library = AdapterLibrary(config=self.config)
        self._losses: deque[float] = deque(maxlen=self.config.plateau_window)
        self._best_val: float | None = None
        self._last_plateau_step: int | None = None
        self._pending: tuple[int, str] | None = None
        self._extraction_count = 0
        self._extraction_seconds = 0.0
        self._training_seconds = 0.0

    # ---- snapshot

    def _tracked(self, model: Any) -> list[tuple[str, Any]]:
        """(parameter name, parameter) for Linear weights selected by the config,
        leaving out weights shared between modules (tied heads)."""
        model = unwrap(model)
        counts: dict[int, int] = {}
        for _, mod in model.named_modules(remove_duplicate=False):
            w = getattr(mod, "weight", None)
            if isinstance(w, torch.nn.Parameter):
                counts[id(w)] = counts.get(id(w), 0) + 1
        out = []
        for mname, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear) or mod.weight.dim() != 2:
                continue
            if counts.get(id(mod.weight), 0) > 1:
                continue
            if self.config.include and not matches(mname, self.config.include):
                continue
            if self.config.exclude and matches(mname, self.config.exclude):
                continue
            out.append((f"{mname}.weight" if mname else "weight", mod.weight))
        return out

    def snapshot_base(self, model: Any) -> int:
        """Copy ``W0`` of every tracked Linear weight (this rank's shard of a sharded
        one); returns how many."""
        self.base_weights.clear()
        self._layouts.clear()
        dev = self.config.snapshot_device
        with torch.no_grad():
            for name, p in self._tracked(model):
                self.base_weights[name], self._layouts[name] = snapshot(p, dev)
        if not self.base_weights:
            raise ExtractionError("snapshot_base: the model has no Linear weights to track")
        return len(self.base_weights)

    # ---- triggers

    def should_extract(self, step: int, loss: float, val_score: float | None = None) -> bool:
        """Record this step's loss (and validation score) and say whether to extract now."""
        cfg = self.config
        loss = float(loss)
        if math.isfinite(loss):
            self._losses.append(loss)
        reason = None
        if step > 0 and cfg.interval_steps > 0 and step % cfg.interval_steps == 0:
            reason = "periodic"
        if cfg.detect_triggers and step > 0:
            if self._plateau(step):
                reason = "plateau"
                self._last_plateau_step = step
            if val_score is not None and math.isfinite(float(val_score)):
                v = float(val_score)
                if self._best_val is not None and v - self._best_val > cfg.val_improvement:
                    reason = "val_improvement"
                self._best_val = v if self._best_val is None else max(self._best_val, v)
        elif val_score is not None and math.isfinite(float(val_score)):
            v = float(val_score)
            self._best_val = v if self._best_val is None else max(self._best_val, v)
        self._pending = (step, reason) if reason else None
        return reason is not None

    def _plateau(self, step: int) -> bool:
        cfg = self.config
        if len(self._losses) < cfg.plateau_window:
            return False
        if (
            self._last_plateau_step is not None
            and step - self._last_plateau_step < cfg.plateau_window
        ):
            return False
        mean = abs(sum(self._losses) / len(self._losses))
        return mean > 0 and (max(self._losses) - min(self._losses)) / mean < cfg.plateau_threshold

    # ---- extraction

    def extract(
        self, model: Any, step: int, metrics: Mapping[str, Any] | None = None
    ) -> ExtractedAdapter:
        """Factor ``W - W0`` of every changed tracked weight and add the adapter to
        the library. ``metrics`` (loss, val_score, anything JSON-able) are kept with it."""
        if not self.base_weights:
            raise ExtractionError("extract() before snapshot_base(model)")
        t0 = time.perf_counter()
        cfg = self.config
        metrics = dict(metrics or {})
        trigger = "manual"
        if self._pending is not None and self._pending[0] == step:
            trigger = self._pending[1]
        self._extraction_count += 1
        prefix = str(metrics.get("optimizer") or "adapter")
        loss = metrics.pop("loss", None)
        val = metrics.pop("val_score", None)
        tags = metrics.pop("tags", None)
        adapter = ExtractedAdapter(
            adapter_id=f"{prefix}_step{step}_{self._extraction_count}",
            step=int(step),
            trigger=trigger,
            loss=None if loss is None else float(loss),
            val_score=None if val is None else float(val),
            metrics={str(k): _scalar(v) for k, v in metrics.items()},
            tags=[str(t) for t in tags] if isinstance(tags, (list, tuple)) else [],
            created_at=time.time(),
        )
        out_dtype = resolve_factor_dtype(cfg.factor_dtype)
        params = dict(self._tracked(model))
        here = factors_here()  # rank 0 factors; other ranks only take part in the gathers
        with torch.no_grad():
            for name, w0 in self.base_weights.items():
                p = params.get(name)
                if p is None:
                    raise ExtractionError(
                        f"extract: {name!r} was snapshotted but is not in the model", tensor=name
                    )
                layout = self._layouts.get(name)
                shape = base_shape(w0, layout)
                if tuple(p.shape) != shape:
                    raise ExtractionError(
                        f"extract: shape of {name!r} changed from {list(shape)} to {list(p.shape)}",
                        tensor=name,
                    )
                dw = full_delta(p, w0, layout, name)  # gathered: a collective when sharded
                norm = float(torch.linalg.vector_norm(dw))
                if not math.isfinite(norm):
                    raise ExtractionError(
                        f"extract: non-finite delta in {name!r} at step {step}", tensor=name
                    )
                if norm == 0.0 or not here:
                    continue
                f = factorize_delta(
                    dw,
                    min_rank=cfg.min_rank,
                    max_rank=cfg.max_rank,
                    explained_variance=cfg.explained_variance,
                    niter=cfg.niter,
                    oversample=cfg.oversample,
                    seed=cfg.seed,
                    name=name,
                    out_dtype=torch.float32,
                    consume=True,
                )
                del dw
                a, b = f.lora_A, f.lora_B
                if cfg.quantize_int8:
                    a, b = _quantize_int8(a), _quantize_int8(b)
                fdtype = p.dtype if out_dtype == "base" else out_dtype
                f.lora_A = a.to(fdtype).cpu()
                f.lora_B = b.to(fdtype).cpu()
                adapter.layers[name] = f
        adapter.seconds = time.perf_counter() - t0
        self._extraction_seconds += adapter.seconds
        self.library.add(adapter)
        self.library.stats = self._stats()
        return adapter

    # ---- overhead and library

    def update_training_time(self, elapsed: float) -> None:
        """Tell the extractor the training run's wall time so far (seconds)."""
        self._training_seconds = float(elapsed)
        self.library.stats = self._stats()

    def overhead_pct(self) -> float:
        """Extraction time as a percentage of the training time given to
        :meth:`update_training_time` (0 until that is known)."""
        if self._training_seconds <= 0:
            return 0.0
        return 100.0 * self._extraction_seconds / self._training_seconds

    @property
    def extraction_seconds(self) -> float:
        return self._extraction_seconds

    def _stats(self) -> dict[str, Any]:
        return {
            "extractions": self._extraction_count,
            "extraction_seconds": self._extraction_seconds,
            "training_seconds": self._training_seconds,
            "overhead_pct": self.overhead_pct(),
        }

    def best(self, by: Literal["loss", "val_score"] = "loss") -> ExtractedAdapter | None:
        return self.library.best(by)

    def summary(self) -> dict[str, Any]:
        self.library.stats = self._stats()
        return self.library.summary()

    def save_library(self, path: str | Path) -> Path:
        """Save the library (rank 0 only under ``torch.distributed``); returns ``path``."""
        self.library.stats = self._stats()
        if not factors_here():
            return Path(path)
        return self.library.save_library(path)

    @staticmethod
    def load_library(path: str | Path) -> AdapterLibrary:
        return AdapterLibrary.load_library(path)


def apply_adapter(model: Any, adapter: ExtractedAdapter, scale: float = 1.0) -> int:
    """Add ``scale * B @ A`` to each weight the adapter covers (in place);
    returns how many weights changed. A layer the model lacks, or a shape that
    differs, raises :class:`ExtractionError` naming it before anything changes."""
    params = dict(model.named_parameters())
    for name, f in adapter.layers.items():
        p = params.get(name)
        if p is None:
            raise ExtractionError(f"apply_adapter: model has no parameter {name!r}", tensor=name)
        if tuple(p.shape) != f.shape:
            raise ExtractionError(
                f"apply_adapter: {name!r} is {list(p.shape)}, adapter has {list(f.shape)}",
                tensor=name,
            )
    with torch.no_grad():
        for name, f in adapter.layers.items():
            p = params[name]
            delta = f.lora_B.to(p.device, torch.float32) @ f.lora_A.to(p.device, torch.float32)
            p.add_((delta * float(scale)).to(p.dtype))
    return len(adapter.layers)
