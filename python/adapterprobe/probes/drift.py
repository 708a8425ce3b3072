"""training_drift: did this run's loss curve descend smoothly?

Reads a store's dlm logs (``logs/train-*.jsonl``) with the Rust streaming
reader and judges the curve on three thresholds: smoothness (how small
step-to-step jitter is next to the overall descent), convergence ratio
(final / initial loss) and instability events (non-finite losses plus loss
increases far above their neighbourhood's typical movement). PASS needs all
three; anything else is WARN. Missing or too-short logs SKIP; unreadable
logs are an ERROR result, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapterprobe import _core
from adapterprobe._core import LogsStatus
from adapterprobe.probes.options import ProbeOptions, Rule, option, with_overrides
from adapterprobe.probes.result import ProbeResult, Verdict

KIND = "training_drift"
CURVE_SAMPLE_CAP = 512


@dataclass(frozen=True)
class DriftOptions(ProbeOptions):
    """Thresholds of :func:`training_drift`."""

    min_steps: int = option(10, Rule(int, low=2), "fewer step records than this: SKIP")
    rolling_window: int = option(
        10, Rule(int, low=2), "points in the window whose median |delta loss| judges a rise"
    )
    spike_sigma: float = option(
        3.0, Rule(float, low=0, low_open=True), "a rise above this many window medians is a spike"
    )
    assert_smoothness_gte: float = option(
        0.7, Rule(float, low=0, high=1), "smallest smoothness that passes"
    )
    assert_convergence_ratio_lte: float = option(
        0.7, Rule(float, low=0, low_open=True), "largest final/initial loss that passes"
    )
    assert_instability_events_lte: int = option(
        0, Rule(int, low=0), "most instability events that pass"
    )


def judge_drift(inputs: Any, options: DriftOptions, *, name: str = KIND) -> ProbeResult:
    """The verdict for one store from its gathered inputs (a ``DriftInput``)."""

    def result(verdict: Verdict, message: str, **kw: Any) -> ProbeResult:
        return ProbeResult(name=name, kind=KIND, verdict=verdict, message=message, **kw)

    if inputs.status == LogsStatus.NoLogsDir:
        return result(Verdict.SKIP, f"{inputs.store} has no logs/ directory")
    if inputs.status == LogsStatus.NoFiles:
        return result(Verdict.SKIP, f"no train-*.jsonl files in {inputs.logs_dir}")
    if inputs.status == LogsStatus.Failed:
        return result(
            Verdict.ERROR, str(inputs.error), evidence={"log_paths": [str(p) for p in inputs.files]}
        )
    o = options
    curve = inputs.curve
    num_steps = len(curve)
    if num_steps < o.min_steps:
        return result(
            Verdict.SKIP,
            f"{num_steps} step records, fewer than min_steps={o.min_steps}: "
            "too short a curve to judge",
            evidence={"num_steps": num_steps, "num_log_files": curve.num_files},
        )

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


def training_drift(
    store_path: str | Path | None,
    *,
    min_steps: int | None = None,
    rolling_window: int | None = None,
    spike_sigma: float | None = None,
    assert_smoothness_gte: float | None = None,
    assert_convergence_ratio_lte: float | None = None,
    assert_instability_events_lte: int | None = None,
    options: DriftOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the loss curve logged under ``store_path/logs``.

    Thresholds left as None take their :class:`DriftOptions` default
    (``options`` when given, else the defaults: min_steps=10,
    rolling_window=10, spike_sigma=3.0, assert_smoothness_gte=0.7,
    assert_convergence_ratio_lte=0.7, assert_instability_events_lte=0).
    Raises UsageError only for invalid options; every problem with the store
    itself is reported in the returned result.
    """
    given = {
        "min_steps": min_steps,
        "rolling_window": rolling_window,
        "spike_sigma": spike_sigma,
        "assert_smoothness_gte": assert_smoothness_gte,
        "assert_convergence_ratio_lte": assert_convergence_ratio_lte,
        "assert_instability_events_lte": assert_instability_events_lte,
    }
    resolved = with_overrides(options or DriftOptions(), given)
    if store_path is None:
        return ProbeResult(
            name=name,
            kind=KIND,
            verdict=Verdict.SKIP,
            message="no store path given, so there is no loss curve to read",
        )
    store = Path(store_path).expanduser().resolve()
    return judge_drift(_core.drift_input(store), resolved, name=name)
