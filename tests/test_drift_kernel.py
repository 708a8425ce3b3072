"""What training_drift's verdicts must do, checked on its Rust kernel
(rust/verdicts/drift/, the one implementation of its rules, with unit tests
per rule beside it) through ``judge_drift``:

- every curve, side series, input state and option set of both rule sets
  gets a verdict and JSON-able evidence, never an exception;
- a coarser logging cadence (every k-th record) keeps a healthy curve
  healthy; multiplying a positive loss by a power of two changes no verdict
  (the trend rules are relative; the one absolute floor is the 2% fall
  ``no_progress`` asks of the loss, itself relative to the start);
- a NaN as the last loss, and a sustained climb above the start, FAIL;
- every rule fires on a curve made for it, under both rule sets;
- the real inputs the repository has get a verdict, and the labelled corpus
  is judged as its physics says.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from verdict_checks import rules_of, well_formed

from adapterprobe import _core
from adapterprobe._core import LogsStatus, _testing
from adapterprobe.probes.drift import DriftOptions, judge_drift
from adapterprobe.probes.options import resolve
from adapterprobe.probes.result import ProbeResult

ROOT = Path(__file__).resolve().parents[1]


def check(inputs: Any, options: DriftOptions) -> ProbeResult:
    """The kernel's answer, well formed (verdict_checks), never an exception."""
    return well_formed(judge_drift(inputs, options, name="run"))


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
    return _testing.loss_curve_from_records(
        records,
        eval_loss=draw(side_series(curve_steps, "eval")),
        grad_norm=grad_norm,
        learning_rate=draw(side_series(curve_steps, "zeros")),
        reward=draw(side_series(curve_steps, "zeros")),
        progress=draw(maybe(st.tuples(st.integers(-5, 200), st.integers(-5, 2000)))),
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
def test_every_curve_gets_a_verdict(curve: Any, options: DriftOptions) -> None:
    inputs = _testing.drift_input_from("/runs/r", LogsStatus.Curve, curve=curve)
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
def test_every_input_state_gets_a_verdict(
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
    inputs = _testing.drift_input_from(
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


def test_every_rule_fires_on_a_curve_made_for_it() -> None:
    """One curve per rule (so each branch is reached for sure, not only
    where Hypothesis happens to go), both rule sets."""
    masked = [*decay(40)[:39], 0.0]
    spiky = [v + 0.3 for v in decay(80)]  # settles well above zero
    spiky[50] = 3.0
    jump = [1e8 * 0.6**i + 5.0 for i in range(40)] + [2e6] * 12 + [8.0] * 30
    peaked = [(s, 0.1 + 0.014 * s if s < 50 else 0.8 - 0.012 * (s - 50)) for s in range(100)]
    cases = [
        (decay(60), {}),
        (decay(60, 30, 1.0), {}),  # regressed
        (decay(60, 12, 6.0, hump=True), {}),  # unstable
        ([1.0 + 0.05 * i for i in range(40)], {}),  # diverged
        ([2.0 + 1e-4 * (i % 2) for i in range(40)], {}),  # no progress
        ([2.0] * 40, {}),  # constant
        ([0.6931, 0.3, 0.1, 0.0, 0.0], {}),  # a preference loss collapsed
        (decay(4), {}),  # a run of 3 steps
        (spiky, {}),  # a spike
        ([*decay(30)[:29], math.nan], {}),  # the last loss NaN
        ([math.nan] * 5, {}),  # no finite loss
        ([-0.5 + 0.01 * i for i in range(30)], {}),  # an RL objective
        (masked, {"grad_norm": [(s, math.nan if s == 39 else 0.0) for s in range(40)]}),
        (decay(40), {"grad_norm": [(s, math.inf if s % 5 == 0 else 1.0) for s in range(40)]}),
        (decay(40), {"learning_rate": [(s, 0.0) for s in range(40)]}),
        (decay(40), {"eval_loss": [(0, 2.0), (10, 1.0), (20, math.nan), (39, 1.5)]}),
        (decay(40), {"eval_loss": [(0, 2.0), (10, 1.0), (20, 1.3), (39, 1.5)]}),
        (decay(40), {"progress": (40, 1000)}),  # stopped early
        ([0.0] * 30, {}),  # degenerate
        (jump, {}),  # orders of magnitude
        ([0.0] * 100, {"reward": peaked}),  # reward fell from its peak
        ([0.0] * 40, {"reward": [(s, 0.0) for s in range(40)]}),  # zero reward
        (decay(8), {}),  # spikes not judged; too short for sway
    ]
    for losses, steps in [([2.0, 1.0], [0, 1]), ([2.0, 1.0], [0, 9]), ([3.0, 2.0, 1.0], [5, 6, 7])]:
        curve = _testing.loss_curve_from_records(list(zip(steps, losses, strict=True)))
        inputs = _testing.drift_input_from("/r", LogsStatus.Curve, curve=curve)
        for rules in ("robust", "sway"):
            check(inputs, DriftOptions(rules=rules, min_steps=2))
    seen: set[str] = set()
    for losses, side in cases:
        curve = _testing.loss_curve_from_records(list(enumerate(losses)), **side)
        inputs = _testing.drift_input_from("/r", LogsStatus.Curve, curve=curve)
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
        "stopped_early",
        "tiny_run",
        "constant_loss",
        "preference_collapse",
        "degenerate_loss",
        "order_jump",
        "reward_fell",
        "zero_reward",
        "not_positive",
        "robust:pass",
        "robust:warn",
        "robust:fail",
        "sway:pass",
        "sway:warn",
        "sway:skip",
    }, seen


def test_constructor_refuses_inconsistent_states() -> None:
    curve = _testing.loss_curve_from_records([(0, 1.0)])
    with pytest.raises(ap_errors().UsageError):
        _testing.drift_input_from("/r", LogsStatus.Curve)
    with pytest.raises(ap_errors().UsageError):
        _testing.drift_input_from("/r", LogsStatus.NoFiles, curve=curve)
    with pytest.raises(ap_errors().UsageError):
        _testing.drift_input_from("/r", LogsStatus.Failed)


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


def test_the_demo_store(demo_store: Path) -> None:
    assert judge_every_folder(demo_store) >= 3


def test_testdata_logs() -> None:
    assert judge_every_folder(ROOT / "rust" / "testdata" / "logs", depth=3) >= 3


def test_real_training_runs(field_root: Path) -> None:
    assert judge_every_folder(field_root) >= 10


def test_the_labelled_corpus(
    corpus: tuple[Path, dict[str, str]],
) -> None:
    root, labels = corpus
    assert judge_every_folder(root) >= len(labels) // 2
    # What training_drift must say of each label (robust): the faults the
    # loss curve carries are flagged; the ones only the optimizer state or
    # the weights show (dead adapter aside, whose loss does not move) pass.
    expected = {
        "healthy": {"pass"},
        "lr_too_high": {"warn", "fail"},
        "lr_too_low": {"warn", "fail"},
        "loss_spikes": {"warn", "fail"},
        "nan_losses": {"warn", "fail"},
        "dead_adapter": {"warn", "fail"},
    }
    for name, label in labels.items():
        if label in expected:
            got = check(_core.drift_input(root / name), DriftOptions())
            assert got.verdict.value in expected[label], (name, got.message)


# ---- properties of the verdicts ----


def judged(steps: list[int], losses: list[float], rules: str = "robust") -> ProbeResult:
    curve = _testing.loss_curve_from_records(list(zip(steps, losses, strict=True)))
    inputs = _testing.drift_input_from("/r", LogsStatus.Curve, curve=curve)
    return check(inputs, resolve(DriftOptions, None, rules, {}))


@st.composite
def healthy_runs(draw: st.DrawFn) -> tuple[list[int], list[float]]:
    """A run that trains: an exponential fall to a floor, with multiplicative
    minibatch noise of up to 5%, logged every ``every`` steps."""
    n = draw(st.integers(60, 1500))
    every = draw(st.sampled_from([1, 1, 5, 10, 50]))
    start, floor = draw(st.floats(0.5, 4.0)), draw(st.floats(0.05, 2.0))
    tau = draw(st.floats(0.1, 0.35)) * n
    sigma = draw(st.floats(0.0, 0.05))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    steps = [every * (i + 1) for i in range(n)]
    losses = [
        (start * math.exp(-i / tau) + floor) * math.exp(rng.gauss(0, sigma)) for i in range(n)
    ]
    return steps, losses


PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(run=healthy_runs(), k=st.integers(2, 10), offset=st.data())
def test_a_coarser_logging_cadence_keeps_a_healthy_run_healthy(
    run: tuple[list[int], list[float]], k: int, offset: st.DataObject
) -> None:
    steps, losses = run
    assume(judged(steps, losses).verdict.value == "pass")
    first = offset.draw(st.integers(0, k - 1), label="first record kept")
    assume(len(steps[first::k]) >= 10)
    thinned = judged(steps[first::k], losses[first::k])
    assert thinned.verdict.value == "pass", thinned.message


@PROPERTY
@given(run=healthy_runs(), exponent=st.sampled_from([-20, -3, -1, 1, 4, 20]))
def test_scaling_a_positive_loss_changes_no_verdict(
    run: tuple[list[int], list[float]], exponent: int
) -> None:
    steps, losses = run
    for rules in ("robust", "sway"):
        before = judged(steps, losses, rules)
        after = judged(steps, [x * 2.0**exponent for x in losses], rules)
        assert (after.verdict, rules_of(after)) == (before.verdict, rules_of(before)), (
            before.message,
            after.message,
        )


@PROPERTY
@given(run=healthy_runs(), bad=st.sampled_from([math.nan, math.inf]))
def test_a_nonfinite_last_loss_fails(run: tuple[list[int], list[float]], bad: float) -> None:
    steps, losses = run
    result = judged([*steps, steps[-1] + 1], [*losses, bad])
    assert result.verdict.value == "fail" and "nonfinite_loss" in rules_of(result)


@PROPERTY
@given(
    run=healthy_runs(),
    share=st.floats(0.2, 0.6),
    height=st.floats(1.3, 4.0),
)
def test_a_sustained_climb_above_the_start_fails(
    run: tuple[list[int], list[float]], share: float, height: float
) -> None:
    """The run then climbs for ``share`` of its length to ``height`` times
    where it started, and stays there."""
    steps, losses = run
    start = losses[0]
    m = max(3, int(share * len(losses)))
    every = steps[1] - steps[0]
    climb = [losses[-1] + (height * start - losses[-1]) * (j + 1) / m for j in range(m)]
    plateau = [height * start] * m
    tail_steps = [steps[-1] + every * (j + 1) for j in range(2 * m)]
    result = judged([*steps, *tail_steps], [*losses, *climb, *plateau])
    assert result.verdict.value == "fail" and "diverged" in rules_of(result), result.message
