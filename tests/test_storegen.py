"""The store generator writes real dlm stores, and the bundled demo says what it claims.

Everything here reads the stores with torch, json and safetensors only, never
with adapterprobe's own readers, so these tests pin the data the readers are
tested against. The drift and gradient rules are re-derived below in a few
lines of plain Python from the probe specification.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import TOOLS  # noqa: E402

import adapterprobe  # noqa: E402
from adapterprobe.errors import UsageError  # noqa: E402
from realruns import dlm as storegen  # noqa: E402

DEMO_ROOT = Path(adapterprobe.__file__).parent / "demo_store"
LOG_NAME = re.compile(r"^train-(\d{6})-(\d{8}T\d{6})\.jsonl$")
LAYER_KEY = re.compile(r"\.layers\.(\d+)\.")
VERSION_FILES = {
    "adapter_model.safetensors",
    "adapter_config.json",
    "training_state.pt",
    "training_state.pt.sha256",
    "training_run.json",
}
STATE_KEYS = {
    "_state_sidecar_version",
    "optimizer_state_dict",
    "scheduler_state_dict",
    "scaler_state_dict",
    "torch_rng_state",
    "cuda_rng_state",
    "global_step",
    "epoch",
    "best_val_loss",
    "dlm_manifest_hash",
    "base_model_revision",
    "pinned_versions",
    "use_qlora",
}


# ---------------------------------------------------------------------------
# Plain-Python restatement of the probe rules
# ---------------------------------------------------------------------------


@dataclass
class Drift:
    num_steps: int
    smoothness: float
    convergence_ratio: float
    spikes: int
    nonfinite: int

    @property
    def events(self) -> int:
        return self.spikes + self.nonfinite

    def verdict(self) -> str:
        if self.num_steps < 10:
            return "skip"
        ok = self.smoothness >= 0.7 and self.convergence_ratio <= 0.7 and self.events == 0
        return "pass" if ok else "warn"


def merged_losses(store: Path) -> dict[int, float]:
    """Step -> loss over all logs in name order; a later file wins; torn lines are skipped."""
    losses: dict[int, float] = {}
    for path in sorted((store / "logs").glob("train-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("type") == "step":
                losses[int(record["step"])] = float(record["loss"])
    return losses


def drift_metrics(losses: dict[int, float], window: int = 10, sigma: float = 3.0) -> Drift:
    curve = [losses[s] for s in sorted(losses)]
    nonfinite = sum(1 for v in curve if not math.isfinite(v))
    filled: list[float] = []
    for v in curve:  # carry the last finite loss over a NaN step
        filled.append(v if math.isfinite(v) else (filled[-1] if filled else math.nan))
    if len(filled) < 2:
        return Drift(len(curve), math.nan, math.nan, 0, nonfinite)
    deltas = [b - a for a, b in itertools.pairwise(filled)]
    var_loss = statistics.pvariance(filled)
    smooth = max(0.0, 1.0 - statistics.pvariance(deltas) / var_loss) if var_loss > 0 else 0.0
    spikes = 0
    half = window // 2
    for i, d in enumerate(deltas):
        if d <= 0:
            continue
        if len(deltas) < window:
            base = statistics.median(abs(x) for x in deltas)
        else:
            lo, hi = max(0, i - half), min(len(deltas), i + half + 1)
            base = statistics.median(abs(deltas[j]) for j in range(lo, hi) if j != i)
        if base == 0 or d > sigma * base:
            spikes += 1
    return Drift(len(curve), smooth, filled[-1] / filled[0], spikes, nonfinite)


@dataclass
class Ghost:
    global_step: int
    layer_ratios: list[float]

    def verdict(self) -> str:
        if self.global_step < 50:
            return "fail"
        high = sum(1 for r in self.layer_ratios if r > 2.0)
        if high / len(self.layer_ratios) > 0.3:
            return "fail"
        return "warn" if high else "pass"


def layered_keys(version: Path) -> list[str]:
    """Safetensors keys with a layer index, in PEFT registration order (layer, then name)."""
    with open(version / "adapter_model.safetensors", "rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
    keys = [k for k in header if k != "__metadata__" and LAYER_KEY.search(k)]
    return sorted(keys, key=lambda k: (int(LAYER_KEY.search(k).group(1)), k))


def ghost_metrics(version: Path) -> Ghost:
    state = torch.load(version / "training_state.pt", weights_only=True)
    per_param = state["optimizer_state_dict"]["state"]
    keys = layered_keys(version)
    layer_of = [int(LAYER_KEY.search(k).group(1)) for k in keys]
    by_layer: dict[int, list[float]] = {}
    for pid, layer in enumerate(layer_of):
        by_layer.setdefault(layer, []).append(float(per_param[pid]["exp_avg_sq"].mean()))
    means = [statistics.fmean(v) for _, v in sorted(by_layer.items())]
    return Ghost(state["global_step"], [m / min(means) for m in means])


# ---------------------------------------------------------------------------
# Store discovery
# ---------------------------------------------------------------------------


def adapter_roots(store: Path) -> list[Path]:
    """``adapter/`` itself, or each ``adapter/<name>/`` in the multi-adapter layout."""
    top = store / "adapter"
    if (top / "current.txt").exists():
        return [top]
    return sorted(p for p in top.iterdir() if (p / "current.txt").exists())


def current_version(root: Path) -> Path:
    return root / (root / "current.txt").read_text(encoding="utf-8").strip()


def all_versions(store: Path) -> list[Path]:
    return [v for root in adapter_roots(store) for v in sorted((root / "versions").iterdir())]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("stores")
    return {name: storegen.write_store(base / name, name) for name in storegen.SCENARIOS}


def stores_for(*scenarios: str) -> list[Any]:
    """Store params: each scenario freshly generated, plus its bundled demo store if any."""
    chosen = scenarios or storegen.SCENARIOS
    fresh = [pytest.param((None, s), id=f"gen-{s}") for s in chosen]
    demo = [
        pytest.param((DEMO_ROOT / d, s), id=f"demo-{d}")
        for d, s in storegen.DEMO_STORES.items()
        if s in chosen
    ]
    return fresh + demo


@pytest.fixture(params=stores_for())
def store(request: pytest.FixtureRequest, generated: dict[str, Path]) -> tuple[Path, str]:
    path, scenario = request.param
    return (generated[scenario] if path is None else path), scenario


# ---------------------------------------------------------------------------
# Layout and file formats
# ---------------------------------------------------------------------------


def test_demo_store_holds_exactly_the_bundled_stores() -> None:
    assert sorted(p.name for p in DEMO_ROOT.iterdir()) == sorted(storegen.DEMO_STORES)


def test_layout(store: tuple[Path, str]) -> None:
    path, scenario = store
    roots = adapter_roots(path)
    assert len(roots) == (len(storegen.MULTI_ADAPTERS) if scenario == "multi" else 1)
    for root in roots:
        pointer = (root / "current.txt").read_text(encoding="utf-8")
        assert re.fullmatch(r"versions/v\d{4}", pointer.strip())
        assert current_version(root).is_dir()
        for version in (root / "versions").iterdir():
            assert re.fullmatch(r"v\d{4}", version.name)
            assert {p.name for p in version.iterdir()} == VERSION_FILES
    names = sorted(p.name for p in (path / "logs").iterdir())
    assert names and all(LOG_NAME.match(n) for n in names)
    run_ids = [int(LOG_NAME.match(n).group(1)) for n in names]
    assert run_ids == sorted(run_ids)
    no_leftovers = [p for p in path.rglob("*") if p.name.startswith(".storegen-")]
    assert no_leftovers == []


def test_training_state_payload(store: tuple[Path, str]) -> None:
    path, _ = store
    for version in all_versions(path):
        state = torch.load(version / "training_state.pt", weights_only=True)
        assert set(state) == STATE_KEYS
        assert state["_state_sidecar_version"] == 2
        opt = state["optimizer_state_dict"]
        assert set(opt) == {"state", "param_groups"}
        ids = [pid for group in opt["param_groups"] for pid in group["params"]]
        assert ids == sorted(opt["state"]) == list(range(len(ids)))
        for entry in opt["state"].values():
            assert {"step", "exp_avg", "exp_avg_sq"} <= set(entry)
            assert all(
                isinstance(entry[k], torch.Tensor) for k in ("step", "exp_avg", "exp_avg_sq")
            )
            assert entry["exp_avg"].shape == entry["exp_avg_sq"].shape
        assert isinstance(state["scheduler_state_dict"], dict)
        assert state["scaler_state_dict"] is None or isinstance(state["scaler_state_dict"], dict)
        rng = state["torch_rng_state"]
        assert isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8
        assert state["cuda_rng_state"] is None or isinstance(state["cuda_rng_state"], list)
        assert type(state["global_step"]) is int and state["global_step"] >= 1
        assert type(state["epoch"]) is float
        assert state["best_val_loss"] is None or type(state["best_val_loss"]) is float
        assert state["dlm_manifest_hash"] is None or isinstance(state["dlm_manifest_hash"], str)
        assert isinstance(state["base_model_revision"], str)
        pins = state["pinned_versions"]
        assert all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in pins.items()
        )
        run_info = json.loads((version / "training_run.json").read_text(encoding="utf-8"))
        assert type(state["use_qlora"]) is bool and state["use_qlora"] == run_info["use_qlora"]
        with zipfile.ZipFile(version / "training_state.pt") as archive:
            assert "training_state/data.pkl" in archive.namelist()


def test_sha256_sidecar_matches(store: tuple[Path, str]) -> None:
    path, _ = store
    for version in all_versions(path):
        digest = hashlib.sha256((version / "training_state.pt").read_bytes()).hexdigest()
        sidecar = (version / "training_state.pt.sha256").read_text(encoding="ascii")
        assert sidecar.strip() == digest


def test_param_ids_are_layer_major_a_before_b(store: tuple[Path, str]) -> None:
    path, _ = store
    for version in all_versions(path):
        state = torch.load(version / "training_state.pt", weights_only=True)
        per_param = state["optimizer_state_dict"]["state"]
        keys = layered_keys(version)
        assert len(keys) == len(per_param)
        tensors = safetensors_torch.load_file(version / "adapter_model.safetensors")
        for pid, key in enumerate(keys):
            # lora_A is (r, in) and lora_B is (out, r): swapped order would mismatch shapes.
            assert per_param[pid]["exp_avg"].shape == tensors[key].shape, key
        factors = [k.split(".lora_")[1][0] for k in keys]
        assert factors == ["A", "B"] * (len(keys) // 2)
        config = json.loads((version / "adapter_config.json").read_text(encoding="utf-8"))
        assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
        assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]


def test_logs_parse(store: tuple[Path, str]) -> None:
    path, scenario = store
    logs = sorted((path / "logs").glob("train-*.jsonl"))
    for index, log in enumerate(logs):
        text = log.read_text(encoding="utf-8")
        lines = text.split("\n")
        torn = scenario == "resumed" and index == 0
        if torn:
            assert not text.endswith("\n")
            with pytest.raises(json.JSONDecodeError):
                json.loads(lines[-1])
            lines = lines[:-1]
        else:
            assert text.endswith("\n") and lines.pop() == ""
        records = [json.loads(line) for line in lines]
        assert records[0]["type"] == "banner"
        assert {"run_id", "seed", "determinism_class", "pinned_versions", "plan"} <= set(records[0])
        assert records[0]["run_id"] == int(LOG_NAME.match(log.name).group(1))
        steps = [r for r in records if r["type"] == "step"]
        assert steps
        for r in steps:
            assert set(r) == {
                "type",
                "step",
                "loss",
                "lr",
                "grad_norm",
                "tokens_per_sec",
                "val_loss",
                "timestamp",
            }
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", r["timestamp"])
        assert [r["step"] for r in steps] == list(range(steps[0]["step"], steps[-1]["step"] + 1))
        for line in lines:  # dlm's writer: sorted keys, default separators
            assert line == json.dumps(json.loads(line), sort_keys=True)
        assert (records[-1]["type"] == "run_complete") is not torn


# ---------------------------------------------------------------------------
# Scenario semantics: what the probes should say
# ---------------------------------------------------------------------------


def test_probe_rules_agree_with_expected_verdicts(store: tuple[Path, str]) -> None:
    path, scenario = store
    expected = storegen.EXPECTED_VERDICTS[scenario]
    assert drift_metrics(merged_losses(path)).verdict() == expected["training_drift"]
    for root in adapter_roots(path):
        assert ghost_metrics(current_version(root)).verdict() == expected["gradient_ghost"]


@pytest.mark.parametrize("store", stores_for("healthy", "resumed", "multi"), indirect=True)
def test_healthy_clears_every_threshold(store: tuple[Path, str]) -> None:
    path, _ = store
    drift = drift_metrics(merged_losses(path))
    assert drift.num_steps >= 50
    assert drift.smoothness >= 0.7 and drift.convergence_ratio <= 0.7 and drift.events == 0
    for root in adapter_roots(path):
        ghost = ghost_metrics(current_version(root))
        assert ghost.global_step >= 50 and max(ghost.layer_ratios) <= 2.0


@pytest.mark.parametrize("store", stores_for("smoke"), indirect=True)
def test_smoke_is_too_short_for_both_probes(store: tuple[Path, str]) -> None:
    path, _ = store
    assert len(merged_losses(path)) == storegen.SMOKE_STEPS < 10
    assert ghost_metrics(current_version(path / "adapter")).global_step < 50


@pytest.mark.parametrize("store", stores_for("spiky"), indirect=True)
def test_spiky_has_spikes_and_a_nan(store: tuple[Path, str]) -> None:
    path, _ = store
    losses = merged_losses(path)
    drift = drift_metrics(losses)
    assert drift.spikes >= 1
    assert [s for s, v in losses.items() if math.isnan(v)] == list(storegen.NAN_STEPS)
    for step in storegen.SPIKE_STEPS:
        assert losses[step] > losses[step - 1] + 1.0
    raw = (path / "logs").glob("*.jsonl")
    assert any('"loss": NaN' in p.read_text(encoding="utf-8") for p in raw)
    state = torch.load(current_version(path / "adapter") / "training_state.pt", weights_only=True)
    assert isinstance(state["scaler_state_dict"], dict)
    # the NaN step's update was skipped: every param saw one step fewer than global_step
    steps = {int(e["step"]) for e in state["optimizer_state_dict"]["state"].values()}
    assert steps == {state["global_step"] - len(storegen.NAN_STEPS)}


@pytest.mark.parametrize("store", stores_for("resumed"), indirect=True)
def test_resumed_repeats_steps_and_points_at_the_resumed_version(store: tuple[Path, str]) -> None:
    path, _ = store
    first, second = sorted((path / "logs").glob("train-*.jsonl"))

    def steps_of(log: Path) -> dict[int, float]:
        out = {}
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec["type"] == "step":
                out[rec["step"]] = rec["loss"]
        return out

    a, b = steps_of(first), steps_of(second)
    crash, checkpoint = storegen.RESUME_CRASH, storegen.RESUME_CHECKPOINT
    assert sorted(a) == list(range(1, crash))  # the crash step's line is torn
    torn_line = first.read_text(encoding="utf-8").rsplit("\n", 1)[1]
    assert f'"step": {crash}' in torn_line  # ... cut after its step number was written
    assert min(b) == checkpoint + 1 and max(b) == storegen.HEALTHY_STEPS
    repeated = sorted(set(a) & set(b))
    assert repeated == list(range(checkpoint + 1, crash))
    # resumed from the exact checkpoint: the first repeated step matches ...
    assert b[checkpoint + 1] == pytest.approx(a[checkpoint + 1], rel=1e-5)
    # ... and the lower resumed learning rate makes the later ones differ
    assert any(abs(a[s] - b[s]) > 1e-4 for s in repeated)
    assert (path / "adapter" / "current.txt").read_text(encoding="utf-8").strip() == (
        "versions/v0002"
    )
    v1, v2 = (
        torch.load(path / "adapter" / "versions" / v / "training_state.pt", weights_only=True)
        for v in ("v0001", "v0002")
    )
    assert v1["global_step"] == checkpoint and v2["global_step"] == storegen.HEALTHY_STEPS


# ---------------------------------------------------------------------------
# Generator behaviour
# ---------------------------------------------------------------------------


def test_generation_is_deterministic(tmp_path: Path) -> None:
    a = storegen.write_store(tmp_path / "a", "resumed")
    b = storegen.write_store(tmp_path / "b", "resumed")
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_generation_ignores_the_string_hash_seed(tmp_path: Path) -> None:
    """PEFT keeps target_modules in a set: its order must not leak into the files."""
    here = storegen.write_store(tmp_path / "here", "smoke")
    code = (
        "import sys, warnings; warnings.simplefilter('ignore');"
        f"sys.path.insert(0, {str(TOOLS)!r}); from realruns import dlm;"
        "dlm.write_store(sys.argv[1], 'smoke')"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = tmp_path / "there"
    subprocess.run([sys.executable, "-c", code, str(there)], check=True, env=env)
    files = sorted(p.relative_to(here) for p in here.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(there) for p in there.rglob("*") if p.is_file())
    for rel in files:
        assert (here / rel).read_bytes() == (there / rel).read_bytes(), rel


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    store = storegen.write_store(tmp_path / "s", "smoke")
    with pytest.raises(UsageError, match="already exists"):
        storegen.write_store(store, "smoke")
    version = store / "adapter" / "versions" / "v0001"
    before = {p.name: p.read_bytes() for p in version.iterdir()}
    run = storegen.train_tiny_lora(steps=2, seed=3)
    with pytest.raises(UsageError, match="v0001"):
        storegen.write_adapter_version(store, 1, run)
    assert {p.name: p.read_bytes() for p in version.iterdir()} == before
    with pytest.raises(UsageError, match="scenario"):
        storegen.write_store(tmp_path / "x", "nonsense")


def test_write_log_torn_tail_and_nan_token(tmp_path: Path) -> None:
    records = [
        {"type": "step", "step": 1, "loss": 2.5, "timestamp": "2025-03-01T09:00:02"},
        {"type": "step", "step": 2, "loss": math.nan, "timestamp": "2025-03-01T09:00:04"},
    ]
    full = storegen.write_log(tmp_path, 7, records)
    assert full.name == "train-000007-20250301T090000.jsonl"
    lines = full.read_text(encoding="utf-8").splitlines()
    assert '"loss": NaN' in lines[2] and json.loads(lines[-1])["type"] == "run_complete"
    torn = storegen.write_log(tmp_path, 8, records, complete=False, torn_tail=True)
    text = torn.read_text(encoding="utf-8")
    whole = json.dumps(records[-1], sort_keys=True)
    assert not text.endswith("\n") and text.endswith(whole[: len(whole) // 2])


def test_importing_storegen_does_not_import_torch() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(TOOLS)!r}); import realruns.dlm;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
