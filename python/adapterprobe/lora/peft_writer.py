"""Write PEFT LoRA adapters: the safetensors file, streamed, and the config.

:class:`SafetensorsWriter` appends tensors one at a time to a spool file and
assembles the safetensors file at the end, so writing an adapter of any size
never holds its tensors in memory. Files are written inside a directory that
:func:`adapterprobe._fs.atomic_dir` renames into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adapterprobe.errors import ExtractionError, require
from adapterprobe.lora.factorize import FACTOR_DTYPES

torch = require("torch", "torch")

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"

# What a tensor saved whole (modules_to_save) may hold besides floats: a module's
# integer buffers go into the file too, since PEFT expects every key of such a module.
_ST_CODES = {
    **FACTOR_DTYPES,
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class SafetensorsWriter:
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
        code = _ST_CODES.get(t.dtype)
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


def peft_config(
    ranks: Mapping[str, int],
    *,
    modules_to_save: Sequence[str] = (),
    base_model_name_or_path: str | None = None,
    fan_in_fan_out: bool = False,
    bias: str = "none",
    ensure_weight_tying: bool = False,
) -> dict[str, Any]:
    """An ``adapter_config.json`` for per-module ranks with alpha = rank (scaling 1).

    ``bias="lora_only"`` when the file holds the LoRA modules' biases
    (``<module>.base_layer.bias``); ``ensure_weight_tying`` when a saved embedding has
    a tied output head, so that PEFT keeps the two tied (the file holds both anyway).
    """
    r = Counter(ranks.values()).most_common(1)[0][0] if ranks else 8
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model_name_or_path,
        "r": int(r),
        "lora_alpha": int(r),
        "target_modules": sorted(ranks),
        "rank_pattern": {m: int(k) for m, k in ranks.items()},
        "alpha_pattern": {m: int(k) for m, k in ranks.items()},
        "lora_dropout": 0.0,
        "bias": bias,
        "fan_in_fan_out": bool(fan_in_fan_out),
        "modules_to_save": sorted(modules_to_save) or None,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    if ensure_weight_tying:  # only then: PEFT versions before 0.18 do not know the key
        config["ensure_weight_tying"] = True
    return config


def peft_key(module: str, which: str) -> str:
    """The key PEFT saves for a module's factor: ``which`` is 'lora_A' or 'lora_B'."""
    return f"base_model.model.{module}.{which}.weight"
