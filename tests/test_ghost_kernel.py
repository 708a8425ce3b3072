"""What gradient_ghost's verdicts must do, checked on its Rust kernel
(rust/verdicts/ghost/, the one implementation of its rules, with unit tests
per rule beside it) through ``judge_ghost``:

- every state gets a verdict and JSON-able evidence, never an exception
  (arbitrary states and options of both rule sets, NaN, inf, overflow), and
  plain data judges as the core's own objects do;
- the order in which a state lists its parameters changes nothing;
- scaling every second moment by a power of two (exact in floating point)
  changes no verdict: the per-layer rules compare layers with each other;
  the step floor, NaN/inf and all-zero rules are deliberately absolute;
- NaN/inf second moments, all-zero ones and a smoke-test step count FAIL;
  one layer's gradients 1000x (robust: more than a decade above its
  nearest layers) WARN and name the layer, exactly past each threshold;
- the real corpora: every fault whose mechanism leaves a trace in the
  optimizer state is flagged, and healthy runs pass.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from verdict_checks import rules_of, well_formed

from adapterprobe import _core
from adapterprobe.errors import MissingFileError, TrainingStateError, WeightsError
from adapterprobe.probes.ghost import GhostOptions, judge_ghost
from adapterprobe.probes.options import resolve
from adapterprobe.probes.result import ProbeResult
from adapterprobe.scan import DEMO_STORE

ROOT = Path(__file__).resolve().parents[1]


def outcome(result: ProbeResult) -> tuple[str, set[str]]:
    return result.verdict.value, rules_of(result)


# ---- arbitrary states ----

NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
FINITE = st.one_of(
    st.floats(-14, 2).map(lambda e: 10.0**e),
    st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e300, 1.7e308, -1.0, 1.0]),
    st.floats(allow_nan=False, allow_infinity=False),
)
MOMENT = st.one_of(FINITE, FINITE, FINITE, NONFINITE)
NAME = st.one_of(st.just(""), st.text(max_size=12), st.sampled_from(["mlp.up.lora_A", "a\nb\x1b"]))
#: Layer factors of a structured state: calm, busy, exploding, dead.
FACTOR = st.sampled_from([1.0, 1.0, 1.0, 0.5, 2.0, 50.0, 1e4, 1e-3, 0.0])


@st.composite
def states(draw: st.DrawFn) -> SimpleNamespace:
    layer_indices = sorted(draw(st.sets(st.integers(0, 40), max_size=8)))
    slots = draw(st.integers(1, 4))
    before, after = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    layered = len(layer_indices) * slots
    n = before + layered + after
    mode = draw(st.sampled_from(["real", "real", "real", "any", "zero"]))
    if mode == "zero":
        # No gradient ever reached the optimizer (zeros of both signs).
        means = draw(st.lists(st.sampled_from([0.0, -0.0]), min_size=n, max_size=n))
    elif mode == "real":
        # Like a real state: each tensor has its scale, each layer a factor.
        scale = draw(
            st.lists(st.floats(-12, -2).map(lambda e: 10.0**e), min_size=slots, max_size=slots)
        )
        factor = draw(st.lists(FACTOR, min_size=len(layer_indices), max_size=len(layer_indices)))
        jitter = draw(st.lists(st.floats(-0.3, 0.3), min_size=n, max_size=n))
        means = [
            scale[(i - before) % slots] * factor[(i - before) // slots] * 10.0 ** jitter[i]
            if before <= i < before + layered
            else draw(FINITE)
            for i in range(n)
        ]
    else:
        means = draw(st.lists(MOMENT, min_size=n, max_size=n))
    nonfinite = [0] * n
    if draw(st.sampled_from([False] * 5 + [True])):
        nonfinite = draw(st.lists(st.sampled_from([0] * 9 + [2]), min_size=n, max_size=n))
    per_param = [
        SimpleNamespace(param_id=i, exp_avg_sq_mean=m, nonfinite=k, numel=4, shape=[2, 2])
        for i, (m, k) in enumerate(zip(means, nonfinite, strict=True))
    ]
    attribution = SimpleNamespace(
        layer_indices=layer_indices,
        params=[
            SimpleNamespace(param_id=before + k, layer=layer_indices[k // slots], slot=k % slots)
            for k in range(layered)
        ],
        slot_names=draw(st.lists(NAME, min_size=slots, max_size=slots)),
        unattributed=[*range(before), *range(before + layered, n)],
    )
    grouping = SimpleNamespace(
        layer_indices=tuple(layer_indices),
        layer_of={i: layer_indices[i // slots] for i in range(layered)},
        num_layers=len(layer_indices),
        params_per_layer=slots,
    )
    implausible = []
    if draw(st.sampled_from([False] * 9 + [True])):
        implausible = draw(st.lists(st.text(max_size=20), min_size=1, max_size=5))
    state = SimpleNamespace(
        global_step=draw(st.one_of(st.integers(60, 400), st.integers(-5, 100))),
        epoch=draw(st.one_of(st.none(), st.floats())),
        best_val_loss=draw(st.one_of(st.floats(), st.just(math.nan))),
        use_qlora=draw(st.booleans()),
        per_param=per_param,
        implausible=implausible,
    )
    error = draw(
        st.sampled_from(
            [
                None,
                MissingFileError("no such file", path="/s/training_state.pt"),
                TrainingStateError("payload is a list, not the dict dlm writes", path="/s/t.pt"),
                TrainingStateError("no path involved"),
            ]
        )
    )
    has_state = draw(st.sampled_from([True] * 7 + [False]))
    has_attribution = draw(st.sampled_from([True] * 4 + [False]))
    return SimpleNamespace(
        state=state if has_state else None,
        error=None if has_state else error,
        grouping=grouping if draw(st.sampled_from([True] * 4 + [False])) else None,
        grouping_error=None,
        attribution=attribution if has_attribution else None,
        attribution_error=None if has_attribution else draw(st.one_of(st.none(), NAME)),
        weights_error=draw(
            st.sampled_from([None] * 9 + [WeightsError("bad header", path="/s/a.safetensors")])
        ),
        optimizer=draw(st.sampled_from([None, "adam", "adafactor", "bnb 8-bit"])),
        note=draw(st.sampled_from([None] * 11 + ["a bare PEFT adapter: no optimizer state"])),
    )


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


ABOVE_ONE = st.one_of(
    st.floats(1, 1e12, exclude_min=True), st.sampled_from([1.0000001, 2.0, 1000.0, 1e300])
)
DECADES = st.one_of(st.floats(0, 10, exclude_min=True), st.sampled_from([1e-300, 400.0, 1e300]))
OPTIONS = st.one_of(
    st.builds(
        GhostOptions,
        rules=st.just("sway"),
        min_steps_threshold=_maybe(st.integers(1, 100)),
        undertrained_layer_ratio=_maybe(ABOVE_ONE),
        layer_failure_frac=_maybe(st.floats(0, 1)),
    ),
    st.builds(
        GhostOptions,
        rules=st.just("robust"),
        min_steps_threshold=_maybe(st.integers(1, 100)),
        layer_outlier_ratio=_maybe(ABOVE_ONE),
        min_layers_compared=_maybe(st.integers(3, 10)),
        layer_lift_decades=_maybe(DECADES),
        first_layer_lift_decades=_maybe(DECADES),
        layer_lift_share=_maybe(st.floats(0, 1, exclude_min=True)),
    ),
)


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(inputs=states(), options=OPTIONS)
def test_every_state_gets_a_verdict(inputs: SimpleNamespace, options: GhostOptions) -> None:
    result = well_formed(judge_ghost(inputs, options))
    converted = judge_ghost(_core.ghost_input_of(inputs), options)
    assert (converted.verdict, converted.message) == (result.verdict, result.message)
    event(result.verdict.value)
    for rule in rules_of(result):
        event(rule)


@SETTINGS
@given(inputs=states(), options=OPTIONS, seed=st.integers(0, 2**32 - 1))
def test_the_order_parameters_are_listed_in_changes_nothing(
    inputs: SimpleNamespace, options: GhostOptions, seed: int
) -> None:
    assume(inputs.state is not None)
    before = well_formed(judge_ghost(inputs, options))
    per_param = list(inputs.state.per_param)
    random.Random(seed).shuffle(per_param)
    inputs.state.per_param = per_param
    after = well_formed(judge_ghost(inputs, options))
    assert outcome(after) == outcome(before), (before.message, after.message)


@SETTINGS
@given(
    inputs=states(),
    rules=st.sampled_from(["robust", "sway"]),
    exponent=st.sampled_from([-40, -7, -1, 1, 9, 40]),
)
def test_scaling_every_second_moment_by_a_power_of_two_changes_no_verdict(
    inputs: SimpleNamespace, rules: str, exponent: int
) -> None:
    assume(inputs.state is not None)
    means = [p.exp_avg_sq_mean for p in inputs.state.per_param]
    # Scaled values stay normal floats, so every ratio between them is exact.
    assume(all(m == 0.0 or (math.isfinite(m) and 1e-200 < abs(m) < 1e200) for m in means))
    options = resolve(GhostOptions, None, rules, {})
    before = well_formed(judge_ghost(inputs, options))
    for p in inputs.state.per_param:
        p.exp_avg_sq_mean *= 2.0**exponent
    after = well_formed(judge_ghost(inputs, options))
    assert outcome(after) == outcome(before), (before.message, after.message)
    event(f"{rules} {before.verdict.value}")


def layered(values: list[float], *, slots: int = 1, step: int = 200) -> SimpleNamespace:
    """A state whose parameter ``i`` is slot ``i % slots`` of layer ``i // slots``."""
    layers = len(values) // slots
    return SimpleNamespace(
        state=SimpleNamespace(
            global_step=step,
            per_param=[
                SimpleNamespace(param_id=i, exp_avg_sq_mean=v, nonfinite=0)
                for i, v in enumerate(values)
            ],
        ),
        attribution=SimpleNamespace(
            layer_indices=list(range(layers)),
            params=[
                SimpleNamespace(param_id=i, layer=i // slots, slot=i % slots)
                for i in range(layers * slots)
            ],
            slot_names=[f"layers.N.proj{j}.lora_A" for j in range(slots)],
        ),
    )


@pytest.mark.parametrize("rules", ["robust", "sway"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_zero_and_too_few_steps_fail(rules: str, bad: float) -> None:
    options = resolve(GhostOptions, None, rules, {})
    calm = [1e-6] * 8
    assert judge_ghost(layered(calm), options).verdict.value == "pass"
    # robust: one NaN/inf tensor is enough; sway (the seed's rule) fails when
    # no tensor is left finite.
    poisoned = [*calm[:-1], bad] if rules == "robust" else [bad] * 8
    assert well_formed(judge_ghost(layered(poisoned), options)).verdict.value == "fail"
    zero = well_formed(judge_ghost(layered([0.0] * 8), options))
    assert zero.verdict.value == ("fail" if rules == "robust" else "pass")  # the seed's rule
    short = well_formed(judge_ghost(layered(calm, step=options.min_steps_threshold - 1), options))
    assert short.verdict.value == "fail" and "is below" in short.message
    at_floor = judge_ghost(layered(calm, step=options.min_steps_threshold), options)
    assert at_floor.verdict.value == "pass"


@settings(max_examples=150, deadline=None)
@given(
    layers=st.integers(5, 24),
    slots=st.integers(1, 3),
    where=st.data(),
    ratio=st.sampled_from([2.0, 50.0, 1000.0]) | st.floats(1.5, 1e5),
    margin=st.sampled_from([0.01, 0.3]),
)
def test_an_outlier_layer_warns_just_past_the_threshold_and_not_before(
    layers: int, slots: int, where: st.DataObject, ratio: float, margin: float
) -> None:
    """Every tensor of one layer x times those of the others: robust WARNs
    layer_outliers exactly when x > layer_outlier_ratio (the lift rule set
    out of reach here), and names the layer."""
    hot = where.draw(st.integers(0, layers - 1), label="hot layer")
    options = resolve(
        GhostOptions,
        None,
        "robust",
        {"layer_outlier_ratio": ratio, "layer_lift_decades": 300, "first_layer_lift_decades": 300},
    )

    def with_factor(x: float) -> ProbeResult:
        values = [1e-6 * (j + 1) for _ in range(layers) for j in range(slots)]
        for j in range(slots):
            values[hot * slots + j] *= x
        return well_formed(judge_ghost(layered(values, slots=slots), options))

    above = with_factor(ratio * (1 + margin))
    assert outcome(above) == ("warn", {"layer_outliers"}), above.message
    assert f"layer {hot} " in above.message
    below = with_factor(ratio * (1 - margin))
    assert outcome(below) == ("pass", set()), below.message


@settings(max_examples=150, deadline=None)
@given(
    layers=st.integers(6, 24),
    where=st.data(),
    decades=st.sampled_from([0.5, 1.0, 2.0]) | st.floats(0.2, 6.0),
    margin=st.sampled_from([0.02, 0.3]),
)
def test_an_exploding_layer_warns_just_past_its_lift_and_not_before(
    layers: int, where: st.DataObject, decades: float, margin: float
) -> None:
    """One layer lifted d decades above calm peers: exploding_layers exactly
    when d > layer_lift_decades (layer 0 has a threshold of its own)."""
    hot = where.draw(st.integers(1, layers - 1), label="hot layer")
    options = resolve(
        GhostOptions, None, "robust", {"layer_lift_decades": decades, "layer_outlier_ratio": 1e300}
    )

    def lifted(d: float) -> ProbeResult:
        values = [1e-6] * layers
        values[hot] *= 10.0**d
        return well_formed(judge_ghost(layered(values), options))

    above = lifted(decades + margin)
    assert outcome(above) == ("warn", {"exploding_layers"}), above.message
    assert f"layer {hot} +" in above.message
    below = lifted(decades - margin)
    assert outcome(below) == ("pass", set()), below.message


def test_a_tensor_without_gradient_among_live_ones_warns() -> None:
    values = [1e-6] * 16  # 8 layers, 2 slots
    values[7] = 0.0  # layer 3's second slot
    result = well_formed(judge_ghost(layered(values, slots=2), GhostOptions()))
    assert outcome(result) == ("warn", {"dead_tensors"}), result.message
    assert "layer 3 " in result.message


def test_huge_lifts_and_options_spell_inf():
    """A 600-decade lift: 10**600 overflows a float; the message says inf."""
    means = [1e-300, 1e-300, 1e300, 1e-300, 1e-300]
    inputs = SimpleNamespace(
        state=SimpleNamespace(
            global_step=100,
            per_param=[SimpleNamespace(param_id=i, exp_avg_sq_mean=m) for i, m in enumerate(means)],
        ),
        attribution=SimpleNamespace(
            layer_indices=list(range(5)),
            params=[SimpleNamespace(param_id=i, layer=i, slot=0) for i in range(5)],
            slot_names=["q"],
        ),
    )
    got = well_formed(judge_ghost(inputs, GhostOptions(layer_outlier_ratio=1e300)))
    assert "layer 2 +600.00 decades (infx) in 1/1 tensors" in got.message
    assert "layer 2 infx (top: q infx)" in got.message  # 1e300 / 1e-300
    calm = SimpleNamespace(
        state=SimpleNamespace(
            global_step=100,
            per_param=[SimpleNamespace(param_id=i, exp_avg_sq_mean=1e-6) for i in range(5)],
        ),
        attribution=inputs.attribution,
    )
    got = well_formed(judge_ghost(calm, GhostOptions(layer_lift_decades=1e300)))
    assert got.verdict == "pass" and "none exploding (infx its nearest layers)" in got.message


# ---- real inputs ----

#: gradient_ghost's robust verdict on each corpus label: the faults whose
#: mechanism shows in the optimizer state are flagged; the others need the
#: loss curve (training_drift) and pass here.
CORPUS_GHOST = {
    "healthy": {"pass"},
    "too_few_steps": {"fail"},
    "dead_adapter": {"fail"},
    "nan_second_moments": {"fail"},
    "exploded_second_moments": {"warn"},
}


def _versions(root: Path) -> list[Path]:
    """Every version dir or state file under ``root`` the probe could be given."""
    found = set()
    for path in root.rglob("*"):
        if path.name in ("training_state.pt", "optimizer.pt", "trainer_state.json"):
            found.add(path.parent)
        elif path.suffix == ".ckpt" or (
            path.is_dir()
            and (path.parent.name == "versions" or path.name.startswith("checkpoint-"))
        ):
            found.add(path)
    return sorted(found)


def test_every_repo_input_gets_a_verdict() -> None:
    verdicts: set[str] = set()
    for root in (DEMO_STORE, ROOT / "rust/testdata", ROOT / "tests/hostile"):
        for version in _versions(root):
            inputs = _core.ghost_input(version)
            for rules in ("robust", "sway"):
                verdicts.add(well_formed(judge_ghost(inputs, GhostOptions(rules=rules))).verdict)
    # The demo stores pass and fail, the test data holds foreign and
    # hostile states (errors) and states without second moments (skips).
    assert {"pass", "fail", "error", "skip"} <= {v.value for v in verdicts}


def test_the_corpus_faults_that_reach_the_optimizer_are_flagged(corpus) -> None:
    root, labels = corpus
    for name, label in labels.items():
        versions = sorted((root / name / "adapter" / "versions").iterdir())
        result = well_formed(judge_ghost(_core.ghost_input(versions[-1]), GhostOptions()))
        if label in CORPUS_GHOST:
            assert result.verdict.value in CORPUS_GHOST[label], (name, result.message)


def test_real_trainer_runs(field_root) -> None:
    """HF Trainer runs: healthy ones pass; lora_B frozen at zero leaves its
    second moments at exactly zero."""
    labels = json.loads((field_root / "labels.json").read_text(encoding="utf-8"))
    for name, info in labels.items():
        for version in _versions(field_root / name):
            result = well_formed(judge_ghost(_core.ghost_input(version), GhostOptions()))
            if info["label"] == "healthy":
                assert result.verdict.value == "pass", (name, version.name, result.message)


def test_plain_data_that_cannot_be_a_grouping_is_refused():
    grouping = SimpleNamespace(layer_indices=(0, 1), params_per_layer=1, layer_of={0: 0, 2: 1})
    inputs = SimpleNamespace(
        state=SimpleNamespace(global_step=100, per_param=[]), grouping=grouping
    )
    with pytest.raises(ValueError, match=r"param id 0\.\.2 to its layer; 1 is missing"):
        judge_ghost(inputs, GhostOptions(rules="sway"))
    # An error held in the input keeps its class: a missing file is a skip.
    missing = SimpleNamespace(state=None, error=MissingFileError("gone", path="/v/t.pt"))
    r = judge_ghost(missing, GhostOptions())
    assert (r.verdict, r.message) == ("skip", "/v/t.pt: gone")
