"""Raw gradients of chosen steps, written as safetensors files for offline study.

A :class:`GradientDump` only says which steps it wants and writes what it is
handed: the monitor decides when a step is sampled and passes the gradients in,
so dumps cost nothing on the steps they skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch

from adapterprobe._fs import atomic_dir
from adapterprobe.errors import MonitorConfigError, UsageError, require
from adapterprobe.monitor.options import int_option


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
        self.start = int_option("start", start, 0)
        self.end = None if end is None else int_option("end (inclusive, >= start)", end, start)
        self.every = int_option("every", every, 1)
        self.first_n = None if first_n is None else int_option("first_n", first_n, 1)

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
        except (OSError, UsageError) as exc:
            raise MonitorConfigError(f"cannot write gradient dump {final}: {exc}") from exc
        return final
