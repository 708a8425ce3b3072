"""training_drift's Rust kernel (``_core.judge_drift``) against its plain-Python
reference (tests/reference/drift_rules.py): the same verdict, score, raw,
message and evidence, floats bit for bit, on arbitrary curves, side series,
input states and options (both rule sets), and on every real input the
repository has (the demo store, rust/testdata's logs, real training runs).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import drift_rules

from adapterprobe import _core
from adapterprobe._core import LogsStatus
from adapterprobe.probes.drift import DriftOptions, judge_drift
from adapterprobe.probes.result import ProbeResult

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
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_result(got: ProbeResult, want: ProbeResult) -> None:
    assert got.kind == want.kind and got.name == want.name
    assert got.verdict is want.verdict, (got.verdict, want.verdict, got.message, want.message)
    assert got.message == want.message
    same(got.score, want.score, "score")
    same(got.raw, want.raw, "raw")
    same(got.evidence, want.evidence, "evidence")


def check(inputs: Any, options: DriftOptions) -> ProbeResult:
    """The kernel's answer, asserted identical to the reference's."""
    want = drift_rules.judge_drift(inputs, options, name="run")
    got = judge_drift(inputs, options, name="run")
    assert_same_result(got, want)
    return got


# ---- arbitrary values ----

odd_floats = st.sampled_from(
    [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 5e-324, 1e300, -1.0, 1e-9, 1e-3]
)
any_float = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), odd_floats)
loss_value = st.one_of(
    st.floats(min_value=0.0, max_value=20.0),
    st.floats(min_value=-5.0, max_value=5.0),
    any_float,
)


@st.composite
def loss_series(draw: st.DrawFn) -> list[float]:
    """Loss sequences of every shape: arbitrary values, and noisy decays that
    plateau, climb back (regress), hump (unstable), diverge or never fall,
    with spikes, NaN/inf and zeros; RL-like objectives below or near zero."""
    n = draw(st.one_of(st.integers(0, 5), st.integers(0, 90)))
    shape = draw(st.sampled_from(["any", "decay", "regress", "hump", "flat", "diverge"]))
    if shape == "any":
        return draw(st.lists(loss_value, min_size=n, max_size=n))
    scale = draw(st.sampled_from([4.0, 4.0, 1.0, 0.01, 100.0, 1e-6, -1.0]))
    rate = draw(st.floats(min_value=0.8, max_value=1.0 if shape != "flat" else 1.02))
    if shape == "flat":
        rate = 1.0 - (1.0 - rate) / 50
    floor = draw(st.sampled_from([0.05, 0.05, 0.0, 1.0, -0.5, 1e-8]))
    noise = draw(st.sampled_from([0.0, 0.0, 0.003, 0.01, 0.1, 0.5]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    out = [scale * rate**i + floor + noise * rng.gauss(0, 1) * abs(scale) for i in range(n)]
    if out and shape in ("regress", "hump", "diverge"):
        lo = {"diverge": 0, "regress": len(out) // 3, "hump": len(out) // 5}[shape]
        hi = len(out) // 2 if shape == "hump" else len(out) - 1
        k = draw(st.integers(lo, max(lo, hi)))
        m = len(out) - k
        size = {"regress": [0.1, 0.2, 0.3], "hump": [0.6, 1.5, 3.0], "diverge": [0.3, 1.5, 3.0]}
        lift = draw(st.sampled_from(size[shape])) * abs(scale)
        if shape == "hump":  # up and back down again
            out[k:] = [v + lift * 2 * min(j, m - j) / m for j, v in enumerate(out[k:])]
        else:
            out[k:] = [v + lift * (j + 1) / m for j, v in enumerate(out[k:])]
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 4]))):
        if out:
            i = draw(st.integers(0, len(out) - 1))
            factor = draw(st.sampled_from([1.5, 3.0, 10.0]))
            bad = st.sampled_from([math.nan, math.inf, -math.inf, 0.0])
            out[i] = draw(st.one_of(bad, st.just(out[i] * factor), any_float))
    return out


@st.composite
def step_numbers(draw: st.DrawFn, n: int) -> list[int]:
    """Steps for ``n`` records: every step, a logging cadence, arbitrary gaps,
    or arbitrary (possibly repeated, unsorted) numbers."""
    kind = draw(st.sampled_from(["every", "cadence", "gaps", "any"]))
    start = draw(st.integers(-5, 10**6))
    if kind == "every":
        return list(range(start, start + n))
    if kind == "cadence":
        every = draw(st.integers(2, 500))
        return list(range(start, start + every * n, every))
    if kind == "gaps":
        gaps = draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n))
        return [start + sum(gaps[: i + 1]) for i in range(n)]
    return draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n))


@st.composite
def side_series(draw: st.DrawFn, steps: list[int], kind: str) -> list[tuple[int, float]]:
    if not draw(st.booleans()):
        return []
    n = draw(st.integers(0, 40))
    if kind == "zeros":
        values = st.one_of(st.just(0.0), st.floats(0.0, 10.0), any_float)
    else:
        values = st.one_of(st.floats(0.01, 10.0), any_float, st.just(0.0))
    at = st.sampled_from(steps) if steps and draw(st.booleans()) else st.integers(-10, 10**6)
    if kind == "eval" and draw(st.booleans()):
        # a real-looking eval curve: falls, then rises (overfitting)
        base = draw(st.floats(0.5, 5.0))
        turn = draw(st.integers(1, 10))
        pts = sorted(set(draw(st.lists(at, min_size=3, max_size=12))))
        return [
            (s, base * (0.8 ** min(i, turn)) * (1.3 ** max(0, i - turn))) for i, s in enumerate(pts)
        ]
    return draw(st.lists(st.tuples(at, values), max_size=n))


@st.composite
def curves(draw: st.DrawFn) -> Any:
    losses = draw(loss_series())
    steps = draw(step_numbers(len(losses)))
    records = list(zip(steps, losses, strict=True))
    curve_steps = sorted(set(steps))
    grad_norm = draw(side_series(curve_steps, "zeros"))
    if curve_steps and draw(st.integers(0, 4)) == 0:
        # the Trainer's NaN masking: a NaN gradient norm and the loss logged as 0.0
        masked = draw(st.lists(st.sampled_from(curve_steps), min_size=1, max_size=3))
        records += [(s, draw(st.sampled_from([0.0, -0.0, 1.0]))) for s in masked]
        grad_norm += [(s, math.nan) for s in masked]
    return _core.loss_curve_from_records(
        records,
        eval_loss=draw(side_series(curve_steps, "eval")),
        grad_norm=grad_norm,
        learning_rate=draw(side_series(curve_steps, "zeros")),
        files=[f"/runs/r/logs/train-{i:06d}.jsonl" for i in range(draw(st.integers(0, 3)))],
        source=draw(st.sampled_from(["dlm", "trainer_state", "tensorboard", "csv"])),
    )


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def unit(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(min_value=low, max_value=high)


@st.composite
def drift_options(draw: st.DrawFn) -> DriftOptions:
    rules = draw(st.sampled_from(["robust", "sway"]))
    given: dict[str, Any] = {"min_steps": draw(maybe(st.integers(2, 40)))}
    if rules == "sway":
        given |= {
            "rolling_window": draw(maybe(st.integers(2, 30))),
            "spike_sigma": draw(maybe(st.floats(min_value=1e-3, max_value=20.0))),
            "assert_smoothness_gte": draw(maybe(unit(0.0, 1.0))),
            "assert_convergence_ratio_lte": draw(maybe(st.floats(min_value=1e-3, max_value=5.0))),
            "assert_instability_events_lte": draw(maybe(st.integers(0, 5))),
        }
    else:
        given |= {
            "min_spike_records": draw(maybe(st.integers(3, 60))),
            "trend_window": draw(maybe(st.integers(3, 31))),
            "spike_false_alarm": draw(maybe(unit(1e-6, 0.5).filter(lambda x: x > 0))),
            "spike_z": draw(maybe(st.floats(min_value=1e-3, max_value=30.0))),
            "min_spike_rise": draw(maybe(unit(0.0, 2.0))),
            "spike_fall_share": draw(maybe(unit(0.0, 2.0))),
            "max_spike_events": draw(maybe(st.integers(0, 4))),
            "min_relative_drop": draw(maybe(unit(0.0, 1.0))),
            "max_regression": draw(maybe(unit(0.0, 2.0))),
            "max_eval_rise": draw(maybe(unit(0.0, 2.0))),
        }
    return DriftOptions.from_given(rules=rules, **given)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(curve=curves(), options=drift_options())
def test_kernel_matches_reference_on_arbitrary_curves(curve: Any, options: DriftOptions) -> None:
    inputs = _core.drift_input_from("/runs/r", LogsStatus.Curve, curve=curve)
    check(inputs, options)


paths = st.sampled_from(
    ["/runs/r", "/runs//r/", "/runs/./r", "runs/r", "//net/r", "/", ".", "/a b/ü/r", "x/../y"]
)


@settings(max_examples=150, deadline=None)
@given(
    status=st.sampled_from(["NoLogsDir", "NoFiles", "Failed", "Curve"]),
    store=paths,
    logs_dir=maybe(paths),
    note=maybe(st.one_of(st.just(""), st.text(max_size=30))),
    error=st.text(max_size=30),
    error_path=maybe(paths),
    files=st.lists(paths, max_size=3),
    options=drift_options(),
    curve=curves(),
)
def test_kernel_matches_reference_in_every_state(
    status: str,
    store: str,
    logs_dir: str | None,
    note: str | None,
    error: str,
    error_path: str | None,
    files: list[str],
    options: DriftOptions,
    curve: Any,
) -> None:
    inputs = _core.drift_input_from(
        store,
        getattr(LogsStatus, status),
        logs_dir=logs_dir,
        files=files,
        curve=curve if status == "Curve" else None,
        error=error if status == "Failed" else None,
        error_path=error_path,
        note=note,
    )
    check(inputs, options)


def decay(n: int, lift_at: int | None = None, lift: float = 0.0, hump: bool = False) -> list[float]:
    out = [4.0 * 0.9**i + 0.05 for i in range(n)]
    if lift_at is not None:
        m = n - lift_at
        for j in range(m):
            out[lift_at + j] += lift * (2 * min(j, m - j) / m if hump else (j + 1) / m)
    return out


def test_every_rule_fires_somewhere_and_agrees() -> None:
    """One curve per rule (so the comparison covers each branch for sure,
    not only where Hypothesis happens to go), both rule sets."""
    masked = [*decay(40)[:39], 0.0]
    spiky = decay(80)
    spiky[50] = 3.0
    cases = [
        (decay(60), {}),
        (decay(60, 30, 1.0), {}),  # regressed
        (decay(60, 12, 6.0, hump=True), {}),  # unstable
        ([1.0 + 0.05 * i for i in range(40)], {}),  # diverged
        ([2.0] * 40, {}),  # no progress
        (spiky, {}),  # a spike
        ([*decay(30)[:29], math.nan], {}),  # the last loss NaN
        ([math.nan] * 5, {}),  # no finite loss
        ([-0.5 + 0.01 * i for i in range(30)], {}),  # an RL objective
        (masked, {"grad_norm": [(s, math.nan if s == 39 else 0.0) for s in range(40)]}),
        (decay(40), {"grad_norm": [(s, math.inf if s % 5 == 0 else 1.0) for s in range(40)]}),
        (decay(40), {"learning_rate": [(s, 0.0) for s in range(40)]}),
        (decay(40), {"eval_loss": [(0, 2.0), (10, 1.0), (20, math.nan), (39, 1.5)]}),
        (decay(8), {}),  # spikes not judged; too short for sway
    ]
    for losses, steps in [([2.0, 1.0], [0, 1]), ([2.0, 1.0], [0, 9]), ([3.0, 2.0, 1.0], [5, 6, 7])]:
        curve = _core.loss_curve_from_records(list(zip(steps, losses, strict=True)))
        inputs = _core.drift_input_from("/r", LogsStatus.Curve, curve=curve)
        for rules in ("robust", "sway"):
            check(inputs, DriftOptions(rules=rules, min_steps=2))
    seen: set[str] = set()
    for losses, side in cases:
        curve = _core.loss_curve_from_records(list(enumerate(losses)), **side)
        inputs = _core.drift_input_from("/r", LogsStatus.Curve, curve=curve)
        for options in ALL_OPTIONS:
            r = check(inputs, options)
            seen.add(f"{options.rules}:{r.verdict.value}")
            seen.update(f["rule"] for f in r.evidence.get("findings", []))
            if r.evidence.get("objective"):
                seen.add("not_positive")
    assert seen >= {
        "regressed",
        "unstable",
        "diverged",
        "no_progress",
        "loss_spikes",
        "nonfinite_loss",
        "nan_masked",
        "nonfinite_grad_norm",
        "zero_gradients",
        "zero_learning_rate",
        "nonfinite_eval_loss",
        "eval_rising",
        "not_positive",
        "robust:pass",
        "robust:warn",
        "robust:fail",
        "sway:pass",
        "sway:warn",
        "sway:skip",
    }, seen


def test_constructor_refuses_inconsistent_states() -> None:
    curve = _core.loss_curve_from_records([(0, 1.0)])
    with pytest.raises(ap_errors().UsageError):
        _core.drift_input_from("/r", LogsStatus.Curve)
    with pytest.raises(ap_errors().UsageError):
        _core.drift_input_from("/r", LogsStatus.NoFiles, curve=curve)
    with pytest.raises(ap_errors().UsageError):
        _core.drift_input_from("/r", LogsStatus.Failed)


def ap_errors() -> Any:
    import adapterprobe.errors

    return adapterprobe.errors


# ---- every real input ----

ALL_OPTIONS = [DriftOptions(rules="robust"), DriftOptions(rules="sway")]


def judge_every_folder(root: Path, depth: int = 2) -> int:
    """Both rule sets on the drift input of ``root`` and of every folder up
    to ``depth`` below it; how many inputs held a curve."""
    folders = [root]
    level = [root]
    for _ in range(depth):
        level = sorted(p for d in level for p in d.iterdir() if p.is_dir())
        folders += level
    curves_seen = 0
    for folder in folders:
        inputs = _core.drift_input(folder)
        curves_seen += inputs.status == LogsStatus.Curve
        for options in ALL_OPTIONS:
            check(inputs, options)
    return curves_seen


def test_kernel_matches_reference_on_the_demo_store(demo_store: Path) -> None:
    assert judge_every_folder(demo_store) >= 3


def test_kernel_matches_reference_on_testdata_logs() -> None:
    assert judge_every_folder(ROOT / "rust" / "testdata" / "logs", depth=3) >= 3


def test_kernel_matches_reference_on_real_training_runs(field_root: Path) -> None:
    assert judge_every_folder(field_root) >= 10


def test_kernel_matches_reference_on_the_labelled_corpus(
    corpus: tuple[Path, dict[str, str]],
) -> None:
    root, labels = corpus
    assert judge_every_folder(root) >= len(labels) // 2
