"""A hostile Hugging Face hub cache: a FIFO (and a link) where a ref file
belongs. The ref reader opens without blocking or following links and reads
only small regular files, so the scan neither hangs nor reads elsewhere."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from adapterprobe import hf_cache

COMMIT = "a" * 40


def hostile_cache(root: Path, demo_store: Path) -> Path:
    repo = root / "models--team--lora"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    version = demo_store / "healthy" / "adapter" / "versions" / "v0001"
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(version / name, snapshot / name)
    refs = repo / "refs"
    refs.mkdir()
    (refs / "main").write_text(COMMIT)
    os.mkfifo(refs / "fifo")  # no writer: a blocking open would wait forever
    outside = root / "outside-secret"
    outside.write_text(COMMIT)
    (refs / "linked").symlink_to(outside)
    return root


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_in_refs_is_passed_over_not_opened_for_ever(tmp_path, demo_store):
    cache = hostile_cache(tmp_path / "hub", demo_store)
    result: dict[str, object] = {}

    def read() -> None:
        result["refs"] = hf_cache._refs(cache / "models--team--lora")

    worker = threading.Thread(target=read, daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the ref reader is blocked on the FIFO"
    assert time.monotonic() - start < 30
    # the FIFO and the link are passed over; the real ref is read
    assert result["refs"] == {COMMIT: ["main"]}
