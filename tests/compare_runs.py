"""Real runs for the compare, similar and baseline tests, trained once per
session into the pytest base temp dir (about 1.5 minutes of CPU).

All four runs train the same tiny Llama with PEFT LoRA under the real
``transformers.Trainer`` on the same data (``data_seed=0``):

- ``seed0``: the recipe (rank 4, lr 2e-3);
- ``seed1``: the same recipe with another seed (LoRA init, batch order);
- ``hilr``: seed 0 with a 10x higher learning rate;
- ``rank8``: seed 0 at rank 8 on the same modules;

plus ``copy``: seed0's final adapter with a tiny perturbation (1e-4 of each
tensor's RMS, seeded), written back with ``safetensors``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

RUNS = {
    "seed0": {"seed": 0},
    "seed1": {"seed": 1},
    "hilr": {"seed": 0, "lr": 2e-2},
    "rank8": {"seed": 0, "rank": 8},
}


def make_runs(base: Path) -> Path:
    """Train (once) and return the root holding the runs and the copy.
    ``ADAPTERPROBE_COMPARE_RUNS`` names a directory to keep them in between
    sessions (while developing)."""
    root = Path(os.environ.get("ADAPTERPROBE_COMPARE_RUNS") or base / "compare-runs")
    done = root / "done.json"
    if done.is_file():
        return root
    for module in ("torch", "safetensors", "transformers", "peft"):
        pytest.importorskip(module)
    from realruns.hf import train_hf_run

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name, kw in RUNS.items():
        train_hf_run(root / name, steps=40, save_steps=20, layers=2, data_seed=0, **kw)
    perturbed_copy(root / "seed0", root / "copy", 1e-4)
    done.write_text(json.dumps(sorted(RUNS)), encoding="utf-8")
    return root


def perturbed_copy(src: Path, dst: Path, relative: float, seed: int = 0) -> Path:
    """`src`'s adapter (weights and config) with every tensor moved by
    `relative` times its RMS in a random direction."""
    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "adapter_config.json", dst / "adapter_config.json")
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(src / "adapter_model.safetensors")
    moved = {}
    for key, t in tensors.items():
        rms = t.float().pow(2).mean().sqrt()
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
        moved[key] = (t.float() + relative * rms * noise).to(t.dtype)
    save_file(moved, dst / "adapter_model.safetensors")
    return dst


def dense_updates(adapter: Path) -> dict[str, object]:
    """Module name -> dense float64 ΔW = scale·B·A (numpy), read with the
    safetensors library and the config as PEFT would apply it."""
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    tensors = load_file(adapter / "adapter_model.safetensors")
    out: dict[str, object] = {}
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")].removeprefix("base_model.model.")
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        r = a.shape[0]
        scale = config["lora_alpha"] / (r**0.5 if config.get("use_rslora") else r)
        out[module] = scale * (b.astype(np.float64) @ a.astype(np.float64))
    return out


def dense_similarity(x: dict[str, object], y: dict[str, object]) -> float:
    """Cosine of the concatenated dense updates over shared same-shape modules."""
    import numpy as np

    inner = ex = ey = 0.0
    for name, wx in x.items():
        wy = y.get(name)
        if wy is None or wy.shape != wx.shape:  # type: ignore[attr-defined]
            continue
        inner += float(np.sum(wx * wy))  # type: ignore[operator]
        ex += float(np.sum(wx * wx))  # type: ignore[operator]
        ey += float(np.sum(wy * wy))  # type: ignore[operator]
    return inner / (ex * ey) ** 0.5
