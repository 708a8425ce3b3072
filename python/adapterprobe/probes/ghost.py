"""gradient_ghost: was this adapter trained long enough to converge?

Reads the optimizer state saved beside an adapter version
(``training_state.pt``) with the Rust reader, without torch and without
running any pickle code, and walks a ladder of signals, most decisive first:

1. ``global_step`` below ``min_steps_threshold``: FAIL (a smoke-test run
   that was never retrained).
2. Every parameter's mean Adam second moment (``exp_avg_sq``) non-finite:
   FAIL (gradients never propagated usefully).
3. Per layer, the mean second moment against the calmest layer's: a layer
   above ``undertrained_layer_ratio`` times that minimum still sees large
   gradient variance. More than ``layer_failure_frac`` of layers: FAIL;
   some: WARN; none: PASS. The minimum is the baseline because a mean
   baseline rises with the outliers it is meant to expose.

A missing state file is a SKIP; an unreadable, hostile, tampered or foreign
one is an ERROR result, never an exception. When the adapter's keys cannot
be attributed to layers, the per-layer signal is simply absent.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapterprobe import _core
from adapterprobe.errors import MissingFileError
from adapterprobe.probes.options import ProbeOptions, Rule, option, with_overrides
from adapterprobe.probes.result import ProbeResult, Verdict

KIND = "gradient_ghost"


@dataclass(frozen=True)
class GhostOptions(ProbeOptions):
    """Thresholds of :func:`gradient_ghost`."""

    min_steps_threshold: int = option(
        50, Rule(int, low=1), "global_step below this: FAIL (severely undertrained)"
    )
    undertrained_layer_ratio: float = option(
        2.0,
        Rule(float, low=1, low_open=True),
        "a layer's mean exp_avg_sq above this many times the calmest layer's is flagged",
    )
    layer_failure_frac: float = option(
        0.3, Rule(float, low=0, high=1), "more than this share of layers flagged: FAIL"
    )


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def judge_ghost(inputs: Any, options: GhostOptions, *, name: str = KIND) -> ProbeResult:
    """The verdict for one adapter from its gathered inputs (a ``GhostInput``)."""

    def result(verdict: Verdict, message: str, **kw: Any) -> ProbeResult:
        return ProbeResult(name=name, kind=KIND, verdict=verdict, message=message, **kw)

    state = inputs.state
    if state is None:
        verdict = Verdict.SKIP if isinstance(inputs.error, MissingFileError) else Verdict.ERROR
        return result(verdict, str(inputs.error))
    o = options

    grouping = inputs.grouping
    num_layers = grouping.num_layers if grouping is not None else 0
    params_per_layer = grouping.params_per_layer if grouping is not None else 0
    per_param = state.per_param
    best_val_loss = _finite_or_none(state.best_val_loss)

    if state.global_step < o.min_steps_threshold:
        return result(
            Verdict.FAIL,
            f"severely undertrained: global_step={state.global_step} is below "
            f"{o.min_steps_threshold}; scores measured on this adapter mean little until it "
            "is trained further",
            score=0.0,
            raw=float(state.global_step),
            evidence={
                "global_step": state.global_step,
                "min_steps_threshold": o.min_steps_threshold,
                "epoch": state.epoch,
                "num_params": len(per_param),
                "num_layers": num_layers,
                "best_val_loss": best_val_loss,
                "primary_signal": "global_step_below_threshold",
            },
        )

    finite = [p.exp_avg_sq_mean for p in per_param if math.isfinite(p.exp_avg_sq_mean)]
    nonfinite_count = len(per_param) - len(finite)
    if not finite:
        return result(
            Verdict.FAIL,
            "no parameter has a finite exp_avg_sq mean: gradients did not flow in any "
            "useful way during training",
            score=0.0,
            raw=0.0,
            evidence={
                "global_step": state.global_step,
                "num_params": len(per_param),
                "num_nonfinite_exp_avg_sq": nonfinite_count,
                "primary_signal": "all_optimizer_state_nan",
            },
        )

    global_mean = statistics.fmean(finite)
    layer_means: dict[int, float] = {}
    undertrained: list[int] = []
    baseline = 0.0
    if grouping is not None and global_mean > 0.0:
        layer_of = grouping.layer_of
        buckets: dict[int, list[float]] = {layer: [] for layer in grouping.layer_indices}
        for p in per_param:
            layer = layer_of.get(p.param_id)
            if layer is not None and math.isfinite(p.exp_avg_sq_mean):
                buckets[layer].append(p.exp_avg_sq_mean)
        layer_means = {layer: statistics.fmean(v) for layer, v in buckets.items() if v}
        if layer_means:
            baseline = min(layer_means.values())
            if baseline > 0.0:
                limit = o.undertrained_layer_ratio
                undertrained = [i for i, m in layer_means.items() if m > limit * baseline]

    frac = len(undertrained) / num_layers if num_layers > 0 else 0.0
    ranked = sorted(layer_means.items(), key=lambda item: -item[1])[:3]
    worst_layers = [
        {"layer": layer, "ratio": (mean / baseline) if baseline > 0 else None}
        for layer, mean in ranked
    ]
    share = f"{frac:.0%} of layers ({len(undertrained)}/{num_layers})"
    if frac > o.layer_failure_frac:
        verdict, score = Verdict.FAIL, 0.3
        message = (
            f"{share} still show high gradient variance, more than "
            f"{o.layer_failure_frac:.0%} allowed: the loss has probably not flattened yet "
            f"(global_step={state.global_step})"
        )
    elif undertrained:
        verdict, score = Verdict.WARN, 0.7
        message = (
            f"{share} have exp_avg_sq above {o.undertrained_layer_ratio:.1f}x the calmest "
            f"layer: partly undertrained, other probes may still be informative "
            f"(global_step={state.global_step})"
        )
    else:
        verdict, score = Verdict.PASS, 0.9
        message = (
            f"global_step={state.global_step}; no layer's exp_avg_sq exceeds "
            f"{o.undertrained_layer_ratio:.1f}x the calmest layer: training looks converged"
        )
    return result(
        verdict,
        message,
        score=score,
        raw=frac,
        evidence={
            "global_step": state.global_step,
            "epoch": state.epoch,
            "num_params": len(per_param),
            "num_layers": num_layers,
            "params_per_layer": params_per_layer,
            "global_mean_exp_avg_sq": global_mean,
            "frac_layers_undertrained": frac,
            "num_layers_undertrained": len(undertrained),
            "worst_layers": worst_layers,
            "num_nonfinite_exp_avg_sq": nonfinite_count,
            "best_val_loss": best_val_loss,
            "use_qlora": state.use_qlora,
        },
    )


def gradient_ghost(
    adapter_path: str | Path,
    *,
    min_steps_threshold: int | None = None,
    undertrained_layer_ratio: float | None = None,
    layer_failure_frac: float | None = None,
    options: GhostOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the optimizer state of one adapter version dir (or its ``.pt`` file).

    Thresholds left as None take their :class:`GhostOptions` default
    (``options`` when given, else min_steps_threshold=50,
    undertrained_layer_ratio=2.0, layer_failure_frac=0.3). Raises UsageError
    only for invalid options.
    """
    given = {
        "min_steps_threshold": min_steps_threshold,
        "undertrained_layer_ratio": undertrained_layer_ratio,
        "layer_failure_frac": layer_failure_frac,
    }
    resolved = with_overrides(options or GhostOptions(), given)
    inputs = _core.ghost_input(Path(adapter_path).expanduser())
    return judge_ghost(inputs, resolved, name=name)
