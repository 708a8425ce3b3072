"""GAP monitor: gradient, activation and parameter statistics for any PyTorch training loop.

    monitor = GAPMonitor(model, interval=10, sink="run.jsonl")
    for step, batch in enumerate(loader):
        with monitor.step(step):            # forward and backward go inside
            loss = model(**batch).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.log_step(step, loss)

Design choices, each answering a complaint about such monitors:

- Hooks exist only inside the block of a sampled step (``step % interval == 0``); on
  other steps ``step()`` returns a shared no-op context and nothing is attached.
- Statistics stay on the device until the block ends and then reach the host in one
  copy per device. A second copy happens only when some parameter or gradient holds
  NaN/inf, to count those elements (their presence is known from ``max_abs``).
- No per-tensor ``.item()`` and no temporary copies: each tensor is reduced to its
  float64 sum, L2 norm (``torch._foreach_norm`` for parameters and gradients), min and
  max; the host derives mean, variance and max-abs from those.
- Any module output is accepted: the module's activation is the first floating tensor
  with a batch dimension found inside tensors, tuples, lists, dicts, dataclasses and
  HF ``ModelOutput``; everything else is ignored.
- NaN/inf are counted (``nonfinite``) and left in the other statistics, which then
  read NaN: an honest signal rather than a silently dropped value.

Statistics (``monitor.latest`` keys ``gap/{params|grads|activations|activation_grads}/
{name}/{stat}``): ``mean``, ``var`` (unbiased), ``max_abs``, ``l2_norm``, ``nonfinite``.
Parameters and gradients are reduced over the whole tensor. Activations and their
gradients are reduced per instance (dim 0 is taken as the instance) and then averaged
over all instances seen in the step (every forward call and micro-batch), except
``max_abs`` (the maximum) and ``nonfinite`` (the total). Sums accumulate in float64
whatever the tensor's dtype (float32 on MPS). Tensors with a single element (per
instance, for activations) have no variance and are skipped, and so are float8,
complex and tensor-subclass values (DTensor): single-process, plain tensors only.

Summaries, under ``gap/summary/{kind}s/``: ``max_abs``, ``nonfinite``,
``nonfinite_tensors`` and, for params and grads, the global ``l2_norm`` (for grads:
the norm gradient clipping sees); the same per layer as ``layers/{layer}/{stat}``,
where a layer is a name's prefix up to its first numeric component
(``model.layers.3``); and the ``top_k`` largest offenders as ``top_l2_norm/{name}``
(params, grads) or ``top_max_abs/{name}`` (activations).

Not covered: under activation checkpointing the recomputed forward is recorded again
(averages stay, ``nonfinite`` counts double); hooks added and removed per sampled
step make ``torch.compile`` recompile.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from adapterprobe._fs import atomic_dir
from adapterprobe.errors import MonitorConfigError, require
from adapterprobe.sinks import GapSink, JsonlSink, TensorBoardSink, step_record

__all__ = ["KINDS", "STATS", "GAPMonitor", "GradientDump", "JsonlSink", "TensorBoardSink"]

KINDS = ("param", "grad", "activation", "activation_grad")
STATS = ("mean", "var", "max_abs", "l2_norm", "nonfinite")
MEAN, VAR, MAX_ABS, L2_NORM, NONFINITE = range(len(STATS))

_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)
# what the reductions handle everywhere (float8 and complex tensors are skipped)
_STAT_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_SEARCH_DEPTH = 4  # how deep to look for a tensor inside a module's output
_NOTHING = nullcontext()  # what a non-sampled step returns: shared, costs nothing


# ---------------------------------------------------------------------------
# Option checks
# ---------------------------------------------------------------------------


def _int_option(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MonitorConfigError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise MonitorConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def _patterns(name: str, value: Any) -> tuple[str, ...]:
    """Glob patterns from None, one string, or an iterable of strings."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    try:
        patterns = tuple(items)
    except TypeError:
        raise MonitorConfigError(f"{name} must be a glob string or a list of them") from None
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise MonitorConfigError(f"{name} patterns must be non-empty strings, got {pattern!r}")
    return patterns


def _kinds(value: Any) -> tuple[str, ...]:
    chosen = _patterns("kinds", value)
    unknown = sorted(set(chosen) - set(KINDS))
    if unknown:
        raise MonitorConfigError(f"unknown kinds {unknown}; choose from {list(KINDS)}")
    return tuple(kind for kind in KINDS if kind in chosen)


def _sinks(value: Any) -> list[Any]:
    """Checked sink arguments (a path or a sink object each); opened by the caller."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            continue
        if not all(callable(getattr(item, m, None)) for m in ("write_gap", "write_step", "close")):
            raise MonitorConfigError(
                f"sink must be a path or have write_gap/write_step/close, got {type(item).__name__}"
            )
    return items


# ---------------------------------------------------------------------------
# Gradient dumps
# ---------------------------------------------------------------------------


class GradientDump:
    """Writes raw gradients of sampled steps to ``directory/step{N}/{name}.safetensors``.

    A step is dumped when it is sampled by the monitor, ``start <= step <= end``
    (both inclusive; ``end=None`` is open) and ``(step - start) % every == 0``.
    ``first_n`` keeps only the leading ``first_n`` entries of every dimension, so that
    huge matrices can be sampled cheaply. Each file holds one tensor, ``"gradient"``,
    with the parameter name and full shape in its metadata. A step directory is built
    under a temporary name and renamed into place, replacing an earlier one.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        start: int = 0,
        end: int | None = None,
        every: int = 1,
        first_n: int | None = None,
    ):
        if not isinstance(directory, (str, os.PathLike)):
            raise MonitorConfigError(f"directory must be a path, got {type(directory).__name__}")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise MonitorConfigError(f"gradient dump directory {self.directory} is a file")
        self.start = _int_option("start", start, 0)
        self.end = None if end is None else _int_option("end (inclusive, >= start)", end, start)
        self.every = _int_option("every", every, 1)
        self.first_n = None if first_n is None else _int_option("first_n", first_n, 1)

    def wants(self, step: int) -> bool:
        """Whether a sampled ``step`` falls in the dump range."""
        if step < self.start or (self.end is not None and step > self.end):
            return False
        return (step - self.start) % self.every == 0

    def write(self, step: int, grads: Iterable[tuple[str, torch.Tensor]]) -> Path:
        """Write one step's gradients; returns the step directory."""
        save_file = require("safetensors.torch", "torch").save_file
        final = self.directory / f"step{step}"
        try:
            with atomic_dir(final, overwrite=True) as staging:
                for name, grad in grads:
                    tensor = grad.detach()
                    full_shape = list(tensor.shape)
                    if self.first_n is not None and tensor.ndim:
                        tensor = tensor[tuple(slice(0, self.first_n) for _ in full_shape)]
                    file = staging / f"{name.replace('/', '_').replace(os.sep, '_')}.safetensors"
                    meta = {"parameter": name, "step": str(step), "full_shape": str(full_shape)}
                    save_file({"gradient": tensor.to("cpu").contiguous()}, str(file), metadata=meta)
        except OSError as exc:
            raise MonitorConfigError(f"cannot write gradient dump {final}: {exc}") from exc
        return final


# ---------------------------------------------------------------------------
# Batched statistics (device side, no host syncs on accelerators)
#
# Every tensor is reduced to its sum, its L2 norm (the root of its sum of squares),
# its min and its max; the host derives mean, variance and max-abs from those. These
# plain reductions read the tensor once each and make no temporary copy. They are
# also the fast ones: on CPU, torch.var_mean, the inf-norm and isfinite run 20 to 70
# times slower than sum and aminmax (measured on torch 2.15, see the bench).
#
# Variance from moments cancels when |mean| >> std (norm weights sit at 1 +- 1e-4; the
# gradient of a sum loss is constant), so sums are accumulated in float64: that keeps
# float32 precision up to |mean|/std of about 1e4, and a constant tensor gets var 0.
# On CPU, where float64 sums cost three times float32 ones and reading a result back
# costs nothing, sums start in float32 and only tensors that would cancel are redone.
# ---------------------------------------------------------------------------


def _cheap_host_reads(device: torch.device) -> bool:
    """Whether reading a result back costs nothing, so that work may depend on values."""
    return device.type == "cpu"


def _wide_accumulator(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def _foreach_dtype_supported() -> bool:
    try:
        torch._foreach_norm([torch.zeros(2, dtype=torch.bfloat16)], 2.0, dtype=torch.float64)
    except (TypeError, RuntimeError):
        return False
    return True


_FOREACH_DTYPE = _foreach_dtype_supported()
_CPU_ZERO = torch.zeros(1)  # the NaN/inf count of a CPU tensor whose min and max are finite


def _norms(tensors: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Per-tensor L2 norms in one multi-tensor call (fused on accelerators)."""
    if _FOREACH_DTYPE:
        return list(torch._foreach_norm(tensors, 2.0, dtype=dtype))
    return [torch.linalg.vector_norm(t, dtype=dtype) for t in tensors]


def _cancels(sums: torch.Tensor, norms: torch.Tensor, sizes: Any) -> torch.Tensor:
    """Where float32 moments would lose the variance: squared mean over 90% of mean square.

    Elsewhere the relative error of a float32 variance stays under about 3e-6.
    """
    return sums * sums > 0.9 * sizes * norms * norms


def _whole_tensor_stats(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sums, L2 norms, minima and maxima of same-device, same-dtype tensors.

    Returns one flat tensor laid out ``[sums..., norms..., mins..., maxes...]``.
    """
    if _cheap_host_reads(tensors[0].device):
        # A host read is free on CPU, and float64 sums cost three times float32 ones:
        # sum in float32, then redo in float64 only the tensors that need it.
        narrow = torch.promote_types(tensors[0].dtype, torch.float32)
        sums = torch.stack([t.sum(dtype=narrow) for t in tensors]).double()
        norms = torch.stack(_norms(tensors, narrow)).double()
        sizes = torch.tensor([t.numel() for t in tensors], dtype=torch.float64)
        for i in torch.nonzero(_cancels(sums, norms, sizes)).flatten().tolist():
            sums[i] = tensors[i].sum(dtype=torch.float64)
            norms[i] = torch.linalg.vector_norm(tensors[i], dtype=torch.float64)
    else:  # no host reads on an accelerator: float64 throughout
        wide = _wide_accumulator(tensors[0].device)
        sums = torch.stack([t.sum(dtype=wide) for t in tensors])
        norms = torch.stack(_norms(tensors, wide))
    extremes = [torch.aminmax(t) for t in tensors]
    lows = torch.stack([low for low, _ in extremes])
    highs = torch.stack([high for _, high in extremes])
    return torch.cat((sums, norms, lows, highs))


def _instance_stats(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-instance sums and L2 norms (dim 0 is the instance), then min, max and NaN/inf count.

    Returned as five small device tensors, ``(sums[B], norms[B], min[1], max[1],
    nonfinite[1])``, concatenated with everything else at the end of the step.
    """
    values = tensor.detach()
    dims = tuple(range(1, values.ndim))
    low, high = torch.aminmax(values)
    extremes = (low.reshape(1), high.reshape(1))
    if not _cheap_host_reads(values.device):  # float64 sums and a count, always
        wide = _wide_accumulator(values.device)
        sums = values.sum(dim=dims, dtype=wide)
        norms = torch.linalg.vector_norm(values, dim=dims, dtype=wide)
        return sums, norms, *extremes, _nonfinite_count(values)
    # On CPU, as for whole tensors: float32 first, float64 where it cancels. Finite min and
    # max prove there is no NaN/inf to count (both propagate NaN): no slow counting pass.
    sums = values.sum(dim=dims, dtype=torch.promote_types(values.dtype, torch.float32))
    norms = torch.linalg.vector_norm(values, dim=dims, dtype=sums.dtype)
    if not (math.isfinite(low) and math.isfinite(high)):
        return sums, norms, *extremes, _nonfinite_count(values)
    if bool(_cancels(sums, norms, values.numel() // values.shape[0]).any()):
        sums = values.sum(dim=dims, dtype=torch.float64)
        norms = torch.linalg.vector_norm(values, dim=dims, dtype=torch.float64)
    return sums, norms, *extremes, _CPU_ZERO


def _nonfinite_count(tensor: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(tensor).logical_not_().sum().reshape(1)


def _moments(sums: np.ndarray, norms: np.ndarray, n: Any) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased variance from sums and L2 norms over ``n`` elements each."""
    with np.errstate(invalid="ignore", over="ignore"):
        mean = sums / n
        var = np.maximum((norms * norms - sums * mean) / (n - 1), 0.0)  # NaN stays NaN
    return mean, var


def _max_abs(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(lows), np.abs(highs))  # NaN stays NaN


def _fetch(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Copy small device tensors to the host: one concatenation and one copy per device."""
    out: list[np.ndarray] = [np.empty(0)] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    for indices in by_device.values():
        parts = [tensors[i].reshape(-1) for i in indices]
        host = torch.cat(parts).to("cpu").double().numpy()
        offset = 0
        for index, part in zip(indices, parts, strict=True):
            out[index] = host[offset : offset + part.numel()]
            offset += part.numel()
    return out


def _usable_activation(value: Any) -> bool:
    """A plain floating tensor with a batch dimension and at least two elements per instance."""
    return (
        type(value) in _PLAIN_TENSOR_TYPES
        and value.dtype in _STAT_DTYPES
        and value.layout is torch.strided
        and value.ndim >= 2
        and value.shape[0] > 0
        and value.numel() >= 2 * value.shape[0]
        and value.device.type != "meta"
    )


def _first_activation(output: Any, depth: int = 0) -> torch.Tensor | None:
    """The first usable tensor inside a module output, searched depth-first."""
    if isinstance(output, torch.Tensor):
        return output if _usable_activation(output) else None
    if depth >= _SEARCH_DEPTH:
        return None
    if isinstance(output, Mapping):  # dicts and HF ModelOutput
        items: Iterable[Any] = output.values()
    elif isinstance(output, (tuple, list)):
        items = output
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        items = (getattr(output, field.name, None) for field in dataclasses.fields(output))
    else:
        return None
    for item in items:
        found = _first_activation(item, depth + 1)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------
# Host-side assembly
# ---------------------------------------------------------------------------


def _max(a: float, b: float) -> float:
    """max() that lets NaN win, so a NaN anywhere shows in the maximum."""
    return math.nan if (a != a or b != b) else max(a, b)


def _rank(value: float) -> float:
    return math.inf if value != value else value


def _layer_of(name: str) -> str | None:
    """``model.layers.3.mlp.up_proj.weight`` -> ``model.layers.3``; None without a number."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: index + 1])
    return None


def _accumulate(acc: list[float], stats: list[float]) -> None:
    """Fold one tensor into [sum of squared l2, max_abs, nonfinite, nonfinite tensors]."""
    acc[0] += stats[L2_NORM] ** 2
    acc[1] = _max(acc[1], stats[MAX_ABS])
    acc[2] += stats[NONFINITE]
    acc[3] += stats[NONFINITE] > 0


def _summaries(per_kind: dict[str, dict[str, list[float]]], top_k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind, named in per_kind.items():
        if not named:
            continue
        prefix = f"gap/summary/{kind}s"
        whole = kind in ("param", "grad")
        total = [0.0, 0.0, 0.0, 0.0]  # sum of squared l2, max_abs, nonfinite, nonfinite tensors
        layers: dict[str, list[float]] = {}
        for name, stats in named.items():
            _accumulate(total, stats)
            layer = _layer_of(name)
            if layer is not None:
                _accumulate(layers.setdefault(layer, [0.0] * 4), stats)
        for where, acc in [("", total)] + [(f"layers/{k}/", v) for k, v in layers.items()]:
            out[f"{prefix}/{where}max_abs"] = acc[1]
            if whole:
                out[f"{prefix}/{where}l2_norm"] = math.sqrt(acc[0])
            out[f"{prefix}/{where}nonfinite"] = acc[2]
            out[f"{prefix}/{where}nonfinite_tensors"] = acc[3]
        stat = L2_NORM if whole else MAX_ABS
        ranked = sorted(named.items(), key=lambda item: _rank(item[1][stat]), reverse=True)
        for name, stats in ranked[:top_k]:
            out[f"{prefix}/top_{STATS[stat]}/{name}"] = stats[stat]
    return out


# ---------------------------------------------------------------------------
# The monitor
# ---------------------------------------------------------------------------


# kind, module name, instances, elements per instance, device statistics of one hook call
_Row = tuple[str, str, int, int, tuple[torch.Tensor, ...]]


class _SampledStep:
    """The context of a sampled step: hooks on at entry, off (always) at exit."""

    __slots__ = ("_monitor", "_step")

    def __init__(self, monitor: GAPMonitor, step: int):
        self._monitor = monitor
        self._step = step

    def __enter__(self) -> None:
        self._monitor._begin(self._step)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._monitor._end(self._step, completed=exc_type is None)


class GAPMonitor:
    """Gradient, activation and parameter statistics for any ``nn.Module`` and any loop.

    ``include``/``exclude`` are case-sensitive glob patterns (``fnmatch``) over parameter
    names (params, grads, dumps) and ``named_modules()`` names (activations; the root
    module is never hooked). ``sink`` is a path (a :class:`JsonlSink` is opened on it), a
    sink object, or a list of them; :meth:`close` closes them all.

    Put the optimizer step after the ``with`` block: parameter and gradient statistics
    are taken when the block exits, on whatever ``.grad`` then holds (accumulated over
    every backward inside the block).
    """

    top_k: int = 5  # offenders listed per kind in the summary

    def __init__(
        self,
        model: nn.Module,
        *,
        interval: int = 1,
        kinds: Iterable[str] | str = KINDS,
        include: Iterable[str] | str | None = None,
        exclude: Iterable[str] | str | None = None,
        dump: GradientDump | None = None,
        sink: Any = None,
    ):
        if not isinstance(model, nn.Module):
            raise MonitorConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.interval = _int_option("interval", interval, 1)
        self.kinds = _kinds(kinds)
        self.include = _patterns("include", include)
        self.exclude = _patterns("exclude", exclude)
        if dump is not None and not isinstance(dump, GradientDump):
            raise MonitorConfigError(f"dump must be a GradientDump, got {type(dump).__name__}")
        if not self.kinds and dump is None:
            raise MonitorConfigError("nothing to monitor: kinds is empty and there is no dump")
        self.dump = dump
        self.sinks: tuple[GapSink, ...] = tuple(
            JsonlSink(s) if isinstance(s, (str, os.PathLike)) else s for s in _sinks(sink)
        )
        self.latest: dict[str, float] = {}
        self.latest_step: int | None = None
        self._activations = "activation" in self.kinds
        self._activation_grads = "activation_grad" in self.kinds
        self._active: int | None = None
        self._closed = False
        self._handles: list[RemovableHandle] = []
        # (kind, name, instances, elements per instance, device stats) per hook call
        self._rows: list[_Row] = []
        # id(tensor) -> (weak ref, version, stats): one module's output is often another's
        # (self_attn and o_proj, mlp and down_proj), and its gradient is the same too
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, tuple[torch.Tensor, ...]]] = {}
        self._selected_names: dict[str, bool] = {}
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}

    # -- public ------------------------------------------------------------

    def step(self, step: int) -> AbstractContextManager[None]:
        """The context for one training step; only a sampled step attaches anything."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise MonitorConfigError(f"step must be an int, got {step!r}")
        if self._closed:
            raise MonitorConfigError("this GAPMonitor is closed")
        if self._active is not None:
            raise MonitorConfigError(f"step({step}) opened inside step({self._active})")
        if step % self.interval:
            return _NOTHING
        return _SampledStep(self, step)

    def log_step(self, step: int, loss: Any, **fields: Any) -> None:
        """Write a dlm ``{"type": "step", ...}`` line (lr, grad_norm, ... as keywords)."""
        if not self.sinks:
            raise MonitorConfigError("log_step needs a sink: pass sink= to GAPMonitor")
        record = step_record(step, loss, **fields)
        for sink in self.sinks:
            sink.write_step(record)

    def close(self) -> None:
        """Remove any hooks still attached and close the sinks."""
        if self._closed:
            return
        self._closed = True
        self._detach()
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> GAPMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- step lifecycle ----------------------------------------------------

    def _begin(self, step: int) -> None:
        if self._active is not None:
            raise MonitorConfigError(f"step({step}) opened inside step({self._active})")
        self._active = step
        self._rows = []
        self._seen = {}
        if not (self._activations or self._activation_grads):
            return
        try:
            for name, module in self.model.named_modules():
                if name and self._selected(name):
                    hook = functools.partial(self._on_forward, name)
                    self._handles.append(module.register_forward_hook(hook))
        except BaseException:
            self._detach()
            raise

    def _end(self, step: int, *, completed: bool) -> None:
        rows = self._rows
        self._detach()
        if completed:
            self._collect(step, rows)

    def _detach(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._active = None
        self._rows = []
        self._seen = {}

    # -- hooks ---------------------------------------------------------------

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        tensor = _first_activation(output)
        if tensor is None:
            return
        if self._activations:
            self._record("activation", name, tensor)
        if self._activation_grads and tensor.requires_grad:
            hook = functools.partial(self._on_activation_grad, name)
            self._handles.append(tensor.register_hook(hook))

    def _on_activation_grad(self, name: str, grad: torch.Tensor) -> None:
        if _usable_activation(grad):
            self._record("activation_grad", name, grad)

    def _record(self, kind: str, name: str, tensor: torch.Tensor) -> None:
        seen = self._seen.get(id(tensor))
        if seen is not None and seen[0]() is tensor and seen[1] == tensor._version:
            stats = seen[2]
        else:
            stats = _instance_stats(tensor)
            self._seen[id(tensor)] = (weakref.ref(tensor), tensor._version, stats)
        instances = tensor.shape[0]
        self._rows.append((kind, name, instances, tensor.numel() // instances, stats))

    # -- collection ------------------------------------------------------------

    def _selected(self, name: str) -> bool:
        chosen = self._selected_names.get(name)
        if chosen is None:
            included = not self.include or any(fnmatch.fnmatchcase(name, p) for p in self.include)
            chosen = included and not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)
            self._selected_names[name] = chosen
        return chosen

    def _stat_keys(self, kind: str, name: str) -> tuple[str, ...]:
        keys = self._keys.get((kind, name))
        if keys is None:
            keys = tuple(f"gap/{kind}s/{name}/{stat}" for stat in STATS)
            self._keys[(kind, name)] = keys
        return keys

    @torch.no_grad()
    def _collect(self, step: int, rows: list[_Row]) -> None:
        params = [
            (name, p)
            for name, p in self.model.named_parameters()
            if self._selected(name) and p.dtype in _STAT_DTYPES and p.device.type != "meta"
        ]
        # Whole-tensor kinds: group by (device, dtype) so each group is one foreach call.
        groups: dict[tuple[str, torch.device, torch.dtype], list[tuple[str, torch.Tensor]]] = {}
        for kind in ("param", "grad"):
            if kind not in self.kinds:
                continue
            for name, p in params:
                tensor = p.detach() if kind == "param" else p.grad
                if tensor is None or tensor.numel() < 2 or type(tensor) not in _PLAIN_TENSOR_TYPES:
                    continue  # no variance in one element; subclasses (DTensor, ...) skipped
                groups.setdefault((kind, tensor.device, tensor.dtype), []).append((name, tensor))
        blocks = [
            (kind, named, _whole_tensor_stats([t for _, t in named]))
            for (kind, _, _), named in groups.items()
        ]
        host = _fetch([stats for _, _, stats in blocks] + [t for row in rows for t in row[4]])

        per_kind: dict[str, dict[str, list[float]]] = {kind: {} for kind in KINDS}
        suspects: list[tuple[list[float], torch.Tensor]] = []
        for (kind, named, _), values in zip(blocks, host, strict=False):
            sums, norms, lows, highs = values.reshape(4, len(named))
            sizes = np.array([tensor.numel() for _, tensor in named], dtype=np.float64)
            means, variances = _moments(sums, norms, sizes)
            max_abs = _max_abs(lows, highs)
            table = np.stack([means, variances, max_abs, norms, np.zeros_like(norms)], axis=1)
            for (name, tensor), stats in zip(named, table.tolist(), strict=True):
                if not math.isfinite(stats[MAX_ABS]):
                    suspects.append((stats, tensor))
                per_kind[kind][name] = stats
        if suspects:  # rare: count NaN/inf only where max_abs says there are some
            counts = _fetch([_nonfinite_count(tensor) for _, tensor in suspects])
            for (stats, _), count in zip(suspects, counts, strict=True):
                stats[NONFINITE] = float(count[0])
        _merge_instance_rows(rows, host[len(blocks) :], per_kind)

        latest: dict[str, float] = {}
        for kind, stats_by_name in per_kind.items():
            for name, stats in stats_by_name.items():
                latest.update(zip(self._stat_keys(kind, name), stats, strict=True))
        latest.update(_summaries(per_kind, self.top_k))
        self.latest = latest
        self.latest_step = step

        if self.dump is not None and self.dump.wants(step):
            self.dump.write(step, [(name, p.grad) for name, p in params if p.grad is not None])
        for sink in self.sinks:
            sink.write_gap(step, latest)


def _merge_instance_rows(
    rows: list[_Row],
    values: list[np.ndarray],
    per_kind: dict[str, dict[str, list[float]]],
) -> None:
    """Average per-instance statistics over every call of a module in the step.

    Vectorised over all rows at once: a sampled step has a row per hook call, and
    numpy calls on a handful of numbers each would cost more than the arithmetic.
    """
    if not rows:
        return
    counts = np.array([row[2] for row in rows])
    sizes = np.array([row[3] for row in rows], dtype=np.float64)
    sums = np.concatenate(values[0::5])  # the five pieces of _instance_stats, row after row
    norms = np.concatenate(values[1::5])
    lows, highs, nonfinite = (np.concatenate(values[i::5]) for i in (2, 3, 4))
    means, variances = _moments(sums, norms, np.repeat(sizes, counts))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    per_row = zip(
        rows,
        np.add.reduceat(means, starts).tolist(),
        np.add.reduceat(variances, starts).tolist(),
        np.add.reduceat(norms, starts).tolist(),
        _max_abs(lows, highs).tolist(),
        nonfinite.tolist(),
        strict=True,
    )
    totals: dict[tuple[str, str], list[float]] = {}  # instances, mean, var, l2, max, nonfinite
    for (kind, name, instances, _, _), mean, var, l2, row_max, row_bad in per_row:
        acc = totals.setdefault((kind, name), [0, 0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += instances
        acc[1] += mean
        acc[2] += var
        acc[3] += l2
        acc[4] = _max(acc[4], row_max)
        acc[5] += row_bad
    for (kind, name), (count, mean, var, l2, top, bad) in totals.items():
        per_kind[kind][name] = [mean / count, var / count, top, l2 / count, bad]
