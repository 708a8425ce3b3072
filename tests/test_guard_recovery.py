"""``GuardCallback(on_fail="recover")`` in the real HF Trainer, on CPU: a run
blown up by poisoned data or a learning rate far too high is rolled back to
the newest checkpoint saved before the fault and goes on; a healthy run is
never rolled back; a run whose needed checkpoint is gone stops with a clear
message. What each test asserts holds whatever the machine's float path:
which step blows up is read from the run's own log, never written in."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

import adapterprobe as ap

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from adapterprobe.integrations.transformers import GuardCallback  # noqa: E402

CLASSES = 4
FEATURES = 16
BATCH = 8


class Blobs(Dataset):
    """Four overlapping Gaussian clusters (a loss floor well above 0, so two
    runs that both converge end near the same loss). ``poisoned``: the
    items fetched while the loader builds batches ``poisoned`` (in the order
    the loader draws them, whatever the sampler's order) have inputs scaled
    by 1e3: a stretch of huge-norm batches, as a corrupted shard gives."""

    def __init__(self, count: int, seed: int, poisoned: range = range(0)):
        centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(7))
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (count,), generator=generator)
        self.inputs = 0.6 * centers[self.labels] + torch.randn(count, FEATURES, generator=generator)
        self.poisoned = poisoned
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        batch = self.fetched // BATCH
        self.fetched += 1
        scale = 1e3 if batch in self.poisoned else 1.0
        return {"x": self.inputs[index] * scale, "labels": self.labels[index]}


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def classifier_run(out: Path, *, poisoned: range = range(0), **guard_options):
    """SGD without clipping on the blobs, 2 epochs of 64 steps, a checkpoint
    every 5 steps; returns the trainer, the guard callback and the final
    loss on a clean held-out set."""
    torch.manual_seed(0)
    callback = GuardCallback(output_classes=CLASSES, output_kind="labels", **guard_options)
    trainer = transformers.Trainer(
        model=Classifier(),
        args=transformers.TrainingArguments(
            output_dir=str(out),
            num_train_epochs=2,
            per_device_train_batch_size=BATCH,
            logging_steps=1,
            learning_rate=0.2,
            optim="sgd",
            max_grad_norm=0.0,
            lr_scheduler_type="constant",
            save_strategy="steps",
            save_steps=5,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=Blobs(512, seed=1, poisoned=poisoned),
        callbacks=[callback],
    )
    trainer.train()
    return trainer, callback, held_out_loss(trainer.model)


def held_out_loss(model: Classifier) -> float:
    """The classifier's loss on a clean held-out set of the same blobs."""
    held_out = Blobs(1024, seed=2)
    with torch.no_grad():
        return model.eval()(held_out.inputs, held_out.labels)["loss"].item()


POISON = range(30, 33)  # batches 30-32 of the first epoch


def clean_stopped_recovered(run, tmp_path: Path):
    """The poisoned-stretch scenario in one trainer (``run``: its
    classifier run): a clean run that learns and is never touched, the
    poisoned run stopped without recovery, and the poisoned run recovered
    with ``skip_window`` over the stretch and never stopped. Returns the
    clean run's held-out loss and the recovered run's (trainer, guard,
    held-out loss)."""
    _, clean_guard, clean = run(tmp_path / "clean")
    assert clean_guard.recoveries == [] and clean_guard.stopped_at is None
    assert clean < 0.9 * math.log(CLASSES)  # it learned

    _, stopped, _ = run(tmp_path / "stop", poisoned=POISON)
    assert stopped.stopped_at is not None, stopped.guard.findings

    trainer, guard, final = run(
        tmp_path / "recover", poisoned=POISON, on_fail="recover", skip_window=len(POISON)
    )
    assert guard.stopped_at is None, guard.guard.findings
    assert 1 <= len(guard.recoveries) <= guard.max_recoveries
    return clean, (trainer, guard, final)


def test_a_poisoned_stretch_is_rolled_back_skipped_and_the_run_ends_as_a_clean_one(tmp_path):
    """Three batches of huge-norm inputs blow the weights up. Recovering,
    the guard restores the checkpoint before them, passes over the rest of
    the stretch (``skip_window``) and the run ends within 10% of a clean
    run's held-out loss; without recovery the guard stops it."""
    clean, (trainer, guard, final) = clean_stopped_recovered(classifier_run, tmp_path)
    first = guard.recoveries[0]
    assert first["to_step"] < first["first_bad_step"] <= first["from_step"]
    assert first["checkpoint"] == f"checkpoint-{first['to_step']}"
    assert first["to_step"] % 5 == 0
    assert final == pytest.approx(clean, rel=0.10), (final, clean)
    # The guard judged the run as a continuation: its verdict is the kept
    # timeline's, and the guard file lists the rollback.
    assert guard.guard.verdict in {"pass", "warn"}, guard.guard.findings
    written = json.loads((tmp_path / "recover" / "adapterprobe-guard.json").read_text())
    assert written["stopped_at"] is None
    assert [r["to_step"] for r in written["recoveries"]] == [r["to_step"] for r in guard.recoveries]
    # Steps count on from the checkpoint, and the run ends that many steps
    # sooner, as its data ends.
    discarded = sum(r["from_step"] - r["to_step"] for r in guard.recoveries)
    assert trainer.state.global_step == trainer.state.max_steps == 128 - discarded


def test_the_log_keeps_both_timelines_and_the_scan_reads_the_kept_one(tmp_path):
    """trainer_state.json holds the discarded records under the rollback
    entry; the loss curve a scan reads is the kept timeline's, so the blow-up
    that was undone is no divergence there."""
    trainer, guard, _ = classifier_run(
        tmp_path / "run", poisoned=POISON, on_fail="recover", skip_window=len(POISON)
    )
    assert guard.recoveries
    trainer.save_state()
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    rollbacks = [r["adapterprobe_rollback"] for r in history if "adapterprobe_rollback" in r]
    assert len(rollbacks) == len(guard.recoveries)
    discarded = rollbacks[0]["discarded"]
    assert discarded and all(r["step"] > rollbacks[0]["to_step"] for r in discarded)
    blown = max(r["loss"] for r in discarded if "loss" in r)
    kept = [r["loss"] for r in history if "loss" in r]
    assert max(kept) < blown
    # skipped steps keep their loss apart from the curve
    assert any("adapterprobe_skipped_loss" in r for r in history)
    (drift,) = [r for r in ap.scan(tmp_path / "run").records if r.probe == "training_drift"]
    assert drift.verdict != "fail", drift.message
    rules = {f["rule"] for f in drift.evidence.get("findings", [])}
    assert "diverged" not in rules and "worse_than_uniform" not in rules, drift.message


def test_a_learning_rate_far_too_high_is_lowered_until_the_run_holds_or_stops(tmp_path, caplog):
    """The learning rate climbs to 2.0 over 40 steps (a tiny Llama blows up
    on the way, at about 1.0). Each rollback restores a checkpoint from before the fault
    and halves the learning rate; the run either finishes with a verdict
    that is not FAIL or stops after ``max_recoveries``."""
    from test_guard import hf_run

    with caplog.at_level(logging.WARNING, logger="adapterprobe.guard"):
        trainer, callback = hf_run(
            tmp_path / "climb",
            lr=2.0,
            max_steps=60,
            warmup_steps=40,
            guard=GuardCallback(on_fail="recover", max_recoveries=2),
            save_steps=5,
        )
    recoveries = callback.recoveries
    assert recoveries, callback.guard.findings
    for n, rollback in enumerate(recoveries, start=1):
        assert rollback["lr_scale"] == pytest.approx(0.5**n)
        assert rollback["to_step"] < rollback["first_bad_step"]
    # After the last rollback, each logged learning rate is the schedule's
    # (0 to 2.0 over 40 steps) times the last scale.
    last = recoveries[-1]
    after = [
        r for r in trainer.state.log_history if "learning_rate" in r and r["step"] > last["to_step"]
    ]
    assert after
    for record in after:
        planned = 2.0 * min((record["step"] - 1) / 40, 1.0)
        assert record["learning_rate"] == pytest.approx(planned * last["lr_scale"], rel=1e-6)
    if callback.stopped_at is None:
        assert callback.guard.verdict != "fail"
    else:
        assert len(recoveries) == 2
        assert any("max_recoveries=2" in r.getMessage() for r in caplog.records)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("adapterprobe guard: recovered (1 of at most 2)") for m in said)
    assert any(m.startswith("adapterprobe guard: verdict at the end of training:") for m in said)


def test_a_healthy_run_is_never_rolled_back(tmp_path):
    from test_guard import hf_run

    trainer, callback = hf_run(
        tmp_path / "healthy", lr=3e-3, guard=GuardCallback(on_fail="recover"), save_steps=5
    )
    assert callback.recoveries == [] and callback.stopped_at is None
    assert trainer.state.global_step == 40
    assert not any("adapterprobe_rollback" in r for r in trainer.state.log_history)


def test_a_checkpoint_deleted_by_save_total_limit_stops_the_run_with_a_clear_message(
    tmp_path, caplog
):
    """A weight goes NaN after step 10's update and a checkpoint is saved
    at every step, one kept: the only checkpoint left before the first bad
    record holds the NaN already. Restoring it fails at once, so the guard
    looks before it, finds nothing left and stops, naming save_total_limit."""
    from test_guard import NAN_AFTER
    from test_integrations import TokenData
    from test_monitor import tiny_llama

    class BreakAWeight(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == NAN_AFTER:
                with torch.no_grad():
                    next(model.model.layers[1].parameters()).view(-1)[0] = float("nan")

    torch.manual_seed(0)
    callback = GuardCallback(on_fail="recover")
    trainer = transformers.Trainer(
        model=tiny_llama(),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path / "run"),
            max_steps=30,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=1e-3,
            save_strategy="steps",
            save_steps=1,
            save_total_limit=1,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(64, 8, 64),
        callbacks=[BreakAWeight(), callback],
    )
    with caplog.at_level(logging.WARNING, logger="adapterprobe.guard"):
        trainer.train()
    assert callback.stopped_at is not None
    assert len(callback.recoveries) <= 1
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "not recovering: no checkpoint saved before step" in said
    assert "save_total_limit=1" in said


def test_recover_needs_checkpoints_with_optimizer_state(tmp_path, caplog):
    """``save_only_model`` checkpoints cannot resume a run: the guard says so
    and stops."""
    from test_guard import hf_run

    with caplog.at_level(logging.WARNING, logger="adapterprobe.guard"):
        _, callback = hf_run(
            tmp_path / "only-model",
            lr=10.0,
            max_steps=40,
            warmup_steps=20,
            guard=GuardCallback(on_fail="recover"),
            save_steps=2,
            save_only_model=True,
        )
    assert callback.stopped_at is not None and callback.recoveries == []
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "holds no optimizer and scheduler state" in said


@pytest.mark.parametrize(
    "options",
    [
        {"on_fail": "retry"},
        {"max_recoveries": -1},
        {"max_recoveries": 1.5},
        {"lr_factor": 0},
        {"lr_factor": 2.0},
        {"skip_window": -3},
    ],
)
def test_bad_recovery_options_are_refused_when_the_callback_is_made(options):
    with pytest.raises(ap.UsageError):
        GuardCallback(**options)


# -- Lightning ----------------------------------------------------------------------


def lightning_classifier_run(out: Path, *, poisoned: range = range(0), **guard_options):
    """The blobs classifier in the real Lightning Trainer: SGD, 2 epochs of
    64 steps, ModelCheckpoint every 5 steps, CSVLogger; returns the
    callback and the final held-out loss."""
    import warnings

    L = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader

    from adapterprobe.integrations.lightning import GuardCallback as LightningGuard

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = Classifier()

        def training_step(self, batch, batch_idx):
            loss = self.model(batch["x"], batch["labels"])["loss"]
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.2)

    callback = LightningGuard(output_classes=CLASSES, output_kind="labels", **guard_options)
    saves = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=str(out / "ckpts"), every_n_train_steps=5, save_top_k=-1
    )
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=L.pytorch.loggers.CSVLogger(str(out), name="logs"),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
        callbacks=[saves, callback],
    )
    module = Module()
    loader = DataLoader(Blobs(512, seed=1, poisoned=poisoned), batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    return trainer, callback, held_out_loss(module.model)


def test_lightning_rolls_a_poisoned_stretch_back_and_ends_as_a_clean_run(tmp_path):
    clean, (trainer, guard, final) = clean_stopped_recovered(lightning_classifier_run, tmp_path)
    first = guard.recoveries[0]
    assert first["checkpoint_step"] % 5 == 0
    assert first["checkpoint_step"] <= first["first_bad_step"]
    assert first["to_step"] == first["checkpoint_step"] - 1
    assert final == pytest.approx(clean, rel=0.10), (final, clean)
    assert guard.guard.verdict in {"pass", "warn"}, guard.guard.findings
    # the optimizer steps count on from the checkpoint's
    discarded = sum(r["from_step"] - r["to_step"] for r in guard.recoveries)
    assert trainer.global_step == 128 - discarded
    written = json.loads((tmp_path / "recover" / "adapterprobe-guard.json").read_text())
    assert len(written["recoveries"]) == len(guard.recoveries)


# -- the live LoRA factor check ------------------------------------------------------


def lora_run(out: Path, lr: float, **guard_options):
    """A PEFT LoRA (r=8 on q/v) on a tiny Llama in the real Trainer, Adam at
    ``lr``; the guard callback's findings."""
    peft = pytest.importorskip("peft")
    from test_integrations import TokenData
    from test_monitor import tiny_llama

    torch.manual_seed(0)
    model = peft.get_peft_model(
        tiny_llama(), peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    callback = GuardCallback(**guard_options)
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=40,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=lr,
            lr_scheduler_type="constant",
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(160, 8, 64),
        callbacks=[callback],
    )
    trainer.train()
    return trainer, callback


def test_a_lora_at_a_learning_rate_far_too_high_is_stopped_by_its_factors(tmp_path):
    """At lr=10 a LoRA's loss sits near ln K, which no loss rule stops; its
    A factors are pushed by the whole step each step. The callback judges
    them on the live model at each log, as adapter_weights would judge the
    adapter saved then, and stops the run; the saved adapter agrees."""
    from adapterprobe.guard import lora_factor_norms

    trainer, callback = lora_run(tmp_path / "blown", lr=10.0)
    assert callback.stopped_at is not None and callback.stopped_at < 40
    (finding,) = [f for f in callback.guard.findings if f["rule"] == "factors_blown_up"]
    assert finding["verdict"] == "fail", finding
    init, modules = lora_factor_norms(trainer.model)
    assert init == "true" and len(modules) == 2 * 2  # q and v of two layers
    trainer.model.save_pretrained(str(tmp_path / "adapter"))
    saved = ap.adapter_weights(tmp_path / "adapter")
    assert saved.verdict.value == "fail" and "factors_blown_up" in saved.message


def test_a_healthy_lora_is_not_flagged_by_its_factors(tmp_path):
    _, callback = lora_run(tmp_path / "healthy", lr=2e-3)
    assert callback.stopped_at is None
    assert not [f for f in callback.guard.findings if f["rule"] == "factors_blown_up"]


# -- skipping one step from its loss (skip_batch_above) ---------------------------


def test_a_step_whose_loss_is_far_above_the_recent_ones_is_skipped_before_it_is_applied(
    tmp_path, caplog
):
    """The poisoned stretch again: with skip_batch_above=6 its three steps
    are skipped before the optimizer applies them, so the run never blows
    up, is neither stopped nor rolled back, and ends within 10% of a clean
    run; the skipped steps' losses are kept apart from the curve."""
    _, _, clean = classifier_run(tmp_path / "clean")
    with caplog.at_level(logging.WARNING, logger="adapterprobe.guard"):
        trainer, guard, final = classifier_run(
            tmp_path / "gated", poisoned=POISON, skip_batch_above=6.0
        )
    assert guard.stopped_at is None and guard.recoveries == [], guard.guard.findings
    skipped = [r["step"] for r in trainer.state.log_history if "adapterprobe_skipped_loss" in r]
    # Batch b is optimizer step b + 1. A poisoned batch whose saturated
    # logits all pick the right class has a loss (and gradient) of 0: it
    # is harmless, and applied.
    poisoned = {p + 1 for p in POISON}
    assert skipped and set(skipped) <= poisoned, skipped
    for record in trainer.state.log_history:
        if record.get("step") in poisoned - set(skipped):
            assert record["loss"] < 1.0, record
    said = [r.getMessage() for r in caplog.records if "skipped step" in r.getMessage()]
    assert len(said) == len(skipped), said
    assert final == pytest.approx(clean, rel=0.10), (final, clean)
    assert trainer.state.global_step == 128


def test_skip_batch_above_is_refused_where_the_trainer_does_not_allow_it():
    pytest.importorskip("lightning")
    from adapterprobe.integrations.lightning import GuardCallback as LightningGuard

    with pytest.raises(ap.UsageError, match="training_step"):
        LightningGuard(skip_batch_above=6.0)
    with pytest.raises(ap.UsageError):
        GuardCallback(skip_batch_above=0)
