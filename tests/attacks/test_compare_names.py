"""Hostile module names through ``compare`` and ``similar``: bidi overrides,
zero-width characters and C1 controls in a tensor name are shown escaped,
as every scan output shows them (``adapterprobe.escape``), never written raw."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from tests.attacks import fs_attacks as fa

HOSTILE = "\u202eevil\u200b\x9b31m\x1b]0;t\x07"
RAW = ("\u202e", "\u200b", "\x9b", "\x1b", "\x07")


def rename_tensors(src: Path, dst: Path, old: str, new: str) -> None:
    """A copy of a safetensors file with ``old`` replaced by ``new`` in every
    tensor name (the header rewritten, the data untouched)."""
    data = src.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    renamed = {k.replace(old, new): v for k, v in header.items()}
    text = json.dumps(renamed).encode()
    dst.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size :])


def hostile_pair(root: Path, demo_store: Path) -> list[Path]:
    version = demo_store / "healthy" / "adapter" / "versions" / "v0001"
    out = []
    for name in ("a", "b"):
        d = root / "adapters" / (name + HOSTILE)  # a hostile path too
        d.mkdir(parents=True)
        shutil.copy(version / "adapter_config.json", d / "adapter_config.json")
        rename_tensors(
            version / "adapter_model.safetensors",
            d / "adapter_model.safetensors",
            "self_attn",
            HOSTILE,
        )
        out.append(d)
    return out


def test_compare_and_similar_show_hostile_module_names_escaped(tmp_path, demo_store):
    a, b = hostile_pair(tmp_path, demo_store)
    for args in (
        ("compare", a, b),
        ("compare", a, b, "--format", "markdown"),
        ("similar", tmp_path / "adapters", "--threshold", "0"),
    ):
        run = fa.cli(*args, timeout=120)
        assert "Traceback" not in run.stderr, run.stderr
        text = run.stdout + run.stderr
        assert "evil" in text, text[:500]
        for raw in RAW:
            assert raw not in text, (args[:2], repr(raw))
