"""An old PEFT ``MergedLinear`` adapter (the alpaca-lora era: ``enable_lora``
in its config, one LoRA over a fused projection such as BLOOM's
``query_key_value``) is judged for what can be judged and skipped with its
reason, never an error (issue 54, item 4). Its tensors follow the shapes
that PEFT 0.2 saved: ``lora_A`` stacks a rank-r block per enabled part,
``lora_B`` is a grouped 1-D convolution of kernel size 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import adapterprobe as ap

safetensors_numpy = pytest.importorskip("safetensors.numpy")

R, HIDDEN, LAYERS = 4, 32, 2
ENABLED = [True, False, True]


def merged_linear_adapter(folder: Path, poison: bool = False) -> Path:
    rng = np.random.default_rng(0)
    parts = sum(ENABLED)
    tensors = {}
    for layer in range(LAYERS):
        name = f"base_model.model.transformer.h.{layer}.self_attention.query_key_value"
        tensors[f"{name}.lora_A.weight"] = rng.normal(size=(parts * R, HIDDEN)).astype("float32")
        b = rng.normal(scale=0.01, size=(parts * HIDDEN, R, 1)).astype("float32")
        if poison and layer == 1:
            b[0, 0, 0] = np.nan
        tensors[f"{name}.lora_B.weight"] = b
    folder.mkdir(parents=True)
    safetensors_numpy.save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "base_model_name_or_path": "bigscience/bloom-560m",
        "enable_lora": ENABLED,
        "fan_in_fan_out": True,
        "lora_alpha": 16,
        "peft_type": "LORA",
        "r": R,
        "target_modules": ["query_key_value"],
        "task_type": "CAUSAL_LM",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_a_merged_linear_adapter_is_skipped_with_its_reason_not_an_error(tmp_path):
    adapter = merged_linear_adapter(tmp_path / "alpaca-lora")
    (record,) = list(ap.scan(adapter, probes=["adapter_weights"]))
    assert record.verdict.value == "skip", record.message
    assert "MergedLinear" in record.message and "enable_lora" in record.message
    assert record.evidence["merged_linear"] is True


def test_a_merged_linear_adapter_with_a_nan_still_fails(tmp_path):
    adapter = merged_linear_adapter(tmp_path / "poisoned", poison=True)
    (record,) = list(ap.scan(adapter, probes=["adapter_weights"]))
    assert record.verdict.value == "fail", record.message


def test_comparing_a_merged_linear_adapter_says_why_it_is_not_compared(tmp_path):
    a = merged_linear_adapter(tmp_path / "a")
    b = merged_linear_adapter(tmp_path / "b")
    (pair,) = ap.compare(a, b).to_dict()["pairs"]
    assert pair["similarity"] is None
    assert "MergedLinear" in pair["error"], pair
