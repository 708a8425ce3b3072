"""GAPMonitor itself: hooks on for a sampled step, statistics collected as it ends.

A sampled step attaches forward hooks (activations) and tensor hooks (their
gradients), reduces each tensor as it appears (:mod:`.reductions`), detaches
everything when the block exits, and only then reads parameters and gradients,
copies the results to the host once and builds the tables and summary
(:mod:`.stats`) that go to ``latest`` and the sinks. A step that is not sampled
attaches nothing and costs nothing.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from adapterprobe.errors import MonitorConfigError
from adapterprobe.monitor.distributed import (
    all_reduce_tables,
    current_world,
    global_name,
    layout_of,
    local_piece,
    refuse_fsdp1,
    unwrap,
    writer_rank,
)
from adapterprobe.monitor.dumps import GradientDump
from adapterprobe.monitor.options import (
    KINDS,
    NONFINITE,
    STATS,
    detail_option,
    int_option,
    kinds_option,
    patterns_option,
    sinks_option,
)
from adapterprobe.monitor.reductions import (
    activation_summary,
    fetch,
    instance_stats,
    nonfinite_count,
    to_host,
    whole_tensor_stats,
)
from adapterprobe.monitor.stats import (
    HookRow,
    StatsTable,
    activation_tables,
    concat_tables,
    layer_of,
    summarize,
    whole_tensor_table,
)
from adapterprobe.sinks import GapSink, JsonlSink, step_record

_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)
# what the reductions handle everywhere (float8 and complex tensors are skipped)
_STAT_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_SEARCH_DEPTH = 4  # how deep to look for a tensor inside a module's output
_NOTHING = nullcontext()  # what a non-sampled step returns: shared, costs nothing


def _usable_activation(value: Any) -> bool:
    """A plain floating tensor with a batch dimension and at least two elements per instance."""
    if type(value) not in _PLAIN_TENSOR_TYPES or value.dtype not in _STAT_DTYPES:
        return False
    shape = value.shape
    return (
        len(shape) >= 2
        and shape[0] > 0
        and value.numel() >= 2 * shape[0]
        and value.layout is torch.strided
        and not value.is_meta
    )


def _first_activation(output: Any, depth: int = 0) -> torch.Tensor | None:
    """The first usable tensor inside a module output, searched depth-first."""
    if type(output) is torch.Tensor or isinstance(output, torch.Tensor):
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

    ``detail="summary"`` (default) records global, per-layer and top-``top_k`` statistics;
    ``detail="tensors"`` adds every tensor's own (see the module docstring for both).
    ``include``/``exclude`` are case-sensitive glob patterns (``fnmatch``) over parameter
    names (params, grads, dumps) and ``named_modules()`` names (activations; the root
    module is never hooked). ``sink`` is a path (a :class:`JsonlSink` is opened on it), a
    sink object, or a list of them; :meth:`close` closes them all.

    Put the optimizer step after the ``with`` block: parameter and gradient statistics
    are taken when the block exits, on whatever ``.grad`` then holds (accumulated over
    every backward inside the block).

    Under ``torch.distributed`` (DDP, FSDP2) every rank builds the monitor with the same
    arguments and enters every sampled step: the statistics are then global (see
    :mod:`adapterprobe.monitor.distributed`), ``latest`` holds them on every rank, and
    rank 0 alone writes the sinks, ``log_step`` lines and dumps. ``timeout`` (seconds)
    bounds the wait for the other ranks (None: the process group's own timeout).
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
        detail: str = "summary",
        top_k: int | None = None,
        timeout: float | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise MonitorConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self._root = unwrap(model)  # names as in single-process: DDP's module
        refuse_fsdp1(name for name, _ in self._root.named_parameters())
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
        ):
            raise MonitorConfigError(
                f"timeout must be a positive number of seconds, got {timeout!r}"
            )
        self.timeout = None if timeout is None else float(timeout)
        self.interval = int_option("interval", interval, 1)
        self.kinds = kinds_option(kinds)
        self.include = patterns_option("include", include)
        self.exclude = patterns_option("exclude", exclude)
        self.detail = detail_option(detail)
        if top_k is not None:
            self.top_k = int_option("top_k", top_k, 0)
        if dump is not None and not isinstance(dump, GradientDump):
            raise MonitorConfigError(f"dump must be a GradientDump, got {type(dump).__name__}")
        if not self.kinds and dump is None:
            raise MonitorConfigError("nothing to monitor: kinds is empty and there is no dump")
        self.dump = dump
        sinks = sinks_option(sink)
        self._has_sink = bool(sinks)
        # under torch.distributed only rank 0 writes: other ranks open no file
        self._writer = writer_rank()
        self.sinks: tuple[GapSink, ...] = tuple(
            JsonlSink(s) if isinstance(s, (str, os.PathLike)) else s
            for s in sinks
            if self._writer or not isinstance(s, (str, os.PathLike))
        )
        self.latest: dict[str, float] = {}
        self.latest_step: int | None = None
        self._tensors = self.detail == "tensors"
        self._reduce = instance_stats if self._tensors else activation_summary
        self._activations = "activation" in self.kinds
        self._activation_grads = "activation_grad" in self.kinds
        self._active: int | None = None
        self._closed = False
        self._handles: list[RemovableHandle] = []
        self._rows: list[HookRow] = []
        # id(tensor) -> (weak ref, version, stats): one module's output is often another's
        # (self_attn and o_proj, mlp and down_proj), and its gradient is the same too
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, tuple[Any, ...]]] = {}
        # (id, version) of a hooked output -> (weak ref, names sharing its gradient hook)
        self._grad_hooks: dict[tuple[int, int], tuple[weakref.ref[torch.Tensor], list[str]]] = {}
        self._selected_names: dict[str, bool] = {}
        self._module_names: list[str] = []  # hooked modules of the step, in model order
        self._layers: dict[str, str | None] = {}
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
        """Write a dlm ``{"type": "step", ...}`` line (lr, grad_norm, ... as keywords).

        Under ``torch.distributed`` only rank 0 writes (other ranks check and return).
        """
        if not self._has_sink:
            raise MonitorConfigError("log_step needs a sink: pass sink= to GAPMonitor")
        record = step_record(step, loss, **fields)
        if not writer_rank():
            return
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
        self._module_names = []
        self._seen = {}
        self._grad_hooks = {}
        if not (self._activations or self._activation_grads):
            return
        try:
            for name, module in self._root.named_modules():
                name = global_name(name)
                if name and self._selected(name):
                    self._module_names.append(name)
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
        self._grad_hooks = {}

    # -- hooks ---------------------------------------------------------------

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        tensor = _first_activation(output)
        if tensor is None:
            return
        if self._activations:
            self._record("activation", (name,), tensor)
        if self._activation_grads and tensor.requires_grad:
            # One hook per tensor version: a module's output is often its parent's too
            # (o_proj and self_attn), and both then get the gradient from one hook.
            key = (id(tensor), tensor._version)
            shared = self._grad_hooks.get(key)
            if shared is not None and shared[0]() is tensor:
                shared[1].append(name)
                return
            names = [name]
            self._grad_hooks[key] = (weakref.ref(tensor), names)
            hook = functools.partial(self._on_activation_grad, names)
            self._handles.append(tensor.register_hook(hook))

    def _on_activation_grad(self, names: list[str], grad: torch.Tensor) -> None:
        if _usable_activation(grad):
            self._record("activation_grad", names, grad)

    def _record(self, kind: str, names: Sequence[str], tensor: torch.Tensor) -> None:
        seen = self._seen.get(id(tensor))
        if seen is not None and seen[0]() is tensor and seen[1] == tensor._version:
            stats = seen[2]
        else:
            # detached (no autograd bookkeeping) when it could record any
            stats = self._reduce(tensor.detach() if tensor.requires_grad else tensor)
            self._seen[id(tensor)] = (weakref.ref(tensor), tensor._version, stats)
        instances = tensor.shape[0]
        size = tensor.numel() // instances
        for name in names:
            self._rows.append((kind, name, instances, size, stats))

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

    def _layer_cache(self, tables: Iterable[StatsTable]) -> dict[str, str | None]:
        for table in tables:
            for name in table.names:
                if name not in self._layers:
                    self._layers[name] = layer_of(name)
        return self._layers

    @torch.no_grad()
    def _collect(self, step: int, rows: list[HookRow]) -> None:
        world = current_world(self.timeout)
        raw = [(name, p) for name, p in self._root.named_parameters()]
        refuse_fsdp1(name for name, _ in raw)
        params = [
            (global_name(name), p)
            for name, p in raw
            if p.dtype in _STAT_DTYPES and self._selected(global_name(name)) and not p.is_meta
        ]
        # Whole-tensor kinds: group by (device, dtype) so each group is one foreach call.
        # A DTensor is read through its local shard, weighted for the global sums.
        groups: dict[tuple[str, torch.device, torch.dtype], list[tuple[str, torch.Tensor]]] = {}
        weights: dict[tuple[str, str], float] = {}
        for kind in ("param", "grad"):
            if kind not in self.kinds:
                continue
            for name, p in params:
                tensor = p if kind == "param" else p.grad  # read under no_grad: no detach
                if tensor is None or tensor.numel() < 2:
                    continue  # no variance in one element
                piece = local_piece(tensor, world)
                if piece is None:
                    continue  # a tensor subclass other than DTensor, or a Partial DTensor
                local, weights[(kind, name)] = piece
                if local.numel():  # an empty shard adds nothing
                    groups.setdefault((kind, local.device, local.dtype), []).append((name, local))
        blocks = [
            (kind, named, whole_tensor_stats([t for _, t in named], with_sums=self._tensors))
            for (kind, _, _), named in groups.items()
        ]
        on_device = [piece for row in rows for piece in row[4] if isinstance(piece, torch.Tensor)]
        host = to_host([stats for _, _, stats in blocks] + on_device)

        tables: dict[str, list[StatsTable]] = {}
        suspects: list[tuple[StatsTable, int, torch.Tensor]] = []
        for (kind, named, _), values in zip(blocks, host, strict=False):
            table, rows_to_count = whole_tensor_table(named, values, self._tensors)
            suspects += [(table, i, named[i][1]) for i in rows_to_count]
            tables.setdefault(kind, []).append(table)
        if suspects:  # rare: count NaN/inf only where the norm or extremes say there are some
            counts = fetch([nonfinite_count(tensor) for _, _, tensor in suspects])
            for (table, i, _), count in zip(suspects, counts, strict=True):
                table.nonfinite[i] = float(count[0])
                if table.stats is not None:
                    table.stats[i, NONFINITE] = float(count[0])
        fetched = iter(host[len(blocks) :])
        per_row: list[Any] = []
        for row in rows:
            stats = row[4]
            if isinstance(stats[0], torch.Tensor):  # an accelerator's pieces, now on the host
                per_row.append(np.concatenate([next(fetched) for _ in stats]))
            else:  # CPU: four floats (summary) or one array (tensors)
                per_row.append(stats[0] if len(stats) == 1 else stats)
        for kind, table in activation_tables(rows, per_row, self._tensors).items():
            tables.setdefault(kind, []).append(table)

        merged = {kind: concat_tables(parts) for kind, parts in tables.items()}
        if world is not None:
            layout = layout_of(self.kinds, [name for name, _ in params], self._module_names)
            merged = all_reduce_tables(world, step, layout, merged, weights, self._tensors)
        layers = self._layer_cache(merged.values())
        latest: dict[str, float] = {}
        for kind in KINDS:
            if kind not in merged or not merged[kind].names:
                continue
            table = merged[kind]
            if table.stats is not None:
                for name, stats in zip(table.names, table.stats.tolist(), strict=True):
                    latest.update(zip(self._stat_keys(kind, name), stats, strict=True))
            latest.update(summarize(kind, table, top_k=self.top_k, layers=layers))
        self.latest = latest
        self.latest_step = step

        # the record first: a failed dump must not lose it
        if writer_rank():
            for sink in self.sinks:
                sink.write_gap(step, latest)
        if self.dump is not None and self.dump.wants(step):
            grads = [(name, p.grad) for name, p in params if p.grad is not None]
            self.dump.write(step, grads, world=world)
