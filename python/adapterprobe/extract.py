"""Extract a PEFT LoRA adapter from a full fine-tune.

For every changed 2-D weight of a Linear module, ``dW = W_tuned - W_base`` is
factored with a randomized truncated SVD (``torch.svd_lowrank``, float32, on
the chosen device) into ``B = U sqrt(S)`` and ``A = sqrt(S) V^T``. The rank of
each module is the smallest ``r`` whose singular values keep
``explained_variance`` of the *whole* energy ``||dW||_F^2`` (energy outside the
computed subspace counts as not kept), clamped to ``[min_rank, max_rank]``.

Checkpoints given as paths are read lazily, tensor by tensor, and the adapter
file is written through a spool file, so peak memory stays a few tensors
whatever the model's size. The output directory appears atomically: it is
built in a temporary sibling directory and renamed into place.

The factorization (:func:`factorize_delta`) and the rank rule
(:func:`choose_rank`) are shared with :mod:`adapterprobe.parasitic`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import shutil
import struct
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adapterprobe.errors import ExtractionError, MissingFileError, UsageError, require
from adapterprobe.result import json_safe

torch = require("torch", "torch")

__all__ = [
    "ExtractionReport",
    "LowRankFactors",
    "ModuleReport",
    "SkippedTensor",
    "choose_rank",
    "extract_lora",
    "factorize_delta",
]

ProgressCallback = Callable[[str, int, int], None]

#: Default oversampling (extra random directions) of the randomized SVD.
DEFAULT_OVERSAMPLE = 16
#: Default number of power iterations of the randomized SVD.
DEFAULT_NITER = 4

REPORT_FILE = "extraction_report.json"
ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"

# Leaf module names treated as embeddings / output heads when the module type
# is unknown (checkpoint paths, state dicts).
_EMBEDDING_LEAVES = frozenset(
    {
        "lm_head",
        "embed_out",
        "wte",
        "wpe",
        "word_embeddings",
        "position_embeddings",
        "token_type_embeddings",
        "shared",
    }
)


# --------------------------------------------------------------------------
# errors


def _fail(tensor: str, message: str) -> ExtractionError:
    exc = ExtractionError(message)
    with contextlib.suppress(AttributeError, TypeError):
        exc.tensor = tensor  # type: ignore[attr-defined]
    return exc


# --------------------------------------------------------------------------
# rank rule and factorization (shared with parasitic.py)


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
        raise _fail(
            name, f"{name or 'delta'}: expected a 2-D tensor, got shape {tuple(delta.shape)}"
        )
    dw = delta if delta.dtype == torch.float32 else delta.float()
    m, n = dw.shape
    k = min(m, n)
    delta_norm = float(torch.linalg.vector_norm(dw))
    total = delta_norm * delta_norm
    if not math.isfinite(total):
        raise _fail(name, f"{name or 'delta'}: non-finite values in the weight delta")
    if out_dtype is None:
        out_dtype = torch.float32
    if total == 0.0 or k == 0:
        raise _fail(name, f"{name or 'delta'}: the delta is zero; nothing to factor")

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
        raise _fail(name, f"{name}: factors overflow {out_dtype}; use dtype=torch.float32")
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


# --------------------------------------------------------------------------
# tensor sources: nn.Module, state dict, safetensors checkpoint (lazy)

_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


@dataclass(frozen=True)
class _Meta:
    shape: tuple[int, ...]
    floating: bool
    dtype: Any  # torch dtype, or None when unknown to torch


class _Source:
    label: str

    def keys(self) -> list[str]:
        raise NotImplementedError

    def meta(self, key: str) -> _Meta:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def module_kind(self, module: str) -> str | None:
        """'linear', 'embedding', 'conv1d', 'other', or None when unknown."""
        return None

    def close(self) -> None:
        pass


def _torch_meta(t: Any) -> _Meta:
    return _Meta(tuple(int(d) for d in t.shape), bool(t.is_floating_point()), t.dtype)


class _DictSource(_Source):
    def __init__(self, tensors: Mapping[str, Any], label: str) -> None:
        self.label = label
        self._t: dict[str, Any] = {}
        for k, v in tensors.items():
            if not isinstance(v, torch.Tensor):
                raise UsageError(f"{label}: state dict entry {k!r} is not a tensor")
            if v.device.type == "meta":
                raise UsageError(f"{label}: tensor {k!r} is on the meta device (no data)")
            self._t[str(k)] = v

    def keys(self) -> list[str]:
        return list(self._t)

    def meta(self, key: str) -> _Meta:
        return _torch_meta(self._t[key])

    def get(self, key: str) -> Any:
        return self._t[key].detach()


class _ModuleSource(_DictSource):
    def __init__(self, model: Any, label: str) -> None:
        state = model.state_dict()
        # drop tied duplicates (lm_head tied to the embedding), as save_pretrained does
        seen: set[tuple[int, int, tuple[int, ...]]] = set()
        unique: dict[str, Any] = {}
        for k, v in state.items():
            try:
                ident = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
            except (RuntimeError, NotImplementedError):
                ident = (id(v), 0, ())
            if ident[0] != 0 and ident in seen:
                continue
            seen.add(ident)
            unique[k] = v
        super().__init__(unique, label)
        self._kinds: dict[str, str] = {}
        for mname, mod in model.named_modules():
            self._kinds[mname] = _kind_of(mod)

    def module_kind(self, module: str) -> str | None:
        return self._kinds.get(module)


def _kind_of(mod: Any) -> str:
    nn = torch.nn
    if isinstance(mod, nn.Embedding):
        return "embedding"
    if isinstance(mod, nn.Linear):
        return "linear"
    if type(mod).__name__ == "Conv1D":
        return "conv1d"
    return "other"


class _SafetensorsSource(_Source):
    """A ``.safetensors`` file, or a dir with ``model.safetensors`` or a sharded index."""

    def __init__(self, path: Path, label: str) -> None:
        self.label = label
        self._safe_open = require("safetensors", "torch").safe_open
        files = _resolve_checkpoint(path, label)
        self._where: dict[str, Path] = {}
        self._handles: dict[Path, Any] = {}
        self._conv1d = _config_uses_conv1d(path if path.is_dir() else path.parent)
        if isinstance(files, dict):
            for key, f in files.items():
                self._where[key] = f
            # make sure every shard exists and holds what the index says
            for f in sorted(set(files.values())):
                if not f.is_file():
                    raise MissingFileError(f"{label}: shard {f} named in the index does not exist")
            for f in sorted(set(files.values())):
                present = set(self._handle(f).keys())
                for key, g in files.items():
                    if g == f and key not in present:
                        raise _fail(
                            key,
                            f"{label}: tensor {key!r} is listed in the index but missing "
                            f"from shard {f.name}",
                        )
        else:
            for key in self._handle(files).keys():  # noqa: SIM118 - not a dict
                self._where[key] = files

    def _handle(self, f: Path) -> Any:
        h = self._handles.get(f)
        if h is None:
            try:
                h = self._safe_open(str(f), framework="pt", device="cpu")
            except Exception as exc:  # safetensors raises its own error types
                raise ExtractionError(f"{self.label}: cannot read {f}: {exc}") from exc
            self._handles[f] = h
        return h

    def keys(self) -> list[str]:
        # group by shard for locality
        return sorted(self._where, key=lambda k: (str(self._where[k]), k))

    def meta(self, key: str) -> _Meta:
        sl = self._handle(self._where[key]).get_slice(key)
        name = _ST_DTYPES.get(sl.get_dtype())
        dtype = getattr(torch, name, None) if name else None
        return _Meta(tuple(int(d) for d in sl.get_shape()), name is not None, dtype)

    def get(self, key: str) -> Any:
        return self._handle(self._where[key]).get_tensor(key)

    def module_kind(self, module: str) -> str | None:
        if self._conv1d and module.rsplit(".", 1)[-1] in _CONV1D_LEAVES:
            return "conv1d"
        return None

    def close(self) -> None:
        self._handles.clear()


# transformers models whose attention/MLP projections are Conv1D (weight stored
# as (in, out)); a checkpoint dir's config.json names the model type.
_CONV1D_MODEL_TYPES = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})
_CONV1D_LEAVES = frozenset({"c_attn", "c_proj", "c_fc", "q_attn"})


def _config_uses_conv1d(folder: Path) -> bool:
    cfg = folder / "config.json"
    if not cfg.is_file():
        return False
    try:
        model_type = json.loads(cfg.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return False
    return model_type in _CONV1D_MODEL_TYPES


def _resolve_checkpoint(path: Path, label: str) -> Path | dict[str, Path]:
    if not path.exists():
        raise MissingFileError(f"{label}: {path} does not exist")
    if path.is_file():
        if path.name.endswith(".index.json"):
            return _read_index(path, label)
        if path.suffix != ".safetensors":
            raise UsageError(
                f"{label}: {path} is not a .safetensors file (pickled checkpoints are not "
                "read; convert with safetensors first)"
            )
        return path
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if single.is_file():
        return single
    if index.is_file():
        return _read_index(index, label)
    raise MissingFileError(
        f"{label}: {path} has neither model.safetensors nor model.safetensors.index.json"
    )


def _read_index(index: Path, label: str) -> dict[str, Path]:
    try:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExtractionError(f"{label}: bad sharded index {index}: {exc}") from exc
    return {str(k): index.parent / str(v) for k, v in weight_map.items()}


def _open_source(obj: Any, label: str) -> _Source:
    if isinstance(obj, torch.nn.Module):
        return _ModuleSource(obj, label)
    if isinstance(obj, (str, os.PathLike)):
        return _SafetensorsSource(Path(obj), label)
    if isinstance(obj, Mapping):
        return _DictSource(obj, label)
    raise UsageError(
        f"{label}: expected an nn.Module, a state dict or a checkpoint path, "
        f"got {type(obj).__name__}"
    )


# --------------------------------------------------------------------------
# streaming safetensors writer


_WRITE_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}


class _SafetensorsWriter:
    """Write tensors one at a time to a spool file, then assemble a safetensors
    file (header + data) without holding the tensors in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._spool_path = path.with_name(path.name + ".spool")
        self._spool = open(self._spool_path, "wb")  # noqa: SIM115 - closed in finish()
        self._entries: dict[str, dict[str, Any]] = {}
        self._offset = 0

    def add(self, key: str, tensor: Any) -> None:
        if key in self._entries:
            raise ExtractionError(f"duplicate tensor {key!r} in the adapter file")
        t = tensor.detach().contiguous().cpu()
        code = _WRITE_DTYPES.get(t.dtype)
        if code is None:
            raise ExtractionError(f"cannot store {key!r} as {t.dtype}")
        raw = t.reshape(-1).view(torch.uint8).numpy()
        self._spool.write(memoryview(raw))
        n = int(raw.nbytes)
        self._entries[key] = {
            "dtype": code,
            "shape": [int(d) for d in t.shape],
            "data_offsets": [self._offset, self._offset + n],
        }
        self._offset += n

    def finish(self, metadata: Mapping[str, str] | None = None) -> None:
        self._spool.close()
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        header.update(self._entries)
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        with open(self.path, "wb") as out, open(self._spool_path, "rb") as spool:
            out.write(struct.pack("<Q", len(blob)))
            out.write(blob)
            shutil.copyfileobj(spool, out, 16 << 20)
            out.flush()
            os.fsync(out.fileno())
        self._spool_path.unlink()

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._spool.close()
        with contextlib.suppress(OSError):
            self._spool_path.unlink()


# --------------------------------------------------------------------------
# atomic directory


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"output {out} exists and is not a directory")
        if not overwrite and any(out.iterdir()):
            raise UsageError(
                f"output {out} exists and is not empty (overwrite=True / --overwrite replaces it)"
            )


@contextlib.contextmanager
def atomic_dir(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``out_dir``; on success it is renamed to
    ``out_dir`` (replacing an existing one when ``overwrite``); on error it is removed."""
    out = Path(out_dir).absolute()
    _check_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        _check_out_dir(out, overwrite)
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        with contextlib.suppress(OSError):
            fd = os.open(out.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w") as f:
        json.dump(json_safe(data), f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def peft_config(
    ranks: Mapping[str, int],
    *,
    modules_to_save: Sequence[str] = (),
    base_model_name_or_path: str | None = None,
    fan_in_fan_out: bool = False,
) -> dict[str, Any]:
    """An ``adapter_config.json`` for per-module ranks with alpha = rank (scaling 1)."""
    r = Counter(ranks.values()).most_common(1)[0][0] if ranks else 8
    return {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model_name_or_path,
        "r": int(r),
        "lora_alpha": int(r),
        "target_modules": sorted(ranks),
        "rank_pattern": {m: int(k) for m, k in ranks.items()},
        "alpha_pattern": {m: int(k) for m, k in ranks.items()},
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": bool(fan_in_fan_out),
        "modules_to_save": sorted(modules_to_save) or None,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }


def peft_key(module: str, which: str) -> str:
    """The key PEFT saves for a module's factor: ``which`` is 'lora_A' or 'lora_B'."""
    return f"base_model.model.{module}.{which}.weight"


# --------------------------------------------------------------------------
# report


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


def _matches(module: str, patterns: Sequence[str]) -> bool:
    return any(
        fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, "*." + p) for p in patterns
    )


def _as_patterns(value: str | Iterable[str] | None, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    try:
        pats = tuple(str(v) for v in value)
    except TypeError as exc:
        raise UsageError(f"{name} must be a pattern or a list of patterns") from exc
    return pats


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


def _resolve_dtype(dtype: Any) -> Any:
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
    if isinstance(dtype, torch.dtype) and dtype in _WRITE_DTYPES:
        return dtype
    raise UsageError(f"bad dtype {dtype!r}: use float32, bfloat16, float16 or 'base'")


def _is_embedding(module: str, kind: str | None) -> bool:
    if kind == "embedding":
        return True
    leaf = module.rsplit(".", 1)[-1]
    return leaf in _EMBEDDING_LEAVES or "embed" in leaf


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
    out_dtype = _resolve_dtype(dtype)
    inc = _as_patterns(include, "include")
    exc_pats = _as_patterns(exclude, "exclude")
    out = Path(out_dir).absolute()
    _check_out_dir(out, overwrite)

    src_base = _open_source(base, "base")
    src_tuned = _open_source(tuned, "tuned")
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
            writer = _SafetensorsWriter(tmp / ADAPTER_FILE)
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
            _write_json(tmp / CONFIG_FILE, cfg)
            report.seconds = time.perf_counter() - t_start
            _write_json(tmp / REPORT_FILE, report.to_dict())
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


def _plan(base: _Source, tuned: _Source, inc: tuple[str, ...], exc: tuple[str, ...]) -> list[_Item]:
    def selected(key: str) -> bool:
        module = key.rsplit(".", 1)[0] if "." in key else key
        if inc and not (_matches(module, inc) or _matches(key, inc)):
            return False
        return not (exc and (_matches(module, exc) or _matches(key, exc)))

    tuned_keys = [k for k in tuned.keys() if selected(k)]  # noqa: SIM118 - a _Source
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
            raise _fail(
                missing[0], f"tensor {missing[0]!r} is in {have} but missing from {lack}{more}"
            )

    items: list[_Item] = []
    for key in tuned_keys:
        mt, mb = tuned.meta(key), base.meta(key)
        if mt.shape != mb.shape:
            raise _fail(
                key, f"shape mismatch for {key!r}: base {list(mb.shape)} vs tuned {list(mt.shape)}"
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
        if _is_embedding(module, kind):
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
        raise _fail(
            conv.key,
            f"{conv.module!r} is a Conv1D (fan_in_fan_out) and {lin.module!r} a Linear: one PEFT "
            "adapter cannot hold both; use include/exclude to extract them separately",
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
    src_base: _Source,
    src_tuned: _Source,
    writer: _SafetensorsWriter,
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
                raise _fail(
                    item.key,
                    f"non-finite delta in {item.key!r}: NaN or infinite values in base or tuned",
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
