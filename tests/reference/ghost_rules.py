"""gradient_ghost's rules in plain Python: the reference the Rust kernel
(``rust/verdicts/ghost/``, ``rust/verdicts/layer_lift.rs``) is compared with,
text for text, in ``tests/test_ghost_kernel.py``.

These are the rules as they were written before the port, with one change:
``10**x`` in messages is ``_pow10(x)``, inf where Python's ``**`` raises
OverflowError (a lift above 308 decades, or such an option), as the
kernel's ``powf`` answers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from adapterprobe import _core
from adapterprobe.errors import MissingFileError
from adapterprobe.probes.ghost import KIND, TAMPERED, GhostOptions
from adapterprobe.probes.layer_lift import (
    FIRST_LAYER,
    PEERS,
    SET_ASIDE,
    nearest_peers,
    peer_reference,
    share_quantile,
)
from adapterprobe.probes.result import ProbeResult, Verdict


def _pow10(x: float) -> float:
    try:
        return float(10**x)
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class LayerLift:
    """One layer's lift over its peers' reference, in decades."""

    layer: int
    decades: float  # reached by at least `share` of its tensors
    tensors: int  # tensors compared
    by_tensor: tuple[tuple[str, float], ...]  # (tensor, lift in decades), highest first


def layer_lifts(
    per_param: list[Any], attribution: Any, *, share: float, min_layers: int
) -> dict[int, LayerLift]:
    """Each layer's lift over its peers (see the module docstring).

    A tensor is compared where it holds a positive, finite second moment in
    at least ``min_layers`` layers (tensors with none are dead: the caller
    reports them); a layer with no compared tensor gets no lift.
    """
    value = {p.param_id: p.exp_avg_sq_mean for p in per_param}
    by_slot: dict[int, dict[int, float]] = {}
    for ps in attribution.params:
        v = value[ps.param_id]
        if v > 0.0 and math.isfinite(v):
            by_slot.setdefault(ps.slot, {})[ps.layer] = math.log10(v)
    per_layer: dict[int, list[tuple[str, float]]] = {}
    for slot, logs in sorted(by_slot.items()):
        if len(logs) < min_layers:
            continue
        tensor = attribution.slot_names[slot] or f"slot {slot}"
        for layer, x in logs.items():
            others = [logs[m] for m in nearest_peers(layer, list(logs))]
            per_layer.setdefault(layer, []).append((tensor, x - peer_reference(others)))
    return {
        layer: LayerLift(
            layer=layer,
            decades=share_quantile([d for _, d in lifts], share),
            tensors=len(lifts),
            by_tensor=tuple(sorted(lifts, key=lambda t: -t[1])),
        )
        for layer, lifts in sorted(per_layer.items())
    }


def mean(values: list[float]) -> float:
    """The arithmetic mean (as ``statistics.fmean``), without overflowing when
    the sum of finite values exceeds the float range."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        scale = max(abs(v) for v in values)
        return math.fsum(v / scale for v in values) / len(values) * scale


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def judge_ghost(inputs: Any, options: GhostOptions, *, name: str = KIND) -> ProbeResult:
    """The verdict for one adapter from its gathered inputs (a ``GhostInput``
    or an object with its attributes)."""

    def result(verdict: Verdict, message: str, **kw: Any) -> ProbeResult:
        return ProbeResult(name=name, kind=KIND, verdict=verdict, message=message, **kw)

    if inputs.note is not None:
        return result(Verdict.SKIP, inputs.note, evidence={"optimizer": inputs.optimizer})
    if inputs.state is None:
        verdict = Verdict.SKIP if isinstance(inputs.error, MissingFileError) else Verdict.ERROR
        return result(verdict, str(inputs.error))
    implausible = list(inputs.state.implausible)
    if implausible:
        # Under every rule set: nothing judged from such a file means anything.
        shown = "; ".join(implausible[:3]) + ("; ..." if len(implausible) > 3 else "")
        return result(
            Verdict.FAIL,
            f"{TAMPERED}: {shown}",
            score=0.0,
            evidence={
                "rules": options.rules,
                "optimizer": inputs.optimizer,
                "implausible": implausible,
            },
        )
    if options.rules == "sway":
        return _judge_sway(inputs, options, result)
    return _judge_robust(inputs, options, result)


def _judge_sway(inputs: Any, o: GhostOptions, result: Any) -> ProbeResult:
    """dlm-sway's ladder: step floor, all-NaN moments, layers vs the calmest one."""
    state = inputs.state

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

    global_mean = mean(finite)
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
        layer_means = {layer: mean(v) for layer, v in buckets.items() if v}
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
            "rules": "sway",
            "global_step": state.global_step,
            "epoch": state.epoch,
            "num_params": len(per_param),
            "num_layers": num_layers,
            "params_per_layer": params_per_layer,
            "layer_exp_avg_sq": {str(k): v for k, v in layer_means.items()},
            "flagged_layers": undertrained,
            "global_mean_exp_avg_sq": global_mean,
            "frac_layers_undertrained": frac,
            "num_layers_undertrained": len(undertrained),
            "worst_layers": worst_layers,
            "num_nonfinite_exp_avg_sq": nonfinite_count,
            "best_val_loss": best_val_loss,
            "use_qlora": state.use_qlora,
        },
    )


def _judge_robust(inputs: Any, o: GhostOptions, result: Any) -> ProbeResult:
    """The robust rule set: see the module docstring."""
    state = inputs.state
    per_param = state.per_param
    base = {
        "rules": "robust",
        "optimizer": inputs.optimizer,
        "global_step": state.global_step,
        "epoch": state.epoch,
        "num_params": len(per_param),
        "best_val_loss": _finite_or_none(state.best_val_loss),
        "use_qlora": state.use_qlora,
    }
    if inputs.weights_error is not None:
        return result(
            Verdict.ERROR,
            f"adapter_weights: cannot read the adapter beside the optimizer state: "
            f"{inputs.weights_error}",
            evidence=base,
        )
    if state.global_step < o.min_steps_threshold:
        return result(
            Verdict.FAIL,
            f"too_few_steps: global_step={state.global_step} is below "
            f"{o.min_steps_threshold}: a smoke-test-length run, not a trained adapter",
            score=0.0,
            raw=float(state.global_step),
            evidence={**base, "min_steps_threshold": o.min_steps_threshold},
        )
    bad = [p.param_id for p in per_param if p.nonfinite or not math.isfinite(p.exp_avg_sq_mean)]
    if bad:
        return result(
            Verdict.FAIL,
            f"nonfinite_second_moments: exp_avg_sq of {len(bad)} of {len(per_param)} "
            f"parameters holds NaN/inf (param ids {_ids_text(bad)}): NaN or inf gradients "
            "reached the optimizer",
            score=0.0,
            evidence={**base, "nonfinite_param_ids": bad},
        )
    if per_param and all(p.exp_avg_sq_mean == 0.0 for p in per_param):
        return result(
            Verdict.FAIL,
            f"no_gradients: every exp_avg_sq is exactly zero after {state.global_step} steps: "
            "no gradient ever reached the optimizer, so the adapter never trained "
            "(a dead adapter, e.g. lora_B frozen at its zero init)",
            score=0.0,
            evidence=base,
        )

    checked = ["global_step", "finite second moments", "gradients reached the optimizer"]
    not_checked: dict[str, str] = {}
    findings: list[tuple[Verdict, str, str]] = []
    layer_values: dict[str, float] = {}
    outliers: list[dict[str, Any]] = []
    lifts: dict[int, LayerLift] = {}
    exploding: list[LayerLift] = []
    attribution = inputs.attribution
    if attribution is None:
        not_checked["per_layer"] = (
            f"optimizer ids cannot be attributed to layers exactly: {inputs.attribution_error}"
        )
    elif len(attribution.layer_indices) < o.min_layers_compared:
        not_checked["per_layer"] = (
            f"only {len(attribution.layer_indices)} layer(s); a layer is compared with its "
            f"peers, which needs at least {o.min_layers_compared} (between two layers, which "
            "one is the outlier cannot be told)"
        )
    else:
        checked.append("per-layer second moments")
        outliers, dead, layer_values = _layer_comparison(per_param, attribution, o)
        lifts = layer_lifts(
            per_param, attribution, share=o.layer_lift_share, min_layers=o.min_layers_compared
        )
        exploding = [x for x in lifts.values() if x.decades > _lift_limit(x.layer, o)]
        if outliers:
            parts = [
                f"layer {x['layer']} {x['ratio']:.3g}x {_core.excerpt(x['tensor'])}"
                for x in sorted(outliers, key=lambda x: -x["ratio"])[:6]
            ]
            findings.append(
                (
                    Verdict.WARN,
                    "layer_outliers",
                    f"{len(outliers)} of {len(attribution.layer_indices)} layers have second "
                    f"moments typically more than {o.layer_outlier_ratio:g}x those of the same "
                    "tensors in the other layers (exploding gradients there): " + "; ".join(parts),
                )
            )
        if exploding:
            parts = [
                f"layer {x.layer} +{x.decades:.2f} decades ({_pow10(x.decades):.3g}x) in "
                f"{_lifted_count(x, o)}/{x.tensors} tensors"
                for x in sorted(exploding, key=lambda x: -x.decades)[:6]
            ]
            findings.append(
                (
                    Verdict.WARN,
                    "exploding_layers",
                    f"{len(exploding)} of {len(attribution.layer_indices)} layers have second "
                    f"moments more than {o.layer_lift_decades:g} decades "
                    f"({_pow10(o.layer_lift_decades):.3g}x; layer 0: "
                    f"{o.first_layer_lift_decades:g}) above the same tensors in their nearest "
                    f"{PEERS} layers (the median, the {SET_ASIDE} highest set aside) in at "
                    f"least {o.layer_lift_share:.0%} of their tensors (exploding gradients "
                    "there, a precursor of instability): " + "; ".join(parts),
                )
            )
        if dead:
            parts = [f"layer {x['layer']} {_core.excerpt(x['tensor'])}" for x in dead[:6]]
            findings.append(
                (
                    Verdict.WARN,
                    "dead_tensors",
                    f"{len(dead)} tensors got no gradient (exp_avg_sq exactly zero) while the "
                    f"same tensor in other layers did: " + "; ".join(parts),
                )
            )
    layer_means: dict[str, float] = {}
    if attribution is not None:
        # Each layer's mean second moment: worth drawing whether compared or not.
        value = {p.param_id: p.exp_avg_sq_mean for p in per_param}
        per_layer: dict[int, list[float]] = {}
        for ps in attribution.params:
            per_layer.setdefault(ps.layer, []).append(value[ps.param_id])
        layer_means = {str(layer): mean(v) for layer, v in sorted(per_layer.items())}
    evidence = {
        **base,
        "checked": checked,
        "not_checked": not_checked,
        "findings": [{"rule": r, "verdict": v.value, "message": t} for v, r, t in findings],
        "num_layers": 0 if attribution is None else len(attribution.layer_indices),
        "layer_exp_avg_sq": layer_means,
        # Each compared layer's score: the median over its tensors of the ratio
        # to the same tensor's median across layers (1.0 is a typical layer).
        "layer_ratio_to_peers": layer_values,
        # Each compared layer's lift in decades (log10) over the same tensors
        # in its nearest layers (their median, the two highest set aside),
        # reached by layer_lift_share of its tensors (0: like its peers; 1.7: 50x).
        "layer_log_lift": {str(x.layer): x.decades for x in lifts.values()},
        "exploding_layers": sorted(x.layer for x in exploding),
        "exploding_tensors": [
            {"layer": x.layer, "tensor": tensor, "lift_decades": lift}
            for x in sorted(exploding, key=lambda x: x.layer)
            for tensor, lift in x.by_tensor
            if lift > _lift_limit(x.layer, o)
        ],
        "flagged_layers": sorted({x["layer"] for x in outliers} | {x.layer for x in exploding}),
        "outliers": outliers,
        "thresholds": o.to_dict(),
    }
    unchecked = "".join(
        f"; {k.replace('_', '-')} check not done: {v}" for k, v in not_checked.items()
    )
    if findings:
        worst = max((v for v, _, _ in findings), key=lambda v: v.severity)
        message = "; ".join(f"{rule}: {text}" for _, rule, text in findings)
        return result(worst, message + unchecked, score=0.5, evidence=evidence)
    done = (
        f"; per-layer check: {len(attribution.params)} tensors in "
        f"{len(attribution.layer_indices)} layers, no layer above {o.layer_outlier_ratio:g}x "
        f"its peers, none exploding ({_pow10(o.layer_lift_decades):.3g}x its nearest layers)"
        if "per_layer" not in not_checked and attribution is not None
        else ""
    )
    return result(
        Verdict.PASS,
        f"global_step={state.global_step}; second moments finite and non-zero{done}{unchecked}",
        score=0.9 if not not_checked else 0.8,
        evidence=evidence,
    )


def _lift_limit(layer: int, o: GhostOptions) -> float:
    return o.first_layer_lift_decades if layer == FIRST_LAYER else o.layer_lift_decades


def _lifted_count(lift: LayerLift, o: GhostOptions) -> int:
    return sum(d > _lift_limit(lift.layer, o) for _, d in lift.by_tensor)


def _ids_text(ids: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def _layer_comparison(
    per_param: list[Any], attribution: Any, o: GhostOptions
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float]]:
    """Each layer against its peers, like with like.

    Every tensor's second moment is divided by the median of the same tensor
    (slot) across layers; a layer's score is the median of its tensors'
    ratios, so one naturally busy tensor (layer 0's q/k projections often sit
    100x above their peers in healthy runs) does not flag a layer, while a
    layer whose gradients blew up, which lifts all its tensors, does.
    Returns the outlier layers, the tensors with no gradient where their
    peers had one, and each layer's score (1.0 is a typical layer).
    """
    value = {p.param_id: p.exp_avg_sq_mean for p in per_param}
    by_slot: dict[int, list[tuple[int, float]]] = {}
    for ps in attribution.params:
        by_slot.setdefault(ps.slot, []).append((ps.layer, value[ps.param_id]))
    dead = []
    ratios: dict[int, list[tuple[float, str]]] = {}
    for slot, entries in sorted(by_slot.items()):
        tensor = attribution.slot_names[slot] or f"slot {slot}"
        median = statistics.median(v for _, v in entries)
        for layer, v in entries:
            if v == 0.0 and median > 0.0:
                dead.append({"layer": layer, "slot": slot, "tensor": tensor})
            if median > 0.0:
                ratios.setdefault(layer, []).append((v / median, tensor))
    scores = {layer: statistics.median(r for r, _ in rs) for layer, rs in sorted(ratios.items())}
    outliers = []
    for layer, score in scores.items():
        if score > o.layer_outlier_ratio:
            top, tensor = max(ratios[layer])
            outliers.append(
                {"layer": layer, "ratio": score, "tensor": f"(top: {tensor} {top:.3g}x)"}
            )
    return outliers, dead, {str(layer): score for layer, score in scores.items()}
