"""Parasitic extraction from a distributed model: W0 kept as shards, deltas gathered per layer.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) a weight is a DTensor whose rank
holds one shard. :func:`snapshot` keeps that rank's shard of ``W0`` and the layout it
came from, so no rank ever holds a full copy of the base model. :func:`full_delta`
subtracts shard from shard and gathers the difference of one layer (a collective:
every rank calls it for the same layers in the same order), so memory is bounded by
one layer. A snapshot taken before wrapping (a full ``W0`` on every rank) works too:
then the current weight is gathered and the full snapshot subtracted.

Only rank 0 (:func:`factors_here`) runs the SVD and keeps factors; under DDP the
replicas are whole already, and the other ranks skip the work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from adapterprobe.errors import ExtractionError


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where a DTensor's shard sits: its mesh, placements and global shape."""

    mesh: Any
    placements: tuple[Any, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _is_dtensor(tensor: Any) -> bool:
    if type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def unwrap(model: Any) -> Any:
    """The module whose names a single-process run gives (DDP's ``module``)."""
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


def factors_here() -> bool:
    """Whether this process factors deltas and writes files: rank 0, or a single process."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def snapshot(weight: Any, device: str | None) -> tuple[Any, ShardLayout | None]:
    """A copy of ``weight`` (of this rank's shard, for a DTensor) and its layout."""
    if not _is_dtensor(weight):
        return weight.detach().to(device or weight.device, copy=True), None
    local = weight.to_local().detach()
    layout = ShardLayout(
        weight.device_mesh, tuple(weight.placements), tuple(weight.shape), tuple(weight.stride())
    )
    return local.to(device or local.device, copy=True), layout


def base_shape(w0: Any, layout: ShardLayout | None) -> tuple[int, ...]:
    return layout.shape if layout is not None else tuple(w0.shape)


def full_delta(weight: Any, w0: Any, layout: ShardLayout | None, name: str) -> Any:
    """``W - W0`` of one layer as a full float32 tensor (gathered on every rank)."""
    if layout is not None:
        from torch.distributed.tensor import DTensor

        if not _is_dtensor(weight):
            raise ExtractionError(
                f"extract: {name!r} was snapshotted as a shard of a sharded model and is "
                "no longer sharded; take the snapshot again",
                tensor=name,
            )
        if tuple(weight.placements) != layout.placements or weight.device_mesh != layout.mesh:
            raise ExtractionError(
                f"extract: {name!r} is sharded differently from its snapshot "
                f"({list(weight.placements)} vs {list(layout.placements)})",
                tensor=name,
            )
        local = weight.to_local().detach()
        delta = local.float() - w0.to(local.device, torch.float32)
        sharded = DTensor.from_local(
            delta,
            layout.mesh,
            layout.placements,
            run_check=False,
            shape=torch.Size(layout.shape),
            stride=layout.stride,
        )
        return sharded.full_tensor()
    if _is_dtensor(weight):  # a full W0 from before wrapping
        full = weight.full_tensor().detach()
        return full.float() - w0.to(full.device, torch.float32)
    return weight.detach().float() - w0.to(weight.device, torch.float32)
