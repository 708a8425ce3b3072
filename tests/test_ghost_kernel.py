"""gradient_ghost's Rust kernel against its plain-Python reference
(tests/reference/ghost_rules.py): the same verdict, score, raw, message and
evidence (keys in the same order, floats bit for bit, NaN equal to NaN) on
arbitrary states under both rule sets and arbitrary valid options, and on
every real input the repo has or trains."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import ghost_rules as ref

from adapterprobe import _core
from adapterprobe.errors import MissingFileError, TrainingStateError, WeightsError
from adapterprobe.probes.ghost import GhostOptions, judge_ghost
from adapterprobe.probes.result import ProbeResult
from adapterprobe.scan import DEMO_STORE

ROOT = Path(__file__).resolve().parents[1]


def _same(a: Any, b: Any, where: str = "") -> None:
    """``a`` and ``b`` equal in value, type and order; floats bit for bit
    (NaN equal to NaN)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__} ({a!r}, {b!r})"
    if isinstance(a, float):
        if math.isnan(a):
            assert math.isnan(b), f"{where}: {a!r} != {b!r}"
        else:
            assert struct.pack("<d", a) == struct.pack("<d", b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _same_result(got: ProbeResult, want: ProbeResult) -> None:
    assert (got.name, got.kind, got.verdict) == (want.name, want.kind, want.verdict), (
        got.message,
        want.message,
    )
    _same(got.message, want.message, "message")
    _same(got.score, want.score, "score")
    _same(got.raw, want.raw, "raw")
    _same(got.evidence, want.evidence, "evidence")


def _compare(inputs: Any, options: GhostOptions) -> ProbeResult:
    """Kernel and reference on the same GhostInput; returns the kernel's answer."""
    want = ref.judge_ghost(inputs, options)
    got = judge_ghost(inputs, options)
    _same_result(got, want)
    return got


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


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=states(), options=OPTIONS)
def test_kernel_matches_reference_on_arbitrary_states(inputs, options):
    converted = _core.ghost_input_of(inputs)
    got = _compare(converted, options)
    # The plain data judged as it is (converted inside judge_ghost) and as
    # the reference reads it: ghost_input_of keeps everything the rules read.
    _same_result(judge_ghost(inputs, options), got)
    _same_result(ref.judge_ghost(inputs, options), got)


def test_the_comparison_can_fail():
    """A differing message, a -0.0 for 0.0, an int for a float: all caught."""
    a = ProbeResult(name="g", kind="k", verdict="pass", score=0.9, evidence={"x": 0.0})
    for b in (
        ProbeResult(name="g", kind="k", verdict="pass", score=0.9, evidence={"x": -0.0}),
        ProbeResult(name="g", kind="k", verdict="pass", score=0.9, evidence={"x": 0}),
        ProbeResult(
            name="g", kind="k", verdict="pass", score=0.9, message="m", evidence={"x": 0.0}
        ),
        ProbeResult(name="g", kind="k", verdict="pass", score=0.8, evidence={"x": 0.0}),
    ):
        with pytest.raises(AssertionError):
            _same_result(a, b)


def test_huge_lifts_and_options_spell_inf_where_python_overflows():
    # A 600-decade lift: 10**600 overflows a float; the kernel writes inf.
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
    got = _compare(_core.ghost_input_of(inputs), GhostOptions(layer_outlier_ratio=1e300))
    assert "layer 2 +600.00 decades (infx) in 1/1 tensors" in got.message
    assert "layer 2 infx (top: q infx)" in got.message  # 1e300 / 1e-300
    calm = SimpleNamespace(
        state=SimpleNamespace(
            global_step=100,
            per_param=[SimpleNamespace(param_id=i, exp_avg_sq_mean=1e-6) for i in range(5)],
        ),
        attribution=inputs.attribution,
    )
    got = _compare(_core.ghost_input_of(calm), GhostOptions(layer_lift_decades=1e300))
    assert got.verdict == "pass" and "none exploding (infx its nearest layers)" in got.message


# ---- real inputs ----

OPTION_SETS = [
    GhostOptions(rules="robust"),
    GhostOptions(rules="sway"),
    # Thresholds low enough that real states raise every per-layer finding.
    GhostOptions(
        rules="robust",
        layer_outlier_ratio=1.0001,
        layer_lift_decades=0.01,
        first_layer_lift_decades=0.01,
        layer_lift_share=0.5,
    ),
    GhostOptions(rules="sway", undertrained_layer_ratio=1.01, layer_failure_frac=0.0),
]


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


def _plain_state(inputs: Any) -> SimpleNamespace:
    """``inputs`` with its state as plain data (the readers' other objects kept)."""
    state = inputs.state
    per_param = [
        SimpleNamespace(
            param_id=p.param_id, exp_avg_sq_mean=p.exp_avg_sq_mean, nonfinite=p.nonfinite
        )
        for p in state.per_param
    ]
    fields = ("global_step", "epoch", "best_val_loss", "use_qlora", "implausible")
    plain = SimpleNamespace(per_param=per_param, **{f: getattr(state, f) for f in fields})
    keep = ("note", "error", "optimizer", "grouping", "attribution", "attribution_error")
    return SimpleNamespace(
        state=plain, weights_error=inputs.weights_error, **{f: getattr(inputs, f) for f in keep}
    )


def _judge_all(roots: list[Path]) -> dict[str, int]:
    verdicts: dict[str, int] = {}
    for root in roots:
        for version in _versions(root):
            inputs = _core.ghost_input(version)
            for options in OPTION_SETS:
                got = _compare(inputs, options)
                verdicts[got.verdict.value] = verdicts.get(got.verdict.value, 0) + 1
                if inputs.state is not None:
                    # As benches/bench_ghost_layers.py scales a real state: plain
                    # data beside the readers' own grouping and attribution.
                    mixed = _plain_state(inputs)
                    _same_result(judge_ghost(mixed, options), got)
                    _same_result(ref.judge_ghost(mixed, options), got)
    return verdicts


def test_kernel_matches_reference_on_the_repo_inputs():
    verdicts = _judge_all([DEMO_STORE, ROOT / "rust/testdata", ROOT / "tests/hostile"])
    # The demo stores pass and fail, the test data holds foreign and
    # hostile states (errors) and states without second moments (skips).
    assert {"pass", "fail", "error", "skip"} <= set(verdicts), verdicts


def test_kernel_matches_reference_on_real_runs(corpus, field_root):
    verdicts = _judge_all([corpus[0], field_root])
    assert {"pass", "warn", "fail"} <= set(verdicts), verdicts


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
