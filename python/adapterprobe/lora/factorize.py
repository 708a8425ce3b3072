"""Factor a weight delta into LoRA matrices with an explained-variance rank rule.

``dW`` is factored with a randomized truncated SVD (``torch.svd_lowrank``,
float32, on the delta's device) into ``B = U sqrt(S)`` and ``A = sqrt(S) V^T``.
The rank is the smallest ``r`` whose singular values keep
``explained_variance`` of the *whole* energy ``||dW||_F^2`` (energy outside
the computed subspace counts as not kept), clamped to ``[min_rank, max_rank]``.
Used by :func:`adapterprobe.extract_lora` and the parasitic extractor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from adapterprobe.errors import ExtractionError, UsageError, require

torch = require("torch", "torch")

#: Default oversampling (extra random directions) of the randomized SVD.
DEFAULT_OVERSAMPLE = 16
#: Default number of power iterations of the randomized SVD.
DEFAULT_NITER = 4

#: Dtypes a factor may be stored in, with their safetensors codes.
FACTOR_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}

_DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def resolve_factor_dtype(dtype: Any) -> Any:
    """None -> float32; 'base' -> the base tensor's dtype; else a float dtype."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        if dtype == "base":
            return "base"
        name = _DTYPE_NAMES.get(dtype.lower())
        if name is None:
            raise UsageError(f"bad dtype {dtype!r}: use float32, bfloat16, float16 or 'base'")
        return getattr(torch, name)
    if isinstance(dtype, torch.dtype) and dtype in FACTOR_DTYPES:
        return dtype
    raise UsageError(f"bad dtype {dtype!r}: use float32, bfloat16, float16 or 'base'")


@dataclass
class LowRankFactors:
    """``dW ≈ lora_B @ lora_A`` for one weight, with how much of ``dW`` it keeps.

    ``lora_B`` is ``(out, r)`` and ``lora_A`` is ``(r, in)``, PEFT's layout.
    ``energy_kept`` is ``sum(S_r^2) / ||dW||_F^2`` and ``rel_error`` is the
    measured ``||dW - B A||_F / ||dW||_F``.
    """

    name: str
    lora_A: Any
    lora_B: Any
    singular_values: Any
    energy_kept: float
    rel_error: float
    target_reached: bool
    delta_norm: float

    @property
    def rank(self) -> int:
        return int(self.lora_A.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.lora_B.shape[0]), int(self.lora_A.shape[1]))

    def num_params(self) -> int:
        return int(self.lora_A.numel() + self.lora_B.numel())

    def delta(self) -> Any:
        """The reconstructed ``B @ A`` in float32."""
        return self.lora_B.float() @ self.lora_A.float()


def choose_rank(
    singular_values: Any,
    total_energy: float,
    explained_variance: float,
    min_rank: int,
    max_rank: int,
) -> tuple[int, bool]:
    """Smallest ``r`` whose top singular values keep ``explained_variance`` of
    ``total_energy`` (the whole ``||dW||_F^2``), clamped to ``[min_rank, max_rank]``.

    Returns ``(rank, reached)``; ``reached`` is False when the target is not
    met by any ``r`` among the given values (the caller may grow the subspace).
    The clamp bounds are also capped by ``len(singular_values)``.
    """
    s = singular_values.detach().double().cpu()
    n = int(s.numel())
    hi = max(1, min(max_rank, n))
    lo = max(1, min(min_rank, hi))
    if total_energy <= 0 or n == 0:
        return lo, True
    kept = torch.cumsum(s * s, 0) / float(total_energy)
    hits = torch.nonzero(kept >= explained_variance)
    if hits.numel() == 0:
        return hi, False
    r = int(hits[0, 0]) + 1
    if r > hi:
        return hi, False
    return max(lo, r), True


def _svd_exact(dw: Any, q: int) -> tuple[Any, Any, Any]:
    u, s, vh = torch.linalg.svd(dw, full_matrices=False)
    return u[:, :q], s[:q], vh[:q].mT


def _svd_randomized(dw: Any, q: int, niter: int, seed: int | None) -> tuple[Any, Any, Any]:
    devices = [dw.device] if dw.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        try:
            return torch.svd_lowrank(dw, q=q, niter=niter)
        except torch.linalg.LinAlgError:  # pragma: no cover - degenerate inputs
            return _svd_exact(dw, q)


def factorize_delta(
    delta: Any,
    *,
    min_rank: int = 8,
    max_rank: int = 64,
    explained_variance: float = 0.95,
    niter: int = DEFAULT_NITER,
    oversample: int = DEFAULT_OVERSAMPLE,
    seed: int | None = 0,
    name: str = "",
    out_dtype: Any = None,
    consume: bool = False,
) -> LowRankFactors:
    """Factor a 2-D delta into LoRA factors with the explained-variance rank rule.

    The delta is converted to float32 on its own device. A randomized SVD
    (``torch.svd_lowrank``) of ``t + oversample`` directions with ``niter``
    power iterations is computed, starting at ``t = max(min_rank,
    ceil(max_rank / 2))``; when the target energy is not reached inside the
    ``t`` leading directions and ``t < max_rank``, the subspace is doubled and
    recomputed. Matrices too small for a sketch to pay use the exact SVD.
    ``seed`` makes the random sketch reproducible without touching the global
    RNG streams (None: use and advance the global RNG). With ``consume`` the
    caller gives up ``delta`` and it is overwritten by the residual.
    """
    if delta.dim() != 2:
        raise ExtractionError(
            f"{name or 'delta'}: expected a 2-D tensor, got shape {tuple(delta.shape)}", tensor=name
        )
    dw = delta if delta.dtype == torch.float32 else delta.float()
    m, n = dw.shape
    k = min(m, n)
    delta_norm = float(torch.linalg.vector_norm(dw))
    total = delta_norm * delta_norm
    if not math.isfinite(total):
        raise ExtractionError(
            f"{name or 'delta'}: non-finite values in the weight delta", tensor=name
        )
    if out_dtype is None:
        out_dtype = torch.float32
    if total == 0.0 or k == 0:
        raise ExtractionError(
            f"{name or 'delta'}: the delta is zero; nothing to factor", tensor=name
        )

    cap = max(1, min(max_rank, k))
    lo = max(1, min(min_rank, cap))
    t = min(cap, max(lo, (cap + 1) // 2))
    while True:
        q = t + oversample
        if 2 * q >= k:
            u, s, v = _svd_exact(dw, min(cap, k))
            exact = True
        else:
            u, s, v = _svd_randomized(dw, q, niter, seed)
            exact = False
        rank, reached = choose_rank(s[:t] if not exact else s, total, explained_variance, lo, cap)
        if reached or exact or t >= cap:
            break
        t = min(cap, 2 * t)

    s_r = s[:rank]
    root = torch.sqrt(s_r)
    lora_b = u[:, :rank] * root.unsqueeze(0)
    lora_a = (v[:, :rank] * root.unsqueeze(0)).mT.contiguous()
    energy_kept = float(torch.sum(s_r.double() ** 2)) / total
    # the measured residual, in place when the delta is ours to overwrite
    resid = dw if (consume or dw is not delta) else dw.clone()
    resid.addmm_(lora_b, lora_a, alpha=-1.0)
    rel_error = float(torch.linalg.vector_norm(resid)) / delta_norm
    del resid
    out_b = lora_b.to(out_dtype)
    out_a = lora_a.to(out_dtype)
    if not (torch.isfinite(out_b).all() and torch.isfinite(out_a).all()):
        raise ExtractionError(
            f"{name}: factors overflow {out_dtype}; use dtype=torch.float32", tensor=name
        )
    return LowRankFactors(
        name=name,
        lora_A=out_a,
        lora_B=out_b,
        singular_values=s_r.detach().float().cpu(),
        energy_kept=min(1.0, energy_kept),
        rel_error=rel_error,
        target_reached=bool(reached),
        delta_norm=delta_norm,
    )
