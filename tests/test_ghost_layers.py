"""gradient_ghost's exploding-layer rule (rules="robust") on real optimizer
states, in both store layouts: tiny runs trained for real, healthy and with
one or two layers' LoRA gradients scaled by sqrt(50) in every step (their
Adam second moments end 50x higher, the fault seen on real runs)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import seed_reference as ref  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import adapterprobe as ap  # noqa: E402
from adapterprobe.probes.layer_lift import peer_reference, share_quantile  # noqa: E402
from realruns import hf  # noqa: E402
from realruns.corpus import write_run  # noqa: E402
from realruns.spread import FACTOR, exploding_run, healthy_run  # noqa: E402

X50 = math.log10(50)  # the lift of a 50x layer, in decades
BASE = 3  # spread row 3: 4 layers, LoRA on q/v, no clipping, 60 steps


class Runs:
    """Real runs, trained on first use and kept for the module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Path] = {}

    def dlm(self, exploding: tuple[int, ...] = (), **changes) -> Path:
        spec = exploding_run(BASE, exploding) if exploding else healthy_run(BASE)
        spec = dataclasses.replace(spec, **changes) if changes else spec
        name = f"dlm-{spec.name}-{spec.layers}"
        if name not in self.made:
            store = self.root / name
            store.mkdir()
            write_run(store, spec)
            self.made[name] = store / "adapter" / "versions" / "v0001"
        return self.made[name]

    def hf(self, exploding: tuple[int, ...] = ()) -> Path:
        name = "hf-" + "-".join(map(str, exploding))
        if name not in self.made:
            self.made[name] = hf.train_hf_run(
                self.root / name,
                layers=4,
                steps=60,
                save_steps=20,
                tensorboard=False,
                grad_scale={layer: FACTOR for layer in exploding},
            )
        return self.made[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("ghost-layers"))


def second_moments(version: Path) -> dict[int, float]:
    """Param id -> mean exp_avg_sq, read with torch (ground truth)."""
    state = torch.load(version / "training_state.pt", map_location="cpu", weights_only=True)
    moments = state["optimizer_state_dict"]["state"]
    return {pid: float(s["exp_avg_sq"].double().mean()) for pid, s in moments.items()}


def test_the_trained_fault_is_50x_on_exactly_those_layers(runs):
    healthy, hot = runs.dlm(), runs.dlm((1,))
    a, b = second_moments(healthy), second_moments(hot)
    attribution = ap._core.ghost_input(hot).attribution
    layer_of = {ps.param_id: ps.layer for ps in attribution.params}
    for pid, value in a.items():
        want = 50.0 if layer_of[pid] == 1 else 1.0
        assert b[pid] / value == pytest.approx(want, rel=0.05), (pid, layer_of[pid])


def test_healthy_states_pass_in_both_layouts(runs):
    for version in (runs.dlm(), runs.hf() / "checkpoint-60"):
        r = ap.gradient_ghost(version)
        assert r.verdict == "pass", r.message
        assert r.evidence["exploding_layers"] == []
        lifts = r.evidence["layer_log_lift"]
        assert set(lifts) == {"0", "1", "2", "3"}
        assert max(lifts.values()) < r.evidence["thresholds"]["layer_lift_decades"]
        assert "per-layer check" in r.message


@pytest.mark.parametrize("layers", [(1,), (1, 2)])
def test_x50_layers_are_named_dlm(runs, layers):
    healthy = ap.gradient_ghost(runs.dlm()).evidence["layer_log_lift"]
    r = ap.gradient_ghost(runs.dlm(layers))
    assert r.verdict == "warn", r.message
    assert r.message.startswith("exploding_layers:"), r.message
    assert r.evidence["exploding_layers"] == list(layers)
    assert set(layers) <= set(r.evidence["flagged_layers"])
    flagged = {(t["layer"], t["tensor"]) for t in r.evidence["exploding_tensors"]}
    assert {layer for layer, _ in flagged} == set(layers)
    lifts = r.evidence["layer_log_lift"]
    for layer in layers:
        assert f"layer {layer} +" in r.message
        assert lifts[str(layer)] > 1.0
    if len(layers) == 1:  # the peers are untouched: the layer's lift rises by log10(50)
        (layer,) = layers
        assert lifts[str(layer)] - healthy[str(layer)] == pytest.approx(X50, abs=0.03)
    # the old 1000x rule alone let these through
    assert r.evidence["outliers"] == []


@pytest.mark.slow
@pytest.mark.parametrize("layers", [(2,), (1, 2)])
def test_x50_layers_are_named_hf_optimizer_pt(runs, layers):
    run = runs.hf(layers)
    for checkpoint in ("checkpoint-20", "checkpoint-40", "checkpoint-60"):
        r = ap.gradient_ghost(run / checkpoint)
        assert r.evidence["optimizer"] == "adam"
        assert r.verdict == "warn", (checkpoint, r.message)
        assert r.evidence["exploding_layers"] == list(layers), (checkpoint, r.message)


def test_two_layers_are_not_checked(runs):
    version = runs.dlm((1,), layers=2, name="two-layers-x50")
    r = ap.gradient_ghost(version)
    assert r.verdict == "pass", r.message
    assert r.evidence["exploding_layers"] == [] and r.evidence["layer_log_lift"] == {}
    reason = r.evidence["not_checked"]["per_layer"]
    assert "only 2 layer(s)" in reason and "cannot be told" in reason
    assert "per-layer check not done" in r.message


def test_sway_is_unchanged(runs):
    """rules="sway" ignores the new rule: its verdict is the seed's, on a faulty state too."""
    for version in (runs.dlm(), runs.dlm((1, 2))):
        payload = torch.load(version / "training_state.pt", map_location="cpu", weights_only=True)
        states = payload["optimizer_state_dict"]["state"]
        means = [float(states[k]["exp_avg_sq"].double().mean()) for k in sorted(states)]
        g = ap.group_layers(version, num_params=len(means), rules="sway")
        want = ref.ghost_verdict(payload["global_step"], means, (g.layer_indices, g.layer_of))
        r = ap.gradient_ghost(version, rules="sway")
        assert (r.verdict.value, r.score) == want[:2]
        assert "exploding_layers" not in r.evidence
    with pytest.raises(ap.UsageError):
        ap.gradient_ghost(version, rules="sway", layer_lift_decades=2.0)


def test_thresholds_are_options(runs):
    version = runs.dlm((1,))
    assert ap.gradient_ghost(version, layer_lift_decades=3.0).verdict == "pass"
    r = ap.gradient_ghost(version, options=ap.GhostOptions(layer_lift_share=1.0))
    assert r.evidence["exploding_layers"] == [1]
    for bad in ({"layer_lift_decades": 0.0}, {"layer_lift_share": 1.5}):
        with pytest.raises(ap.UsageError):
            ap.gradient_ghost(version, **bad)


def test_peer_reference_sets_two_highest_aside():
    assert peer_reference([0.0]) == 0.0
    assert peer_reference([0.0, 5.0]) == 0.0  # three layers: the calmer other one
    assert peer_reference([0.0, 9.0, 5.0]) == 0.0  # four layers: one busy, one exploding
    assert peer_reference([3.0, 0.0, 9.0, 1.0, 5.0]) == 1.0
    assert share_quantile([3.0, 1.0, 2.0, 0.0], 0.9) == 0.0  # 4 tensors: all of them
    assert share_quantile([float(i) for i in range(20)], 0.9) == 2.0  # 18 of 20 reach 2
    assert share_quantile([1.0], 0.5) == 1.0


@settings(max_examples=200, deadline=None)
@given(
    others=st.lists(st.floats(-12, -2), min_size=2, max_size=31),
    shift=st.floats(-5, 5),
    data=st.data(),
)
def test_peer_reference_is_a_shifted_healthy_value(others, shift, data):
    """Shifting every layer shifts the reference; raising up to two of the
    others moves it no higher than the same median of the values not raised."""
    assert peer_reference([x + shift for x in others]) == pytest.approx(
        peer_reference(others) + shift, abs=1e-9
    )
    raised = data.draw(st.sets(st.integers(0, len(others) - 1), max_size=2))
    lifted = [x + 3.0 if i in raised else x for i, x in enumerate(others)]
    untouched = sorted(x for i, x in enumerate(others) if i not in raised)
    keep = max(1, len(others) - 2)
    assert peer_reference(lifted) >= statistics.median(sorted(others)[:keep]) - 1e-9
    if untouched:
        assert peer_reference(lifted) <= statistics.median(untouched[:keep]) + 1e-9
