"""The HF Trainer and Lightning callbacks, each driving a real (tiny) training run."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

from test_monitor import hook_count, read_jsonl, tiny_llama  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from adapterprobe import GAPMonitor, MonitorConfigError  # noqa: E402
from adapterprobe.sinks import read_tensor_stats  # noqa: E402


def grad_norm(parameters):
    squares = [p.grad.double().pow(2).sum().item() for p in parameters if p.grad is not None]
    return math.sqrt(sum(squares))


# -- Hugging Face Trainer --------------------------------------------------------------


class TokenData(Dataset):
    def __init__(self, count, length, vocab):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def test_hf_trainer_callback_records_sampled_steps_and_step_lines(tmp_path):
    transformers = pytest.importorskip("transformers")
    from adapterprobe.integrations.transformers import GAPCallback

    model = tiny_llama()
    log = tmp_path / "gap.jsonl"
    monitor = GAPMonitor(
        model, interval=2, kinds=("grad", "activation"), detail="tensors", sink=log
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        logging_steps=1,
        max_grad_norm=1e9,  # the Trainer logs the norm it clips by, and this never clips
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=TokenData(16, 8, 64),
        callbacks=[GAPCallback(monitor)],
    )
    trainer.train()
    monitor.close()

    assert hook_count(model) == 0
    records = read_jsonl(log)
    gaps = {r["step"]: r["stats"] for r in records if r["type"] == "gap"}
    steps = {r["step"]: r for r in records if r["type"] == "step"}
    assert sorted(gaps) == [2, 4]
    assert sorted(steps) == [1, 2, 3, 4]
    side_files = [r["tensors_file"] for r in records if r["type"] == "gap"]
    assert side_files == [
        "gap.tensors/step00000002.safetensors",
        "gap.tensors/step00000004.safetensors",
    ]
    history = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    for step, line in steps.items():
        assert line["loss"] == pytest.approx(history[step]["loss"])
        assert line["lr"] == pytest.approx(history[step]["learning_rate"])
    for step, stats in gaps.items():
        assert stats["gap/summary/grads/l2_norm"] == pytest.approx(
            history[step]["grad_norm"], rel=1e-5
        )
        assert "gap/summary/activations/layers/model.layers.1/rms" in stats
        assert "gap/activations/model.layers.1.mlp/var" in read_tensor_stats(
            tmp_path / f"gap.tensors/step{step:08d}.safetensors"
        )


def test_callbacks_need_a_monitor():
    pytest.importorskip("transformers")
    from adapterprobe.integrations.transformers import GAPCallback

    with pytest.raises(MonitorConfigError, match="needs a GAPMonitor"):
        GAPCallback(nn.Linear(2, 2))


# -- Lightning ---------------------------------------------------------------------------


def lightning_module(fail_at_step=None):
    L = pytest.importorskip("lightning")

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
            self.reference_norms = {}
            self.losses = {}

        def training_step(self, batch, batch_idx):
            if self.global_step == fail_at_step:
                raise RuntimeError("boom")
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.losses.setdefault(self.global_step, []).append(loss.item())
            return loss

        def on_before_optimizer_step(self, optimizer):
            self.reference_norms[self.global_step] = grad_norm(self.parameters())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return L, Regression()


def lightning_fit(L, module, monitor, tmp_path):
    from adapterprobe.integrations.lightning import GAPCallback

    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16, 8, generator=generator), torch.randn(16, 4))
    trainer = L.Trainer(
        max_steps=4,
        accumulate_grad_batches=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[GAPCallback(monitor)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dataloader worker advice
        trainer.fit(module, DataLoader(data, batch_size=2))


def test_lightning_callback_records_accumulated_gradients_and_step_lines(tmp_path):
    L, module = lightning_module()
    log = tmp_path / "gap.jsonl"
    monitor = GAPMonitor(module, interval=2, sink=log)
    lightning_fit(L, module, monitor, tmp_path)
    monitor.close()

    assert hook_count(module) == 0
    records = read_jsonl(log)
    gaps = {r["step"]: r["stats"] for r in records if r["type"] == "gap"}
    steps = {r["step"]: r for r in records if r["type"] == "step"}
    assert sorted(gaps) == [0, 2]
    assert sorted(steps) == [0, 1, 2, 3]
    for step, stats in gaps.items():
        reference = module.reference_norms[step]
        assert stats["gap/summary/grads/l2_norm"] == pytest.approx(reference, rel=1e-5)
        assert steps[step]["grad_norm"] == pytest.approx(reference, rel=1e-5)
        assert "gap/summary/activation_grads/layers/net.2/rms" in stats
    for step, line in steps.items():
        micro = module.losses[step]
        assert len(micro) == 2
        assert line["loss"] == pytest.approx(sum(micro) / 2, rel=1e-6)
        assert line["lr"] == pytest.approx(0.1)
    assert steps[1]["grad_norm"] is None


def test_lightning_callback_removes_hooks_when_training_fails(tmp_path):
    L, module = lightning_module(fail_at_step=2)
    monitor = GAPMonitor(module, interval=1)
    with pytest.raises(RuntimeError, match="boom"):
        lightning_fit(L, module, monitor, tmp_path)
    assert hook_count(module) == 0
    assert monitor.latest_step == 1
    with monitor.step(5):  # the monitor is usable again
        pass
    assert monitor.latest_step == 5
