"""The HF Trainer and Lightning callbacks on two real ranks (DDP, gloo, CPU): each step once.

The Trainer calls every callback on every rank; the monitor writes from rank 0 only, so
the log holds what a single process would write, with the global numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this build", allow_module_level=True)

from dist_workers import run_world  # noqa: E402

from adapterprobe import GAPMonitor  # noqa: E402

STEPS = 3


def hf_run(rank: int, world: int, workdir: Path) -> dict[str, Any]:
    from adapterprobe.integrations.transformers import GAPCallback
    from realruns.tiny import tiny_llama

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    ids = torch.randint(0, 64, (16, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    model = tiny_llama(0, max_positions=32)
    monitor = GAPMonitor(model, kinds=("grad", "activation"), sink=workdir / "hf.jsonl")
    args = transformers.TrainingArguments(
        output_dir=str(workdir / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        logging_steps=1,
        max_grad_norm=1e9,  # never clips: the logged norm is the gradient's own
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, callbacks=[GAPCallback(monitor)]
    )
    trainer.train()
    monitor.close()
    return {"world": trainer.args.world_size, "sinks": len(monitor.sinks)}


def test_hf_trainer_under_ddp_writes_each_step_once(tmp_path):
    results = run_world(hf_run, tmp_path)
    assert [r["world"] for r in results] == [2, 2]
    assert [r["sinks"] for r in results] == [1, 0]
    records = [json.loads(line) for line in (tmp_path / "hf.jsonl").read_text().splitlines()]
    gaps = [r for r in records if r["type"] == "gap"]
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in gaps] == [1, 2, 3]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for gap, step in zip(gaps, steps, strict=True):
        # the Trainer's norm is of the DDP-averaged gradient: the monitor's global one
        norm = gap["stats"]["gap/summary/grads/l2_norm"]
        assert step["grad_norm"] == pytest.approx(norm, rel=1e-4)


def lightning_run(rank: int, world: int, workdir: Path) -> dict[str, Any]:
    import warnings

    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from adapterprobe.integrations.lightning import GAPCallback

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Regression()
    monitor = GAPMonitor(module, sink=workdir / "lightning.jsonl")
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16, 8, generator=generator), torch.randn(16, 4))
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=world,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(workdir / "lightning"),
        callbacks=[GAPCallback(monitor)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(data, batch_size=2))
    monitor.close()
    return {"world": trainer.world_size, "sinks": len(monitor.sinks)}


def test_lightning_ddp_writes_each_step_once(tmp_path):
    pytest.importorskip("lightning")
    results = run_world(lightning_run, tmp_path)
    assert [r["world"] for r in results] == [2, 2]
    assert [r["sinks"] for r in results] == [1, 0]
    records = [json.loads(line) for line in (tmp_path / "lightning.jsonl").read_text().splitlines()]
    gaps = [r for r in records if r["type"] == "gap"]
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in gaps] == list(range(STEPS))
    assert [r["step"] for r in steps] == list(range(STEPS))
    for gap, step in zip(gaps, steps, strict=True):
        norm = gap["stats"]["gap/summary/grads/l2_norm"]
        assert step["grad_norm"] == pytest.approx(norm, rel=1e-6)


# -- the guard under DDP: rank 0 decides, every rank stops at the same step ---------


def hf_guard_run(rank: int, world: int, workdir: Path) -> dict[str, Any]:
    """The lr climbs from 0 to 10 over 80 steps; each rank's guard callback."""
    from adapterprobe.integrations.transformers import GuardCallback
    from realruns.tiny import tiny_llama

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    ids = torch.randint(0, 64, (64, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    callback = GuardCallback()
    args = transformers.TrainingArguments(
        output_dir=str(workdir / "out"),
        max_steps=80,
        per_device_train_batch_size=2,
        logging_steps=1,
        learning_rate=10.0,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=80,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=tiny_llama(0, max_positions=32), args=args, train_dataset=data, callbacks=[callback]
    )
    trainer.train()
    return {"stopped_at": callback.stopped_at, "global_step": trainer.state.global_step}


def test_hf_guard_under_ddp_stops_every_rank_at_the_same_step(tmp_path):
    results = run_world(hf_guard_run, tmp_path)
    stopped = results[0]["stopped_at"]
    assert stopped is not None and stopped < 80
    assert results == [{"stopped_at": stopped, "global_step": stopped}] * 2
    from test_guard import checkpoint_at_stop_as_it_should_be

    checkpoint_at_stop_as_it_should_be(tmp_path / "out", stopped)
    written = json.loads((tmp_path / "out" / "adapterprobe-guard.json").read_text())
    assert written["stopped_at"] == stopped and written["verdict"] == "fail"


def lightning_guard_run(rank: int, world: int, workdir: Path) -> dict[str, Any]:
    """Ranks that disagree: from step 5 on, rank 0's loss carries an
    infinite term with no gradient (so the weights, which DDP keeps equal,
    stay finite) and rank 1's does not. Rank 0's guard FAILs; rank 1's
    alone never would. Without the shared decision rank 0 stops alone and
    rank 1 waits in its next all-reduce until the harness kills it."""
    import warnings

    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from adapterprobe.integrations.lightning import GuardCallback

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if rank == 0 and self.trainer.global_step >= 5:
                loss = loss + torch.tensor(float("inf"))
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    callback = GuardCallback()
    trainer = L.Trainer(
        max_steps=200,
        accelerator="cpu",
        devices=world,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(workdir / "lightning"),
        callbacks=[callback],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Regression(), DataLoader(data, batch_size=8))
    return {"stopped_at": callback.stopped_at, "global_step": int(trainer.global_step)}


def test_lightning_guard_under_ddp_stops_every_rank_at_the_same_step(tmp_path):
    pytest.importorskip("lightning")
    results = run_world(lightning_guard_run, tmp_path)
    stopped = results[0]["stopped_at"]
    assert stopped is not None and 5 <= stopped < 20
    assert [r["stopped_at"] for r in results] == [stopped, stopped]
    assert results[0]["global_step"] == results[1]["global_step"]
    # rank 0's loss is infinite, which reads as NaN/inf weights: every rank
    # agrees (rank 0 decides) to save no checkpoint of them
    assert not (tmp_path / "lightning" / f"guard-stop-step{stopped}.ckpt").exists()
    written = json.loads((tmp_path / "lightning" / "adapterprobe-guard.json").read_text())
    assert written["stopped_at"] == stopped


def hf_recover_run(rank: int, world: int, workdir: Path) -> dict[str, Any]:
    """The lr climbs from 0 to 4.0 over 40 of 60 steps, a checkpoint every 5
    steps, the guard recovering: each rank's rollbacks, its weights' digest
    at the end and where it ended."""
    from adapterprobe.integrations.transformers import GuardCallback
    from realruns.tiny import tiny_llama

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    ids = torch.randint(0, 64, (256, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    callback = GuardCallback(on_fail="recover", max_recoveries=2)
    args = transformers.TrainingArguments(
        output_dir=str(workdir / "out"),
        max_steps=60,
        per_device_train_batch_size=2,
        logging_steps=1,
        learning_rate=4.0,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=40,
        report_to="none",
        save_strategy="steps",
        save_steps=5,
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=tiny_llama(0, max_positions=32), args=args, train_dataset=data, callbacks=[callback]
    )
    trainer.train()
    weights = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    return {
        "rollbacks": [(r["from_step"], r["to_step"], r["lr_scale"]) for r in callback.recoveries],
        "stopped_at": callback.stopped_at,
        "global_step": trainer.state.global_step,
        "weights": weights.double().sum().item(),
        "lr": trainer.optimizer.param_groups[0]["lr"],
    }


def test_hf_guard_under_ddp_rolls_every_rank_back_to_the_same_checkpoint(tmp_path):
    """Rank 0 decides; both ranks restore the same checkpoint at the same
    step, with the same learning rate, and end with the same weights."""
    results = run_world(hf_recover_run, tmp_path)
    assert results[0]["rollbacks"], results
    assert results[0] == results[1]
    for from_step, to_step, _ in results[0]["rollbacks"]:
        assert to_step < from_step and to_step % 5 == 0
