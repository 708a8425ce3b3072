"""Raw gradients of chosen steps, written as safetensors files for offline study.

A :class:`GradientDump` only says which steps it wants and writes what it is
handed: the monitor decides when a step is sampled and passes the gradients in,
so dumps cost nothing on the steps they skip.

The ``step{N}`` folders (and their ``.step{N}.*`` staging names) are names this
module chooses inside the dump directory, which may be a shared or resumed run
folder: a symbolic link standing at one is replaced by the new folder, never
followed, so a dump can neither overwrite nor delete what a planted link points
at (see :mod:`adapterprobe._fs`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from adapterprobe._fs import atomic_dir, remove_link, replace_dir
from adapterprobe.errors import MonitorConfigError, UsageError, require
from adapterprobe.monitor.distributed import World
from adapterprobe.monitor.options import int_option


class GradientDump:
    """Writes raw gradients of sampled steps to ``directory/step{N}/{name}.safetensors``.

    A step is dumped when it is sampled by the monitor, ``start <= step <= end``
    (both inclusive; ``end=None`` is open) and ``(step - start) % every == 0``.
    ``first_n`` keeps only the leading ``first_n`` entries of every dimension, so that
    huge matrices can be sampled cheaply. Each file holds one tensor, ``"gradient"``,
    with the parameter name and full shape in its metadata. A step directory is built
    under a temporary name and renamed into place, replacing an earlier one (or a
    symbolic link at its name: the link itself, never what it points at).

    Under ``torch.distributed`` (see :meth:`write`): with ``first_n`` the global
    gradients are gathered one at a time and rank 0 writes the same files (metadata
    ``full_shape`` is the global shape); with ``first_n=None`` the step directory is a
    ``torch.distributed.checkpoint`` of the full gradients, each rank writing its shards
    (read it back with ``torch.distributed.checkpoint.load``, or
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``).
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
        self.start = int_option("start", start, 0)
        self.end = None if end is None else int_option("end (inclusive, >= start)", end, start)
        self.every = int_option("every", every, 1)
        self.first_n = None if first_n is None else int_option("first_n", first_n, 1)

    def wants(self, step: int) -> bool:
        """Whether a sampled ``step`` falls in the dump range."""
        if step < self.start or (self.end is not None and step > self.end):
            return False
        return (step - self.start) % self.every == 0

    def write(
        self,
        step: int,
        grads: Iterable[tuple[str, torch.Tensor]],
        *,
        world: World | None = None,
    ) -> Path:
        """Write one step's gradients; returns the step directory.

        With ``world`` (more than one rank) every rank must call this with the same
        names: ``first_n`` gathers each global gradient in turn and rank 0 writes the
        safetensors files; ``first_n=None`` writes a ``torch.distributed.checkpoint``
        in ``step{N}/`` (every rank its shards). A failure on any rank raises a
        :class:`MonitorConfigError` on every rank.
        """
        final = self.directory / f"step{step}"
        if world is None:
            try:
                with atomic_dir(final, overwrite=True, replace_link=True) as staging:
                    for name, grad in grads:
                        self._save_one(staging, step, name, _full(grad))
            except (OSError, UsageError) as exc:
                raise MonitorConfigError(f"cannot write gradient dump {final}: {exc}") from exc
            return final
        if self.first_n is None:
            return self._write_checkpoint(final, step, grads, world)
        return self._write_gathered(final, step, grads, world)

    def _save_one(self, staging: Path, step: int, name: str, grad: torch.Tensor) -> None:
        save_file = require("safetensors.torch", "torch").save_file
        tensor = grad.detach()
        full_shape = list(tensor.shape)
        if self.first_n is not None and tensor.ndim:
            tensor = tensor[tuple(slice(0, self.first_n) for _ in full_shape)]
        file = staging / f"{name.replace('/', '_').replace(os.sep, '_')}.safetensors"
        meta = {"parameter": name, "step": str(step), "full_shape": str(full_shape)}
        save_file({"gradient": tensor.to("cpu").contiguous()}, str(file), metadata=meta)

    def _write_gathered(
        self, final: Path, step: int, grads: Iterable[tuple[str, torch.Tensor]], world: World
    ) -> Path:
        # Every rank takes part in every gather, whatever happens to rank 0's files,
        # so that a write error cannot leave the other ranks waiting.
        error: BaseException | None = None
        target: Any = None  # rank 0's staging directory, renamed into place at the end
        staging: Path | None = None
        if world.rank == 0:
            try:
                target = atomic_dir(final, overwrite=True, replace_link=True)
                staging = target.__enter__()
            except (OSError, UsageError) as exc:
                error = exc
        for name, grad in grads:
            full = _full(grad)  # a collective for a DTensor: on every rank
            if staging is not None and error is None:
                try:
                    self._save_one(staging, step, name, full)
                except (OSError, UsageError) as exc:
                    error = exc
            del full
        if staging is not None:
            try:  # on an error the staging directory is removed, and the error kept
                if error is None:
                    target.__exit__(None, None, None)
                else:
                    target.__exit__(type(error), error, error.__traceback__)
            except (OSError, UsageError) as exc:
                error = exc
        _agree(error, world, step, f"cannot write gradient dump {final}")
        return final

    def _write_checkpoint(
        self, final: Path, step: int, grads: Iterable[tuple[str, torch.Tensor]], world: World
    ) -> Path:
        dcp = require("torch.distributed.checkpoint", "torch")
        staging = final.with_name(f".{final.name}.dcp.tmp")
        error: BaseException | None = None
        if world.rank == 0:
            try:
                if not remove_link(staging) and staging.exists():  # a link: itself, not its target
                    shutil.rmtree(staging)
                staging.parent.mkdir(parents=True, exist_ok=True)
            except (OSError, UsageError) as exc:
                error = exc
        _agree(error, world, step, f"cannot write gradient dump {final}")  # also a barrier
        state = {name: grad.detach() for name, grad in grads}
        try:
            dcp.save(state, checkpoint_id=str(staging))
        except Exception as exc:  # DCP raises the same error on every rank
            raise MonitorConfigError(f"cannot write gradient dump {final}: {exc}") from exc
        error = None
        if world.rank == 0:
            try:
                replace_dir(staging, final)  # a link at final: replaced, never followed
            except OSError as exc:
                error = exc
        _agree(error, world, step, f"cannot write gradient dump {final}")
        return final


def _full(grad: torch.Tensor) -> torch.Tensor:
    """The whole gradient: a DTensor's shards gathered (a collective), a plain tensor as is."""
    full_tensor = getattr(grad, "full_tensor", None)
    if full_tensor is not None and type(grad) is not torch.Tensor:
        return full_tensor()
    return grad


def _agree(error: BaseException | None, world: World, step: int, what: str) -> None:
    """Raise on every rank when any rank failed (one small all-reduce, bounded wait)."""
    flag = torch.tensor([0.0 if error is None else 1.0], dtype=torch.float64)
    work = torch.distributed.all_reduce(flag, group=world.group(step), async_op=True)
    try:
        work.wait() if world.timeout is None else work.wait(timeout=world.timeout)
    except RuntimeError as exc:
        raise MonitorConfigError(
            f"gradient dump of step {step}: rank {world.rank} timed out or failed waiting "
            f"for the other ranks ({exc})"
        ) from exc
    if error is not None:
        raise MonitorConfigError(f"{what}: {error}") from error
    if float(flag.item()):
        raise MonitorConfigError(f"{what}: it failed on another rank")
