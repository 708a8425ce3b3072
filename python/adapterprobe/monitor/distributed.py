"""A sampled step's statistics combined over the ranks of ``torch.distributed``.

When a process group is initialized with more than one rank, every rank reduces what
it holds (its shards of DTensor parameters and gradients, its replicas of plain ones,
the activations of its part of the batch) into the same per-name tables as a single
process does, and this module folds them into global tables:

- sums (elements, sums of squares, sums, NaN/inf counts, per-instance sums and
  instance counts) are added over the ranks; a replicated tensor (a plain tensor under
  DDP, a ``Replicate`` placement of a DTensor) is weighted by one over its number of
  replicas, so that it counts once;
- extremes (``max_abs``) are maxed; NaN is carried as a count beside them, so a NaN on
  any rank is NaN in the result.

The reduction is one collective per sampled step, whatever the number of tensors: an
all-gather of each rank's packed float64 buffer (header, sums, maxima), summed and
maxed on every rank (a sum and a max cannot share one all-reduce; gathered, they are
one exchange of a few KB per rank), on a gloo group of the monitor's own (host
buffers whatever the training backend; never paired with the training's collectives).
Their layout is fixed by the model (every selected parameter and module, whether it
was seen on this rank or not), and a header carries the step and a checksum of the
layout, so that ranks at different steps or with differently built monitors fail with
a message instead of mixing numbers. A rank that never reaches the collective makes
the others time out (the monitor's
``timeout`` or the process group's own), with a message naming the step.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from adapterprobe.errors import MonitorConfigError
from adapterprobe.monitor.options import KINDS
from adapterprobe.monitor.stats import StatsTable

_WHOLE = ("param", "grad")
# Per entry in the SUM buffer: elements, sum of squares, NaN/inf count, NaN-in-max flag,
# three sums (whole tensors: the sum; activations: per-instance means, variances and
# L2 norms) and the instance count (activations).
_NUMEL, _SUMSQ, _BAD, _NAN, _S1, _S2, _S3, _COUNT = range(8)
_FIELDS = 8
_HEADER = 2  # at the head of each rank's buffer: the step and the layout's checksum

# wrapper prefixes that are not part of a parameter's name in a single-process model
_WRAPPER_PARTS = ("_fsdp_wrapped_module",)
_FSDP1_MARKS = ("_fsdp_wrapped_module", "_flat_param")


@dataclasses.dataclass(frozen=True)
class World:
    """The default process group, as the monitor sees it."""

    rank: int
    size: int
    timeout: datetime.timedelta | None  # None: the process group's own

    def group(self, step: int) -> Any:
        """The monitor's own gloo group over every rank, made at the first sampled step.

        Its collectives never pair with the training's (DDP's buckets, FSDP's gathers),
        so a rank that skips a step makes the others time out instead of mixing
        buffers, and its buffers stay on the host whatever the training backend.
        """
        default = torch.distributed.distributed_c10d._get_default_group()
        made = _GROUPS.get(id(default))
        group = made[1] if made is not None and made[0] is default else None
        if group is None:
            try:
                group = torch.distributed.new_group(backend="gloo", timeout=self.timeout)
            except RuntimeError as exc:
                raise MonitorConfigError(
                    f"GAP monitor step {step}: rank {self.rank} of {self.size} timed out "
                    f"or failed making the monitor's process group ({exc}); every rank "
                    "must build the monitor and enter every sampled step"
                ) from exc
            _GROUPS.clear()  # a group of an earlier, destroyed default group
            _GROUPS[id(default)] = (default, group)
        return group


# id of the default group -> (that group, the monitor's group over the same ranks)
_GROUPS: dict[int, tuple[Any, Any]] = {}


def current_world(timeout: float | None) -> World | None:
    """The initialized default group of more than one rank, else None (single process)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    size = torch.distributed.get_world_size()
    if size < 2:
        return None
    wait = None if timeout is None else datetime.timedelta(seconds=timeout)
    return World(torch.distributed.get_rank(), size, wait)


def writer_rank() -> bool:
    """Whether this process writes sinks and files: rank 0, or a single process.

    Before the process group is initialized, a launcher's ``RANK`` (torchrun) decides,
    or else its ``LOCAL_RANK`` (Lightning's launcher sets that one first).
    """
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")).strip()
        return not rank.isdigit() or int(rank) == 0
    return torch.distributed.get_rank() == 0


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose names a single-process run gives (DDP's ``module``)."""
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


def global_name(name: str) -> str:
    """A parameter or module name without distributed wrapper components."""
    if "_fsdp_wrapped_module" not in name:
        return name
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def refuse_fsdp1(names: Iterable[str]) -> None:
    """FSDP1 flat parameters are local shards of several tensors: never report them."""
    for name in names:
        if any(mark in name for mark in _FSDP1_MARKS):
            raise MonitorConfigError(
                f"parameter {name!r} belongs to FSDP1 (FullyShardedDataParallel), whose "
                "parameters are flat local shards; the GAP monitor supports FSDP2 "
                "(torch.distributed.fsdp.fully_shard) and DDP"
            )


def local_piece(tensor: torch.Tensor, world: World | None) -> tuple[torch.Tensor, float] | None:
    """This rank's part of a tensor and its weight in the global sums.

    A plain tensor is one replica of ``world.size`` (DDP); a DTensor's local shard
    counts once per replica of its ``Replicate`` mesh dimensions. None for what cannot
    be combined (a ``Partial`` placement, another tensor subclass).
    """
    if type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter:
        return tensor, 1.0 if world is None else 1.0 / world.size
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return None
    replicas = 1
    for dim, placement in enumerate(tensor.placements):
        if placement.is_partial():
            return None
        if placement.is_replicate():
            replicas *= tensor.device_mesh.size(dim)
    return tensor.to_local(), 1.0 / replicas


def _checksum(layout: Sequence[tuple[str, Sequence[str]]]) -> float:
    text = "\n".join(f"{kind}:{','.join(names)}" for kind, names in layout)
    return float(zlib.crc32(text.encode("utf-8")))


def _pack(
    layout: Sequence[tuple[str, Sequence[str]]],
    tables: Mapping[str, StatsTable],
    weights: Mapping[tuple[str, str], float],
) -> tuple[np.ndarray, np.ndarray]:
    entries = sum(len(names) for _, names in layout)
    sums = np.zeros((entries, _FIELDS))
    maxima = np.zeros(entries)
    offset = 0
    for kind, names in layout:
        table = tables.get(kind)
        if table is not None and table.names:
            index = {name: i for i, name in enumerate(names)}
            rows = np.array([offset + index[name] for name in table.names], dtype=np.int64)
            weight = np.array([weights.get((kind, name), 1.0) for name in table.names])
            sums[rows, _NUMEL] = table.numel * weight
            sums[rows, _SUMSQ] = table.sumsq * weight
            sums[rows, _BAD] = table.nonfinite * weight
            nan = np.isnan(table.max_abs)
            sums[rows, _NAN] = nan
            maxima[rows] = np.where(nan, 0.0, table.max_abs)
            if table.stats is not None:
                if kind in _WHOLE:  # the sum, from the mean
                    sums[rows, _S1] = table.stats[:, 0] * table.numel * weight
                else:  # per-instance sums of mean, var and L2 norm, and the instances
                    count = table.count if table.count is not None else np.zeros(len(rows))
                    sums[rows, _S1] = table.stats[:, 0] * count
                    sums[rows, _S2] = table.stats[:, 1] * count
                    sums[rows, _S3] = table.stats[:, 3] * count
                    sums[rows, _COUNT] = count
        offset += len(names)
    return sums, maxima


def _order(names: Sequence[str], kept: np.ndarray, local: StatsTable | None) -> np.ndarray:
    """The kept rows in this rank's table order (hook order, as one process has them:
    ties among the top_k break alike), then the rest in layout order."""
    if local is None or not local.names:
        return kept
    index = {name: i for i, name in enumerate(names)}
    first = [index[name] for name in local.names]
    seen = set(first)
    rest = [i for i in kept.tolist() if i not in seen]
    kept_set = set(kept.tolist())
    return np.array([i for i in first if i in kept_set] + rest, dtype=np.int64)


def _unpack(
    layout: Sequence[tuple[str, Sequence[str]]],
    sums: np.ndarray,
    maxima: np.ndarray,
    with_stats: bool,
    local: Mapping[str, StatsTable],
) -> dict[str, StatsTable]:
    out: dict[str, StatsTable] = {}
    offset = 0
    for kind, names in layout:
        block = sums[offset : offset + len(names)]
        top = maxima[offset : offset + len(names)]
        offset += len(names)
        keep = _order(names, np.nonzero(block[:, _NUMEL] > 0)[0], local.get(kind))
        if not len(keep):
            continue
        block, top = block[keep], top[keep]
        # weights of 1/replicas make exact integers again up to rounding
        numel = np.round(block[:, _NUMEL])
        bad = np.round(block[:, _BAD])
        max_abs = np.where(block[:, _NAN] > 0, math.nan, top)
        table = StatsTable([names[i] for i in keep.tolist()], block[:, _SUMSQ], numel, max_abs, bad)
        if with_stats:
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                if kind in _WHOLE:
                    mean = block[:, _S1] / numel
                    var = np.maximum((block[:, _SUMSQ] - block[:, _S1] * mean) / (numel - 1), 0.0)
                    l2 = np.sqrt(block[:, _SUMSQ])
                else:
                    count = block[:, _COUNT]
                    mean, var, l2 = (block[:, f] / count for f in (_S1, _S2, _S3))
                    table.count = count
            table.stats = np.stack([mean, var, max_abs, l2, bad], axis=1)
        out[kind] = table
    return out


def _wait(works: Sequence[Any], world: World, step: int) -> None:
    try:
        for work in works:
            if world.timeout is None:
                work.wait()
            else:
                work.wait(timeout=world.timeout)
    except RuntimeError as exc:
        raise MonitorConfigError(
            f"GAP monitor step {step}: rank {world.rank} of {world.size} timed out or failed "
            "waiting for the other ranks' statistics; every rank must build the monitor "
            f"with the same arguments and enter every sampled step ({exc})"
        ) from exc


def all_reduce_tables(
    world: World,
    step: int,
    layout: Sequence[tuple[str, Sequence[str]]],
    tables: Mapping[str, StatsTable],
    weights: Mapping[tuple[str, str], float],
    with_stats: bool,
) -> dict[str, StatsTable]:
    """Global tables from every rank's local ones (see the module docstring)."""
    sums, maxima = _pack(layout, tables, weights)
    header = np.array([step, _checksum(layout)], dtype=np.float64)
    mine = torch.from_numpy(np.concatenate((header, sums.reshape(-1), maxima)))
    gathered = [torch.empty_like(mine) for _ in range(world.size)]
    work = torch.distributed.all_gather(gathered, mine, group=world.group(step), async_op=True)
    _wait([work], world, step)
    rows = torch.stack(gathered).numpy()
    steps, checks = rows[:, 0], rows[:, 1]
    if not (steps == steps[0]).all():
        raise MonitorConfigError(
            f"GAP monitor step {step}: the ranks reduced different steps "
            f"({int(steps.min())} to {int(steps.max())}); every rank must enter every "
            "sampled step"
        )
    if not (checks == checks[0]).all():
        raise MonitorConfigError(
            f"GAP monitor step {step}: the ranks monitor different tensors; build the "
            "monitor with the same model and arguments on every rank"
        )
    body = rows[:, _HEADER:]
    total = body[:, : sums.size].sum(axis=0).reshape(-1, _FIELDS)
    top = body[:, sums.size :].max(axis=0)
    return _unpack(layout, total, top, with_stats, tables)


def layout_of(
    kinds: Sequence[str], params: Sequence[str], modules: Sequence[str]
) -> list[tuple[str, list[str]]]:
    """Every (kind, names) a step may report, in KINDS order, the same on every rank."""
    return [(kind, list(params if kind in _WHOLE else modules)) for kind in KINDS if kind in kinds]
