"""Plain-Python reference of training_drift's rules (both rule sets).

This is the rule code the probe ran before its rules became the Rust kernel
``verdicts::drift`` (``_core.judge_drift``); tests/test_drift_kernel.py
compares the two on arbitrary curves, side series, states and options, and on
every real input the repository has. It reads the same gathered inputs
(``DriftInput`` and its ``LossCurve``) through their Python API.
"""

from __future__ import annotations

import math
from typing import Any

from adapterprobe._core import LogsStatus
from adapterprobe.probes.drift import CURVE_SAMPLE_CAP, KIND, DriftOptions
from adapterprobe.probes.result import ProbeResult, Verdict


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
        steps = curve.steps.tolist()
        span = steps[-1] - steps[0] + 1 if steps else 0
        over = f" over {span:,} steps" if span > num_steps else ""
        return result(
            Verdict.SKIP,
            f"{num_steps} logged records{over}, fewer than min_steps={options.min_steps}: "
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
#: Non-finite gradient norms on more than this share of records (or on the
#: last one) WARN; fewer are what fp16 loss scaling does while it calibrates.
NONFINITE_GRAD_SHARE = 0.05
#: Zero gradient norms or a zero learning rate on more than this share of
#: the logged records: nothing was training for most of the run.
ZERO_SHARE = 0.5
#: Eval points needed before the eval loss is judged.
MIN_EVAL_POINTS = 3
#: The smoothed loss climbing this share above its start (or three noise
#: scales, if more) mid-run is an instability, wherever the run ends.
UNSTABLE_RISE = 0.25


def _steps_text(steps: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" and {len(steps) - limit} more" if len(steps) > limit else "")


def _span_text(steps: list[int]) -> str:
    """'over 2,750 steps (6 logged records)': training steps and records, both."""
    n = len(steps)
    span = steps[-1] - steps[0] + 1 if n else 0
    records = f"{n:,} logged record{'s' if n != 1 else ''}"
    if span == n:
        return f"over {n:,} step{'s' if n != 1 else ''}"
    return f"over {span:,} steps ({records})"


def _change_text(head: float, tail: float) -> str:
    """The change from head to tail with its sign: '+0.5%' is a rise."""
    return f"{(tail - head) / abs(head):+.1%}"


#: A series whose start is below this, and below this share of its largest
#: value, starts at zero rather than at a loss (a KL-regularised RL objective).
NEAR_ZERO_START = 1e-3


def _is_positive_loss(losses: list[float]) -> bool:
    """Whether the series reads as a loss to be minimised from a positive start.

    Cross-entropy and its kin start well above zero and stay >= 0; exact
    zeros later on are judged (NaN masking, memorisation). A negative value,
    a start at or below zero, or a start that is near zero next to the rest of
    the series (GRPO's loss grows from ~1e-8 with its KL term) is some other
    objective, for which "fell by x%" means nothing.
    """
    finite = [v for v in losses if math.isfinite(v)]
    if not finite or min(finite) < 0:
        return False
    start = sorted(finite[:3])[len(finite[:3]) // 2]
    near_zero = start < NEAR_ZERO_START and start < NEAR_ZERO_START * max(finite)
    return start > 0 and not near_zero


def _side_findings(
    curve: Any, steps: list[int], losses: list[float], o: DriftOptions
) -> tuple[list[tuple[Verdict, str, str]], dict[str, Any]]:
    """Findings and evidence from what the logs carry beside the loss."""
    findings: list[tuple[Verdict, str, str]] = []
    evidence: dict[str, Any] = {}
    # One Rust pass per series: samples, non-finite steps, zero counts.
    side = curve.side_summary(CURVE_SAMPLE_CAP)

    grad = side.get("grad_norm")
    if grad:
        evidence["grad_norm_sampled"] = grad["sampled"]
        bad, n = grad["nonfinite_steps"], grad["len"]
        # The Trainer's NaN masking: NaN gradients, and the loss logged as 0.0.
        loss_at = dict(zip(steps, losses, strict=True)) if bad else {}
        masked = [s for s in bad if loss_at.get(s) == 0.0]
        last_bad = bool(bad) and bad[-1] == grad["sampled"][-1][0]
        if masked:
            findings.append(
                (
                    Verdict.FAIL,
                    "nan_masked",
                    f"the loss is logged as exactly 0.0 with NaN/inf gradient norms at "
                    f"{len(masked)} records (steps {_steps_text(masked)}): the weights went "
                    "NaN and the trainer masked the loss",
                )
            )
        elif bad and (len(bad) / n > NONFINITE_GRAD_SHARE or last_bad):
            findings.append(
                (
                    Verdict.WARN,
                    "nonfinite_grad_norm",
                    f"{len(bad)} NaN/inf gradient norms ({len(bad) / n:.1%} of records"
                    + (", the last one included" if last_bad else "")
                    + f") at steps {_steps_text(bad)}",
                )
            )
        zeros = grad["zeros"]
        if zeros > ZERO_SHARE * n:
            findings.append(
                (
                    Verdict.WARN,
                    "zero_gradients",
                    f"the gradient norm is exactly 0 at {zeros} of {n} logged records: "
                    "nothing is being trained (frozen parameters, or a LoRA B and A that "
                    "cannot move)",
                )
            )
    lr = side.get("learning_rate")
    if lr:
        evidence["learning_rate_sampled"] = lr["sampled"]
        if lr["zeros"] > ZERO_SHARE * lr["len"]:
            findings.append(
                (
                    Verdict.WARN,
                    "zero_learning_rate",
                    f"the learning rate is 0 at {lr['zeros']} of {lr['len']} logged records",
                )
            )
    evals = curve.eval_loss if "eval_loss" in side else []
    if evals:
        evidence["eval_loss_sampled"] = side["eval_loss"]["sampled"]
        bad = [s for s, v in evals if not math.isfinite(v)]
        finite = [(s, v) for s, v in evals if math.isfinite(v)]
        if bad:
            findings.append(
                (
                    Verdict.FAIL,
                    "nonfinite_eval_loss",
                    f"{len(bad)} NaN/inf eval losses at steps {_steps_text(bad)}",
                )
            )
        if len(finite) >= MIN_EVAL_POINTS and all(v > 0 for _, v in finite):
            best_step, best = min(finite, key=lambda p: p[1])
            last_step, last = finite[-1]
            rise = (last - best) / best
            evidence["eval_best_loss"] = best
            evidence["eval_best_step"] = best_step
            evidence["eval_final_loss"] = last
            train_fell = _train_fell_between(steps, losses, best_step, last_step)
            if rise > o.max_eval_rise and train_fell:
                findings.append(
                    (
                        Verdict.WARN,
                        "eval_rising",
                        f"eval loss rose {rise:.0%} from its best ({best:.4g} at step "
                        f"{best_step} -> {last:.4g} at step {last_step}) while the training "
                        "loss fell: overfitting",
                    )
                )
    return findings, evidence


def _train_fell_between(steps: list[int], losses: list[float], first: int, last: int) -> bool:
    """Whether the training loss is lower around ``last`` than around ``first``
    (medians of the three finite records nearest each step)."""

    def level_at(step: int) -> float:
        near = sorted(
            (abs(s - step), v) for s, v in zip(steps, losses, strict=True) if math.isfinite(v)
        )[:3]
        vals = sorted(v for _, v in near)
        return vals[len(vals) // 2] if vals else math.nan

    return last > first and level_at(last) < level_at(first)


def _regression_noise(a: Any, n: int, head: float, window: int) -> float:
    """How far above its best a healthy run's end level can sit by noise
    alone, as a share of the start: three standard errors of the end level
    (a median of ``level_points`` records) plus the expected depth of the
    lowest of the trend's independent windows below the true level (the best
    level is a minimum, so it is biased low by about sqrt(2 ln m) of them)."""
    per_point = 1.2533 * a.noise  # standard error factor of a median
    tail_scale = abs(a.tail_level) if a.relative else 1.0
    best_scale = abs(a.best_level) if a.relative else 1.0
    windows = max(n // max(window, 1), 2)
    end = 3.0 * per_point * tail_scale / a.level_points**0.5
    low = per_point * best_scale / max(window, 1) ** 0.5 * math.sqrt(2 * math.log(windows))
    return (end + low) / head


def _thirds_drop_bound(losses: list[float], noise: float) -> float:
    """An upper bound on how far the loss fell, from the medians of the first
    and last thirds of the records (more points than the start and end levels,
    so a flat curve is told from a noisy one): the relative drop plus three
    standard errors of a median of that many points."""
    finite = [v for v in losses if math.isfinite(v)]
    third = max(len(finite) // 3, 1)
    first = sorted(finite[:third])[third // 2]
    last = sorted(finite[-third:])[third // 2]
    if not first > 0:
        return math.inf  # nothing to measure a fall against
    return (first - last) / first + 3.0 * 1.2533 * noise / third**0.5


def _judge_robust(curve: Any, o: DriftOptions, result: Any) -> ProbeResult:
    """The robust rule set: see the module docstring and README's rules section."""
    num_steps = len(curve)
    steps = curve.steps.tolist()
    losses = curve.losses.tolist()
    span = _span_text(steps)
    side, side_evidence = _side_findings(curve, steps, losses, o)
    base_evidence = {
        "rules": "robust",
        "num_steps": num_steps,
        "num_records": num_steps,
        "step_span": steps[-1] - steps[0] + 1,
        "num_log_files": curve.num_files,
        "log_format": curve.source,
        "curve_sampled": curve.sample(CURVE_SAMPLE_CAP),
        **side_evidence,
        "thresholds": o.to_dict(),
    }

    def finish(findings: list[tuple[Verdict, str, str]], summary: str, **kw: Any) -> ProbeResult:
        findings = findings + side
        worst = max((v for v, _, _ in findings), key=lambda v: v.severity, default=Verdict.PASS)
        evidence = {
            **base_evidence,
            "findings": [{"rule": r, "verdict": v.value, "message": t} for v, r, t in findings],
            **kw.pop("evidence", {}),
        }
        if worst is Verdict.PASS:
            return result(Verdict.PASS, summary, evidence=evidence, **kw)
        score = 0.3 if worst is Verdict.WARN else 0.0
        message = "; ".join(f"{rule}: {text}" for _, rule, text in findings) + f" ({summary})"
        return result(worst, message, evidence=evidence, **{**kw, "score": score})

    if not any(math.isfinite(v) for v in losses):
        return finish(
            [
                (
                    Verdict.FAIL,
                    "nonfinite_loss",
                    f"all {num_steps} logged losses are NaN or infinite",
                )
            ],
            f"no finite loss {span}",
            score=0.0,
            evidence={"nonfinite_steps": steps},
        )

    nonfinite_steps = [s for s, v in zip(steps, losses, strict=True) if not math.isfinite(v)]
    findings: list[tuple[Verdict, str, str]] = []
    if nonfinite_steps:
        last_bad = nonfinite_steps[-1] == steps[-1]
        share = len(nonfinite_steps) / num_steps
        severe = last_bad or share > NONFINITE_FAIL_SHARE
        findings.append(
            (
                Verdict.FAIL if severe else Verdict.WARN,
                "nonfinite_loss",
                f"{len(nonfinite_steps)} NaN/inf losses ({share:.1%} of records"
                + (", the last one included" if last_bad else "")
                + f") at steps {_steps_text(nonfinite_steps)}",
            )
        )

    a = curve.robust(
        trend_window=o.trend_window,
        spike_z=o.spike_z,
        min_spike_rise=o.min_spike_rise,
        spike_false_alarm=o.spike_false_alarm,
        spike_fall_share=o.spike_fall_share,
    )
    head, tail, best = a.head_level, a.tail_level, a.best_level
    if not (_is_positive_loss(losses) and head > 0):
        finite = [v for v in losses if math.isfinite(v)]
        return finish(
            findings,
            f"objective {finite[0]:.4g} -> {finite[-1]:.4g} {span}; not a positive loss (it "
            "goes negative or starts at or near 0: an RL, KL or log-ratio objective?), so only "
            "NaN/inf and the side series are judged, not its trend or spikes",
            score=0.6,
            raw=None,
            evidence={"objective": "not_positive", "nonfinite_steps": nonfinite_steps},
        )

    drop = a.relative_drop()  # head > 0 here: a positive loss
    regression = a.relative_regression()
    # How far apart two level estimates may be by noise alone (3 standard errors).
    level_noise = 3.0 * a.noise * (1.0 if a.relative else 1.0 / head) / (a.level_points**0.5)

    judge_spikes = num_steps >= o.min_spike_records
    spikes = [
        {
            "start_step": steps[e.start],
            "end_step": steps[e.end],
            "peak_step": steps[e.peak],
            "rise": e.rise,
            "relative_rise": e.relative_rise,
            "z": e.z if math.isfinite(e.z) else None,  # None: a noise-free curve
        }
        for e in (a.spikes if judge_spikes else [])
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
                f"{len(spikes)} loss spike{'s' if len(spikes) != 1 else ''} beyond "
                f"{a.spike_threshold:.1f} noise scales (a {o.spike_false_alarm:.0%} false-alarm "
                f"threshold for {num_steps} records): " + "; ".join(parts) + more,
            )
        )

    best_step = steps[a.best_index]
    change = _change_text(head, tail)
    rise = -drop
    # The trend's highest point past the start: a healthy run's smoothed loss
    # does not climb far above where it began, even when it ends lower.
    peak, peak_index = a.peak_level, a.peak_index
    peak_rise = (peak - head) / head
    unstable_limit = max(UNSTABLE_RISE, 3.0 * a.noise if a.relative else 3.0 * a.noise / head)
    if rise > max(0.05, level_noise):
        findings.append(
            (
                Verdict.FAIL,
                "diverged",
                f"loss ended {rise:.0%} above where it started ({head:.4g} -> {tail:.4g} "
                f"{span}; best {best:.4g} at step {best_step})",
            )
        )
    elif peak_rise > unstable_limit:
        findings.append(
            (
                Verdict.WARN,
                "unstable",
                f"the loss trend climbed {peak_rise:.0%} above where it started "
                f"({head:.4g} -> {peak:.4g} at step {steps[peak_index]}) "
                f"before ending at {tail:.4g}",
            )
        )
    elif regression > max(o.max_regression, _regression_noise(a, num_steps, head, o.trend_window)):
        findings.append(
            (
                Verdict.WARN,
                "regressed",
                f"loss climbed back from its best by {regression:.0%} of its starting level "
                f"({best:.4g} at step {best_step} -> {tail:.4g} at the end), more than "
                f"{o.max_regression:.0%}",
            )
        )
    elif drop < o.min_relative_drop and _thirds_drop_bound(losses, a.noise) < o.min_relative_drop:
        # Even allowing for noise, it fell less than required.
        findings.append(
            (
                Verdict.WARN,
                "no_progress",
                f"loss did not fall: {change} {span} ({head:.4g} -> {tail:.4g}), less than the "
                f"{o.min_relative_drop:.0%} fall required",
            )
        )

    noise_text = f"{a.noise:.1%}" if a.relative else f"{a.noise:.3g}"
    spike_note = (
        "no spikes"
        if judge_spikes
        else f"spikes not judged ({num_steps} records, fewer than {o.min_spike_records})"
    )
    summary = f"loss {head:.4g} -> {tail:.4g} ({change}) {span}, noise {noise_text}"
    sample_idx = _sample_indices(num_steps, CURVE_SAMPLE_CAP)
    trend = a.trend  # one copy out of the kernel's result
    clean = not findings and not side
    return finish(
        findings,
        summary + (f"; {spike_note}, no NaN/inf losses" if clean else ""),
        score=0.6 + 0.4 * min(1.0, max(0.0, drop) / 0.5),
        raw=drop,
        evidence={
            "head_loss": head,
            "tail_loss": tail,
            "best_loss": best,
            "best_step": best_step,
            "relative_drop": drop,
            "relative_regression": regression,
            "noise": a.noise,
            "noise_is_relative": a.relative,
            "spikes_judged": judge_spikes,
            "spike_threshold": a.spike_threshold,
            "spikes": spikes,
            "spike_steps": [s["peak_step"] for s in spikes],
            "nonfinite_steps": nonfinite_steps,
            "trend_sampled": [[steps[i], trend[i]] for i in sample_idx],
        },
    )


def _sample_indices(n: int, cap: int) -> list[int]:
    """The indices ``LossCurve.sample`` keeps: an even stride, the last point always."""
    stride = 1 if n <= cap else -(-n // cap)
    idx = list(range(0, n, stride))
    if n and idx[-1] != n - 1:
        idx.append(n - 1)
    return idx
