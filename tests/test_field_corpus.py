"""The field corpus (tools/realruns/field.py) is what the Trainer writes, and its
labels hold physically.

A session fixture trains a cheap subset of the corpus (about half a minute on
one core). The checks read the runs with json, torch and safetensors only,
never with adapterprobe's readers or verdict rules (those are what the corpus
is for): ``trainer_state.json``'s ``log_history``, ``optimizer.pt``, the
adapter or model weights, and the TensorBoard events through tensorboard's
own reader.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # the session's subset takes about half a minute of training

from conftest import realruns_source  # noqa: E402

from adapterprobe.errors import UsageError  # noqa: E402
from realruns import field  # noqa: E402
from realruns.field import ALL_LABELS, FAULTS, FIELD, LABELS, run_named  # noqa: E402
from realruns.fixtures import FIELD_SUBSET as SUBSET  # noqa: E402

LOSS_KEYS = {"epoch", "grad_norm", "learning_rate", "loss", "step"}
CHECKPOINT_FILES = {
    "trainer_state.json",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
    "training_args.bin",
}
LORA_FILES = {"adapter_model.safetensors", "adapter_config.json"}
FULL_FILES = {"model.safetensors", "config.json"}
LN_VOCAB = math.log(128)


# ---------------------------------------------------------------------------
# Reading (json, torch, safetensors only)
# ---------------------------------------------------------------------------


def checkpoints(run_dir: Path) -> list[Path]:
    found = [p for p in run_dir.iterdir() if re.fullmatch(r"checkpoint-\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def state(run_dir: Path, checkpoint: Path | None = None) -> dict[str, Any]:
    where = checkpoint or checkpoints(run_dir)[-1]
    return json.loads((where / "trainer_state.json").read_text(encoding="utf-8"))


def history(run_dir: Path) -> list[dict[str, Any]]:
    return state(run_dir)["log_history"]


def train_entries(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in history(run_dir) if "loss" in e]


def losses(run_dir: Path) -> list[float]:
    return [float(e["loss"]) for e in train_entries(run_dir)]


def eval_entries(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in history(run_dir) if "eval_loss" in e]


def weights(run_dir: Path) -> dict[str, Any]:
    """The last checkpoint's adapter (LoRA) or model (full fine-tune) tensors."""
    last = checkpoints(run_dir)[-1]
    adapter = last / "adapter_model.safetensors"
    return safetensors_torch.load_file(
        str(adapter if adapter.exists() else last / "model.safetensors")
    )


def optimizer_state(run_dir: Path) -> dict[str, Any]:
    return torch.load(checkpoints(run_dir)[-1] / "optimizer.pt", weights_only=True)


def labels_of(root: Path) -> dict[str, Any]:
    return json.loads((root / "labels.json").read_text(encoding="utf-8"))


def head_tail(values: list[float], share: float = 0.1) -> tuple[float, float]:
    n = max(1, int(len(values) * share))
    return statistics.fmean(values[:n]), statistics.fmean(values[-n:])


def step_scatter(values: list[float]) -> float:
    """Median relative step-to-step change over the second half of a curve."""
    half = values[len(values) // 2 :]
    return statistics.median(abs(b - a) / abs(a) for a, b in itertools.pairwise(half) if a)


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# ---------------------------------------------------------------------------
# The corpus definition
# ---------------------------------------------------------------------------


def test_corpus_covers_the_field() -> None:
    """Every fault class, both fine-tune kinds, the cadences, batches and features."""
    assert {r.label for r in FIELD} == set(ALL_LABELS)
    healthy = [r for r in FIELD if r.label == "healthy"]
    assert {r.finetune for r in healthy} == {"lora", "full"}
    assert {1, 10, 50, 500} <= {r.logging_steps for r in healthy}
    assert min(r.batch for r in healthy) == 2 and max(r.batch for r in healthy) == 64
    assert any(r.max_steps == -1 and r.epochs >= 10 for r in healthy)  # multi-epoch
    assert any(r.eval_steps for r in healthy)
    assert any(r.grad_accum > 1 for r in healthy)
    assert any(r.bf16 for r in healthy)
    assert any(r.stop_at for r in healthy)
    assert {"linear", "cosine"} <= {r.schedule for r in healthy}
    assert {"reinforce", "grpo", "expected_reward"} <= {r.objective for r in healthy}
    assert len(LABELS) == len(FIELD)  # names are unique
    for run in FIELD:
        assert (run.label == "healthy") == (not run.signals)
        assert run.injected is None  # every fault comes from training itself


def test_subset_spans_every_fault_class() -> None:
    assert {LABELS[name] for name in SUBSET} == set(ALL_LABELS)


# ---------------------------------------------------------------------------
# The files are the Trainer's
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SUBSET)
def test_output_dir_is_the_trainers(field_root: Path, name: str) -> None:
    run = run_named(name)
    out = field_root / name
    cps = checkpoints(out)
    assert cps, "no checkpoint-N folder"
    for cp in cps:
        files = {p.name for p in cp.iterdir()}
        assert files >= CHECKPOINT_FILES, sorted(files)
        if run.finetune == "lora":
            assert files >= LORA_FILES and "model.safetensors" not in files
        else:
            assert files >= FULL_FILES and "adapter_model.safetensors" not in files
    last = state(out)
    assert last["global_step"] == int(cps[-1].name.split("-")[1])
    assert last["logging_steps"] == run.logging_steps
    assert last["train_batch_size"] == run.batch
    if run.max_steps > 0:
        assert last["max_steps"] == run.max_steps == last["global_step"]
    if field.tensorboard_available():
        assert list((out / "runs").rglob("events.out.tfevents.*"))
    # leftovers of staging never reach the root
    assert not [p for p in field_root.iterdir() if p.name.startswith(".field-")]


@pytest.mark.parametrize("name", SUBSET)
def test_log_history_entries(field_root: Path, name: str) -> None:
    run = run_named(name)
    entries = history(field_root / name)
    for entry in entries:
        if "loss" in entry:
            assert set(entry) == LOSS_KEYS, entry
            assert entry["step"] % run.logging_steps == 0
        elif "eval_loss" in entry:
            assert {"eval_loss", "eval_runtime", "epoch", "step"} <= set(entry)
        else:  # nothing else is saved in a checkpoint's log_history
            pytest.fail(f"unexpected entry {entry}")
    steps = [e["step"] for e in entries if "loss" in e]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_labels_describe_the_runs(field_root: Path) -> None:
    labels = labels_of(field_root)
    assert sorted(labels) == sorted(SUBSET)
    for name, label in labels.items():
        run = run_named(name)
        assert label["label"] == run.label in ALL_LABELS
        assert label["finetune"] == run.finetune
        assert label["logging_steps"] == state(field_root / name)["logging_steps"]
        assert label["per_device_train_batch_size"] == run.batch
        assert label["max_steps"] == run.max_steps
        assert label["eval_strategy"] == ("steps" if run.eval_steps else "no")
        assert label["mechanism"] and (label["signals"] or label["label"] == "healthy")
        seen = label["observed"]
        assert seen["global_step"] == state(field_root / name)["global_step"]
        assert seen["loss_entries"] == len(train_entries(field_root / name))


def test_tensorboard_holds_the_logged_losses(field_root: Path) -> None:
    """report_to=["tensorboard"] wrote the same train/loss as log_history."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = field_root / "full-b2-log1"
    (events,) = [p.parent for p in (out / "runs").rglob("events.out.tfevents.*")]
    acc = EventAccumulator(str(events))
    acc.Reload()
    scalars = {e.step: e.value for e in acc.Scalars("train/loss")}
    logged = {e["step"]: e["loss"] for e in train_entries(out)}
    assert sorted(scalars) == sorted(logged)
    assert all(scalars[s] == pytest.approx(logged[s], rel=1e-6) for s in logged)


# ---------------------------------------------------------------------------
# Healthy runs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lora-b2-log1", "full-b2-log1", "lora-resumed-b8-log1"])
def test_healthy_runs_learn(field_root: Path, name: str) -> None:
    values = losses(field_root / name)
    assert all(finite(v) for v in values)
    head, tail = head_tail(values)
    assert tail <= 0.65 * head
    if run_named(name).finetune == "lora":
        bs = [t for k, t in weights(field_root / name).items() if ".lora_B." in k]
        assert bs and all(float(b.abs().max()) > 1e-3 for b in bs)


@pytest.mark.parametrize("name", ["lora-b2-log1", "full-b2-log1"])
def test_small_batch_runs_are_noisy(field_root: Path, name: str) -> None:
    """Batch 2, every step logged: losses jump by over 10% from step to step
    (median over the second half), though the run is healthy."""
    assert step_scatter(losses(field_root / name)) > 0.10


def test_resumed_run(field_root: Path) -> None:
    run = run_named("lora-resumed-b8-log1")
    out = field_root / run.name
    assert run.stop_at is not None
    names = [p.name for p in checkpoints(out)]
    assert names == ["checkpoint-100", "checkpoint-200", "checkpoint-300"]
    # checkpoint-100 was written by the first job, the later ones by the resumed job
    assert len(train_entries(out)) == run.max_steps
    assert [e["step"] for e in train_entries(out)] == list(range(1, run.max_steps + 1))
    assert len(state(out, out / "checkpoint-100")["log_history"]) == 100
    if field.tensorboard_available():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        dirs = sorted({p.parent for p in (out / "runs").rglob("events.out.tfevents.*")})
        assert len(dirs) == 2  # one per job
        jobs = []
        for d in dirs:
            acc = EventAccumulator(str(d))
            acc.Reload()
            jobs.append({e.step: e.value for e in acc.Scalars("train/loss")})
        first, second = sorted(jobs, key=min)
        assert sorted(first) == list(range(1, run.stop_at + 1))
        assert sorted(second) == list(range(101, run.max_steps + 1))
        # Same weights, optimizer, schedule, RNG and batches: the repeated steps agree.
        for step in range(101, run.stop_at + 1):
            assert second[step] == pytest.approx(first[step], rel=1e-4)


def test_rl_loss_flips_sign(field_root: Path) -> None:
    values = losses(field_root / "rl-reinforce-b8-log1")
    assert abs(values[0]) < 0.1  # starts near zero
    positive = sum(v > 0 for v in values)
    negative = sum(v < 0 for v in values)
    assert positive >= 0.05 * len(values) and negative >= 0.5 * len(values)
    flips = sum((a > 0) != (b > 0) for a, b in itertools.pairwise(values))
    assert flips >= 10


def test_prompt_only_rows_log_zero_but_train(field_root: Path) -> None:
    """A batch with no target token: the Trainer logs loss 0.0 and grad_norm 0.0,
    the weights stay finite and the run learns."""
    out = field_root / "lora-prompt-only-rows-b2-log1"
    zero = [e for e in train_entries(out) if e["loss"] == 0.0]
    assert zero and all(e["grad_norm"] == 0.0 for e in zero)
    assert all(finite(e["grad_norm"]) for e in train_entries(out))
    assert all(bool(torch.isfinite(t).all()) for t in weights(out).values())
    nonzero = [v for v in losses(out) if v]
    head, tail = head_tail(nonzero)
    assert tail <= 0.8 * head


# ---------------------------------------------------------------------------
# Fault runs: each label holds physically
# ---------------------------------------------------------------------------


def test_lr_too_high(field_root: Path) -> None:
    """AdamW at lr 1 moves every weight by about 1 per step: the weights end tens
    of times their initial size and the loss climbs far above its start and stays
    above it. Past the blow-up the run is chaotic (how high it peaks and where it
    ends differ with the CPU's kernels: peaks of 20 to 36, an end level of 0.8x
    to 1.9x its start, seen on one machine under different BLAS and ATen kernel
    paths), so it is held to what every trajectory shows, not to its end level."""
    run = run_named("lr-too-high-full-adam1-log1")
    out = field_root / run.name
    values = losses(out)
    assert all(finite(v) for v in values)
    start = values[0]
    assert max(values) >= 3 * start  # ~5 -> over 15 (3.8x to 6.8x seen)
    assert statistics.fmean(values) >= 1.5 * start  # the run's mean far above its start
    assert sum(v > start for v in values) >= 0.75 * len(values)  # above it most of the run
    before = field.build_model(run).state_dict()
    after = weights(out)
    grown = max(float(after[k].abs().max()) for k in after)
    assert grown >= 20 * max(float(before[k].abs().max()) for k in after)


def _first_nan_norm(out: Path) -> int:
    return next(e["step"] for e in train_entries(out) if not finite(e["grad_norm"]))


def test_nan_poisoned_filtered(field_root: Path) -> None:
    """logging_nan_inf_filter=True: loss 0.0 with grad_norm NaN from the poisoned step on."""
    out = field_root / "nan-empty-batch-b2-log1"
    first = _first_nan_norm(out)
    max_steps = run_named(out.name).max_steps
    assert 0.3 * max_steps <= first <= 0.9 * max_steps  # mid-run
    before = [e for e in train_entries(out) if e["step"] < first]
    after = [e for e in train_entries(out) if e["step"] >= first]
    assert all(finite(e["loss"]) and e["loss"] > 0 and finite(e["grad_norm"]) for e in before)
    assert all(e["loss"] == 0.0 and math.isnan(e["grad_norm"]) for e in after)
    trained = [t for k, t in weights(out).items() if "lora_" in k]
    assert trained and all(bool(t.isnan().all()) for t in trained)
    moments = optimizer_state(out)["state"].values()
    assert all(bool(m["exp_avg_sq"].isnan().all()) for m in moments)


def test_nan_poisoned_unfiltered(field_root: Path) -> None:
    out = field_root / "nan-empty-batch-nofilter-log1"
    first = _first_nan_norm(out)
    assert first == _first_nan_norm(field_root / "nan-empty-batch-b2-log1")  # same batch
    after = [e for e in train_entries(out) if e["step"] >= first]
    assert all(math.isnan(e["loss"]) and math.isnan(e["grad_norm"]) for e in after)
    assert '"loss": NaN' in (checkpoints(out)[-1] / "trainer_state.json").read_text()


def test_nan_logged_with_finite_weights(field_root: Path) -> None:
    """The model's own loss on an all-masked batch: NaN loss, zero gradients; the
    Trainer's running loss stays NaN while the weights and grad norms stay finite."""
    out = field_root / "nan-logged-weights-fine-nofilter"
    entries = train_entries(out)
    first = next(e["step"] for e in entries if not finite(e["loss"]))
    assert all(finite(e["loss"]) for e in entries if e["step"] < first)
    assert all(math.isnan(e["loss"]) for e in entries if e["step"] >= first)
    assert all(finite(e["grad_norm"]) for e in entries)
    assert next(e for e in entries if e["step"] == first)["grad_norm"] == 0.0
    assert all(bool(torch.isfinite(t).all()) for t in weights(out).values())


def test_frozen_lora_b(field_root: Path) -> None:
    out = field_root / "frozen-lora-b-b8-log5"
    tensors = weights(out)
    bs = [t for k, t in tensors.items() if ".lora_B." in k]
    as_ = [t for k, t in tensors.items() if ".lora_A." in k]
    assert bs and all(not b.any() for b in bs)  # delta W = B @ A = 0
    assert as_ and all(a.abs().max() > 0 for a in as_)
    # Only lora_A was handed to the optimizer, and no gradient ever reached it.
    moments = list(optimizer_state(out)["state"].values())
    assert len(moments) == len(as_)
    assert all(not m["exp_avg"].any() and not m["exp_avg_sq"].any() for m in moments)
    assert all(e["grad_norm"] == 0.0 for e in train_entries(out))
    head, tail = head_tail(losses(out), 0.2)
    assert abs(tail - head) / head < 0.03


def test_overfit_eval_rising(field_root: Path) -> None:
    out = field_root / "overfit-full-32seq-eval20"
    evals = eval_entries(out)
    values = [e["eval_loss"] for e in evals]
    best = min(range(len(values)), key=values.__getitem__)
    assert 0 < best < len(values) - 1  # eval first improved, then turned
    assert values[-1] >= 1.3 * values[best]
    train = losses(out)
    assert head_tail(train)[1] <= 0.05 * train[0]  # memorised its 32 sequences
    at_best = [e["loss"] for e in train_entries(out) if e["step"] <= evals[best]["step"]][-1]
    assert head_tail(train)[1] < at_best  # train kept falling while eval rose


@pytest.mark.xfail(
    realruns_source() == "fresh",
    reason="chaotic run trained fresh: of 8 seeds, 4 collapse this way on one CPU; which "
    "ones depends on the CPU's kernels (the committed fixture is checked in every run)",
    strict=False,
)
def test_dead_relu_collapse(field_root: Path) -> None:
    """Loss pinned at ln(vocab) with zero gradients; the last MLP's ReLUs all dead."""
    run = run_named("dead-relu-sgd-log1")
    out = field_root / run.name
    entries = train_entries(out)
    assert entries[0]["loss"] < 6  # a normal start ...
    pinned = [e for e in entries if e["step"] >= 10]
    assert all(e["loss"] == pytest.approx(LN_VOCAB, abs=1e-3) for e in pinned)  # ... then flat
    assert all(e["grad_norm"] == 0.0 for e in pinned)
    model = field.build_model(run)
    model.load_state_dict(weights(out), strict=False)
    acts: list[Any] = []
    model.model.layers[-1].mlp.act_fn.register_forward_hook(lambda m, i, o: acts.append(o))
    ids = field.field_sequences(run.seed, run.seq_len)[:64]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert not bool((acts[0] > 0).any())  # every ReLU of the last MLP is dead
    assert float(logits.std(dim=-1).max()) == 0.0  # every logit equal: loss = ln(128)


def test_no_progress_tiny_lr(field_root: Path) -> None:
    run = run_named("no-progress-full-lr1e-9-b4-log1")
    out = field_root / run.name
    assert max(e["learning_rate"] for e in train_entries(out)) <= 1e-9
    head, tail = head_tail(losses(out), 0.2)
    assert abs(tail - head) / head < 0.03
    before = field.build_model(run).state_dict()
    after = weights(out)
    assert max(float((after[k] - before[k]).abs().max()) for k in after) < 1e-6


def test_no_progress_lr_horizon(field_root: Path) -> None:
    run = run_named("no-progress-lr-horizon-log10")
    assert run.lr_horizon is not None
    entries = train_entries(field_root / run.name)
    late = [e for e in entries if e["step"] > run.lr_horizon]
    assert all(e["learning_rate"] == 0.0 for e in late)
    assert len(late) >= 0.9 * len(entries)
    flat = [e["loss"] for e in late]
    assert (max(flat) - min(flat)) / statistics.fmean(flat) < 0.05
    bs = [t for k, t in weights(field_root / run.name).items() if ".lora_B." in k]
    assert all(b.any() for b in bs)  # it did train, for 20 steps


def test_too_few_steps(field_root: Path) -> None:
    logged = field_root / "too-few-steps-full-log1"
    assert state(logged)["global_step"] == 5 == len(train_entries(logged))
    unlogged = field_root / "too-few-steps-lora-log10"
    assert state(unlogged)["global_step"] == 8
    assert history(unlogged) == []  # logging_steps=10 > max_steps: nothing logged


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------


def test_same_seed_same_run(tmp_path: Path) -> None:
    """A run trained twice logs the same losses (single thread, seeded)."""
    name = "too-few-steps-full-log1"
    field.write_field_corpus(tmp_path / "a", [name])
    field.write_field_corpus(tmp_path / "b", [name])
    first, again = (train_entries(tmp_path / side / name) for side in "ab")
    assert [e["loss"] for e in again] == [e["loss"] for e in first]
    assert [e["grad_norm"] for e in again] == [e["grad_norm"] for e in first]


def test_cli_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "corpus"
    assert field.main([str(out), "--only", "too-few-steps-lora-log10"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"too-few-steps-lora-log10 +\d+\.\d s +too_few_steps +steps=8", printed)
    assert sorted(p.name for p in out.iterdir()) == ["labels.json", "too-few-steps-lora-log10"]
    assert field.main([str(out), "--only", "too-few-steps-lora-log10"]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
    with pytest.raises(UsageError, match="no field run named"):
        field.write_field_corpus(out, ["no-such-run"])
    with pytest.raises(UsageError, match="unknown label"):
        field.FieldRun("x", "sick", "what")
    with pytest.raises(UsageError, match="signals"):
        field.FieldRun("x", "lr_too_high", "what")
    assert set(FAULTS) < set(ALL_LABELS)
