"""ap.Guard: the drift rules online, held to the offline verdict.

- replayed record by record on the committed real runs (the dlm corpus and
  the HF Trainer field corpus), the guard's final ``result()`` is exactly
  ``training_drift``'s verdict, no healthy run is ever at FAIL mid-run, and
  every run the offline rules flag is flagged before its last record;
- what can be undone stays WARN while training; NaN weights stop at once;
- the contract names (``observe``, ``verdict``, ``findings``, ``result``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import adapterprobe as ap
from adapterprobe.errors import UsageError


def labelled(root: Path) -> dict[str, str]:
    labels = json.loads((root / "labels.json").read_text(encoding="utf-8"))
    return {name: info["label"] for name, info in labels.items()}


# Rules about how long the run was: mid-run every run is short, so the guard
# applies them only in result(), after the last record.
END_OF_RUN_RULES = {"tiny_run", "stopped_early"}


def replay_all(root: Path) -> list[tuple[str, str, ap.Guard, list[tuple[int, str]]]]:
    out = []
    for name, label in labelled(root).items():
        store = root / name
        if not store.is_dir():
            continue
        try:
            guard, changes = ap.Guard.replay(store)
        except UsageError:
            continue  # no loss curve to replay
        out.append((name, label, guard, changes))
    return out


@pytest.mark.parametrize("which", ["corpus", "field_root"])
def test_replayed_runs_keep_the_contract_and_never_stop_a_healthy_run(which, request):
    fixture = request.getfixturevalue(which)
    root = fixture[0] if isinstance(fixture, tuple) else fixture
    runs = replay_all(root)
    assert len(runs) >= 10
    for name, label, guard, changes in runs:
        offline = ap.training_drift(root / name)
        assert guard.result().verdict == offline.verdict, (name, offline.message)
        if label == "healthy":
            assert "fail" not in {v for _, v in changes}, (name, guard.findings)
        judged_at_the_end = {f["rule"] for f in offline.evidence.get("findings", [])}
        if judged_at_the_end <= END_OF_RUN_RULES:
            continue  # a run's length is known once it has ended
        if offline.verdict.value in {"warn", "fail"}:
            last = max(ap.read_loss_curve(root / name).steps.tolist())
            first = next((s for s, v in changes if v in {"warn", "fail"}), None)
            assert first is not None and first <= last, (name, changes)


def test_a_climb_is_held_at_warn_and_nan_weights_stop_at_once():
    guard = ap.Guard()
    for step in range(1, 61):
        verdict = guard.observe(step, loss=1.0 + 0.05 * step, grad_norm=1.0)
    assert verdict == guard.verdict == "warn"
    assert guard.result().verdict.value == "fail"  # offline: diverged
    (diverged,) = [f for f in guard.findings if f["rule"] == "diverged"]
    assert set(diverged) == {"rule", "step", "verdict", "message"}
    assert diverged["verdict"] == "warn" and diverged["step"] < 60
    for step in range(61, 64):
        verdict = guard.observe(step, loss=math.nan, grad_norm=math.nan)
    assert verdict == "fail", guard.findings


def test_a_loss_worse_than_a_uniform_guess_stops_the_run():
    guard = ap.Guard(output_classes=50257)
    verdicts = [guard.observe(s, loss=3000.0 * 0.97**s + 400.0) for s in range(1, 40)]
    assert verdicts[-1] == "fail", guard.findings
    assert any(f["rule"] == "worse_than_uniform" for f in guard.findings)
    # Without K the same curve is a falling loss.
    plain = ap.Guard()
    assert [plain.observe(s, loss=3000.0 * 0.97**s + 400.0) for s in range(1, 40)][-1] == "pass"


def test_sway_is_refused_and_options_are_the_probes():
    with pytest.raises(UsageError, match="robust"):
        ap.Guard(rules="sway")
    with pytest.raises(UsageError):
        ap.Guard(output_kind="tokens")
    strict = ap.DriftOptions(rules="robust", max_eval_rise=0.01)
    guard = ap.Guard(options=strict)
    assert guard.options.max_eval_rise == 0.01
    assert repr(guard) == "Guard(pass, 0 records)"


# -- the HF Trainer callback, in the real Trainer -----------------------------------


def hf_run(
    out: Path,
    lr: float,
    max_steps: int = 40,
    warmup_steps: int = 0,
    guard=None,
    save_steps: int | None = None,
    save_only_model: bool = False,
):
    """A tiny Llama trained by the real Trainer; with ``warmup_steps`` the
    learning rate climbs linearly from 0 to ``lr`` over that many steps.
    ``guard``: the GuardCallback (a default one when None); ``save_steps``:
    a checkpoint every that many steps (none when None)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_integrations import TokenData
    from test_monitor import tiny_llama

    from adapterprobe.integrations.transformers import GuardCallback

    torch.manual_seed(0)
    callback = GuardCallback() if guard is None else guard
    trainer = transformers.Trainer(
        model=tiny_llama(),
        args=transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=max_steps,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=lr,
            lr_scheduler_type="constant_with_warmup" if warmup_steps else "constant",
            warmup_steps=warmup_steps,
            save_strategy="no" if save_steps is None else "steps",
            save_steps=save_steps or 500,
            save_only_model=save_only_model,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(64, 8, 64),
        callbacks=[callback],
    )
    trainer.train()
    return trainer, callback


def checkpoint_at_stop_as_it_should_be(out: Path, stopped: int) -> None:
    """A checkpoint at the stop exactly when the weights are not NaN/inf:
    which rule stopped a blown-up run (far above ln K, or NaN) can depend on
    the CPU's float path, so the verdict file says which to expect."""
    from adapterprobe.guard import NAN_WEIGHT_RULES

    findings = json.loads((out / "adapterprobe-guard.json").read_text())["findings"]
    nan = any(f["verdict"] == "fail" and f["rule"] in NAN_WEIGHT_RULES for f in findings)
    assert (out / f"checkpoint-{stopped}").is_dir() is not nan, findings


def test_the_trainer_callback_stops_a_blown_up_run_with_a_checkpoint(tmp_path):
    """lr=10 on a full fine-tune: the loss is far above ln(vocab) within a
    few steps. The guard stops the run the Trainer's way, a checkpoint is
    saved at that step, and the verdict is written beside it."""
    trainer, callback = hf_run(tmp_path / "blown", lr=10.0)
    stopped = callback.stopped_at
    assert stopped is not None and stopped < 40, callback.guard.findings
    assert trainer.state.global_step == stopped
    checkpoint_at_stop_as_it_should_be(tmp_path / "blown", stopped)
    written = json.loads((tmp_path / "blown" / "adapterprobe-guard.json").read_text())
    assert written["verdict"] == "fail" and written["stopped_at"] == stopped
    assert "worse_than_uniform" in {f["rule"] for f in written["findings"]}


def test_the_trainer_callback_stops_a_run_whose_lr_climbs_until_it_blows_up(tmp_path):
    """The learning rate climbs from 0 to 10 over the whole run: the loss
    first falls, then blows up somewhere on the way. The guard stops the run
    after the blow-up and long before max_steps, with a checkpoint."""
    trainer, callback = hf_run(tmp_path / "climb", lr=10.0, max_steps=80, warmup_steps=80)
    stopped = callback.stopped_at
    assert stopped is not None and stopped < 80, callback.guard.findings
    assert trainer.state.global_step == stopped
    checkpoint_at_stop_as_it_should_be(tmp_path / "climb", stopped)
    history = trainer.state.log_history
    losses = [r["loss"] for r in history if "loss" in r]
    assert min(losses[:stopped]) < losses[0]  # it learned before the lr got too high
    lr_at_stop = [r["learning_rate"] for r in history if "learning_rate" in r][-1]
    assert lr_at_stop < 10.0
    # the store carries the guard's verdict: a scan of the run reports it
    (drift,) = [r for r in ap.scan(tmp_path / "climb").records if r.probe == "training_drift"]
    assert drift.evidence["guard_stopped_at"] == stopped
    assert drift.evidence["guard_verdict"] == "fail"
    assert f"guard stopped the run at step {stopped}" in drift.message


@pytest.mark.parametrize(
    "text",
    ['{"verdict": "maybe"}', "[1, 2]", '{"verdict": "fail", "stopped_at": "x"}', "\x00" * 10, ""],
)
def test_a_guard_file_that_is_not_the_guards_is_passed_over(tmp_path, field_root, text):
    import shutil

    run = next(p for p in sorted(field_root.iterdir()) if p.is_dir())
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    (copy / "adapterprobe-guard.json").write_text(text)
    (drift,) = [r for r in ap.scan(copy).records if r.probe == "training_drift"]
    assert "guard_verdict" not in drift.evidence


def test_the_trainer_callback_lets_a_healthy_run_finish(tmp_path):
    trainer, callback = hf_run(tmp_path / "healthy", lr=3e-3)
    assert callback.stopped_at is None, callback.guard.findings
    assert trainer.state.global_step == 40
    written = json.loads((tmp_path / "healthy" / "adapterprobe-guard.json").read_text())
    assert written["stopped_at"] is None and written["verdict"] in {"pass", "warn"}


# -- the Lightning callback, in the real Trainer ------------------------------------


def lightning_run(tmp_path: Path, lr: float, *, checkpointing: bool = False):
    L = pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = DataLoader(data, batch_size=8)
    return fit_guarded(L, tmp_path, Regression(), loader, 200, checkpointing=checkpointing)


def fit_guarded(
    L, tmp_path: Path, module, loader, max_steps: int, *, checkpointing=False, **callback_args
):
    """``module`` trained on CPU by the real Lightning Trainer for ``max_steps``
    with a GuardCallback (``callback_args``) and nothing else (with
    ``checkpointing``, Lightning's default ``ModelCheckpoint`` too); the
    trainer and the callback."""
    import warnings

    from adapterprobe.integrations.lightning import GuardCallback

    callback = GuardCallback(**callback_args)
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=checkpointing,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dataloader worker advice
        trainer.fit(module, loader)
    return trainer, callback


def test_the_lightning_callback_stops_a_run_whose_loss_went_nan(tmp_path):
    """SGD at lr=50: the loss overflows to inf/NaN within a few steps; three
    non-finite records in a row and the guard stops the run, and saves no
    checkpoint of the NaN weights."""
    trainer, callback = lightning_run(tmp_path, lr=50.0)
    assert callback.stopped_at is not None and callback.stopped_at < 200, callback.guard.findings
    assert trainer.global_step < 200
    # the weights are NaN/inf: no checkpoint of them
    assert not (tmp_path / f"guard-stop-step{callback.stopped_at}.ckpt").exists()
    written = json.loads((tmp_path / "adapterprobe-guard.json").read_text())
    assert written["verdict"] == "fail" and written["stopped_at"] == callback.stopped_at


def test_no_model_checkpoint_saves_the_nan_weights_at_the_stop(tmp_path):
    """Lightning's default ``ModelCheckpoint`` saves at each epoch's end, the
    stopped epoch's too. The run goes NaN within its first epoch, so the guard
    holds that save and no checkpoint is written (one was, of the NaN
    weights: ``epoch=0-step=10.ckpt``)."""
    trainer, callback = lightning_run(tmp_path, lr=50.0, checkpointing=True)
    assert callback.stopped_at is not None and trainer.checkpoint_callbacks
    assert trainer.global_step < len(trainer.train_dataloader), "stopped in the first epoch"
    saved = sorted(p.name for p in tmp_path.rglob("*.ckpt"))
    assert not saved, saved


def test_the_lightning_callback_lets_a_healthy_run_finish(tmp_path):
    trainer, callback = lightning_run(tmp_path, lr=0.01)
    assert callback.stopped_at is None, callback.guard.findings
    assert trainer.global_step == 200


def lightning_csv_run(tmp_path: Path, lr: float):
    """The Regression run of ``lightning_run`` for 40 steps, logging its loss
    at every step and ``val_loss`` every 10 through Lightning's CSVLogger,
    with the guard; the callback and the run's folder (``metrics.csv``)."""
    import warnings

    L = pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from adapterprobe.integrations.lightning import GuardCallback

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    callback = GuardCallback()
    trainer = L.Trainer(
        max_steps=40,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
        val_check_interval=10,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dataloader worker advice
        trainer.fit(Regression(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=64))
    return callback, tmp_path / "lightning_logs" / "version_0"


def csv_steps(run: Path, column: str) -> list[int]:
    """The steps of metrics.csv's rows that hold `column`, as Lightning wrote them."""
    import csv

    with (run / "metrics.csv").open(newline="", encoding="utf-8") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get(column)]


@pytest.mark.parametrize("lr", [0.01, 50.0], ids=["healthy", "nan"])
def test_the_lightning_guard_names_the_steps_metrics_csv_shows(tmp_path, lr):
    """Issue 56, item 6: the guard said NaN at steps 51, 52, 53 where the scan
    of the same run's metrics.csv said 50, 51, 52 (Lightning logs optimizer
    step k at k - 1, while trainer.global_step is k by on_train_batch_end)."""
    callback, run = lightning_csv_run(tmp_path, lr)
    guarded = callback.guard.result()
    scanned = ap.training_drift(run)
    train = csv_steps(run, "train_loss")
    assert train[0] == 0 and train == sorted(set(train))
    assert [s for s, _ in guarded.evidence["curve_sampled"]] == train
    assert [s for s, _ in scanned.evidence["curve_sampled"]] == train
    assert guarded.evidence["nonfinite_steps"] == scanned.evidence["nonfinite_steps"]
    if lr == 0.01:
        validated = csv_steps(run, "val_loss")
        assert [s for s, _ in guarded.evidence["eval_loss_sampled"]] == validated == [9, 19, 29]
        assert callback.stopped_at is None and guarded.verdict == scanned.verdict
        return
    # The NaN run: stopped at the last step metrics.csv holds, saying the same steps.
    assert callback.stopped_at == train[-1] < 39
    assert guarded.evidence["nonfinite_steps"], guarded.message
    (finding,) = [f for f in callback.guard.findings if f["rule"] == "nonfinite_loss"]
    assert finding["message"] in scanned.message, (finding, scanned.message)
    assert guarded.verdict == scanned.verdict == "fail"


def lightning_lm_run(tmp_path: Path, lr: float, **callback_args):
    """A tiny next-token model over a vocabulary of 128 (K in its hparams),
    trained by Adam at ``lr`` in the real Lightning Trainer."""
    L = pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class TinyLM(L.LightningModule):
        def __init__(self, vocab_size: int = 128):
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.embed = nn.Embedding(vocab_size, 32)
            self.head = nn.Linear(32, vocab_size)

        def training_step(self, batch, batch_idx):
            (tokens,) = batch
            logits = self.head(self.embed(tokens[:, :-1]))
            targets = tokens[:, 1:].reshape(-1)
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=lr)

    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 128, (512, 16), generator=generator)
    loader = DataLoader(TensorDataset(tokens), batch_size=8)
    return fit_guarded(L, tmp_path, TinyLM(), loader, 60, **callback_args)


def test_the_lightning_callback_knows_k_and_stops_a_blown_up_lm_at_once(tmp_path):
    """Adam at lr=10 sends a next-token loss over 128 tokens (ln 128 = 4.85) far
    past a uniform guess within a few steps. K comes from the module's hparams:
    the guard stops at the first record far above ln K, whatever the curve."""
    trainer, callback = lightning_lm_run(tmp_path, lr=10.0)
    assert callback.guard.result().evidence["output_classes"] == 128
    assert callback.stopped_at is not None, callback.guard.findings
    assert trainer.global_step < 60
    (finding,) = [f for f in callback.guard.findings if f["rule"] == "worse_than_uniform"]
    assert finding["verdict"] == "fail" and finding["step"] == callback.stopped_at


def test_the_lightning_callback_takes_k_by_hand_and_lets_a_healthy_lm_finish(tmp_path):
    trainer, callback = lightning_lm_run(tmp_path / "healthy", lr=1e-3, output_classes=128)
    assert callback.guard.result().evidence["output_classes"] == 128
    assert callback.stopped_at is None, callback.guard.findings
    assert trainer.global_step == 60


# -- the guard with the GAP monitor's statistics ------------------------------------


NAN_AFTER = 10  # the step after whose update a weight is set to NaN
SAVE_EVERY = 4  # checkpoints at 4 and 8 hold good weights; 12 would not


def nan_weight_run(out: Path, *, monitor_interval: int | None, save_every: int = SAVE_EVERY):
    """A tiny Llama in the real Trainer whose first weight of layer 1 is set
    to NaN after step NAN_AFTER's update; with ``monitor_interval`` a GAP
    monitor samples every that many steps and the guard judges its
    statistics too. Returns ``(guard callback, the Trainer's log history)``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_integrations import TokenData
    from test_monitor import tiny_llama

    from adapterprobe import GAPMonitor
    from adapterprobe.integrations.transformers import GAPCallback, GuardCallback

    class BreakAWeight(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == NAN_AFTER:
                with torch.no_grad():
                    next(model.model.layers[1].parameters()).view(-1)[0] = float("nan")

    torch.manual_seed(0)
    model = tiny_llama()
    monitor = GAPMonitor(model, interval=monitor_interval or 2)
    guard = GuardCallback(monitor=monitor if monitor_interval else None)
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=30,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=1e-3,
            save_strategy="steps",
            save_steps=save_every,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(64, 8, 64),
        callbacks=[GAPCallback(monitor), BreakAWeight(), guard],
    )
    trainer.train()
    monitor.close()
    return guard, trainer.state.log_history


#: Non-finite losses in a row that make `nonfinite_loss` a stop (the guard's
#: `FINAL_NONFINITE_RUN`).
NONFINITE_RUN_TO_STOP = 3


def first_record_showing_nan(history: list[dict]) -> int | None:
    """The first step after the NaN whose logged record shows it to the loss
    rules, as the Trainer logs it: the loss masked to exactly 0.0 beside a
    non-finite gradient norm (`nan_masked`), or the last of a run of
    non-finite losses long enough to stop on. A non-finite gradient norm
    beside a finite loss is no stop (fp16 loss scaling logs one whenever it
    skips a step). Which step shows it depends on the machine's float path
    (on one CPU step 11's loss is masked, on another step 11 logs a NaN
    gradient norm beside a finite loss and step 12 the masked one), so the
    tests derive it from the run's own log."""
    nonfinite_run = 0
    for record in history:
        step = record.get("step", 0)
        if step <= NAN_AFTER or "loss" not in record:
            continue
        loss, grad_norm = record["loss"], record.get("grad_norm", 0.0)
        nonfinite_run = 0 if math.isfinite(loss) else nonfinite_run + 1
        masked = loss == 0.0 and not math.isfinite(grad_norm)
        if masked or nonfinite_run >= NONFINITE_RUN_TO_STOP:
            return step
    return None


def first_failure(guard) -> dict:
    return next(f for f in guard.guard.findings if f["verdict"] == "fail")


@pytest.mark.parametrize("interval", [1, 2])
def test_the_guard_stops_at_the_first_step_that_shows_the_nan_weights(tmp_path, interval):
    """A weight goes NaN after step 10's update. The guard stops the run at
    the first step whose record or monitor sample shows it, whichever rule
    sees it first (on one CPU the masked loss of step 11 does, on others the
    monitor's sample or the masked loss of step 12); when the monitor sees it,
    its ``nonfinite`` finding names the layer.

    With a sample at every step the monitor's statistics of step 11 see the
    NaN on every machine, whatever that step's record shows."""
    watched, history = nan_weight_run(tmp_path / "watched", monitor_interval=interval)
    first_sample = next(s for s in range(NAN_AFTER + 1, 31) if s % interval == 0)
    record = first_record_showing_nan(history)
    assert watched.stopped_at == min(first_sample, record or first_sample), (
        record,
        watched.guard.findings,
    )
    assert first_failure(watched)["step"] == watched.stopped_at
    failing = {f["rule"]: f for f in watched.guard.findings if f["verdict"] == "fail"}
    if watched.stopped_at == first_sample:  # the monitor saw it: its finding names the layer
        nonfinite = failing["nonfinite"]
        assert nonfinite["step"] == watched.stopped_at
        assert f"NaN/inf params at step {watched.stopped_at}" in nonfinite["message"]
        assert "layers.1" in nonfinite["message"]
    else:  # only the record showed it: a loss rule stopped the run
        assert watched.stopped_at == record
        assert "nonfinite" not in failing and set(failing) & {"nan_masked", "nonfinite_loss"}
    # The weights are NaN: no checkpoint of them is saved at the stop, and the
    # verdict file names the newest checkpoint saved before the fault.
    out = tmp_path / "watched"
    assert not (out / f"checkpoint-{watched.stopped_at}").exists()
    written = json.loads((out / "adapterprobe-guard.json").read_text())
    newest_before = max(s for s in range(SAVE_EVERY, 31, SAVE_EVERY) if s < watched.stopped_at)
    assert written["last_good_checkpoint"] == f"checkpoint-{newest_before}"
    assert (out / written["last_good_checkpoint"]).is_dir()


def test_no_checkpoint_of_nan_weights_is_saved_where_the_trainer_has_one_due(tmp_path):
    """The Trainer saves every step here, so it has a save due at the step the
    guard stops on (step 11: with a sample at every step the monitor sees the
    NaN there on every machine). The guard calls that save off: a checkpoint of
    NaN weights would be the newest, the one a resume picks."""
    guard, _ = nan_weight_run(tmp_path / "run", monitor_interval=1, save_every=1)
    stop = guard.stopped_at
    assert stop == NAN_AFTER + 1, guard.guard.findings
    assert not (tmp_path / "run" / f"checkpoint-{stop}").exists()
    assert (tmp_path / "run" / f"checkpoint-{stop - 1}").is_dir()
    assert guard.last_good_checkpoint == f"checkpoint-{stop - 1}"


def test_a_warn_is_said_once_in_the_log_while_the_run_goes_on(caplog):
    """A loss above its start is held at WARN online (it may still fall):
    the callback says it once, when first reported, and does not stop."""
    from adapterprobe.guard import GuardCallbackBase

    callback = GuardCallbackBase()
    callback._start()
    with caplog.at_level("WARNING", logger="adapterprobe.guard"):
        for step in range(1, 61):
            assert not callback._must_stop(step, loss=1.0 + 0.05 * step)
    said = [r.getMessage() for r in caplog.records if "(the run goes on)" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("adapterprobe guard: WARN diverged at step"), said


def test_without_the_monitor_the_loss_rules_stop_on_the_first_record_showing_the_nan(tmp_path):
    """Without the monitor the loss rules stop the run on the first record
    showing the NaN (``nan_masked``: the Trainer logs the NaN loss as 0.0),
    with no word of where the NaN is."""
    blind, history = nan_weight_run(tmp_path / "blind", monitor_interval=None)
    record = first_record_showing_nan(history)
    assert record is not None and blind.stopped_at == record, (history, blind.guard.findings)
    assert first_failure(blind)["step"] == record
    assert "nonfinite" not in {f["rule"] for f in blind.guard.findings}


def test_the_last_good_checkpoint_is_the_newest_checkpoint_folder_before_the_fault(tmp_path):
    from adapterprobe.guard import last_checkpoint_before

    for name in ("checkpoint-4", "checkpoint-8", "checkpoint-12", "checkpoint-²", "checkpoint-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-9").write_text("not a folder")
    assert last_checkpoint_before(tmp_path, 10) == "checkpoint-8"
    assert last_checkpoint_before(tmp_path, 13) == "checkpoint-12"
    assert last_checkpoint_before(tmp_path, 4) is None
    assert last_checkpoint_before(tmp_path / "missing", 10) is None


def test_the_lightning_callback_names_the_last_checkpoint_saved_before_the_fault(tmp_path):
    """SGD whose learning rate climbs to 30 over the run: healthy at first,
    NaN once the rate is far too high. ModelCheckpoint saves every 10 steps;
    the stop names the newest checkpoint from before the first bad record,
    in the log and in adapterprobe-guard.json (issue 53, item 1)."""
    import json
    import warnings

    L = pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from adapterprobe.integrations.lightning import GuardCallback

    class Climbing(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            ramp = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1e-3 * 1.15**s)
            return [optimizer], [{"scheduler": ramp, "interval": "step"}]

    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    saves = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=str(tmp_path / "ckpts"), every_n_train_steps=10, save_top_k=-1
    )
    callback = GuardCallback()
    trainer = L.Trainer(
        max_steps=200,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[saves, callback],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Climbing(), loader)
    assert callback.stopped_at is not None, callback.guard.findings
    first = callback._first_fault_step()
    good = callback.last_good_checkpoint
    assert good is not None and good.endswith(".ckpt"), good
    saved_at = int(good.rsplit("step=", 1)[1].split(".")[0])
    assert saved_at < first
    later = [
        p
        for p in (tmp_path / "ckpts").glob("*.ckpt")
        if saved_at < int(p.stem.rsplit("step=", 1)[1]) < first
    ]
    assert not later, later
    report = json.loads((tmp_path / "adapterprobe-guard.json").read_text())
    assert report["last_good_checkpoint"] == good


def test_a_guard_line_is_not_glued_to_a_progress_bar(capsys):
    """While a tqdm bar is drawn on the console, a guard line clears it and
    takes a line of its own (the HF Trainer's and Lightning's bars glued it
    to their end)."""
    import logging
    import sys

    tqdm = pytest.importorskip("tqdm")
    from adapterprobe.guard import say

    def logged(draw_bar: bool) -> str:
        handler = logging.StreamHandler(sys.stderr)  # the console, as a user has it
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            if draw_bar:
                with tqdm.tqdm(total=10, file=sys.stderr, desc="training", ascii=True) as bar:
                    bar.update(3)
                    bar.refresh()
                    say("adapterprobe guard: %s", "a line of its own")
            else:
                say("adapterprobe guard: %s", "a line of its own")
        finally:
            root.removeHandler(handler)
        return capsys.readouterr().err

    text = logged(draw_bar=True)
    at = text.index("adapterprobe guard: a line of its own")
    assert text[at - 1] in "\r\n", repr(text[max(0, at - 40) : at + 10])
    assert logged(draw_bar=False) == "adapterprobe guard: a line of its own\n"
