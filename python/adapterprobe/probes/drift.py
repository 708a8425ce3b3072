"""training_drift: did this run's loss curve descend the way a healthy run does?

Reads the store's loss curve with the Rust readers and judges it with the
Rust kernel ``verdicts::drift`` (the function a scan runs inside its gather,
the one implementation of the rules) under one of two rule sets
(``rules=``):

- ``"robust"`` (default), built to gate CI on and for every logging
  cadence: trend verdicts (diverged, unstable, regressed, no progress) from a
  handful of logged records; spikes against the curve's own heavy-tailed
  noise, at a threshold set by a stated per-run false-alarm rate and the
  number of records (see ``analysis::robust_curve`` in the Rust core);
  non-finite losses always events; the eval loss, gradient norm and learning
  rate judged where the logs carry them; objectives that are not positive
  losses judged for NaN/inf only. docs/rules.md ("How the robust drift rules
  are built") states each rule and its false-alarm design.
- ``"sway"``: dlm-sway's training_drift exactly: smoothness, convergence
  ratio and MAD spike count against fixed thresholds; PASS needs all three.

Missing or too-short logs SKIP; unreadable logs are an ERROR result, never an
exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe.probes.options import ProbeOptions, Rule, option, resolve
from adapterprobe.probes.result import ProbeResult, Verdict

KIND = "training_drift"
CURVE_SAMPLE_CAP = 512


@dataclass(frozen=True)
class DriftOptions(ProbeOptions):
    """Thresholds of :func:`training_drift`; None takes the rule set's default."""

    min_steps: int = option(
        Rule(int, low=2),
        "fewer logged records than this: SKIP (records, not training steps)",
        robust=3,
        sway=10,
    )
    # rules="sway"
    rolling_window: int = option(
        Rule(int, low=2), "points in the window whose median |delta loss| judges a rise", sway=10
    )
    spike_sigma: float = option(
        Rule(float, low=0, low_open=True),
        "a rise above this many window medians is an instability event",
        sway=3.0,
    )
    assert_smoothness_gte: float = option(
        Rule(float, low=0, high=1), "smallest smoothness that passes", sway=0.7
    )
    assert_convergence_ratio_lte: float = option(
        Rule(float, low=0, low_open=True), "largest final/initial loss that passes", sway=0.7
    )
    assert_instability_events_lte: int = option(
        Rule(int, low=0), "most instability events that pass", sway=0
    )
    # rules="robust"
    min_spike_records: int = option(
        Rule(int, low=3),
        "fewer logged records than this: spikes are not judged (trend verdicts still are)",
        robust=20,
    )
    trend_window: int = option(
        Rule(int, low=3), "points in the rolling-median trend window", robust=11
    )
    spike_false_alarm: float = option(
        Rule(float, low=0, low_open=True, high=0.5),
        "chance that a healthy run (t4-tailed noise) shows a spike; the threshold grows "
        "with the records judged",
        robust=0.005,
    )
    spike_z: float = option(
        Rule(float, low=0, low_open=True),
        "a spike rises at least this many noise scales above the trend (a floor under the "
        "false-alarm threshold)",
        robust=6.0,
    )
    min_spike_rise: float = option(
        Rule(float, low=0), "... and at least this fraction of the trend", robust=0.1
    )
    spike_fall_share: float = option(
        Rule(float, low=0),
        "... and at least this share of how far the run has fallen (start minus best)",
        robust=0.1,
    )
    max_spike_events: int = option(Rule(int, low=0), "more spike events than this: WARN", robust=0)
    min_relative_drop: float = option(
        Rule(float, low=0, high=1),
        "the loss must fall at least this share of its start, else WARN (no progress)",
        robust=0.02,
    )
    max_regression: float = option(
        Rule(float, low=0),
        "ending more than this share of the start above the best level: WARN",
        robust=0.1,
    )
    max_eval_rise: float = option(
        Rule(float, low=0),
        "eval loss ending more than this share above its best while training loss fell: WARN",
        robust=0.2,
    )


def judge_drift(inputs: Any, options: DriftOptions, *, name: str = KIND) -> ProbeResult:
    """The verdict for one store from its gathered inputs (a ``DriftInput``),
    by the Rust kernel ``verdicts::drift`` (the same function a scan runs)."""
    return ProbeResult.judged(name, KIND, _core.judge_drift(inputs, options))


def training_drift(
    store_path: str | Path | None,
    *,
    rules: str | None = None,
    min_steps: int | None = None,
    rolling_window: int | None = None,
    spike_sigma: float | None = None,
    assert_smoothness_gte: float | None = None,
    assert_convergence_ratio_lte: float | None = None,
    assert_instability_events_lte: int | None = None,
    min_spike_records: int | None = None,
    trend_window: int | None = None,
    spike_false_alarm: float | None = None,
    spike_z: float | None = None,
    min_spike_rise: float | None = None,
    spike_fall_share: float | None = None,
    max_spike_events: int | None = None,
    min_relative_drop: float | None = None,
    max_regression: float | None = None,
    max_eval_rise: float | None = None,
    options: DriftOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the loss curve at ``store_path``: a store of any layout the scan
    knows (a dlm store's ``logs/``, an HF Trainer output directory, a
    Lightning run, a folder of TensorBoard events), one HF checkpoint (its
    own ``trainer_state.json``), or a folder with one run somewhere below it
    (with several, the result SKIPs and names them).

    ``rules``: ``"robust"`` (default) or ``"sway"`` (see the module doc).
    Thresholds left as None take the rule set's default (see
    :class:`DriftOptions`); giving one that the rule set does not use, or an
    invalid value, raises UsageError. ``options`` passes a whole
    :class:`DriftOptions` instead. Every problem with the store itself is
    reported in the returned result, never raised.
    """
    given = {
        "min_steps": min_steps,
        "rolling_window": rolling_window,
        "spike_sigma": spike_sigma,
        "assert_smoothness_gte": assert_smoothness_gte,
        "assert_convergence_ratio_lte": assert_convergence_ratio_lte,
        "assert_instability_events_lte": assert_instability_events_lte,
        "min_spike_records": min_spike_records,
        "trend_window": trend_window,
        "spike_false_alarm": spike_false_alarm,
        "spike_z": spike_z,
        "min_spike_rise": min_spike_rise,
        "spike_fall_share": spike_fall_share,
        "max_spike_events": max_spike_events,
        "min_relative_drop": min_relative_drop,
        "max_regression": max_regression,
        "max_eval_rise": max_eval_rise,
    }
    resolved = resolve(DriftOptions, options, rules, given)
    if store_path is None:
        return ProbeResult(
            name=name,
            kind=KIND,
            verdict=Verdict.SKIP,
            message="no store path given, so there is no loss curve to read",
        )
    store = Path(store_path).expanduser().resolve()
    return judge_drift(_core.drift_input(store), resolved, name=name)
