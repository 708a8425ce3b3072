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

from pathlib import Path
from typing import Any

from adapterprobe import _core
from adapterprobe.errors import UsageError
from adapterprobe.result import ProbeResult, Verdict, option_defaults

KIND = "training_drift"
CURVE_SAMPLE_CAP = 512


def check_options(
    *,
    min_steps: int,
    rolling_window: int,
    spike_sigma: float,
    assert_smoothness_gte: float,
    assert_convergence_ratio_lte: float,
    assert_instability_events_lte: int,
) -> None:
    """Raise UsageError for options outside their documented ranges."""
    problems = []
    if min_steps < 2:
        problems.append(f"min_steps must be >= 2, got {min_steps}")
    if rolling_window < 2:
        problems.append(f"rolling_window must be >= 2, got {rolling_window}")
    if not spike_sigma > 0:
        problems.append(f"spike_sigma must be > 0, got {spike_sigma}")
    if not 0.0 <= assert_smoothness_gte <= 1.0:
        problems.append(f"assert_smoothness_gte must be in [0, 1], got {assert_smoothness_gte}")
    if not assert_convergence_ratio_lte > 0:
        problems.append(
            f"assert_convergence_ratio_lte must be > 0, got {assert_convergence_ratio_lte}"
        )
    if assert_instability_events_lte < 0:
        problems.append(
            f"assert_instability_events_lte must be >= 0, got {assert_instability_events_lte}"
        )
    if problems:
        raise UsageError("; ".join(problems))


def judge_drift(
    inputs: Any,
    *,
    min_steps: int = 10,
    rolling_window: int = 10,
    spike_sigma: float = 3.0,
    assert_smoothness_gte: float = 0.7,
    assert_convergence_ratio_lte: float = 0.7,
    assert_instability_events_lte: int = 0,
    name: str = KIND,
) -> ProbeResult:
    """The verdict for one store from its gathered inputs (a ``DriftInput``)."""

    def result(verdict: Verdict, message: str, **kw: Any) -> ProbeResult:
        return ProbeResult(name=name, kind=KIND, verdict=verdict, message=message, **kw)

    if inputs.status == "no_logs_dir":
        return result(Verdict.SKIP, f"{inputs.store} has no logs/ directory")
    if inputs.status == "no_files":
        return result(Verdict.SKIP, f"no train-*.jsonl files in {inputs.logs_dir}")
    if inputs.status == "failed":
        return result(
            Verdict.ERROR, inputs.error, evidence={"log_paths": [str(p) for p in inputs.files]}
        )
    curve = inputs.curve
    num_steps = len(curve)
    if num_steps < min_steps:
        return result(
            Verdict.SKIP,
            f"{num_steps} step records, fewer than min_steps={min_steps}: "
            "too short a curve to judge",
            evidence={"num_steps": num_steps, "num_log_files": curve.num_files},
        )

    m = curve.metrics(rolling_window=rolling_window, spike_sigma=spike_sigma)
    smooth, conv = m["smoothness"], m["convergence_ratio"]
    events = int(m["instability_events"])

    shortfalls = []
    if not smooth >= assert_smoothness_gte:
        shortfalls.append(f"smoothness {smooth:.2f} is below {assert_smoothness_gte}")
    if not conv <= assert_convergence_ratio_lte:
        shortfalls.append(f"convergence_ratio {conv:.2f} is above {assert_convergence_ratio_lte}")
    if not events <= assert_instability_events_lte:
        shortfalls.append(f"{events} instability events, more than {assert_instability_events_lte}")
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
                "smoothness_gte": assert_smoothness_gte,
                "convergence_ratio_lte": assert_convergence_ratio_lte,
                "instability_events_lte": assert_instability_events_lte,
            },
        },
    )


DEFAULTS = option_defaults(judge_drift)


def training_drift(
    store_path: str | Path | None,
    *,
    min_steps: int = 10,
    rolling_window: int = 10,
    spike_sigma: float = 3.0,
    assert_smoothness_gte: float = 0.7,
    assert_convergence_ratio_lte: float = 0.7,
    assert_instability_events_lte: int = 0,
    name: str = KIND,
) -> ProbeResult:
    """Judge the loss curve logged under ``store_path/logs``.

    Raises UsageError only for invalid options; every problem with the
    store itself is reported in the returned result.
    """
    options = {
        "min_steps": min_steps,
        "rolling_window": rolling_window,
        "spike_sigma": spike_sigma,
        "assert_smoothness_gte": assert_smoothness_gte,
        "assert_convergence_ratio_lte": assert_convergence_ratio_lte,
        "assert_instability_events_lte": assert_instability_events_lte,
    }
    check_options(**options)
    if store_path is None:
        return ProbeResult(
            name=name,
            kind=KIND,
            verdict=Verdict.SKIP,
            message="no store path given, so there is no loss curve to read",
        )
    store = Path(store_path).expanduser().resolve()
    return judge_drift(_core.drift_input(str(store)), name=name, **options)
