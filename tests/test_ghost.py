"""gradient_ghost: the seed's ladder, on real demo states and on synthetic inputs."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import seed_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import adapterprobe as ap
from adapterprobe.probes.ghost import GhostOptions, judge_ghost
from adapterprobe.scan import DEMO_STORE


def current(store: Path) -> Path:
    return store / "adapter" / (store / "adapter" / "current.txt").read_text().strip()


@pytest.mark.parametrize(
    "store, verdict, signal",
    [
        ("healthy", "pass", None),
        ("smoke-test", "fail", "global_step_below_threshold"),
        ("spiky-nan", "pass", None),
        ("resumed-torn", "pass", None),
    ],
)
def test_demo_stores(store, verdict, signal):
    r = ap.gradient_ghost(current(DEMO_STORE / store), rules="sway")
    assert r.verdict == verdict, r.message
    assert r.evidence.get("primary_signal") == signal
    if verdict == "pass":
        for key in (
            "global_step",
            "epoch",
            "num_params",
            "num_layers",
            "params_per_layer",
            "global_mean_exp_avg_sq",
            "frac_layers_undertrained",
            "num_layers_undertrained",
            "worst_layers",
            "num_nonfinite_exp_avg_sq",
            "best_val_loss",
            "use_qlora",
        ):
            assert key in r.evidence
        assert r.score == 0.9
        assert r.evidence["num_layers"] == 2


def test_matches_torch_load_reference():
    torch = pytest.importorskip("torch")
    adapter = current(DEMO_STORE / "healthy")
    payload = torch.load(adapter / "training_state.pt", map_location="cpu", weights_only=True)
    states = payload["optimizer_state_dict"]["state"]
    means = [float(states[k]["exp_avg_sq"].double().mean()) for k in sorted(states)]
    g = ap.group_layers(adapter, num_params=len(means), rules="sway")
    want = ref.ghost_verdict(payload["global_step"], means, (g.layer_indices, g.layer_of))
    r = ap.gradient_ghost(adapter, rules="sway")
    assert (r.verdict.value, r.score) == want[:2]
    assert r.raw == pytest.approx(want[2], rel=1e-12)
    got_worst = r.evidence["worst_layers"]
    assert [w["layer"] for w in got_worst] == [w["layer"] for w in want[4]]
    for got, expected in zip(got_worst, want[4], strict=True):
        assert got["ratio"] == pytest.approx(expected["ratio"], rel=1e-9)


def test_missing_state_skips_and_bad_state_errors(tmp_path):
    assert ap.gradient_ghost(tmp_path, rules="sway").verdict == "skip"
    shutil.copytree(current(DEMO_STORE / "healthy"), tmp_path / "v")
    state = tmp_path / "v" / "training_state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    r = ap.gradient_ghost(tmp_path / "v", rules="sway")
    assert r.verdict == "error"
    assert "sha256" in r.message.lower() or "digest" in r.message.lower()
    (tmp_path / "v" / "training_state.pt.sha256").unlink()
    state.write_bytes(b"not a zip at all")
    r = ap.gradient_ghost(tmp_path / "v", rules="sway")
    assert r.verdict == "error"
    assert r.score is None


def test_unattributable_layers_degrade_to_no_layer_signal(tmp_path):
    shutil.copytree(current(DEMO_STORE / "healthy"), tmp_path / "v")
    (tmp_path / "v" / "adapter_model.safetensors").write_bytes(b"\x00" * 3)
    r = ap.gradient_ghost(tmp_path / "v", rules="sway")
    assert r.verdict == "pass"
    assert r.evidence["num_layers"] == 0
    assert r.evidence["worst_layers"] == []


def test_options_are_checked():
    with pytest.raises(ap.UsageError):
        ap.gradient_ghost(".", undertrained_layer_ratio=1.0, rules="sway")
    with pytest.raises(ap.UsageError):
        ap.gradient_ghost(".", layer_failure_frac=1.5, rules="sway")


def test_works_without_torch(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import adapterprobe as ap\n"
        f"r = ap.gradient_ghost({str(current(DEMO_STORE / 'healthy'))!r})\n"
        "assert r.verdict == 'pass', r\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


mean = st.one_of(st.floats(0, 10), st.just(math.nan), st.just(math.inf), st.just(0.0))


@settings(max_examples=300, deadline=None)
@given(
    step=st.integers(0, 200),
    layers=st.integers(1, 6),
    per_layer=st.integers(1, 4),
    extra=st.integers(0, 3),
    data=st.data(),
    grouped=st.booleans(),
    ratio=st.floats(1.01, 5),
    frac=st.floats(0, 1),
)
def test_judge_matches_reference_ladder(step, layers, per_layer, extra, data, grouped, ratio, frac):
    n = layers * per_layer + extra
    means = data.draw(st.lists(mean, min_size=n, max_size=n))
    layer_indices = tuple(range(0, 2 * layers, 2))
    layer_of = {p: layer_indices[p // per_layer] for p in range(layers * per_layer)}
    grouping = (
        SimpleNamespace(
            layer_indices=layer_indices,
            layer_of=layer_of,
            num_layers=layers,
            params_per_layer=per_layer,
        )
        if grouped
        else None
    )
    state = SimpleNamespace(
        global_step=step,
        epoch=1.0,
        best_val_loss=math.nan,
        use_qlora=False,
        per_param=[SimpleNamespace(param_id=i, exp_avg_sq_mean=m) for i, m in enumerate(means)],
        implausible=[],
    )
    inputs = SimpleNamespace(
        state=state, grouping=grouping, error=None, note=None, optimizer="adam"
    )
    options = GhostOptions(rules="sway", undertrained_layer_ratio=ratio, layer_failure_frac=frac)
    got = judge_ghost(inputs, options)
    want = ref.ghost_verdict(
        step, means, (layer_indices, layer_of) if grouped else None, 50, ratio, frac
    )
    assert (got.verdict.value, got.score, got.raw) == want[:3]
    if want[3] is not None:
        assert got.evidence["frac_layers_undertrained"] == want[3]
        assert got.evidence["worst_layers"] == want[4]
