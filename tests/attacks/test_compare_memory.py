"""Sparse adapters whose headers claim factors of 2^27 values (16 KiB on
disk), and a store of copies of one adapter: under an address-space limit,
``compare`` and ``similar`` answer (an error naming the claim, a skipped
adapter, a capped list of pairs) instead of dying of SIGABRT or holding a
million pairs."""

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


def sparse_adapter(root: Path, *, one_value: bool = False) -> Path:
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
        if one_value:  # one non-zero value of A and of B: a non-zero update
            f.seek(8 + len(text))
            f.write(struct.pack("<e", 1.0))
            f.seek(8 + len(text) + a_bytes)
            f.write(struct.pack("<e", 1.0))
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
    # Refused from the header's claim, before any allocation: the pair is
    # "not compared", with the reason, as compare reports any pair it
    # cannot judge.
    assert "not compared" in done.stdout, (done.stdout, done.stderr[-500:])
    assert "read at once" in done.stdout, (done.stdout, done.stderr[-500:])
    assert done.returncode == 0, done.returncode


def _run_limited(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit,
        env={**os.environ, "RAYON_NUM_THREADS": "2"},
    )


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux applies it")
def test_similar_skips_sparse_huge_claims_and_goes_on(tmp_path):
    # Non-zero updates, so the sketch lets the pair through to the exact
    # pass, which reads whole modules: there the claim is refused.
    sparse_adapter(tmp_path / "store" / "a", one_value=True)
    sparse_adapter(tmp_path / "store" / "b", one_value=True)
    done = _run_limited("similar", str(tmp_path / "store"), "--threshold", "0.5")
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    skipped = [line for line in done.stderr.splitlines() if "skipped" in line]
    assert skipped and all("read at once" in line for line in skipped), done.stderr


def tiny_adapter(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"]})
    )
    header = {
        "base_model.model.layers.0.q_proj.lora_A.weight": {
            "dtype": "F32",
            "shape": [1, 4],
            "data_offsets": [0, 16],
        },
        "base_model.model.layers.0.q_proj.lora_B.weight": {
            "dtype": "F32",
            "shape": [4, 1],
            "data_offsets": [16, 32],
        },
    }
    text = json.dumps(header).encode()
    values = struct.pack("<8f", 1, 2, 3, 4, 1, -1, 2, 0.5)
    (root / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + values)


def test_copies_of_one_adapter_list_a_capped_number_of_pairs(tmp_path):
    store = tmp_path / "store"
    n = 300  # 44,850 identical pairs
    for i in range(n):
        tiny_adapter(store / f"copy{i:04d}")
    done = _run_limited("similar", str(store), "--max-pairs", "50", "--format", "json")
    assert done.returncode == 0, done.stderr[-800:]
    pairs = json.loads(done.stdout)
    assert len(pairs) == 50
    assert f"{n * (n - 1) // 2} pairs are at or above" in done.stderr, done.stderr[-500:]

    import adapterprobe as ap

    found = ap.similar(store)
    assert found["pairs_found"] == n * (n - 1) // 2
    assert len(found["pairs"]) == found["max_pairs"] == 10_000
