"""Where extraction reads weights from: a module, a state dict or a checkpoint.

Every source answers the same questions (keys, shape/dtype of a key, the
tensor of a key, what kind of module a key belongs to). Checkpoint paths
(``.safetensors``, a directory with ``model.safetensors`` or a sharded
``model.safetensors.index.json``) are opened lazily and read tensor by
tensor, so a model larger than memory can be compared.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapterprobe.errors import ExtractionError, MissingFileError, UsageError, require

torch = require("torch", "torch")

_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    floating: bool
    dtype: Any  # torch dtype, or None when unknown to torch


class TensorSource:
    label: str

    def keys(self) -> list[str]:
        raise NotImplementedError

    def meta(self, key: str) -> TensorMeta:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def module_kind(self, module: str) -> str | None:
        """'linear', 'embedding', 'conv1d', 'other', or None when unknown."""
        return None

    def close(self) -> None:
        pass


def _torch_meta(t: Any) -> TensorMeta:
    return TensorMeta(tuple(int(d) for d in t.shape), bool(t.is_floating_point()), t.dtype)


class DictSource(TensorSource):
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

    def meta(self, key: str) -> TensorMeta:
        return _torch_meta(self._t[key])

    def get(self, key: str) -> Any:
        return self._t[key].detach()


class ModuleSource(DictSource):
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


class SafetensorsSource(TensorSource):
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
                        raise ExtractionError(
                            f"{label}: tensor {key!r} is listed in the index but missing "
                            f"from shard {f.name}",
                            tensor=key,
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

    def meta(self, key: str) -> TensorMeta:
        sl = self._handle(self._where[key]).get_slice(key)
        name = _ST_DTYPES.get(sl.get_dtype())
        dtype = getattr(torch, name, None) if name else None
        return TensorMeta(tuple(int(d) for d in sl.get_shape()), name is not None, dtype)

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


def open_source(obj: Any, label: str) -> TensorSource:
    if isinstance(obj, torch.nn.Module):
        return ModuleSource(obj, label)
    if isinstance(obj, (str, os.PathLike)):
        return SafetensorsSource(Path(obj), label)
    if isinstance(obj, Mapping):
        return DictSource(obj, label)
    raise UsageError(
        f"{label}: expected an nn.Module, a state dict or a checkpoint path, "
        f"got {type(obj).__name__}"
    )


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


def is_embedding(module: str, kind: str | None) -> bool:
    """Whether a module is an embedding or output head (by type, else by name)."""
    if kind == "embedding":
        return True
    leaf = module.rsplit(".", 1)[-1]
    return leaf in _EMBEDDING_LEAVES or "embed" in leaf
