"""mlx-lm LoRA runs on a tiny llama, trained by the real mlx-lm on CPU.

mlx ships Linux wheels for glibc 2.35 and newer only, so it is not in the
dev lock (manylinux 2.28) and CI cannot run it. The runs it wrote are
committed instead (``tests/fixtures/mlx-lm/``), so CI judges files the real
library wrote; where mlx installs, the tests also train afresh.

    python tools/realruns/mlx_runs.py tests/fixtures/mlx-lm

writes ``healthy`` (lr 1e-2) and ``hot`` (lr 30: the loss falls once and
sticks at a uniform guess over its 64 tokens), each with mlx-lm's
``adapter_config.json``, ``adapters.safetensors`` and what ``train`` printed
as ``train.log``.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

#: (name, iterations, learning rate) of the committed runs.
RUNS = (("healthy", 24, 1e-2), ("hot", 24, 30.0))


def mlx_train(folder: Path, iters: int, lr: float) -> None:
    """Train LoRA layers of a tiny llama built from its config with the real
    mlx-lm trainer on CPU; what it prints is kept as train.log."""
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm import lora as mlx_lora
    from mlx_lm.models import llama
    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import save_config

    mx.random.seed(0)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        rms_norm_eps=1e-5,
        vocab_size=64,
        num_key_value_heads=4,
    )
    model = llama.Model(args)
    model.freeze()
    config = dict(mlx_lora.CONFIG_DEFAULTS)
    config.update(
        adapter_path=str(folder),
        iters=iters,
        batch_size=4,
        num_layers=2,
        model="tiny",
        learning_rate=lr,
    )
    linear_to_lora_layers(model, 2, config["lora_parameters"])
    folder.mkdir(parents=True)
    save_config(config, folder / "adapter_config.json")
    data = [(list(range(1, 21)), 0) for _ in range(16)]
    targs = TrainingArgs(
        batch_size=4,
        iters=iters,
        val_batches=2,
        steps_per_report=2,
        steps_per_eval=4,
        steps_per_save=1000,
        adapter_file=folder / "adapters.safetensors",
        max_seq_length=64,
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        train(model, optim.Adam(learning_rate=lr), data, data[:8], args=targs)
    (folder / "train.log").write_text(out.getvalue())


def main(root: str) -> None:
    for name, iters, lr in RUNS:
        mlx_train(Path(root) / name, iters, lr)


if __name__ == "__main__":
    main(sys.argv[1])
