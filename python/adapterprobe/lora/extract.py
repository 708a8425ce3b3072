"""Extract a PEFT LoRA adapter from a full fine-tune (:func:`extract_lora`).

For every changed 2-D weight of a Linear module the delta ``W_tuned -
W_base`` is factored (:mod:`adapterprobe.lora.factorize`); embeddings and
output heads are skipped or saved whole. Checkpoints are read lazily tensor by
tensor (:mod:`adapterprobe.lora.sources`) and the adapter is streamed to disk
(:mod:`adapterprobe.lora.peft_writer`), so peak memory stays a few tensors
whatever the model's size. The output directory appears atomically.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adapterprobe._fs import atomic_dir, check_out_dir, write_json
from adapterprobe._json import json_safe
from adapterprobe.errors import ExtractionError, UsageError, require
from adapterprobe.lora.factorize import (
    DEFAULT_NITER,
    DEFAULT_OVERSAMPLE,
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
from adapterprobe.lora.sources import TensorSource, is_embedding, open_source

torch = require("torch", "torch")

__all__ = ["ExtractionReport", "ModuleReport", "SkippedTensor", "extract_lora"]

ProgressCallback = Callable[[str, int, int], None]

REPORT_FILE = "extraction_report.json"


@dataclass
class ModuleReport:
    """One extracted module: its rank and how much of the delta the factors keep."""

    name: str
    shape: tuple[int, int]
    rank: int
    energy_kept: float
    rel_error: float
    delta_norm: float
    target_reached: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "name": self.name,
                "shape": list(self.shape),
                "rank": self.rank,
                "energy_kept": self.energy_kept,
                "rel_error": self.rel_error,
                "delta_norm": self.delta_norm,
                "target_reached": self.target_reached,
                "seconds": self.seconds,
            }
        )


@dataclass
class SkippedTensor:
    """A tensor that is not in the adapter. ``delta_norm`` > 0 means it changed
    and the adapter does not reproduce that change; None when not measured."""

    name: str
    shape: tuple[int, ...]
    reason: str
    delta_norm: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "name": self.name,
                "shape": list(self.shape),
                "reason": self.reason,
                "delta_norm": self.delta_norm,
            }
        )


@dataclass
class ExtractionReport:
    """What :func:`extract_lora` did: per module rank, energy kept and relative
    Frobenius error; skipped tensors with the reason; totals; seconds."""

    out_dir: str
    modules: list[ModuleReport] = field(default_factory=list)
    skipped: list[SkippedTensor] = field(default_factory=list)
    modules_to_save: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    device: str = "cpu"

    # ---- totals
    @property
    def num_modules(self) -> int:
        return len(self.modules)

    @property
    def ranks(self) -> dict[str, int]:
        return {m.name: m.rank for m in self.modules}

    @property
    def mean_rank(self) -> float:
        return sum(m.rank for m in self.modules) / len(self.modules) if self.modules else 0.0

    @property
    def lora_params(self) -> int:
        return sum(m.rank * (m.shape[0] + m.shape[1]) for m in self.modules)

    @property
    def energy_kept(self) -> float:
        """Energy kept over all extracted modules, weighted by each delta's energy."""
        total = sum(m.delta_norm**2 for m in self.modules)
        if total <= 0:
            return 1.0
        return sum(m.energy_kept * m.delta_norm**2 for m in self.modules) / total

    @property
    def rel_error(self) -> float:
        """Relative Frobenius error of all extracted deltas taken together."""
        total = sum(m.delta_norm**2 for m in self.modules)
        if total <= 0:
            return 0.0
        return math.sqrt(sum((m.rel_error * m.delta_norm) ** 2 for m in self.modules) / total)

    @property
    def missed_changes(self) -> list[SkippedTensor]:
        """Skipped tensors that did change (the adapter does not carry them)."""
        return [s for s in self.skipped if s.delta_norm is not None and s.delta_norm > 0]

    def totals(self) -> dict[str, Any]:
        return {
            "modules": self.num_modules,
            "modules_to_save": len(self.modules_to_save),
            "skipped": len(self.skipped),
            "missed_changes": len(self.missed_changes),
            "mean_rank": self.mean_rank,
            "min_rank": min((m.rank for m in self.modules), default=0),
            "max_rank": max((m.rank for m in self.modules), default=0),
            "target_not_reached": sum(not m.target_reached for m in self.modules),
            "lora_params": self.lora_params,
            "energy_kept": self.energy_kept,
            "rel_error": self.rel_error,
        }

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "out_dir": self.out_dir,
                "device": self.device,
                "seconds": self.seconds,
                "settings": self.settings,
                "totals": self.totals(),
                "modules": [m.to_dict() for m in self.modules],
                "modules_to_save": self.modules_to_save,
                "skipped": [s.to_dict() for s in self.skipped],
            }
        )

    def summary(self, max_rows: int = 20) -> str:
        t = self.totals()
        lines = [
            f"LoRA extracted to {self.out_dir}",
            f"  {t['modules']} modules, rank {t['min_rank']}-{t['max_rank']} "
            f"(mean {t['mean_rank']:.1f}), {t['lora_params']:,} parameters",
            f"  energy kept {t['energy_kept']:.4f}, relative error {t['rel_error']:.4f}; "
            f"{t['target_not_reached']} module(s) hit max_rank before the target",
        ]
        if self.modules_to_save:
            lines.append(f"  modules_to_save: {', '.join(self.modules_to_save)}")
        missed = self.missed_changes
        lines.append(
            f"  {t['skipped']} tensors skipped, {len(missed)} of them changed "
            "(not carried by the adapter)"
        )
        lines.append(f"  {self.seconds:.2f}s on {self.device}")
        if self.modules:
            width = min(60, max(len(m.name) for m in self.modules))
            lines.append(f"  {'module':<{width}}  rank  energy  rel_err")
            for m in self.modules[:max_rows]:
                flag = "" if m.target_reached else "  (max_rank)"
                lines.append(
                    f"  {m.name:<{width}}  {m.rank:>4}  {m.energy_kept:6.4f}  "
                    f"{m.rel_error:7.4f}{flag}"
                )
            if len(self.modules) > max_rows:
                lines.append(f"  ... {len(self.modules) - max_rows} more")
        for s in missed[:max_rows]:
            lines.append(f"  changed but skipped: {s.name} ({s.reason}, |dW|={s.delta_norm:.3g})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# --------------------------------------------------------------------------
# extraction


def _resolve_device(device: Any) -> Any:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"bad device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("device 'cuda' requested but CUDA is not available")
    return dev


def _validate_args(
    min_rank: int, max_rank: int, explained_variance: float, embeddings: str
) -> None:
    if not isinstance(min_rank, int) or not isinstance(max_rank, int):
        raise UsageError("min_rank and max_rank must be integers")
    if min_rank < 1 or max_rank < min_rank:
        raise UsageError(f"need 1 <= min_rank <= max_rank, got {min_rank} and {max_rank}")
    ev = float(explained_variance)
    if not (0.0 < ev <= 1.0):
        raise UsageError(f"explained_variance must be in (0, 1], got {explained_variance}")
    if embeddings not in ("skip", "save"):
        raise UsageError(f"embeddings must be 'skip' or 'save', got {embeddings!r}")


def _label_of(obj: Any) -> str | None:
    if isinstance(obj, (str, os.PathLike)):
        return str(obj)
    return None


def extract_lora(
    base: Any,
    tuned: Any,
    out_dir: str | os.PathLike[str],
    *,
    min_rank: int = 8,
    max_rank: int = 64,
    explained_variance: float = 0.95,
    device: Any = None,
    dtype: Any = None,
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    embeddings: Literal["skip", "save"] = "skip",
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
    niter: int = DEFAULT_NITER,
    oversample: int = DEFAULT_OVERSAMPLE,
    seed: int | None = 0,
) -> ExtractionReport:
    """Extract a PEFT LoRA adapter for ``tuned - base`` into ``out_dir``.

    ``base`` and ``tuned``: an ``nn.Module``, a state dict, or a checkpoint path
    (a ``.safetensors`` file, or a dir with ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``); paths are read lazily tensor by tensor.

    Every changed 2-D weight of a Linear module (path sources: every 2-D
    ``*.weight`` not named like an embedding) becomes a LoRA pair whose rank is
    the smallest keeping ``explained_variance`` of ``||dW||_F^2``, clamped to
    ``[min_rank, max_rank]`` (``min_rank == max_rank`` gives a fixed rank).
    Embeddings and output heads are skipped, or with ``embeddings="save"``
    stored whole as ``modules_to_save``. transformers' ``Conv1D`` projections
    (GPT-2 family; known from the module, or from a checkpoint dir's
    ``config.json``) are factored transposed and the adapter gets
    ``fan_in_fan_out``; one adapter cannot mix them with Linear modules.
    ``include``/``exclude`` are glob
    patterns on module paths (``"q_proj"`` matches ``*.q_proj``).

    ``device``: where the SVDs run (None: CUDA when available). ``dtype``: of
    the saved factors, None for float32, ``"base"`` for each base tensor's
    dtype, or an explicit float dtype. ``progress(name, done, total)`` is
    called after each tensor.

    Writes ``adapter_config.json``, ``adapter_model.safetensors`` and
    ``extraction_report.json`` atomically and returns the report. Raises
    :class:`ExtractionError` (naming the tensor) for mismatched shapes, tensors
    missing on one side and non-finite deltas, :class:`UsageError` for bad
    arguments and :class:`MissingFileError` for missing checkpoints.
    """
    t_start = time.perf_counter()
    _validate_args(min_rank, max_rank, explained_variance, embeddings)
    dev = _resolve_device(device)
    out_dtype = resolve_factor_dtype(dtype)
    inc = as_patterns(include, "include")
    exc_pats = as_patterns(exclude, "exclude")
    out = Path(out_dir).absolute()
    check_out_dir(out, overwrite)

    src_base = open_source(base, "base")
    src_tuned = open_source(tuned, "tuned")
    try:
        plan = _plan(src_base, src_tuned, inc, exc_pats)
        settings = {
            "min_rank": min_rank,
            "max_rank": max_rank,
            "explained_variance": float(explained_variance),
            "dtype": "base" if out_dtype == "base" else str(out_dtype).replace("torch.", ""),
            "embeddings": embeddings,
            "include": list(inc),
            "exclude": list(exc_pats),
            "niter": niter,
            "oversample": oversample,
            "seed": seed,
            "method": "torch.svd_lowrank",
        }
        report = ExtractionReport(out_dir=str(out), settings=settings, device=str(dev))
        with atomic_dir(out, overwrite=overwrite) as tmp:
            writer = SafetensorsWriter(tmp / ADAPTER_FILE)
            try:
                _run_plan(
                    plan,
                    src_base,
                    src_tuned,
                    writer,
                    report,
                    dev=dev,
                    out_dtype=out_dtype,
                    min_rank=min_rank,
                    max_rank=max_rank,
                    explained_variance=float(explained_variance),
                    embeddings=embeddings,
                    niter=niter,
                    oversample=oversample,
                    seed=seed,
                    progress=progress,
                )
                if not report.modules and not report.modules_to_save:
                    raise ExtractionError(
                        "nothing to extract: no changed 2-D Linear weights between base and tuned"
                        + (" (after include/exclude)" if inc or exc_pats else "")
                    )
                from adapterprobe import __version__

                writer.finish({"format": "pt", "producer": f"adapterprobe {__version__}"})
            except BaseException:
                writer.abort()
                raise
            cfg = peft_config(
                report.ranks,
                modules_to_save=report.modules_to_save,
                base_model_name_or_path=_label_of(base),
                fan_in_fan_out=any(i.transpose for i in plan if i.action == "lora"),
            )
            write_json(tmp / CONFIG_FILE, cfg)
            report.seconds = time.perf_counter() - t_start
            write_json(tmp / REPORT_FILE, report.to_dict())
        return report
    finally:
        src_base.close()
        src_tuned.close()


@dataclass
class _Item:
    key: str
    module: str
    shape: tuple[int, ...]
    action: str  # "lora", "save", "measure", "skip"
    reason: str = ""
    transpose: bool = False  # Conv1D: weight is (in, out), PEFT's fan_in_fan_out


def _plan(
    base: TensorSource, tuned: TensorSource, inc: tuple[str, ...], exc: tuple[str, ...]
) -> list[_Item]:
    def selected(key: str) -> bool:
        module = key.rsplit(".", 1)[0] if "." in key else key
        if inc and not (matches(module, inc) or matches(key, inc)):
            return False
        return not (exc and (matches(module, exc) or matches(key, exc)))

    tuned_keys = [k for k in tuned.keys() if selected(k)]  # noqa: SIM118 - a TensorSource
    base_keys = {k for k in base.keys() if selected(k)}  # noqa: SIM118
    tuned_set = set(tuned_keys)
    only_tuned = [k for k in tuned_keys if k not in base_keys]
    only_base = sorted(base_keys - tuned_set)
    for missing, have, lack in ((only_tuned, "tuned", "base"), (only_base, "base", "tuned")):
        if missing:
            more = (
                f" (and {len(missing) - 1} more: {', '.join(missing[1:4])}...)"
                if len(missing) > 1
                else ""
            )
            raise ExtractionError(
                f"tensor {missing[0]!r} is in {have} but missing from {lack}{more}",
                tensor=missing[0],
            )

    items: list[_Item] = []
    for key in tuned_keys:
        mt, mb = tuned.meta(key), base.meta(key)
        if mt.shape != mb.shape:
            raise ExtractionError(
                f"shape mismatch for {key!r}: base {list(mb.shape)} vs tuned {list(mt.shape)}",
                tensor=key,
            )
        module, _, leaf = key.rpartition(".")
        if not (mt.floating and mb.floating):
            items.append(_Item(key, module, mt.shape, "skip", "not floating-point"))
            continue
        if len(mt.shape) != 2:
            items.append(_Item(key, module, mt.shape, "measure", f"{len(mt.shape)}-D"))
            continue
        if leaf != "weight" or not module:
            items.append(_Item(key, module, mt.shape, "measure", "not a module weight"))
            continue
        kind = tuned.module_kind(module) or base.module_kind(module)
        if is_embedding(module, kind):
            items.append(_Item(key, module, mt.shape, "save", "embedding or output head"))
            continue
        if kind == "conv1d":
            items.append(_Item(key, module, mt.shape, "lora", transpose=True))
            continue
        if kind == "other":
            items.append(_Item(key, module, mt.shape, "measure", "not a Linear module"))
            continue
        items.append(_Item(key, module, mt.shape, "lora"))
    lora = [i for i in items if i.action == "lora"]
    if lora and any(i.transpose for i in lora) and not all(i.transpose for i in lora):
        conv = next(i for i in lora if i.transpose)
        lin = next(i for i in lora if not i.transpose)
        raise ExtractionError(
            f"{conv.module!r} is a Conv1D (fan_in_fan_out) and {lin.module!r} a Linear: one PEFT "
            "adapter cannot hold both; use include/exclude to extract them separately",
            tensor=conv.key,
        )
    return items


def _chunked_delta_norm(tuned: Any, base: Any, dev: Any, chunk_bytes: int = 64 << 20) -> float:
    """||tuned - base||_F in float32 chunks (no full-size float32 copies); NaN if non-finite."""
    a = tuned.reshape(tuned.shape[0], -1) if tuned.dim() > 1 else tuned.reshape(1, -1)
    b = base.reshape(a.shape)
    step = max(1, chunk_bytes // max(1, 4 * a.shape[1]))
    total = 0.0
    for i in range(0, a.shape[0], step):
        d = a[i : i + step].to(dev, torch.float32) - b[i : i + step].to(dev, torch.float32)
        total += float(torch.linalg.vector_norm(d)) ** 2
    return math.sqrt(total) if math.isfinite(total) else float("nan")


def _run_plan(
    plan: list[_Item],
    src_base: TensorSource,
    src_tuned: TensorSource,
    writer: SafetensorsWriter,
    report: ExtractionReport,
    *,
    dev: Any,
    out_dtype: Any,
    min_rank: int,
    max_rank: int,
    explained_variance: float,
    embeddings: str,
    niter: int,
    oversample: int,
    seed: int | None,
    progress: ProgressCallback | None,
) -> None:
    total = len(plan)
    for i, item in enumerate(plan, 1):
        t0 = time.perf_counter()
        if item.action == "skip":
            report.skipped.append(SkippedTensor(item.key, item.shape, item.reason))
        else:
            w_base = src_base.get(item.key)
            w_tuned = src_tuned.get(item.key)
            base_dtype = w_base.dtype
            if item.action == "lora":
                # one float32 tensor on the device, plus the base in its own dtype
                dw = w_tuned.to(dev, torch.float32, copy=True)
                dw.sub_(w_base.to(dev))
                if item.transpose:  # Conv1D stores (in, out); PEFT factors (out, in)
                    dw = dw.mT.contiguous()
                norm = float(torch.linalg.vector_norm(dw))
            else:
                dw = None
                norm = _chunked_delta_norm(w_tuned, w_base, dev)
            del w_base
            if not math.isfinite(norm):
                raise ExtractionError(
                    f"non-finite delta in {item.key!r}: NaN or infinite values in base or tuned",
                    tensor=item.key,
                )
            if norm == 0.0:
                report.skipped.append(SkippedTensor(item.key, item.shape, "unchanged", 0.0))
            elif item.action == "measure":
                report.skipped.append(SkippedTensor(item.key, item.shape, item.reason, norm))
            elif item.action == "save":
                if embeddings == "save":
                    writer.add(f"base_model.model.{item.key}", w_tuned)
                    report.modules_to_save.append(item.module)
                else:
                    report.skipped.append(
                        SkippedTensor(
                            item.key, item.shape, item.reason + " (embeddings='skip')", norm
                        )
                    )
            else:
                fdtype = base_dtype if out_dtype == "base" else out_dtype
                f = factorize_delta(
                    dw,
                    min_rank=min_rank,
                    max_rank=max_rank,
                    explained_variance=explained_variance,
                    niter=niter,
                    oversample=oversample,
                    seed=seed,
                    name=item.key,
                    out_dtype=fdtype,
                    consume=True,
                )
                writer.add(peft_key(item.module, "lora_A"), f.lora_A)
                writer.add(peft_key(item.module, "lora_B"), f.lora_B)
                report.modules.append(
                    ModuleReport(
                        name=item.module,
                        shape=(int(dw.shape[0]), int(dw.shape[1])),
                        rank=f.rank,
                        energy_kept=f.energy_kept,
                        rel_error=f.rel_error,
                        delta_norm=f.delta_norm,
                        target_reached=f.target_reached,
                        seconds=time.perf_counter() - t0,
                    )
                )
            del dw, w_tuned
        if progress is not None:
            progress(item.key, i, total)
