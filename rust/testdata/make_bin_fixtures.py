"""Write the `torch.save` files that rust/formats/torch_state_dict.rs is tested on.

Run from the repository root with an environment that has torch and
safetensors (nothing is installed by this script):

    python rust/testdata/make_bin_fixtures.py

- weights_bin/<fixture>/: each adapter of rust/testdata/weights/ as PEFT's
  `save_pretrained(safe_serialization=False)` writes it: the same state dict
  (loaded from its adapter_model.safetensors) passed to `torch.save` as
  adapter_model.bin, beside a copy of its adapter_config.json. The Rust
  tests hold the reports of both formats equal.
- state_dicts/: small torch.save files of the shapes a state dict can take
  that PEFT never writes (shared storages, a transposed view, values that
  are not tensors, a non-float tensor, a list at the top, the legacy
  pre-1.6 format), to test what is read and what is refused.

torch.save writes the same bytes for the same tensors, so reruns reproduce
the files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent


def adapter_twins() -> None:
    out = HERE / "weights_bin"
    shutil.rmtree(out, ignore_errors=True)
    for src in sorted((HERE / "weights").iterdir()):
        weights = src / "adapter_model.safetensors"
        if not weights.is_file():
            continue
        target = out / src.name
        target.mkdir(parents=True)
        shutil.copyfile(src / "adapter_config.json", target / "adapter_config.json")
        # What PEFT's save_pretrained does with safe_serialization=False.
        torch.save(load_file(weights), target / "adapter_model.bin")


def state_dicts() -> None:
    out = HERE / "state_dicts"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)
    # Two names, one storage: the second a view from row 1 on.
    torch.save({"a": x, "b": x[1:]}, out / "shared.bin")
    torch.save({"w": x.t()}, out / "transposed.bin")
    torch.save({"w": x, "step": 3}, out / "not_a_tensor.bin")
    torch.save({"w": x, "ids": torch.arange(4)}, out / "int_tensor.bin")
    torch.save([x], out / "list.bin")
    torch.save({"w": x}, out / "legacy.bin", _use_new_zipfile_serialization=False)
    torch.save(
        {"h": x.half(), "b": x.bfloat16(), "d": x.double(), "s": torch.tensor(2.5)},
        out / "dtypes.bin",
    )


if __name__ == "__main__":
    adapter_twins()
    state_dicts()
