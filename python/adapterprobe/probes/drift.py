"""training_drift: did this run's loss curve descend the way a healthy run does?

Reads the store's loss curve with the Rust readers and judges it under one
of two rule sets (``rules=``):

- ``"robust"`` (default), built to gate CI on: mini-batch noise is not an
  instability. A rolling-median trend and the curve's own robust noise scale
  around it decide what a spike is (a rise of ``spike_z`` noise scales *and*
  ``min_spike_rise`` of the trend); non-finite losses are always events; the
  run is judged on what it reached (relative drop from its start, rise above
  its best, divergence), not on a fixed final/initial ratio. Short runs SKIP.
- ``"sway"``: dlm-sway's training_drift exactly: smoothness, convergence
  ratio and MAD spike count against fixed thresholds; PASS needs all three.

Missing or too-short logs SKIP; unreadable logs are an ERROR result, never an
exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapterprobe import _core
from adapterprobe._core import LogsStatus
from adapterprobe.probes.options import ProbeOptions, Rule, option, resolve
from adapterprobe.probes.result import ProbeResult, Verdict

KIND = "training_drift"
CURVE_SAMPLE_CAP = 512


@dataclass(frozen=True)
class DriftOptions(ProbeOptions):
    """Thresholds of :func:`training_drift`; None takes the rule set's default."""

    min_steps: int = option(
        Rule(int, low=2), "fewer step records than this: SKIP", robust=20, sway=10
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
    trend_window: int = option(
        Rule(int, low=3), "points in the rolling-median trend window", robust=11
    )
    spike_z: float = option(
        Rule(float, low=0, low_open=True),
        "a spike rises this many robust noise scales above the trend",
        robust=6.0,
    )
    min_spike_rise: float = option(
        Rule(float, low=0), "... and at least this fraction of the trend", robust=0.1
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


def judge_drift(inputs: Any, options: DriftOptions, *, name: str = KIND) -> ProbeResult:
    """The verdict for one store from its gathered inputs (a ``DriftInput``)."""

    def result(verdict: Verdict, message: str, **kw: Any) -> ProbeResult:
        return ProbeResult(name=name, kind=KIND, verdict=verdict, message=message, **kw)

    if inputs.status == LogsStatus.NoLogsDir:
        return result(Verdict.SKIP, inputs.note or f"{inputs.store} has no logs/ directory")
    if inputs.status == LogsStatus.NoFiles:
        return result(Verdict.SKIP, inputs.note or f"no train-*.jsonl files in {inputs.logs_dir}")
    if inputs.status == LogsStatus.Failed:
        return result(
            Verdict.ERROR, str(inputs.error), evidence={"log_paths": [str(p) for p in inputs.files]}
        )
    curve = inputs.curve
    num_steps = len(curve)
    if num_steps < options.min_steps:
        return result(
            Verdict.SKIP,
            f"{num_steps} step records, fewer than min_steps={options.min_steps}: "
            "too short a curve to judge",
            evidence={"num_steps": num_steps, "num_log_files": curve.num_files},
        )
    if options.rules == "sway":
        return _judge_sway(curve, options, result)
    return _judge_robust(curve, options, result)


def _judge_sway(curve: Any, o: DriftOptions, result: Any) -> ProbeResult:
    """dlm-sway's rule: smoothness, convergence ratio and MAD spikes, all must pass."""
    num_steps = len(curve)
    m = curve.metrics(rolling_window=o.rolling_window, spike_sigma=o.spike_sigma)
    smooth, conv = m["smoothness"], m["convergence_ratio"]
    events = int(m["instability_events"])

    shortfalls = []
    if not smooth >= o.assert_smoothness_gte:
        shortfalls.append(f"smoothness {smooth:.2f} is below {o.assert_smoothness_gte}")
    if not conv <= o.assert_convergence_ratio_lte:
        shortfalls.append(f"convergence_ratio {conv:.2f} is above {o.assert_convergence_ratio_lte}")
    if not events <= o.assert_instability_events_lte:
        shortfalls.append(
            f"{events} instability events, more than {o.assert_instability_events_lte}"
        )
    summary = (
        f"smoothness={smooth:.2f}, convergence_ratio={conv:.2f}, "
        f"instability_events={events}, final_loss={m['final_loss']:.3f}"
    )
    if shortfalls:
        verdict, score = Verdict.WARN, min(1.0, max(0.0, smooth * 0.5))
        message = f"{summary}; " + "; ".join(shortfalls)
    else:
        verdict, score, message = Verdict.PASS, min(1.0, max(0.0, smooth)), summary

    return result(
        verdict,
        message,
        score=score,
        raw=smooth,
        evidence={
            "rules": "sway",
            "final_loss": m["final_loss"],
            "initial_loss": m["initial_loss"],
            "convergence_ratio": conv,
            "smoothness": smooth,
            "instability_events": events,
            "spike_steps": m["spike_steps"],
            "nonfinite_steps": m["nonfinite_steps"],
            "num_steps": num_steps,
            "num_log_files": curve.num_files,
            "curve_sampled": curve.sample(CURVE_SAMPLE_CAP),
            "thresholds": {
                "smoothness_gte": o.assert_smoothness_gte,
                "convergence_ratio_lte": o.assert_convergence_ratio_lte,
                "instability_events_lte": o.assert_instability_events_lte,
            },
        },
    )


#: A final loss that is not finite, or more than this share of non-finite
#: steps, makes non-finite losses a FAIL rather than a WARN.
NONFINITE_FAIL_SHARE = 0.05


def _steps_text(steps: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" and {len(steps) - limit} more" if len(steps) > limit else "")


def _judge_robust(curve: Any, o: DriftOptions, result: Any) -> ProbeResult:
    """The robust rule set: see the module docstring."""
    num_steps = len(curve)
    steps = curve.steps.tolist()
    analysis = curve.robust(
        trend_window=o.trend_window, spike_z=o.spike_z, min_spike_rise=o.min_spike_rise
    )
    if analysis is None:
        return result(
            Verdict.FAIL,
            f"nonfinite_loss: all {num_steps} logged losses are NaN or infinite",
            score=0.0,
            evidence={"rules": "robust", "num_steps": num_steps, "nonfinite_steps": steps},
        )
    a = analysis
    drop, regression = a.relative_drop(), a.relative_regression()
    # How far apart two level estimates may be by noise alone (3 standard errors).
    level_noise = (
        3.0 * a.noise * (1.0 if a.relative else 1.0 / abs(a.head_level)) / (a.level_points**0.5)
    )
    findings: list[tuple[Verdict, str, str]] = []

    nonfinite_steps = [steps[i] for i in a.nonfinite]
    if nonfinite_steps:
        last_bad = a.nonfinite[-1] == num_steps - 1
        share = len(nonfinite_steps) / num_steps
        severe = last_bad or share > NONFINITE_FAIL_SHARE
        findings.append(
            (
                Verdict.FAIL if severe else Verdict.WARN,
                "nonfinite_loss",
                f"{len(nonfinite_steps)} NaN/inf losses ({share:.1%} of steps"
                + (", the last one included" if last_bad else "")
                + f") at steps {_steps_text(nonfinite_steps)}",
            )
        )

    spikes = [
        {
            "start_step": steps[e.start],
            "end_step": steps[e.end],
            "peak_step": steps[e.peak],
            "rise": e.rise,
            "relative_rise": e.relative_rise,
            "z": e.z if math.isfinite(e.z) else None,  # None: a noise-free curve
        }
        for e in a.spikes
    ]
    if len(spikes) > o.max_spike_events:
        parts = [
            f"step {s['peak_step']} ("
            + (f"+{s['relative_rise']:.0%} over trend" if a.relative else f"+{s['rise']:.3g}")
            + (f", {s['z']:.0f} noise scales)" if s["z"] is not None else ", noise-free curve)")
            for s in spikes[:6]
        ]
        more = f" and {len(spikes) - 6} more" if len(spikes) > 6 else ""
        findings.append(
            (
                Verdict.WARN,
                "loss_spikes",
                f"{len(spikes)} loss spikes, more than {o.max_spike_events} allowed: "
                + "; ".join(parts)
                + more,
            )
        )

    best_step = steps[a.best_index]
    rise = -drop
    if rise > max(0.05, level_noise):
        findings.append(
            (
                Verdict.FAIL,
                "diverged",
                f"loss ended {rise:.0%} above where it started "
                f"({a.head_level:.4g} -> {a.tail_level:.4g}; best {a.best_level:.4g} at "
                f"step {best_step})",
            )
        )
    elif regression > max(o.max_regression, level_noise):
        findings.append(
            (
                Verdict.WARN,
                "regressed",
                f"loss ended {regression:.0%} of its starting level above its best "
                f"({a.best_level:.4g} at step {best_step} -> {a.tail_level:.4g} at the end), "
                f"more than {o.max_regression:.0%}",
            )
        )
    elif drop < o.min_relative_drop:
        findings.append(
            (
                Verdict.WARN,
                "no_progress",
                f"loss barely moved: {drop:+.1%} over {num_steps} steps "
                f"({a.head_level:.4g} -> {a.tail_level:.4g}), less than the "
                f"{o.min_relative_drop:.0%} required",
            )
        )

    noise_text = f"{a.noise:.1%}" if a.relative else f"{a.noise:.3g}"
    summary = (
        f"loss {a.head_level:.4g} -> {a.tail_level:.4g} ({-drop:+.0%}) over {num_steps} steps, "
        f"noise {noise_text}"
    )
    worst = max((v for v, _, _ in findings), key=lambda v: v.severity, default=Verdict.PASS)
    if worst is Verdict.PASS:
        verdict, score = Verdict.PASS, 0.6 + 0.4 * min(1.0, max(0.0, drop) / 0.5)
        message = f"{summary}; no spikes, no NaN/inf losses"
    else:
        verdict = worst
        score = 0.3 if worst is Verdict.WARN else 0.0
        message = "; ".join(f"{rule}: {text}" for _, rule, text in findings) + f" ({summary})"

    sample_idx = _sample_indices(num_steps, CURVE_SAMPLE_CAP)
    trend = a.trend
    return result(
        verdict,
        message,
        score=score,
        raw=drop,
        evidence={
            "rules": "robust",
            "findings": [{"rule": r, "verdict": v.value, "message": t} for v, r, t in findings],
            "num_steps": num_steps,
            "num_log_files": curve.num_files,
            "log_format": curve.source,
            "head_loss": a.head_level,
            "tail_loss": a.tail_level,
            "best_loss": a.best_level,
            "best_step": best_step,
            "relative_drop": drop,
            "relative_regression": regression,
            "noise": a.noise,
            "noise_is_relative": a.relative,
            "spikes": spikes,
            "spike_steps": [s["peak_step"] for s in spikes],
            "nonfinite_steps": nonfinite_steps,
            "curve_sampled": curve.sample(CURVE_SAMPLE_CAP),
            "trend_sampled": [[steps[i], trend[i]] for i in sample_idx],
            "thresholds": o.to_dict(),
        },
    )


def _sample_indices(n: int, cap: int) -> list[int]:
    """The indices ``LossCurve.sample`` keeps: an even stride, the last point always."""
    stride = 1 if n <= cap else -(-n // cap)
    idx = list(range(0, n, stride))
    if n and idx[-1] != n - 1:
        idx.append(n - 1)
    return idx


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
    trend_window: int | None = None,
    spike_z: float | None = None,
    min_spike_rise: float | None = None,
    max_spike_events: int | None = None,
    min_relative_drop: float | None = None,
    max_regression: float | None = None,
    options: DriftOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the loss curve of a store (its ``logs/``).

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
        "trend_window": trend_window,
        "spike_z": spike_z,
        "min_spike_rise": min_spike_rise,
        "max_spike_events": max_spike_events,
        "min_relative_drop": min_relative_drop,
        "max_regression": max_regression,
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
