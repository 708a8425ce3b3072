"""Sparse adapters whose headers claim factors of 2^27 values (16 KiB on
disk): under an address-space limit, ``compare`` answers with an error
naming the allocation it could not make, instead of dying of SIGABRT."""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

LIMIT = 1536 << 20  # 1.5 GB of address space
CLAIMED = 1 << 27  # values of one factor, F16


def sparse_adapter(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"]})
    )
    a_bytes = CLAIMED * 2
    header = {
        "base_model.model.layers.0.q_proj.lora_A.weight": {
            "dtype": "F16",
            "shape": [1, CLAIMED],
            "data_offsets": [0, a_bytes],
        },
        "base_model.model.layers.0.q_proj.lora_B.weight": {
            "dtype": "F16",
            "shape": [8, 1],
            "data_offsets": [a_bytes, a_bytes + 16],
        },
    }
    text = json.dumps(header).encode()
    path = root / "adapter_model.safetensors"
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + a_bytes + 16)  # a hole: nothing written
    return root


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux applies it")
def test_compare_of_sparse_huge_claims_is_an_error_not_an_abort(tmp_path):
    a = sparse_adapter(tmp_path / "a")
    b = sparse_adapter(tmp_path / "b")
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "compare", str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit,
        env={**os.environ, "RAYON_NUM_THREADS": "2"},
    )
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr[-500:]}"
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert "cannot allocate" in done.stdout + done.stderr, (done.stdout, done.stderr[-500:])
