"""Extract a PEFT LoRA adapter from a full fine-tune (:func:`extract_lora`).

Every changed 2-D weight of a Linear (or transformers ``Conv1D``) module becomes a
LoRA pair: its delta ``W_tuned - W_base`` is factored
(:mod:`adapterprobe.lora.factorize`). What cannot be factored is saved whole where
PEFT can load it, so that the adapter reproduces the fine-tune and not only its
Linear part:

- changed 1-D tensors (norm weights, biases; ``save_1d``, on by default, like
  mergekit's ``--save-module``): a LoRA module's bias as ``<module>.base_layer.bias``
  with PEFT's ``bias="lora_only"``, any other module (a norm) in ``modules_to_save``;
- embeddings and output heads with ``embeddings="save"`` in ``modules_to_save``; an
  output head tied to the input embedding (GPT-2, tied Llamas) is saved under both
  names with ``ensure_weight_tying``, so that PEFT loads the tuned head too.

Checkpoints are read lazily tensor by tensor (:mod:`adapterprobe.lora.sources`) and
the adapter is streamed to disk (:mod:`adapterprobe.lora.peft_writer`), so peak
memory stays a few tensors whatever the model's size. The output directory appears
atomically, and it may never be, contain or sit inside an input.
The report (:mod:`adapterprobe.lora.report`) accounts for every changed tensor by
category; ``verify`` measures the loaded adapter's logits (:mod:`.verify`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from adapterprobe._fs import atomic_dir, check_disjoint, check_out_dir, resolve_output, write_json
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
from adapterprobe.lora.report import (
    CategoryReport,
    ExtractionReport,
    ModuleReport,
    SavedTensor,
    SkippedTensor,
)
from adapterprobe.lora.sources import TensorSource, is_embedding, open_source

torch = require("torch", "torch")

__all__ = ["ExtractionReport", "ModuleReport", "SavedTensor", "SkippedTensor", "extract_lora"]

ProgressCallback = Callable[[str, int, int], None]

REPORT_FILE = "extraction_report.json"


# --------------------------------------------------------------------------
# arguments


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
    if (
        isinstance(min_rank, bool)
        or isinstance(max_rank, bool)
        or not isinstance(min_rank, int)
        or not isinstance(max_rank, int)
    ):
        raise UsageError("min_rank and max_rank must be integers")
    if min_rank < 1 or max_rank < min_rank:
        raise UsageError(f"need 1 <= min_rank <= max_rank, got {min_rank} and {max_rank}")
    try:
        ev = float(explained_variance)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"explained_variance must be a number, got {explained_variance!r}"
        ) from exc
    if not (0.0 < ev <= 1.0):
        raise UsageError(f"explained_variance must be in (0, 1], got {explained_variance}")
    if embeddings not in ("skip", "save"):
        raise UsageError(f"embeddings must be 'skip' or 'save', got {embeddings!r}")


def _verify_batches(verify: Any) -> int:
    """0 for no verification, else the number of random batches to run."""
    from adapterprobe.lora.verify import DEFAULT_BATCHES

    if verify is False or verify is None:
        return 0
    if verify is True:
        return DEFAULT_BATCHES
    if isinstance(verify, int) and verify >= 1:
        return verify
    raise UsageError(f"verify must be True/False or a number of batches >= 1, got {verify!r}")


def _label_of(obj: Any) -> str | None:
    if isinstance(obj, (str, os.PathLike)):
        return str(obj)
    return None


def _input_paths(obj: Any, source: TensorSource) -> list[Path]:
    if not isinstance(obj, (str, os.PathLike)):
        return []
    return [Path(obj), *source.paths()]


# --------------------------------------------------------------------------
# the entry point


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
    save_1d: bool = True,
    verify: bool | int = False,
) -> ExtractionReport:
    """Extract a PEFT LoRA adapter for ``tuned - base`` into ``out_dir``.

    ``base`` and ``tuned``: an ``nn.Module``, a state dict, or a checkpoint path
    (a ``.safetensors`` file, or a dir with ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``); paths are read lazily tensor by tensor.

    Every changed 2-D weight of a Linear module (path sources: every 2-D
    ``*.weight`` not named like an embedding) becomes a LoRA pair whose rank is
    the smallest keeping ``explained_variance`` of ``||dW||_F^2``, clamped to
    ``[min_rank, max_rank]`` (``min_rank == max_rank`` gives a fixed rank).
    transformers' ``Conv1D`` projections (GPT-2 family; known from the module, or
    from a checkpoint dir's ``config.json``) are factored transposed and the
    adapter gets ``fan_in_fan_out``; one adapter cannot mix them with Linear
    modules. ``include``/``exclude`` are glob patterns on module paths
    (``"q_proj"`` matches ``*.q_proj``).

    ``save_1d`` (default True): changed 1-D tensors (norm weights, biases) are
    saved whole, as PEFT can load them. ``embeddings``: embeddings and output
    heads are skipped (``"skip"``, the default: they are large) or saved whole
    (``"save"``), with a tied output head saved under both names.

    ``device``: where the SVDs run (None: CUDA when available). ``dtype``: of
    the saved factors, None for float32, ``"base"`` for each base tensor's
    dtype, or an explicit float dtype (tensors saved whole keep their own).
    ``progress(name, done, total)`` is called after each tensor.

    ``verify`` (True, or a number of batches): load the written adapter with
    PEFT onto the base model and measure, on random token batches, how much of
    the tuned model's logit change it recovers (needs ``nn.Module`` inputs or
    transformers checkpoint directories, and peft). The figure is in the report.

    Writes ``adapter_config.json``, ``adapter_model.safetensors`` and
    ``extraction_report.json`` atomically and returns the report. Raises
    :class:`ExtractionError` (naming the tensor) for mismatched shapes, tensors
    missing on one side, non-finite deltas and malformed checkpoints,
    :class:`UsageError` for bad arguments and outputs (one that is, contains or
    sits inside an input is refused), and :class:`MissingFileError` for missing
    checkpoints.
    """
    t_start = time.perf_counter()
    _validate_args(min_rank, max_rank, explained_variance, embeddings)
    if not isinstance(save_1d, bool):
        raise UsageError(f"save_1d must be True or False, got {save_1d!r}")
    batches = _verify_batches(verify)
    dev = _resolve_device(device)
    out_dtype = resolve_factor_dtype(dtype)
    inc = as_patterns(include, "include")
    exc_pats = as_patterns(exclude, "exclude")
    out = resolve_output(out_dir)
    check_out_dir(out, overwrite)
    if batches:
        from adapterprobe.lora.verify import check_verifiable

        require("peft", "peft")
        check_verifiable(base, "base")
        check_verifiable(tuned, "tuned")

    src_base = open_source(base, "base")
    try:
        src_tuned = open_source(tuned, "tuned")
    except BaseException:
        src_base.close()
        raise
    try:
        check_disjoint(out, _input_paths(base, src_base) + _input_paths(tuned, src_tuned))
        plan = _plan(src_base, src_tuned, inc, exc_pats)
        settings = {
            "min_rank": min_rank,
            "max_rank": max_rank,
            "explained_variance": float(explained_variance),
            "dtype": "base" if out_dtype == "base" else str(out_dtype).replace("torch.", ""),
            "embeddings": embeddings,
            "save_1d": save_1d,
            "include": list(inc),
            "exclude": list(exc_pats),
            "niter": niter,
            "oversample": oversample,
            "seed": seed,
            "verify": batches,
            "method": "torch.svd_lowrank",
        }
        report = ExtractionReport(out_dir=str(out), settings=settings, device=str(dev))
        with atomic_dir(out, overwrite=overwrite) as tmp:
            writer = SafetensorsWriter(tmp / ADAPTER_FILE)
            try:
                run = _Run(src_base, src_tuned, writer, report, dev=dev, progress=progress)
                run.factor_and_measure(
                    plan,
                    out_dtype=out_dtype,
                    min_rank=min_rank,
                    max_rank=max_rank,
                    explained_variance=float(explained_variance),
                    niter=niter,
                    oversample=oversample,
                    seed=seed,
                )
                run.save_whole(plan, embeddings=embeddings, save_1d=save_1d)
                if not report.modules and not report.saved:
                    raise ExtractionError(
                        "nothing to extract: no changed weights between base and tuned"
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
                bias=report.bias,
                ensure_weight_tying=bool(report.tied),
            )
            write_json(tmp / CONFIG_FILE, cfg)
            if batches:
                from adapterprobe.lora.verify import verify_adapter

                report.verification = verify_adapter(base, tuned, tmp, batches=batches, device=dev)
            report.seconds = time.perf_counter() - t_start
            write_json(tmp / REPORT_FILE, report.to_dict())
        return report
    finally:
        src_base.close()
        src_tuned.close()


# --------------------------------------------------------------------------
# the plan: what happens to each tensor


@dataclass
class _Item:
    key: str
    module: str
    shape: tuple[int, ...]
    action: str  # "lora", "embed", "1d", "measure", "skip"
    category: str  # a report category ("" for tensors not counted)
    reason: str = ""
    transpose: bool = False  # Conv1D: weight is (in, out), PEFT's fan_in_fan_out
    norm: float = 0.0  # ||tuned - base||_F, once measured
    kept: float = 0.0  # delta energy the adapter carries


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
            items.append(_Item(key, module, mt.shape, "skip", "", "not floating-point"))
            continue
        if len(mt.shape) == 1:
            items.append(_Item(key, module, mt.shape, "1d", "1-D", "1-D"))
            continue
        if len(mt.shape) != 2:
            items.append(_Item(key, module, mt.shape, "measure", "other", f"{len(mt.shape)}-D"))
            continue
        if leaf != "weight" or not module:
            items.append(_Item(key, module, mt.shape, "measure", "other", "not a module weight"))
            continue
        kind = tuned.module_kind(module) or base.module_kind(module)
        if is_embedding(module, kind):
            reason = "embedding or output head"
            items.append(_Item(key, module, mt.shape, "embed", "embedding", reason))
            continue
        if kind == "conv1d":
            items.append(_Item(key, module, mt.shape, "lora", "linear", transpose=True))
            continue
        if kind == "other":
            reason = "not a Linear module"
            items.append(_Item(key, module, mt.shape, "measure", "other", reason))
            continue
        items.append(_Item(key, module, mt.shape, "lora", "linear"))
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


def _holds_lora(module: str, lora_modules: set[str]) -> bool:
    """Whether ``module`` is a LoRA module or holds one (PEFT cannot save it whole)."""
    if not module:
        return True
    prefix = module + "."
    return module in lora_modules or any(m.startswith(prefix) for m in lora_modules)


class _Run:
    """One extraction: the factors (pass one, streamed) and what is saved whole (pass two)."""

    def __init__(
        self,
        base: TensorSource,
        tuned: TensorSource,
        writer: SafetensorsWriter,
        report: ExtractionReport,
        *,
        dev: Any,
        progress: ProgressCallback | None,
    ) -> None:
        self.base, self.tuned, self.writer, self.report = base, tuned, writer, report
        self.dev = dev
        self.progress = progress

    def factor_and_measure(
        self,
        plan: list[_Item],
        *,
        out_dtype: Any,
        min_rank: int,
        max_rank: int,
        explained_variance: float,
        niter: int,
        oversample: int,
        seed: int | None,
    ) -> None:
        """Pass one, tensor by tensor: factor the Linear deltas, measure all others."""
        total = len(plan)
        report = self.report
        for i, item in enumerate(plan, 1):
            t0 = time.perf_counter()
            if item.action == "skip":
                report.skipped.append(SkippedTensor(item.key, item.shape, item.reason))
            else:
                w_base = self.base.get(item.key)
                w_tuned = self.tuned.get(item.key)
                base_dtype = w_base.dtype
                if item.action == "lora":
                    # one float32 tensor on the device, plus the base in its own dtype
                    dw = w_tuned.to(self.dev, torch.float32, copy=True)
                    dw.sub_(w_base.to(self.dev))
                    if item.transpose:  # Conv1D stores (in, out); PEFT factors (out, in)
                        dw = dw.mT.contiguous()
                    norm = float(torch.linalg.vector_norm(dw))
                else:
                    dw = None
                    norm = _chunked_delta_norm(w_tuned, w_base, self.dev)
                del w_base, w_tuned
                if not math.isfinite(norm):
                    raise ExtractionError(
                        f"non-finite delta in {item.key!r}: NaN or infinite values in base or "
                        "tuned",
                        tensor=item.key,
                    )
                item.norm = norm
                if item.action == "lora" and norm > 0:
                    assert dw is not None
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
                    self.writer.add(peft_key(item.module, "lora_A"), f.lora_A)
                    self.writer.add(peft_key(item.module, "lora_B"), f.lora_B)
                    item.kept = f.energy_kept * norm * norm
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
                del dw
            if self.progress is not None:
                self.progress(item.key, i, total)

    def save_whole(self, plan: list[_Item], *, embeddings: str, save_1d: bool) -> None:
        """Pass two: decide what is saved whole, write it, and account for every tensor."""
        report = self.report
        lora_modules = set(report.ranks)
        to_save: dict[str, str] = {}  # module -> why it is saved whole
        lora_bias = False
        reasons: dict[str, str] = {}  # key -> why a changed tensor is left out
        for item in plan:
            if item.action in ("skip", "lora") or item.norm == 0:
                continue
            if item.action == "embed":
                if embeddings == "save":
                    to_save.setdefault(item.module, "embedding or output head")
                else:
                    reasons[item.key] = item.reason + " (embeddings='skip')"
            elif item.action == "1d":
                leaf = item.key.rsplit(".", 1)[-1]
                if not save_1d:
                    reasons[item.key] = "1-D (save_1d=False)"
                elif item.module in lora_modules and leaf == "bias":
                    lora_bias = True
                elif _holds_lora(item.module, lora_modules):
                    reasons[item.key] = "1-D tensor of a module holding LoRA modules"
                else:
                    to_save.setdefault(item.module, "1-D tensor changed")
        for item in plan:  # other changed tensors ride along when their module is saved
            if item.action == "measure" and item.norm > 0 and item.module not in to_save:
                reasons[item.key] = item.reason
        saved_keys = self._write_modules(to_save, plan, lora_modules)
        if lora_bias:
            report.bias = "lora_only"
            saved_keys.update(self._write_lora_biases(lora_modules, plan))
        report.modules_to_save = sorted(to_save.keys() | set(report.tied))
        for item in plan:
            if not item.category:
                continue
            energy = item.norm * item.norm
            if item.action == "lora" and item.norm > 0:
                how = "lora"
            elif item.key in saved_keys:
                how, item.kept = "saved", energy
            else:
                how = "missed"
                reason = reasons.get(item.key, "unchanged" if item.norm == 0 else item.reason)
                report.skipped.append(SkippedTensor(item.key, item.shape, reason, item.norm))
            category: CategoryReport = report.categories[item.category]
            category.add(energy, item.kept, how)

    def _module_keys(self) -> dict[str, list[str]]:
        """Every tuned key by the module holding it directly (include/exclude aside:
        PEFT expects all of a saved module's tensors)."""
        keys: dict[str, list[str]] = {}
        for key in self.tuned.keys():  # noqa: SIM118 - a TensorSource
            module, _, _ = key.rpartition(".")
            keys.setdefault(module, []).append(key)
        return keys

    def _write_modules(
        self, to_save: dict[str, str], plan: list[_Item], lora_modules: set[str]
    ) -> set[str]:
        """Write every tensor of the modules saved whole (and of tied heads)."""
        if not to_save:
            return set()
        report = self.report
        norms = {item.key: item.norm for item in plan}
        by_module = self._module_keys()
        tied = {**self.base.tied, **self.tuned.tied}  # missing key -> the key it shares
        written: set[str] = set()
        for module, why in sorted(to_save.items()):
            for key in by_module.get(module, []):
                tensor = self.tuned.get(key)
                self.writer.add(f"base_model.model.{key}", tensor)
                written.add(key)
                shape = tuple(int(d) for d in tensor.shape)
                report.saved.append(
                    SavedTensor(key, f"base_model.model.{key}", shape, why, norms.get(key))
                )
                for alias, target in sorted(tied.items()):
                    if target != key:
                        continue
                    alias_module = alias.rpartition(".")[0]
                    if alias_module in to_save or _holds_lora(alias_module, lora_modules):
                        continue
                    self.writer.add(f"base_model.model.{alias}", tensor)
                    report.tied[alias_module] = module
                    report.saved.append(
                        SavedTensor(
                            alias,
                            f"base_model.model.{alias}",
                            shape,
                            f"tied to {key}",
                            norms.get(key),
                        )
                    )
                del tensor
        return written

    def _write_lora_biases(self, lora_modules: set[str], plan: list[_Item]) -> set[str]:
        """With ``bias="lora_only"`` PEFT expects every LoRA module's bias: write them all."""
        norms = {item.key: item.norm for item in plan}
        all_keys = set(self.tuned.keys())
        written: set[str] = set()
        for module in sorted(lora_modules):
            key = f"{module}.bias"
            if key not in all_keys:
                continue
            tensor = self.tuned.get(key)
            peft_bias = f"base_model.model.{module}.base_layer.bias"
            self.writer.add(peft_bias, tensor)
            written.add(key)
            shape = tuple(int(d) for d in tensor.shape)
            self.report.saved.append(
                SavedTensor(key, peft_bias, shape, "bias of a LoRA module", norms.get(key))
            )
            del tensor
        return written
