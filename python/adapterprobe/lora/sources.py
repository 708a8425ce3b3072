"""Where extraction reads weights from: a module, a state dict or a checkpoint.

Every source answers the same questions (keys, shape/dtype of a key, the
tensor of a key, what kind of module a key belongs to, which keys are tied to
another). Checkpoint paths (``.safetensors``, a directory with
``model.safetensors`` or a sharded ``model.safetensors.index.json``) are opened
lazily and read tensor by tensor, so a model larger than memory can be compared.

JSON beside a checkpoint (``config.json``, the shard index) is read defensively:
anything malformed is an :class:`ExtractionError` naming the file, and an index
may only name shards inside its own directory.
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
    #: keys left out because they share storage with another key (a tied output
    #: head): missing key -> the key it is tied to
    tied: dict[str, str]

    def keys(self) -> list[str]:
        raise NotImplementedError

    def meta(self, key: str) -> TensorMeta:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def module_kind(self, module: str) -> str | None:
        """'linear', 'embedding', 'conv1d', 'other', or None when unknown."""
        return None

    def paths(self) -> list[Path]:
        """The files this source reads (none for in-memory sources)."""
        return []

    def close(self) -> None:
        pass


def _torch_meta(t: Any) -> TensorMeta:
    return TensorMeta(tuple(int(d) for d in t.shape), bool(t.is_floating_point()), t.dtype)


class DictSource(TensorSource):
    def __init__(self, tensors: Mapping[str, Any], label: str) -> None:
        self.label = label
        self.tied = {}
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
        seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
        unique: dict[str, Any] = {}
        tied: dict[str, str] = {}
        for k, v in state.items():
            try:
                ident = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
            except (RuntimeError, NotImplementedError):
                ident = (id(v), 0, ())
            if ident[0] != 0 and ident in seen:
                tied[k] = seen[ident]
                continue
            seen[ident] = k
            unique[k] = v
        super().__init__(unique, label)
        self.tied = tied
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
        config = read_config(path if path.is_dir() else path.parent, label)
        self._conv1d = config.get("model_type") in _CONV1D_MODEL_TYPES
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
        self.tied = _tied_head(config, self._where)

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

    def paths(self) -> list[Path]:
        return sorted(set(self._where.values()))

    def close(self) -> None:
        self._handles.clear()


# transformers models whose attention/MLP projections are Conv1D (weight stored
# as (in, out)); a checkpoint dir's config.json names the model type.
_CONV1D_MODEL_TYPES = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})
_CONV1D_LEAVES = frozenset({"c_attn", "c_proj", "c_fc", "q_attn"})
# Input token embeddings an output head may be tied to (module leaf names).
_TOKEN_EMBEDDING_LEAVES = frozenset(
    {"embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings", "shared"}
)
#: JSON files beside a checkpoint are small; anything larger is refused unread.
MAX_JSON_BYTES = 64 << 20


def read_json_file(path: Path, what: str) -> Any:
    """Parsed JSON of a small file; ExtractionError (naming ``what``) for anything wrong."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ValueError(f"{size:,} bytes is more than the {MAX_JSON_BYTES:,} allowed")
        return json.loads(path.read_bytes().decode("utf-8"))
    except RecursionError:
        raise ExtractionError(f"bad {what}: nested too deeply", path=path) from None
    except (OSError, ValueError) as exc:  # ValueError covers JSON and UTF-8 errors
        raise ExtractionError(f"bad {what}: {exc}", path=path) from exc


def read_config(folder: Path, label: str) -> dict[str, Any]:
    """A checkpoint folder's ``config.json`` as a dict ({} when there is none)."""
    cfg = folder / "config.json"
    if not cfg.is_file():
        return {}
    data = read_json_file(cfg, f"{label} config.json")
    if not isinstance(data, dict):
        raise ExtractionError(
            f"bad {label} config.json: a {type(data).__name__}, not an object", path=cfg
        )
    model_type = data.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ExtractionError(f"bad {label} config.json: model_type is not a string", path=cfg)
    tie = data.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        raise ExtractionError(
            f"bad {label} config.json: tie_word_embeddings is not true/false", path=cfg
        )
    return data


def _tied_head(config: dict[str, Any], keys: Mapping[str, Any]) -> dict[str, str]:
    """``{"lm_head.weight": <input embedding key>}`` when a checkpoint left out an output
    head tied to its token embedding (``save_pretrained`` stores tied tensors once)."""
    if config.get("tie_word_embeddings") is False or "lm_head.weight" in keys:
        return {}
    if not config:  # no config.json: no claim that anything is tied
        return {}
    embeds = [
        k
        for k in keys
        if k.endswith(".weight")
        and k[: -len(".weight")].rsplit(".", 1)[-1] in _TOKEN_EMBEDDING_LEAVES
    ]
    return {"lm_head.weight": embeds[0]} if len(embeds) == 1 else {}


def contained(name: str) -> bool:
    """Whether a file name from an index or a library stays inside its directory:
    relative, no ``..`` climbing out. Symbolic links inside the directory are allowed
    (the HF hub cache is made of them)."""
    if not name or "\x00" in name or Path(name).is_absolute() or os.path.isabs(name):
        return False
    normal = os.path.normpath(name)
    return not (normal == ".." or normal.startswith(".." + os.sep) or normal == ".")


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
    data = read_json_file(index, f"{label} sharded index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ExtractionError(
            f"bad {label} sharded index: no weight_map object (got {type(weight_map).__name__})",
            path=index,
        )
    out: dict[str, Path] = {}
    for key, shard in weight_map.items():
        if not isinstance(shard, str):
            raise ExtractionError(
                f"bad {label} sharded index: the shard of {key!r} is not a file name",
                path=index,
                tensor=key,
            )
        if not contained(shard):
            raise ExtractionError(
                f"bad {label} sharded index: shard {shard!r} of {key!r} is outside "
                f"the index's directory",
                path=index,
                tensor=key,
            )
        out[key] = index.parent / shard
    return out


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
