"""What adapter_weights' and full_weights' verdicts must do, checked on the
Rust kernels (``_core.judge_weights``, ``_core.judge_full_weights``) through
the probe API.

The rules are written once, in Rust (rust/verdicts/weights.rs,
full_weights.rs, with unit tests per rule beside them); these tests hold
them to properties any correct rule set has, under Hypothesis, and to the
real adapters and checkpoints the repository has:

- every input gets a verdict, a message and JSON-able evidence, never an
  exception (arbitrary adapters, models, options, NaN, inf, overflow);
- the verdict does not depend on the order of modules, tensors or layers;
- scaling every dW by a power of two (exact in floating point) changes no
  verdict: the dead-module and concentration rules are relative. The one
  absolute rule is deliberate: a dW of exactly 0 is dead at any scale;
- a NaN/inf weight is a FAIL; an adapter whose every dW is 0 is a FAIL; one
  dead module among live ones, dW energy held by a few modules, and a
  version identical to the one before are each a WARN naming its rule.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from verdict_checks import rules_of
from verdict_checks import well_formed as checked

from adapterprobe import _core
from adapterprobe._core import _testing
from adapterprobe.probes.full_weights import FullWeightsOptions, judge_full_weights
from adapterprobe.probes.options import resolve
from adapterprobe.probes.result import ProbeResult
from adapterprobe.probes.weights import WeightsOptions, judge_weights

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS_RULES = {"dead_modules", "concentrated", "unchanged"}


def well_formed(result: ProbeResult) -> ProbeResult:
    return checked(result, WEIGHTS_RULES)


# ---- strategies ----

SPECIAL = [0.0, -0.0, 1.0, 5e-324, 1e-300, 1e-7, 0.5, 2.0, 1e150, 1e160, 1e308]
floats = st.one_of(
    st.sampled_from([*SPECIAL, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=10.0),
)
healthy = st.floats(min_value=0.1, max_value=10.0)
norm_values = st.one_of(
    healthy,
    healthy,
    st.floats(min_value=0.0, max_value=10.0),
    st.sampled_from([0.0, -0.0, 1e-9, 1.0, 3.0]),
    floats,
)
names = st.one_of(
    st.sampled_from(
        ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.up_proj", "lm_head", "x"]
    ),
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=100),
)
paths = st.sampled_from(
    ["/store/v0001", "/store//versions/./v0002/", "rel/ckpt-10", "", "//net/a", "/"]
)
counts = st.one_of(st.just(0), st.integers(min_value=0, max_value=5), st.integers(0, 2**40))


@st.composite
def lora_modules(draw: st.DrawFn) -> Any:
    return _testing.make_lora_module_stats(
        draw(names),
        layer=draw(st.none() | st.integers(0, 40)),
        rank=draw(st.integers(0, 64)),
        norm_a=draw(norm_values),
        norm_b=draw(norm_values),
        nonfinite_a=draw(st.sampled_from([0, 0, 0, 1, 7])),
        nonfinite_b=draw(st.sampled_from([0, 0, 0, 2])),
        delta_fro=None if draw(st.integers(0, 15)) == 0 else draw(norm_values),
        stable_rank=draw(norm_values),
        rank_used=draw(st.none() | st.integers(0, 64) | st.integers(0, 2**62)),
        magnitude_nonfinite=draw(st.sampled_from([0, 0, 0, 0, 3])),
    )


def module_lists(max_size: int) -> st.SearchStrategy[list[Any]]:
    return st.lists(lora_modules(), max_size=max_size)


@st.composite
def adapter_weights(draw: st.DrawFn, modules: st.SearchStrategy[list[Any]]) -> Any:
    config = draw(
        st.builds(
            _testing.make_config_summary,
            st.just("/store/v0001/adapter_config.json"),
            st.integers(0, 256),
            floats,
            use_rslora=st.booleans(),
            use_dora=st.booleans(),
            target_modules=st.lists(names, max_size=3),
            modules_to_save=st.lists(names, max_size=2),
        )
    )
    if draw(st.integers(0, 7)) == 0:
        config = None  # the adapter cannot be judged without it
    others = draw(
        st.lists(
            st.builds(_testing.make_tensor_stats, names, nonfinite=st.sampled_from([0, 0, 1, 4])),
            max_size=4,
        )
    )
    layers = draw(
        st.lists(
            st.builds(_testing.make_layer_energy, st.integers(0, 12), st.integers(0, 8), floats),
            max_size=8,
        )
    )
    return _testing.make_adapter_weights(
        draw(paths),
        config,
        draw(modules),
        others,
        layers,
        tensor_bytes=draw(counts),
        nonfinite_total=draw(st.sampled_from([0, 0, 0, 0, 1, 12])),
    )


@st.composite
def weights_inputs(draw: st.DrawFn, modules: st.SearchStrategy[list[Any]]) -> Any:
    state = draw(st.sampled_from(["weights"] * 12 + ["note", "error", "error-path"]))
    adapter = draw(paths)
    if state == "note":
        return _testing.make_weights_input(adapter, note=draw(names))
    if state != "weights":
        path = draw(paths) if state == "error-path" else None
        return _testing.make_weights_input(adapter, error=draw(names), error_path=path)
    return _testing.make_weights_input(adapter, weights=draw(adapter_weights(modules)))


@st.composite
def weights_options(draw: st.DrawFn) -> WeightsOptions:
    given_ = {
        "dead_relative_norm": draw(
            st.none() | st.sampled_from([0.0, 1e-6, 0.5, 1.0]) | st.floats(0, 2)
        ),
        "max_top_share": draw(
            st.none() | st.sampled_from([1.0, 0.9, 0.01]) | st.floats(0, 1, exclude_min=True)
        ),
        "min_modules_for_share": draw(st.none() | st.integers(2, 12)),
    }
    return resolve(WeightsOptions, None, draw(st.sampled_from(["robust", "sway"])), given_)


def changed(inputs: Any, bump: float) -> Any:
    """``inputs`` with the first module's ||A|| moved by ``bump`` (0: the same)."""
    w = inputs.weights
    mods = list(w.modules)
    if mods and bump:
        m = mods[0]
        mods[0] = _testing.make_lora_module_stats(
            m.name,
            layer=m.layer,
            rank=m.rank,
            norm_a=m.norm_a + bump,
            norm_b=m.norm_b,
            delta_fro=m.delta_fro,
            stable_rank=m.stable_rank,
            rank_used=m.rank_used,
        )
    rebuilt = _testing.make_adapter_weights(
        w.path,
        w.config,
        mods,
        list(w.other_tensors),
        list(w.layers),
        tensor_bytes=w.tensor_bytes,
        nonfinite_total=w.nonfinite_total,
    )
    return _testing.make_weights_input("/store/v0000/", weights=rebuilt)


def rebuilt(inputs: Any, modules: list[Any], *, shuffle: random.Random | None = None) -> Any:
    """``inputs`` with ``modules`` in place of its own (others and layers
    shuffled too when ``shuffle`` is given)."""
    w = inputs.weights
    others, layers = list(w.other_tensors), list(w.layers)
    if shuffle is not None:
        shuffle.shuffle(others)
        shuffle.shuffle(layers)
    again = _testing.make_adapter_weights(
        w.path,
        w.config,
        modules,
        others,
        layers,
        tensor_bytes=w.tensor_bytes,
        nonfinite_total=w.nonfinite_total,
    )
    return _testing.make_weights_input(inputs.adapter, weights=again)


def module_like(m: Any, **changes: Any) -> Any:
    fields = {
        "layer": m.layer,
        "rank": m.rank,
        "norm_a": m.norm_a,
        "norm_b": m.norm_b,
        "nonfinite_a": m.nonfinite_a,
        "nonfinite_b": m.nonfinite_b,
        "delta_fro": m.delta_fro,
        "stable_rank": m.stable_rank,
        "rank_used": m.rank_used,
        "magnitude_nonfinite": m.magnitude_nonfinite,
    }
    fields.update(changes)
    return _testing.make_lora_module_stats(m.name, **fields)


def healthy_module(name: str, delta: float, *, layer: int = 0) -> Any:
    return _testing.make_lora_module_stats(
        name,
        layer=layer,
        rank=8,
        norm_a=1.0,
        norm_b=delta,
        delta_fro=delta,
        stable_rank=2.0,
        rank_used=4,
    )


def adapter_of(deltas: list[float], *, nonfinite_total: int = 0, config: bool = True) -> Any:
    mods = [
        healthy_module(f"model.layers.{i}.self_attn.q_proj", d, layer=i)
        for i, d in enumerate(deltas)
    ]
    summary = _testing.make_config_summary("/a/adapter_config.json", 8, 16.0) if config else None
    w = _testing.make_adapter_weights(
        "/a/adapter_model.safetensors", summary, mods, [], [], nonfinite_total=nonfinite_total
    )
    return _testing.make_weights_input("/a", weights=w)


ROBUST = resolve(WeightsOptions, None, "robust", {})
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- properties of the verdicts ----


@SETTINGS
@given(
    inputs=weights_inputs(module_lists(24)),
    options=weights_options(),
    previous=st.none() | weights_inputs(module_lists(24)),
    bump=st.sampled_from([None, 0.0, 1.0]),
)
def test_every_adapter_gets_a_verdict(
    inputs: Any, options: WeightsOptions, previous: Any, bump: float | None
) -> None:
    if bump is not None and inputs.weights is not None:
        previous = changed(inputs, bump)  # the same, or barely changed, fingerprint
    result = well_formed(judge_weights(inputs, options, previous=previous))
    event(result.verdict.value)
    for rule in rules_of(result):
        event(rule)


@SETTINGS
@given(
    inputs=weights_inputs(st.lists(lora_modules(), max_size=80)),
    options=weights_options(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_order_of_modules_changes_no_verdict(
    inputs: Any, options: WeightsOptions, seed: int
) -> None:
    assume(inputs.weights is not None)
    before = well_formed(judge_weights(inputs, options))
    shuffle = random.Random(seed)
    modules = list(inputs.weights.modules)
    shuffle.shuffle(modules)
    after = well_formed(judge_weights(rebuilt(inputs, modules, shuffle=shuffle), options))
    assert after.verdict == before.verdict
    assert rules_of(after) == rules_of(before)
    for key in ("total_delta_fro", "stable_rank_median", "rank_used"):
        a, b = after.evidence.get(key), before.evidence.get(key)
        assert a == b or (a != a and b != b), key  # exact sums: not a bit moves (NaN == NaN)
    assert sorted(after.evidence.get("dead_modules", [])) == sorted(
        before.evidence.get("dead_modules", [])
    )
    event(before.verdict.value)


@SETTINGS
@given(
    deltas=st.lists(
        st.floats(min_value=0.01, max_value=100.0) | st.just(0.0), min_size=1, max_size=60
    ),
    options=weights_options(),
    exponent=st.sampled_from([-20, -1, 1, 3, 20]),
)
def test_scaling_every_dw_by_a_power_of_two_changes_no_verdict(
    deltas: list[float], options: WeightsOptions, exponent: int
) -> None:
    scale = 2.0**exponent
    before = well_formed(judge_weights(adapter_of(deltas), options))
    after = well_formed(judge_weights(adapter_of([d * scale for d in deltas]), options))
    assert (after.verdict, rules_of(after)) == (before.verdict, rules_of(before))
    assert after.evidence["dead_modules"] == before.evidence["dead_modules"]
    assert after.evidence["total_delta_fro"] == before.evidence["total_delta_fro"] * scale
    event(before.verdict.value)


@SETTINGS
@given(inputs=weights_inputs(module_lists(24)), options=weights_options(), bad=st.integers(1, 9))
def test_a_nonfinite_weight_fails(inputs: Any, options: WeightsOptions, bad: int) -> None:
    assume(inputs.weights is not None and inputs.weights.config is not None)
    w = inputs.weights
    poisoned = _testing.make_adapter_weights(
        w.path, w.config, list(w.modules), list(w.other_tensors), list(w.layers),
        nonfinite_total=bad,
    )  # fmt: skip
    result = well_formed(
        judge_weights(_testing.make_weights_input("/a", weights=poisoned), options)
    )
    assert result.verdict.value == "fail"
    assert result.message.startswith("nonfinite_weights:")


@settings(max_examples=100, deadline=None)
@given(
    deltas=st.lists(st.floats(min_value=0.1, max_value=10.0), min_size=1, max_size=40),
    zeros=st.integers(1, 40),
    options=weights_options(),
)
def test_every_dw_zero_fails_and_one_zero_among_live_ones_warns(
    deltas: list[float], zeros: int, options: WeightsOptions
) -> None:
    dead = well_formed(judge_weights(adapter_of([0.0] * zeros), options))
    assert dead.verdict.value == "fail" and dead.message.startswith("dead_adapter:")
    # Default options: a dW of 0 among dW of 0.1-10 (options may call 10x the
    # median dead too, making every module dead).
    one_dead = well_formed(judge_weights(adapter_of([*deltas, 0.0]), ROBUST))
    assert "dead_modules" in rules_of(one_dead)
    assert one_dead.verdict.value in {"warn", "fail"}
    assert one_dead.evidence["dead_modules"][-1] == f"model.layers.{len(deltas)}.self_attn.q_proj"


@pytest.mark.parametrize("n", [8, 20, 64])
def test_energy_in_a_few_modules_warns_and_spread_energy_does_not(n: int) -> None:
    spread = well_formed(judge_weights(adapter_of([1.0] * n), ROBUST))
    assert spread.verdict.value == "pass", spread.message
    heavy = well_formed(judge_weights(adapter_of([1.0] * (n - 1) + [100.0]), ROBUST))
    assert heavy.verdict.value == "warn"
    assert rules_of(heavy) == {"concentrated"}
    assert heavy.evidence["top_modules"][0]["module"].startswith(f"model.layers.{n - 1}.")
    # Below min_modules_for_share the share is not judged.
    few = well_formed(judge_weights(adapter_of([1.0] * 3 + [100.0]), ROBUST))
    assert "concentrated" not in rules_of(few)


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.floats(min_value=0.2, max_value=0.97),
    n=st.integers(8, 39),  # one module is the top 5%
    margin=st.sampled_from([0.005, 0.02, 0.1]),
)
def test_concentration_warns_just_above_its_threshold_and_not_below(
    threshold: float, n: int, margin: float
) -> None:
    """One module holding share s of the dW energy (the rest hold 1 each):
    WARN exactly when s > max_top_share."""
    options = resolve(WeightsOptions, None, "robust", {"max_top_share": threshold})

    def holding(share: float) -> ProbeResult:
        top = math.sqrt(share * (n - 1) / (1.0 - share))
        return well_formed(judge_weights(adapter_of([1.0] * (n - 1) + [top]), options))

    above = holding(min(threshold + margin, 0.995))
    assert "concentrated" in rules_of(above), above.message
    below = holding(threshold - margin)
    assert "concentrated" not in rules_of(below), below.message


@settings(max_examples=200, deadline=None)
@given(
    relative=st.sampled_from([1e-6, 1e-3, 0.1, 0.5]) | st.floats(1e-6, 0.9),
    live=st.integers(4, 30),
    margin=st.sampled_from([0.01, 0.2]),
)
def test_a_module_is_dead_just_below_its_threshold_and_not_above(
    relative: float, live: int, margin: float
) -> None:
    """With the median dW at 1.0, a module at dead_relative_norm x (1 - margin)
    is dead and one at x (1 + margin) is not."""
    options = resolve(WeightsOptions, None, "robust", {"dead_relative_norm": relative})
    low = well_formed(judge_weights(adapter_of([1.0] * live + [relative * (1 - margin)]), options))
    assert len(low.evidence["dead_modules"]) == 1, low.message
    high = well_formed(judge_weights(adapter_of([1.0] * live + [relative * (1 + margin)]), options))
    assert high.evidence["dead_modules"] == [], high.message


def test_a_version_identical_to_the_one_before_warns() -> None:
    inputs = adapter_of([1.0, 2.0, 3.0])
    same = well_formed(judge_weights(inputs, ROBUST, previous=inputs))
    assert same.verdict.value == "warn" and rules_of(same) == {"unchanged"}
    moved = well_formed(judge_weights(inputs, ROBUST, previous=changed(inputs, 1e-3)))
    assert moved.verdict.value == "pass"
    assert moved.evidence["total_delta_fro_previous"] == pytest.approx(math.sqrt(14.0))


def test_no_config_is_an_error_and_no_factors_a_skip() -> None:
    assert judge_weights(adapter_of([1.0], config=False), ROBUST).verdict.value == "error"
    assert judge_weights(adapter_of([]), ROBUST).verdict.value == "skip"


@settings(max_examples=100, deadline=None)
@given(
    norms=st.lists(
        st.sampled_from([0.0, 1.0, 2.0, 3.0, math.nan, 0.5]) | st.floats(0, 4), max_size=300
    )
)
def test_nan_norms_are_left_out_of_the_median_and_ranked_last(norms: list[float]) -> None:
    """NaN has one policy: no part in the median, last in the energy ranking."""
    mods = [
        _testing.make_lora_module_stats(f"m{i}", delta_fro=n, stable_rank=n, rank_used=i % 5)
        for i, n in enumerate(norms)
    ]
    config = _testing.make_config_summary("/a/adapter_config.json", 8, 16.0)
    w = _testing.make_adapter_weights("/a/adapter_model.safetensors", config, mods, [], [])
    result = well_formed(judge_weights(_testing.make_weights_input("/a", weights=w), ROBUST))
    if not mods:
        return
    finite = sorted(n for n in norms if not math.isnan(n))
    if finite:
        assert result.evidence["stable_rank_median"] == pytest.approx(
            finite[len(finite) // 2]
            if len(finite) % 2
            else (finite[len(finite) // 2 - 1] + finite[len(finite) // 2]) / 2
        )
    top = [int(item["module"][1:]) for item in result.evidence["top_modules"]]
    energy = [n * n if n == n else -1.0 for n in (norms[i] for i in top)]  # NaN ranks last
    assert energy == sorted(energy, reverse=True)


# ---- full_weights ----


@st.composite
def full_inputs(draw: st.DrawFn) -> Any:
    state = draw(st.sampled_from(["weights"] * 6 + ["note", "error", "error-path"]))
    adapter = draw(paths)
    if state == "note":
        return _testing.make_full_weights_input(adapter, note=draw(names))
    if state != "weights":
        path = draw(paths) if state == "error-path" else None
        return _testing.make_full_weights_input(adapter, error=draw(names), error_path=path)
    tensors = draw(
        st.lists(
            st.builds(
                _testing.make_tensor_stats, names, nonfinite=st.sampled_from([0, 0, 0, 1, 2**40])
            ),
            max_size=12,
        )
    )
    layers = draw(
        st.lists(
            st.builds(
                _testing.make_layer_weights,
                st.integers(0, 30),
                norm=floats,
                nonfinite=st.sampled_from([0, 0, 3]),
            ),
            max_size=10,
        )
    )
    w = _testing.make_full_weights(
        draw(paths),
        draw(st.lists(paths, max_size=3)),
        tensors,
        layers,
        skipped=draw(st.lists(st.tuples(names, st.sampled_from(["I64", "BOOL"])), max_size=3)),
        other_norm=draw(floats),
        total_norm=draw(floats),
        tensor_bytes=draw(counts),
        nonfinite_total=sum(t.nonfinite for t in tensors) if draw(st.booleans()) else 0,
    )
    return _testing.make_full_weights_input(adapter, model_file=draw(st.none() | paths), weights=w)


@SETTINGS
@given(
    inputs=full_inputs(),
    rules=st.sampled_from(["robust", "sway"]),
    max_listed=st.none() | st.integers(1, 15),
    seed=st.integers(0, 2**32 - 1),
)
def test_full_weights_verdicts(inputs: Any, rules: str, max_listed: int | None, seed: int) -> None:
    """Every checkpoint gets a verdict; NaN/inf is a FAIL; no float tensor a
    SKIP; the order of tensors and layers changes nothing."""
    options = resolve(FullWeightsOptions, None, rules, {"max_listed": max_listed})
    result = well_formed(judge_full_weights(inputs, options))
    event(result.verdict.value)
    w = inputs.weights
    if w is None:
        assert result.verdict.value in {"skip", "error"}
        return
    if w.nonfinite_total:
        assert result.verdict.value == "fail"
        assert result.message.startswith("nonfinite_weights:")
    elif not list(w.tensors):
        assert result.verdict.value == "skip"
    else:
        assert result.verdict.value == "pass"
    shuffle = random.Random(seed)
    tensors, layers = list(w.tensors), list(w.layers)
    shuffle.shuffle(tensors)
    shuffle.shuffle(layers)
    again = _testing.make_full_weights(
        w.path,
        list(w.files),
        tensors,
        layers,
        skipped=list(w.skipped),
        other_norm=w.other_norm,
        total_norm=w.total_norm,
        tensor_bytes=w.tensor_bytes,
        nonfinite_total=w.nonfinite_total,
    )
    moved = judge_full_weights(
        _testing.make_full_weights_input(
            inputs.adapter, model_file=inputs.model_file, weights=again
        ),
        options,
    )
    assert moved.verdict == result.verdict


# ---- every real input the repository has ----

WEIGHTS_DATA = ROOT / "rust" / "testdata" / "weights"
WEIGHT_FIXTURES = sorted(p for p in WEIGHTS_DATA.iterdir() if p.is_dir())
#: What each adapter in rust/testdata/weights is, so what it must get.
EXPECTED = {
    "gpt2_fan_in_fan_out": "pass",
    "llama_dora_f16": "pass",
    "llama_nan": "fail",
    "llama_patterns_rslora_bf16": "pass",
    # A trained embedding LoRA holds 96% of the dW energy in one module.
    "llama_trained": "warn",
    "llama_untouched": "fail",
}


@pytest.mark.parametrize("rules", ["robust", "sway"])
def test_testdata_adapters(rules: str) -> None:
    options = resolve(WeightsOptions, None, rules, {})
    got = {
        p.name: well_formed(judge_weights(_core.weights_input(p), options)).verdict.value
        for p in WEIGHT_FIXTURES
    }
    assert got == EXPECTED
    missing = judge_weights(_core.weights_input(WEIGHTS_DATA / "no-such-adapter"), options)
    assert missing.verdict.value == "error"
    trained = _core.weights_input(WEIGHTS_DATA / "llama_trained")
    assert rules_of(judge_weights(trained, options)) == {"concentrated"}
    again = judge_weights(trained, options, previous=trained)
    assert rules_of(again) == {"concentrated", "unchanged"}


def test_demo_store(demo_store: Path) -> None:
    discovery = _core.discover([demo_store], all_versions=True)
    gathered = _core.probe_targets(
        discovery.targets, drift=False, ghost=False, weights=True, full_weights=True
    )
    seen = 0
    for target in gathered:
        items = list(target.weights)
        for i, item in enumerate(items):
            well_formed(judge_weights(item, ROBUST, previous=items[i - 1] if i else None))
            seen += 1
    assert seen > 0


def test_real_training_runs(field_root: Path) -> None:
    """LoRA and full fine-tunes trained with the real HF Trainer and PEFT,
    every version against the one before it, judged as what happened to
    them says they must be."""
    discovery = _core.discover([field_root], all_versions=True)
    gathered = _core.probe_targets(
        discovery.targets, drift=False, ghost=False, weights=True, full_weights=True
    )
    f_options = resolve(FullWeightsOptions, None, "robust", {"max_listed": 2})
    lora: dict[str, list[str]] = {}
    full: dict[str, list[str]] = {}
    for target in gathered:
        run = Path(target.store).relative_to(field_root).parts[0]
        items = list(target.weights)
        for i, item in enumerate(items):
            result = well_formed(judge_weights(item, ROBUST, previous=items[i - 1] if i else None))
            if result.verdict.value != "skip":  # a full fine-tune has no LoRA factors
                lora.setdefault(run, []).append(result.verdict.value)
        for item in target.full_weights:
            result = well_formed(judge_full_weights(item, f_options))
            if result.verdict.value != "skip":  # a LoRA checkpoint has no full weights
                full.setdefault(run, []).append(result.verdict.value)
    labels = json.loads((field_root / "labels.json").read_text(encoding="utf-8"))
    for run, label in labels.items():
        if label["label"] == "healthy":
            assert set(lora.get(run, []) + full.get(run, [])) == {"pass"}, run
    # lora_B frozen at its zero init: dW = 0 in every version.
    assert set(lora["frozen-lora-b-b8-log5"]) == {"fail"}
    # An empty batch's NaN gradient reached the weights after the first checkpoint.
    assert lora["nan-empty-batch-b2-log1"] == ["pass", "fail"]
    assert lora["nan-empty-batch-nofilter-log1"] == ["pass", "fail"]
    # NaN was only logged; the optimizer skipped it and the weights are fine.
    assert set(lora["nan-logged-weights-fine-nofilter"]) == {"pass"}
    # The schedule ended at step 0 of the second leg: nothing trained after it.
    assert lora["no-progress-lr-horizon-log10"] == ["pass", "warn"]
    assert {run for run, got in full.items() if got} >= {"full-b2-log1", "dead-relu-sgd-log1"}
