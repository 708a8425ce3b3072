"""adapter_weights' and full_weights' Rust kernels (``_core.judge_weights``,
``_core.judge_full_weights``) against their plain-Python references
(tests/reference/weights_rules.py, full_weights_rules.py): the same verdict,
score, raw, message and evidence, floats bit for bit, on arbitrary adapters,
models, previous versions and options, and on every real input the
repository has (the demo store, rust/testdata's adapters, real training runs
with LoRA and full fine-tunes, NaN weights among them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from reference import full_weights_rules, weights_rules

from adapterprobe import _core
from adapterprobe.probes.full_weights import FullWeightsOptions, judge_full_weights
from adapterprobe.probes.options import resolve
from adapterprobe.probes.result import ProbeResult
from adapterprobe.probes.weights import WeightsOptions, judge_weights

ROOT = Path(__file__).resolve().parents[1]


def same(a: Any, b: Any, where: str = "") -> None:
    """``a`` and ``b`` identical: the same types, keys in the same order, and
    floats with the same bits (NaN equal to NaN, 0.0 not to -0.0)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__} ({a!r}, {b!r})"
    if isinstance(a, float):
        if math.isnan(a):
            assert math.isnan(b), f"{where}: {a!r} != {b!r}"
        else:
            assert a == b and math.copysign(1, a) == math.copysign(1, b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)} ({a!r}, {b!r})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_result(kernel: ProbeResult, reference: ProbeResult) -> None:
    for field in ("name", "kind", "verdict", "score", "raw", "message", "evidence"):
        same(getattr(kernel, field), getattr(reference, field), field)


def check_weights(inputs: Any, options: WeightsOptions, previous: Any = None) -> ProbeResult:
    """The kernel's result, asserted identical to the reference's. Where the
    reference raises (``math.fsum`` or ``x ** 2`` overflowing on finite
    values past ~1e154, which the scan reported as an error record), the
    kernel takes the sum as infinite and still answers."""
    kernel = judge_weights(inputs, options, previous=previous)
    try:
        reference = weights_rules.judge_weights(inputs, options, previous=previous)
    except OverflowError:
        assert kernel.verdict.value in {"pass", "warn", "fail"}
        return kernel
    same_result(kernel, reference)
    return kernel


def check_full(inputs: Any, options: FullWeightsOptions) -> ProbeResult:
    kernel = judge_full_weights(inputs, options)
    same_result(kernel, full_weights_rules.judge_full_weights(inputs, options))
    return kernel


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
    return _core.make_lora_module_stats(
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
            _core.make_config_summary,
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
            st.builds(_core.make_tensor_stats, names, nonfinite=st.sampled_from([0, 0, 1, 4])),
            max_size=4,
        )
    )
    layers = draw(
        st.lists(
            st.builds(_core.make_layer_energy, st.integers(0, 12), st.integers(0, 8), floats),
            max_size=8,
        )
    )
    return _core.make_adapter_weights(
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
        return _core.make_weights_input(adapter, note=draw(names))
    if state != "weights":
        path = draw(paths) if state == "error-path" else None
        return _core.make_weights_input(adapter, error=draw(names), error_path=path)
    return _core.make_weights_input(adapter, weights=draw(adapter_weights(modules)))


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
        mods[0] = _core.make_lora_module_stats(
            m.name,
            layer=m.layer,
            rank=m.rank,
            norm_a=m.norm_a + bump,
            norm_b=m.norm_b,
            delta_fro=m.delta_fro,
            stable_rank=m.stable_rank,
            rank_used=m.rank_used,
        )
    rebuilt = _core.make_adapter_weights(
        w.path,
        w.config,
        mods,
        list(w.other_tensors),
        list(w.layers),
        tensor_bytes=w.tensor_bytes,
        nonfinite_total=w.nonfinite_total,
    )
    return _core.make_weights_input("/store/v0000/", weights=rebuilt)


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    inputs=weights_inputs(module_lists(24)),
    options=weights_options(),
    previous=st.none() | weights_inputs(module_lists(24)),
    bump=st.sampled_from([None, 0.0, 1.0]),
)
def test_weights_kernel_is_the_reference(
    inputs: Any, options: WeightsOptions, previous: Any, bump: float | None
) -> None:
    if bump is not None and inputs.weights is not None:
        # A version before with the same (or barely changed) fingerprint.
        previous = changed(inputs, bump)
    result = check_weights(inputs, options, previous)
    event(result.verdict.value)
    for finding in result.evidence.get("findings", []):
        event(finding["rule"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=weights_inputs(st.lists(lora_modules(), min_size=60, max_size=200)),
    options=weights_options(),
)
def test_weights_kernel_sorts_many_modules_as_python(inputs: Any, options: WeightsOptions) -> None:
    """Past 64 modules CPython's sort merges runs; NaN norms and ranks then
    land where its timsort leaves them, which the kernel's sort follows."""
    check_weights(inputs, options)


@settings(max_examples=100, deadline=None)
@given(
    norms=st.lists(
        st.sampled_from([0.0, 1.0, 2.0, 3.0, math.nan, 0.5]) | st.floats(0, 4), max_size=300
    )
)
def test_median_and_ranking_of_nan_norms(norms: list[float]) -> None:
    """Norms alone (healthy config and counts), many ties and NaNs: the
    median, the dead list and the energy ranking of the evidence."""
    mods = [
        _core.make_lora_module_stats(f"m{i}", delta_fro=n, stable_rank=n, rank_used=i % 5)
        for i, n in enumerate(norms)
    ]
    config = _core.make_config_summary("/a/adapter_config.json", 8, 16.0)
    w = _core.make_adapter_weights("/a/adapter_model.safetensors", config, mods, [], [])
    inputs = _core.make_weights_input("/a", weights=w)
    check_weights(inputs, resolve(WeightsOptions, None, "robust", {}))


@st.composite
def full_inputs(draw: st.DrawFn) -> Any:
    state = draw(st.sampled_from(["weights"] * 6 + ["note", "error", "error-path"]))
    adapter = draw(paths)
    if state == "note":
        return _core.make_full_weights_input(adapter, note=draw(names))
    if state != "weights":
        path = draw(paths) if state == "error-path" else None
        return _core.make_full_weights_input(adapter, error=draw(names), error_path=path)
    tensors = draw(
        st.lists(
            st.builds(
                _core.make_tensor_stats, names, nonfinite=st.sampled_from([0, 0, 0, 1, 2**40])
            ),
            max_size=12,
        )
    )
    layers = draw(
        st.lists(
            st.builds(
                _core.make_layer_weights,
                st.integers(0, 30),
                norm=floats,
                nonfinite=st.sampled_from([0, 0, 3]),
            ),
            max_size=10,
        )
    )
    w = _core.make_full_weights(
        draw(paths),
        draw(st.lists(paths, max_size=3)),
        tensors,
        layers,
        skipped=draw(st.lists(st.tuples(names, st.sampled_from(["I64", "BOOL"])), max_size=3)),
        other_norm=draw(floats),
        total_norm=draw(floats),
        tensor_bytes=draw(counts),
        nonfinite_total=draw(st.sampled_from([0, 0, 0, 5])),
    )
    return _core.make_full_weights_input(adapter, model_file=draw(st.none() | paths), weights=w)


@SETTINGS
@given(
    inputs=full_inputs(),
    rules=st.sampled_from(["robust", "sway"]),
    max_listed=st.none() | st.integers(1, 15),
)
def test_full_weights_kernel_is_the_reference(
    inputs: Any, rules: str, max_listed: int | None
) -> None:
    options = resolve(FullWeightsOptions, None, rules, {"max_listed": max_listed})
    event(check_full(inputs, options).verdict.value)


# ---- every real input the repository has ----

WEIGHTS_DATA = ROOT / "rust" / "testdata" / "weights"
WEIGHT_FIXTURES = sorted(p for p in WEIGHTS_DATA.iterdir() if p.is_dir())


@pytest.mark.parametrize("rules", ["robust", "sway"])
def test_testdata_adapters(rules: str) -> None:
    options = resolve(WeightsOptions, None, rules, {})
    inputs = [_core.weights_input(p) for p in WEIGHT_FIXTURES]
    inputs.append(_core.weights_input(WEIGHTS_DATA / "no-such-adapter"))
    verdicts = set()
    for i, item in enumerate(inputs):
        # Each with no version before, itself before it, and its neighbour.
        for previous in (None, item, inputs[i - 1]):
            verdicts.add(check_weights(item, options, previous).verdict.value)
    assert {"pass", "fail", "error"} <= verdicts


def test_demo_store(demo_store: Path) -> None:
    discovery = _core.discover([demo_store], all_versions=True)
    gathered = _core.probe_targets(
        discovery.targets, drift=False, ghost=False, weights=True, full_weights=True
    )
    weights_options_ = resolve(WeightsOptions, None, "robust", {})
    full_options = resolve(FullWeightsOptions, None, "robust", {})
    seen = 0
    for target in gathered:
        items = list(target.weights)
        for i, item in enumerate(items):
            check_weights(item, weights_options_, items[i - 1] if i else None)
            seen += 1
        for item in target.full_weights:
            check_full(item, full_options)
    assert seen > 0


def test_real_training_runs(field_root: Path) -> None:
    """LoRA and full fine-tunes trained with the real HF Trainer and PEFT,
    NaN weights among them, every version against the one before it."""
    discovery = _core.discover([field_root], all_versions=True)
    gathered = _core.probe_targets(
        discovery.targets, drift=False, ghost=False, weights=True, full_weights=True
    )
    verdicts: dict[str, set[str]] = {"weights": set(), "full": set()}
    for rules in ("robust", "sway"):
        w_options = resolve(WeightsOptions, None, rules, {})
        f_options = resolve(FullWeightsOptions, None, rules, {"max_listed": 2})
        for target in gathered:
            items = list(target.weights)
            for i, item in enumerate(items):
                result = check_weights(item, w_options, items[i - 1] if i else None)
                verdicts["weights"].add(result.verdict.value)
            for item in target.full_weights:
                verdicts["full"].add(check_full(item, f_options).verdict.value)
    assert "pass" in verdicts["weights"] and "pass" in verdicts["full"]
    assert "fail" in verdicts["full"] | verdicts["weights"]
