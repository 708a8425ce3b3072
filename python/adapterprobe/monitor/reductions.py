"""Device-side reductions: every tensor reduced where it lives, then one copy to the host.

Every tensor is reduced to its L2 norm (the root of its sum of squares), its min and
its max, plus its sum when per-tensor means are wanted; the host derives mean,
variance and max-abs from those (:mod:`adapterprobe.monitor.stats`). These plain
reductions read the tensor once each and make no temporary copy. They are also the
fast ones: on CPU, torch.var_mean, the inf-norm and isfinite run 20 to 70 times
slower than sum and aminmax (torch 2.15).

Variance from moments cancels when |mean| >> std (norm weights sit at 1 +- 1e-4; the
gradient of a sum loss is constant), so sums are accumulated in float64: that keeps
float32 precision up to |mean|/std of about 1e4, and a constant tensor gets var 0.
On CPU, where float64 sums cost three times float32 ones and reading a result back
costs nothing, sums start in float32 and only tensors that would cancel are redone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


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


def _norms(tensors: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Per-tensor L2 norms in one multi-tensor call (fused on accelerators)."""
    if _FOREACH_DTYPE:
        return list(torch._foreach_norm(tensors, 2.0, dtype=dtype))
    return [torch.linalg.vector_norm(t, dtype=dtype) for t in tensors]


def _cancels(sums: Any, norms: Any, sizes: Any) -> Any:
    """Where float32 moments would lose the variance: squared mean over 90% of mean square.

    Elsewhere the relative error of a float32 variance stays under about 3e-6.
    """
    return sums * sums > 0.9 * sizes * norms * norms


def whole_tensor_stats(tensors: list[torch.Tensor], *, with_sums: bool) -> torch.Tensor:
    """L2 norms, minima, maxima (and sums) of same-device, same-dtype tensors.

    Returns one flat tensor laid out ``[norms..., mins..., maxes..., sums...]``.
    """
    device = tensors[0].device
    if _cheap_host_reads(device):
        narrow = torch.promote_types(tensors[0].dtype, torch.float32)
        norms = torch.stack(_norms(tensors, narrow)).double()
    else:  # no host reads on an accelerator: wide throughout
        wide = _wide_accumulator(device)
        norms = torch.stack(_norms(tensors, wide))
    extremes = [torch.aminmax(t) for t in tensors]
    lows = torch.stack([low for low, _ in extremes])
    parts = [norms, lows, torch.stack([high for _, high in extremes])]
    if with_sums:
        if _cheap_host_reads(device):
            # float32 sums first; float64 only for the tensors whose variance would cancel
            sums = torch.stack([t.sum(dtype=narrow) for t in tensors]).double()
            sizes = torch.tensor([t.numel() for t in tensors], dtype=torch.float64)
            for i in torch.nonzero(_cancels(sums, norms, sizes)).flatten().tolist():
                sums[i] = tensors[i].sum(dtype=torch.float64)
                norms[i] = torch.linalg.vector_norm(tensors[i], dtype=torch.float64)
        else:
            sums = torch.stack([t.sum(dtype=norms.dtype) for t in tensors])
        parts.append(sums)
    return torch.cat([p.to(parts[0].dtype) for p in parts])


def nonfinite_count(tensor: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(tensor).logical_not_().sum().reshape(1)


def activation_summary(values: torch.Tensor) -> tuple[Any, ...]:
    """``(min, max, sum of squares, NaN/inf count)`` of one activation.

    On CPU the values are read back at once, as four floats; finite min and max prove
    there is nothing to count (both propagate NaN). On an accelerator they are four
    device tensors of shape [1], and the count is always taken (a kernel, not a host
    read).
    """
    low, high = torch.aminmax(values)
    if not _cheap_host_reads(values.device):
        norm = torch.linalg.vector_norm(values, dtype=_wide_accumulator(values.device))
        return low.reshape(1), high.reshape(1), (norm * norm).reshape(1), nonfinite_count(values)
    lo, hi = float(low), float(high)
    if values.dtype == torch.float32 or values.dtype == torch.float64:
        norm = float(torch.linalg.vector_norm(values))
    else:  # half types: accumulate in float32
        norm = float(torch.linalg.vector_norm(values, dtype=torch.float32))
    bad = 0.0 if math.isfinite(lo) and math.isfinite(hi) else float(nonfinite_count(values))
    return (lo, hi, norm * norm, bad)


def instance_stats(values: torch.Tensor) -> tuple[Any, ...]:
    """Per-instance sums and L2 norms (dim 0 is the instance), then min, max and NaN/inf count.

    Laid out ``[sums (B), norms (B), min, max, nonfinite]``: one NumPy array on CPU, five
    device tensors elsewhere (copied to the host with everything else at the end of the
    step).
    """
    dims = tuple(range(1, values.ndim))
    low, high = torch.aminmax(values)
    if not _cheap_host_reads(values.device):  # float64 sums and a count, always
        wide = _wide_accumulator(values.device)
        sums = values.sum(dim=dims, dtype=wide)
        norms = torch.linalg.vector_norm(values, dim=dims, dtype=wide)
        return sums, norms, low.reshape(1), high.reshape(1), nonfinite_count(values)
    # On CPU, as for whole tensors: float32 first, float64 where it cancels.
    lo, hi = float(low), float(high)
    narrow = torch.promote_types(values.dtype, torch.float32)
    host_sums = values.sum(dim=dims, dtype=narrow).double().numpy()
    host_norms = torch.linalg.vector_norm(values, dim=dims, dtype=narrow).double().numpy()
    bad = 0.0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        bad = float(nonfinite_count(values))
    elif bool(_cancels(host_sums, host_norms, values.numel() // values.shape[0]).any()):
        host_sums = values.sum(dim=dims, dtype=torch.float64).numpy()
        host_norms = torch.linalg.vector_norm(values, dim=dims, dtype=torch.float64).numpy()
    return (np.concatenate((host_sums, host_norms, (lo, hi, bad))),)


# ---------------------------------------------------------------------------
# The copy to the host


def fetch(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Copy small device tensors to the host: one concatenation and one copy per device."""
    out: list[np.ndarray] = [np.empty(0)] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    for indices in by_device.values():
        parts = [tensors[i].reshape(-1).double() for i in indices]
        host = torch.cat(parts).to("cpu").numpy()
        offset = 0
        for index, part in zip(indices, parts, strict=True):
            out[index] = host[offset : offset + part.numel()]
            offset += part.numel()
    return out


def to_host(values: Sequence[Any]) -> list[np.ndarray]:
    """NumPy arrays for a mix of NumPy arrays (CPU results) and device tensors."""
    out = list(values)
    pending = [i for i, v in enumerate(out) if isinstance(v, torch.Tensor)]
    if pending:
        for i, host in zip(pending, fetch([out[i] for i in pending]), strict=True):
            out[i] = host
    return out
