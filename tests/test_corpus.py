"""Every label in the corpus of real training runs is physically true.

The corpus (tools/realruns/corpus.py) is what new verdict rules are developed
and checked against, so its labels must hold for a physical reason. These
tests read the stores with torch, json and safetensors only, never with
adapterprobe's readers (those are what the corpus will test): loss curves from
the JSONL logs, Adam moments from ``training_state.pt``, LoRA factors from the
safetensors file. The thresholds are stated once below; healthy runs clear
them with a wide margin and each fault run breaks its own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # the session's corpus takes about a minute of CPU training

from conftest import ROOT, realruns_source  # noqa: E402

from adapterprobe.errors import UsageError  # noqa: E402
from realruns.corpus import (  # noqa: E402
    ALL_PROJ,
    CORPUS,
    FAULTS,
    QV,
    RunSpec,
    spec_named,
    write_corpus,
)

# A healthy run's loss falls by at least this fraction (mean of the last ten
# steps against the first ten); one on an already tuned base by 10-20 %.
HEALTHY_DROP = 0.25
WARM_DROP = (0.10, 0.20)
# A step is a spike when its loss is this many nats above the median of its
# ten neighbours; healthy minibatch noise stays below HEALTHY_RESIDUAL.
SPIKE_NATS = 1.0
HEALTHY_RESIDUAL = 0.6
# The ten-step rolling mean of a healthy run never climbs more than this above
# its lowest value so far; an oscillating run swings by SWING_NATS, repeatedly.
HEALTHY_RISE = 0.3
SWING_NATS = 0.8
# Adam second moments: a blown-up layer sits this far above the median layer
# of the same module. Healthy runs reach a few hundred (layer 0's q/k), so the
# symptom check below uses EXPLODED_SYMPTOM.
EXPLODED_RATIO = 100.0
EXPLODED_SYMPTOM = 1000.0
# lora_B magnitudes: trained vs. barely moved.
TRAINED_B = 1e-2
BARELY_MOVED_B = 1e-4
FLAT = 0.03  # "the loss did not move": |relative change| of the ten-step means

VERSION_FILES = {
    "adapter_model.safetensors",
    "adapter_config.json",
    "training_state.pt",
    "training_state.pt.sha256",
    "training_run.json",
}
STEP_KEYS = {"type", "step", "loss", "lr", "grad_norm", "tokens_per_sec", "val_loss", "timestamp"}
LOG_NAME = re.compile(r"^train-(\d{6})-(\d{8}T\d{6})\.jsonl$")
KEY = re.compile(r"\.layers\.(\d+)\.(self_attn|mlp)\.(\w+_proj)\.lora_([AB])\.weight$")
# PEFT registers LoRA modules in the model's module order, A before B.
MODULE_ORDER = ALL_PROJ
#: A run trained at lr 30 is chaotic: which way it swings depends on the last
#: bits of the CPU's kernels, so the same seed oscillates on one machine and
#: settles on another. Its label is checked on the committed fixture (and when
#: fixtures are regenerated); trained fresh on the CI machine
#: (ADAPTERPROBE_REALRUNS=fresh) a miss is reported as XFAIL, not hidden.
CHAOTIC = {"lr-too-high-oscillate"}
chaotic_when_fresh = pytest.mark.xfail(
    realruns_source() == "fresh",
    reason="chaotic run trained fresh: its end state depends on this CPU's kernels",
    strict=False,
)
HEALTHY = [s.name for s in CORPUS if s.label == "healthy"]
FAULTY = [s.name for s in CORPUS if s.label != "healthy"]


# ---------------------------------------------------------------------------
# Reading the stores (json, torch, safetensors only)
# ---------------------------------------------------------------------------


def log_paths(store: Path) -> list[Path]:
    return sorted((store / "logs").glob("train-*.jsonl"))


def log_records(path: Path) -> list[dict[str, Any]]:
    """Every parseable line of one log; a torn last line is skipped."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def steps_of(store: Path) -> list[dict[str, Any]]:
    """Step records in step order over all logs; a later file wins a repeated step."""
    merged: dict[int, dict[str, Any]] = {}
    for path in log_paths(store):
        for record in log_records(path):
            if record.get("type") == "step":
                merged[record["step"]] = record
    return [merged[s] for s in sorted(merged)]


def losses_of(store: Path) -> list[float]:
    return [float(r["loss"]) for r in steps_of(store)]


def current(store: Path) -> Path:
    root = store / "adapter"
    return root / (root / "current.txt").read_text(encoding="utf-8").strip()


def state_of(version: Path) -> dict[str, Any]:
    return torch.load(version / "training_state.pt", weights_only=True)


def tensors_of(version: Path) -> dict[str, Any]:
    return safetensors_torch.load_file(version / "adapter_model.safetensors")


def registration_order(keys: list[str]) -> list[str]:
    """LoRA keys in PEFT's registration (= optimizer param id) order."""

    def rank(key: str) -> tuple[int, int, str]:
        match = KEY.search(key)
        assert match, key
        return int(match.group(1)), MODULE_ORDER.index(match.group(3)), match.group(4)

    return sorted(keys, key=rank)


def second_moments(version: Path) -> dict[str, dict[int, Any]]:
    """``"<proj>.lora_<A|B>"`` -> layer -> that parameter's ``exp_avg_sq``."""
    per_param = state_of(version)["optimizer_state_dict"]["state"]
    out: dict[str, dict[int, Any]] = {}
    for pid, key in enumerate(registration_order(list(tensors_of(version)))):
        match = KEY.search(key)
        assert match
        module = f"{match.group(3)}.lora_{match.group(4)}"
        out.setdefault(module, {})[int(match.group(1))] = per_param[pid]["exp_avg_sq"]
    return out


def layer_ratios(version: Path) -> dict[str, dict[int, float]]:
    """Each layer's mean ``exp_avg_sq`` over the median layer's, per module."""
    out = {}
    for module, by_layer in second_moments(version).items():
        means = {layer: float(v.mean()) for layer, v in by_layer.items()}
        median = statistics.median(means.values())
        out[module] = {layer: _ratio(m, median) for layer, m in means.items()}
    return out


def _ratio(value: float, median: float) -> float:
    if median > 0:
        return value / median
    return math.inf if value > 0 else 1.0  # all-zero moments (no gradient ever arrived)


def delta_ws(version: Path) -> dict[str, Any]:
    """Module path -> PEFT's ``delta_W = (lora_alpha / r) * B @ A``."""
    config = json.loads((version / "adapter_config.json").read_text(encoding="utf-8"))
    scale = config["lora_alpha"] / config["r"]
    tensors = tensors_of(version)
    return {
        key[: -len(".lora_A.weight")]: scale * tensors[key.replace("lora_A", "lora_B")] @ a
        for key, a in tensors.items()
        if key.endswith(".lora_A.weight")
    }


def lora_b(version: Path) -> list[Any]:
    return [t for k, t in tensors_of(version).items() if ".lora_B." in k]


# ---------------------------------------------------------------------------
# Curve measures
# ---------------------------------------------------------------------------


def head_tail(losses: list[float], n: int = 10) -> tuple[float, float]:
    return statistics.fmean(losses[:n]), statistics.fmean(losses[-n:])


def drop(losses: list[float]) -> float:
    """Fractional fall of the last ten steps' mean loss against the first ten's."""
    head, tail = head_tail(losses)
    return 1.0 - tail / head


def rolling(losses: list[float], window: int = 10) -> list[float]:
    return [statistics.fmean(losses[i - window : i]) for i in range(window, len(losses) + 1)]


def residuals(losses: list[float], half: int = 5) -> list[float]:
    """Each step's loss minus the median of its ``2 * half`` neighbours."""
    out = []
    for i, value in enumerate(losses):
        lo, hi = max(0, i - half), min(len(losses), i + half + 1)
        out.append(value - statistics.median(losses[j] for j in range(lo, hi) if j != i))
    return out


def max_rise(losses: list[float]) -> float:
    """Largest climb of the rolling mean above its lowest value so far."""
    low, worst = math.inf, 0.0
    for value in rolling(losses):
        low = min(low, value)
        worst = max(worst, value - low)
    return worst


def swings(losses: list[float], nats: float = SWING_NATS) -> int:
    """How often the rolling mean climbs ``nats`` above a low and falls back."""
    count, low, high, rising = 0, math.inf, -math.inf, False
    for value in rolling(losses):
        if rising:
            high = max(high, value)
            if high - value >= nats:
                rising, low = False, value
        else:
            low = min(low, value)
            if value - low >= nats:
                count, rising, high = count + 1, True, value
    return count


# ---------------------------------------------------------------------------
# The labels file and the store layout
# ---------------------------------------------------------------------------


def test_labels_file_covers_every_fault_class(corpus: tuple[Path, dict[str, str]]) -> None:
    root, labels = corpus
    on_disk = json.loads((root / "labels.json").read_text(encoding="utf-8"))
    assert on_disk == {s.name: {"label": s.label, "what": s.what} for s in CORPUS}
    assert all(info["what"] and "\n" not in info["what"] for info in on_disk.values())
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(labels)
    counts = {label: list(labels.values()).count(label) for label in ("healthy", *FAULTS)}
    assert counts["healthy"] >= 10
    assert all(counts[fault] >= 1 for fault in FAULTS), counts
    assert counts["lr_too_high"] == 2


@pytest.mark.parametrize("name", [s.name for s in CORPUS])
def test_store_layout(corpus: tuple[Path, dict[str, str]], name: str) -> None:
    root, _ = corpus
    store, spec = root / name, spec_named(name)
    versions = sorted((store / "adapter" / "versions").iterdir())
    expected = ["v0001", "v0002"] if spec.resumed else ["v0001"]
    assert [v.name for v in versions] == expected
    assert current(store) == versions[-1]
    logs = log_paths(store)
    assert [LOG_NAME.match(p.name).group(1) for p in logs] == [  # type: ignore[union-attr]
        f"{i:06d}" for i in range(1, len(expected) + 1)
    ]
    assert sorted(p.name for p in store.rglob("*") if p.name.startswith(".")) == []
    for version in versions:
        assert {p.name for p in version.iterdir()} == VERSION_FILES
        digest = hashlib.sha256((version / "training_state.pt").read_bytes()).hexdigest()
        assert (version / "training_state.pt.sha256").read_text(encoding="ascii").strip() == digest
        config = json.loads((version / "adapter_config.json").read_text(encoding="utf-8"))
        assert (config["peft_type"], config["r"], config["lora_alpha"]) == (
            "LORA",
            spec.rank,
            spec.alpha,
        )
        assert sorted(config["target_modules"]) == sorted(spec.targets)
        tensors = tensors_of(version)
        assert len(tensors) == 2 * spec.layers * len(spec.targets)
        per_param = state_of(version)["optimizer_state_dict"]["state"]
        assert sorted(per_param) == list(range(len(tensors)))
        for pid, key in enumerate(registration_order(list(tensors))):
            assert per_param[pid]["exp_avg_sq"].shape == tensors[key].shape, key
    state = state_of(versions[-1])
    records = steps_of(store)
    assert state["global_step"] == spec.steps == records[-1]["step"] == len(records)
    for path in logs:
        lines = log_records(path)
        banner = lines[0]
        assert banner["type"] == "banner" and banner["seed"] == spec.seed
        plan = banner["plan"]
        assert plan["lora"] == {
            "r": spec.rank,
            "lora_alpha": spec.alpha,
            "target_modules": list(spec.targets),
        }
        assert plan["optimizer"]["lr"] == spec.lr
        assert plan["base_model"]["num_hidden_layers"] == spec.layers
        assert plan["data"]["batch"] == spec.batch
        assert plan["schedule"]["type"] == spec.schedule
        for record in lines[1:]:
            if record["type"] == "step":
                assert set(record) == STEP_KEYS


# ---------------------------------------------------------------------------
# Healthy runs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_run_is_healthy(corpus: tuple[Path, dict[str, str]], name: str) -> None:
    root, _ = corpus
    store, spec = root / name, spec_named(name)
    records = steps_of(store)
    losses = [r["loss"] for r in records]
    assert len(losses) >= 40
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)
    if spec.warm_start_steps:
        assert WARM_DROP[0] <= drop(losses) <= WARM_DROP[1], drop(losses)
    else:
        assert drop(losses) >= HEALTHY_DROP, drop(losses)
    assert max(residuals(losses)) < HEALTHY_RESIDUAL
    assert max_rise(losses) < HEALTHY_RISE
    vals = [r["val_loss"] for r in records if r["val_loss"] is not None]
    assert len(vals) == len(losses) // 10 and all(math.isfinite(v) for v in vals)
    assert vals[-1] < vals[0]

    version = current(store)
    assert all(float(b.abs().max()) >= TRAINED_B for b in lora_b(version))
    assert all(float(dw.abs().max()) > 0 for dw in delta_ws(version).values())
    state = state_of(version)
    for entry in state["optimizer_state_dict"]["state"].values():
        assert int(entry["step"]) == state["global_step"]  # no update was skipped
        assert bool(torch.isfinite(entry["exp_avg_sq"]).all())
        assert float(entry["exp_avg_sq"].mean()) > 0
    worst = max(r for by_layer in layer_ratios(version).values() for r in by_layer.values())
    assert worst < EXPLODED_SYMPTOM


def test_healthy_runs_vary(corpus: tuple[Path, dict[str, str]]) -> None:
    """Depth, rank, lr, length, batch, schedule and history differ across healthy runs,
    as recorded in the stores themselves."""
    root, _ = corpus
    plans = [log_records(log_paths(root / n)[0])[0]["plan"] for n in HEALTHY]
    layers = {p["base_model"]["num_hidden_layers"] for p in plans}
    assert min(layers) == 2 and max(layers) == 6 and len(layers) >= 4
    assert {p["lora"]["r"] for p in plans} == {4, 8, 16}
    lrs = [p["optimizer"]["lr"] for p in plans]
    assert min(lrs) == pytest.approx(3e-4) and max(lrs) == pytest.approx(3e-3)
    assert {p["schedule"]["type"] for p in plans} == {"linear", "cosine", "constant"}
    assert {p["data"]["batch"] for p in plans} == {4, 8, 16}
    assert any(p["data"]["grad_accum"] > 1 for p in plans)
    assert any(p["optimizer"]["max_grad_norm"] is None for p in plans)
    assert {tuple(p["lora"]["target_modules"]) for p in plans} == {QV, ALL_PROJ}
    lengths = [steps_of(root / n)[-1]["step"] for n in HEALTHY]
    assert min(lengths) == 40 and max(lengths) == 400
    assert sum(len(log_paths(root / n)) == 2 for n in HEALTHY) == 1


def test_resumed_run_repeats_steps_from_its_checkpoint(
    corpus: tuple[Path, dict[str, str]],
) -> None:
    root, _ = corpus
    (spec,) = [s for s in CORPUS if s.resumed]
    assert spec.checkpoint_at is not None and spec.crash_at is not None
    store = root / spec.name
    first, second = log_paths(store)
    assert not first.read_text(encoding="utf-8").endswith("\n")  # killed mid-line
    a = {r["step"]: r["loss"] for r in log_records(first) if r["type"] == "step"}
    b = {r["step"]: r["loss"] for r in log_records(second) if r["type"] == "step"}
    assert sorted(a) == list(range(1, spec.crash_at))
    assert sorted(b) == list(range(spec.checkpoint_at + 1, spec.steps + 1))
    repeated = sorted(set(a) & set(b))
    assert repeated == list(range(spec.checkpoint_at + 1, spec.crash_at))
    # Same weights, optimizer, schedule and batches: the resumed steps redo the same losses.
    assert all(b[s] == pytest.approx(a[s], rel=1e-5) for s in repeated)
    v1, v2 = (state_of(store / "adapter" / "versions" / v) for v in ("v0001", "v0002"))
    assert (v1["global_step"], v2["global_step"]) == (spec.checkpoint_at, spec.steps)


def test_warm_base_starts_low(corpus: tuple[Path, dict[str, str]]) -> None:
    """The run on an already tuned base starts where random-base runs only end up."""
    root, _ = corpus
    (warm,) = [s.name for s in CORPUS if s.label == "healthy" and s.warm_start_steps]
    cold_starts = [losses_of(root / n)[0] for n in HEALTHY if n != warm]
    assert losses_of(root / warm)[0] < min(cold_starts) - 1.0


# ---------------------------------------------------------------------------
# Fault runs: each label is physically true
# ---------------------------------------------------------------------------


def runs_labelled(label: str) -> list[RunSpec]:
    return [s for s in CORPUS if s.label == label]


def test_too_few_steps(corpus: tuple[Path, dict[str, str]]) -> None:
    root, _ = corpus
    (spec,) = runs_labelled("too_few_steps")
    store = root / spec.name
    assert 5 <= state_of(current(store))["global_step"] == len(steps_of(store)) <= 8
    # It is a healthy config cut short: same model, data and first batch.
    twin = next(
        s.name
        for s in runs_labelled("healthy")
        if (s.layers, s.rank, s.targets, s.lr, s.seed, s.batch)
        == (spec.layers, spec.rank, spec.targets, spec.lr, spec.seed, spec.batch)
    )
    assert losses_of(store)[0] == losses_of(root / twin)[0]
    assert all(math.isfinite(v) for v in losses_of(store))


def test_lr_too_high_runs_are_the_two_variants() -> None:
    specs = runs_labelled("lr_too_high")
    assert {s.name.rsplit("-", 1)[1] for s in specs} == {"diverge", "oscillate"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(s.name, marks=[chaotic_when_fresh] if s.name in CHAOTIC else [])
        for s in CORPUS
        if s.label == "lr_too_high"
    ],
)
def test_lr_too_high_variants(corpus: tuple[Path, dict[str, str]], name: str) -> None:
    """Each variant on its own: only the chaotic one may miss when trained fresh."""
    root, _ = corpus
    spec = spec_named(name)
    healthy_lrs = [s.lr for s in runs_labelled("healthy")]
    losses = losses_of(root / spec.name)
    assert all(math.isfinite(v) for v in losses)  # too high, but not NaN
    assert spec.lr >= 100 * max(healthy_lrs)
    assert max(float(b.abs().max()) for b in lora_b(current(root / spec.name))) > 1.0
    if spec.name.endswith("diverge"):
        start = losses[0]
        assert max(losses[:20]) >= start + 1.0  # knocked out early ...
        assert min(rolling(losses, 5)[10:]) >= start + 0.3  # ... never comes back ...
        assert head_tail(losses)[1] >= start + 0.5  # ... and ends above its start
    else:
        assert swings(losses) >= 2  # up and down by a nat, more than once
        assert max_rise(losses) >= 1.5
        assert head_tail(losses)[1] >= min(rolling(losses)) + 0.5  # not converged


def test_lr_too_low(corpus: tuple[Path, dict[str, str]]) -> None:
    root, _ = corpus
    (spec,) = runs_labelled("lr_too_low")
    store = root / spec.name
    records = steps_of(store)
    assert max(r["lr"] for r in records) <= 1e-7
    assert abs(drop([r["loss"] for r in records])) < FLAT
    bs = lora_b(current(store))
    assert all(0 < float(b.abs().max()) < BARELY_MOVED_B for b in bs)  # moved, barely
    assert all(float(dw.abs().max()) < 1e-5 for dw in delta_ws(current(store)).values())


def test_dead_adapter(corpus: tuple[Path, dict[str, str]]) -> None:
    root, _ = corpus
    (spec,) = runs_labelled("dead_adapter")
    store = root / spec.name
    version = current(store)
    tensors = tensors_of(version)
    assert all(not t.any() for k, t in tensors.items() if ".lora_B." in k)
    assert all(t.abs().max() > 0 for k, t in tensors.items() if ".lora_A." in k)
    assert all(not dw.any() for dw in delta_ws(version).values())
    state = state_of(version)
    for entry in state["optimizer_state_dict"]["state"].values():
        # the optimizer did step every time; no gradient ever reached it
        assert int(entry["step"]) == state["global_step"]
        assert not entry["exp_avg"].any() and not entry["exp_avg_sq"].any()
    assert abs(drop(losses_of(store))) < FLAT


def test_nan_losses(corpus: tuple[Path, dict[str, str]]) -> None:
    root, _ = corpus
    (spec,) = runs_labelled("nan_losses")
    store = root / spec.name
    records = steps_of(store)
    bad = [r["step"] for r in records if not math.isfinite(r["loss"])]
    assert bad == list(spec.nan_steps) and len(bad) >= 2
    assert '"loss": NaN' in log_paths(store)[0].read_text(encoding="utf-8")
    state = state_of(current(store))
    scaler = state["scaler_state_dict"]
    assert scaler["scale"] == 2.0**16 * 0.5 ** len(bad)  # backed off once per overflow
    for entry in state["optimizer_state_dict"]["state"].values():
        assert int(entry["step"]) == state["global_step"] - len(bad)  # those updates skipped
        assert bool(torch.isfinite(entry["exp_avg_sq"]).all())
    assert all(bool(torch.isfinite(t).all()) for t in tensors_of(current(store)).values())
    finite = [r["loss"] for r in records if math.isfinite(r["loss"])]
    assert drop(finite) >= HEALTHY_DROP  # otherwise a healthy run


def test_loss_spikes(corpus: tuple[Path, dict[str, str]]) -> None:
    root, _ = corpus
    (spec,) = runs_labelled("loss_spikes")
    store = root / spec.name
    records = steps_of(store)
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(v) for v in losses)
    by_step = dict(zip((r["step"] for r in records), residuals(losses), strict=True))
    for step in spec.spike_steps:
        assert by_step[step] >= SPIKE_NATS, (step, by_step[step])
    others = [v for s, v in by_step.items() if s not in spec.spike_steps]
    assert max(others) < HEALTHY_RESIDUAL
    state = state_of(current(store))
    assert all(  # the corrupt batches were trained on, not skipped
        int(e["step"]) == state["global_step"]
        for e in state["optimizer_state_dict"]["state"].values()
    )


def test_exploded_second_moments(corpus: tuple[Path, dict[str, str]]) -> None:
    root, _ = corpus
    (spec,) = runs_labelled("exploded_second_moments")
    store = root / spec.name
    assert 4 <= spec.layers <= 6 and 1 <= len(spec.explode_layers) <= 2
    ratios = layer_ratios(current(store))
    assert set(ratios) == {f"{m}.lora_{f}" for m in spec.targets for f in "AB"}
    for module, by_layer in ratios.items():
        for layer, ratio in by_layer.items():
            if layer in spec.explode_layers:
                assert ratio >= EXPLODED_RATIO, (module, layer, ratio)
            else:
                assert ratio < EXPLODED_RATIO, (module, layer, ratio)
    records = steps_of(store)
    assert all(math.isfinite(r["loss"]) for r in records)  # the loss never shows it
    assert drop([r["loss"] for r in records]) >= HEALTHY_DROP
    norms = {r["step"]: r["grad_norm"] for r in records}
    assert norms[spec.explode_from] >= 100 * norms[spec.explode_from - 1]


def test_nan_second_moments(corpus: tuple[Path, dict[str, str]]) -> None:
    root, _ = corpus
    (spec,) = runs_labelled("nan_second_moments")
    store = root / spec.name
    (first_nan,) = spec.nan_steps
    version = current(store)
    for by_layer in second_moments(version).values():
        assert all(bool(v.isnan().all()) for v in by_layer.values())
    assert all(bool(t.isnan().all()) for t in tensors_of(version).values())
    records = steps_of(store)
    assert all(math.isfinite(r["loss"]) for r in records if r["step"] < first_nan)
    assert all(math.isnan(r["loss"]) for r in records if r["step"] >= first_nan)


# ---------------------------------------------------------------------------
# The checks separate the classes
# ---------------------------------------------------------------------------


def _finite_losses(store: Path) -> list[float]:
    losses = losses_of(store)
    return losses if all(math.isfinite(v) for v in losses) else []


#: Label -> a spec-free check that a store shows that fault. None may fire on a
#: healthy run; each fault run must show its own.
SYMPTOMS: dict[str, Callable[[Path], bool]] = {
    "too_few_steps": lambda s: state_of(current(s))["global_step"] < 10,
    "lr_too_high": lambda s: bool(
        (f := _finite_losses(s)) and (head_tail(f)[1] > f[0] + 0.3 or swings(f) >= 2)
    ),
    "lr_too_low": lambda s: all(
        0 < float(b.abs().max()) < BARELY_MOVED_B for b in lora_b(current(s))
    ),
    "dead_adapter": lambda s: all(not b.any() for b in lora_b(current(s))),
    "nan_losses": lambda s: any(not math.isfinite(v) for v in losses_of(s)),
    "loss_spikes": lambda s: bool((f := _finite_losses(s)) and max(residuals(f)) >= SPIKE_NATS),
    "exploded_second_moments": lambda s: any(
        r >= EXPLODED_SYMPTOM for m in layer_ratios(current(s)).values() for r in m.values()
    ),
    "nan_second_moments": lambda s: all(
        bool(v.isnan().all()) for m in second_moments(current(s)).values() for v in m.values()
    ),
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(s.name, marks=[chaotic_when_fresh] if s.name in CHAOTIC else []) for s in CORPUS],
)
def test_symptoms_fire_only_where_they_belong(
    corpus: tuple[Path, dict[str, str]], name: str
) -> None:
    root, labels = corpus
    store = root / name
    fired = {label for label, shows in SYMPTOMS.items() if shows(store)}
    if labels[name] == "healthy":
        assert fired == set()
    else:
        assert labels[name] in fired


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------

CHEAP = ["too-few-steps", "healthy-short", "nan-losses"]


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    """Runs written alone give the bytes they get when written with others.

    Compared with a second fresh write, not with the committed fixture: on
    another CPU the same seed may train to other bits."""
    alone = {name: write_corpus(tmp_path / name, names=[name])[name] for name in CHEAP}
    together = write_corpus(tmp_path / "together", names=CHEAP)
    assert sorted(together) == sorted(CHEAP)
    for name in CHEAP:
        mine = sorted(p.relative_to(alone[name]) for p in alone[name].rglob("*") if p.is_file())
        theirs = sorted(
            p.relative_to(together[name]) for p in together[name].rglob("*") if p.is_file()
        )
        assert mine == theirs
        for rel in mine:
            assert (alone[name] / rel).read_bytes() == (together[name] / rel).read_bytes(), rel
    labels = json.loads((tmp_path / "together" / "labels.json").read_text(encoding="utf-8"))
    assert sorted(labels) == sorted(CHEAP)


def test_write_corpus_refuses_bad_requests(tmp_path: Path) -> None:
    write_corpus(tmp_path, names=["too-few-steps"])
    before = {p: p.read_bytes() for p in (tmp_path / "too-few-steps").rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match="already exists"):
        write_corpus(tmp_path, names=["too-few-steps"])
    after = {p: p.read_bytes() for p in (tmp_path / "too-few-steps").rglob("*") if p.is_file()}
    assert after == before
    with pytest.raises(UsageError, match="no corpus run named"):
        write_corpus(tmp_path, names=["no-such-run"])
    with pytest.raises(UsageError, match="unknown label"):
        RunSpec("x", "sick", "what")
    with pytest.raises(UsageError, match="checkpoint"):
        RunSpec("x", "healthy", "what", steps=10, checkpoint_at=5, crash_at=12)


def _load_script() -> Any:
    path = ROOT / "scripts" / "make_corpus.py"
    spec = importlib.util.spec_from_file_location("make_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_corpus_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _load_script()
    out = tmp_path / "corpus"
    assert script.main([str(out), "--only", "too-few-steps"]) == 0
    printed = capsys.readouterr().out
    assert re.search(
        r"too-few-steps .* too_few_steps +steps=6 +loss \d\.\d{3} -> \d\.\d{3}", printed
    )
    assert sorted(p.name for p in out.iterdir()) == ["labels.json", "too-few-steps"]
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]  # nothing staged is left
    # A second run replaces the corpus as a whole ...
    assert script.main([str(out), "--only", "dead-adapter"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dead-adapter", "labels.json"]
    # ... but never a directory holding something else.
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    assert script.main([str(out), "--only", "too-few-steps"]) == 1
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert "refusing" in capsys.readouterr().err
