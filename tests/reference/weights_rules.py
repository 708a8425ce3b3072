"""Plain-Python reference of adapter_weights' rules (both rule sets run the
same checks).

This is the rule code the probe ran before its rules became the Rust kernel
``verdicts::weights`` (``_core.judge_weights``); tests/test_weights_kernel.py
compares the two on arbitrary adapters, versions and options, and on every
real adapter the repository has. It reads the same gathered inputs
(``WeightsInput`` and its ``AdapterWeights``) through their Python API.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from adapterprobe import _core
from adapterprobe.probes.result import ProbeResult, Verdict
from adapterprobe.probes.weights import KIND, WeightsOptions


def _names_text(names: list[str], limit: int = 6) -> str:
    """Names from the file for a message: the first few, each a short excerpt."""
    shown = ", ".join(_core.excerpt(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _fingerprint(weights: Any) -> list[tuple[str, float, float]]:
    return [(m.name, m.norm_a, m.norm_b) for m in weights.modules]


def judge_weights(
    inputs: Any, options: WeightsOptions, *, previous: Any = None, name: str = KIND
) -> ProbeResult:
    """The verdict for one adapter version from its gathered inputs (a
    ``WeightsInput``); ``previous`` is the version before it, when known."""

    def result(verdict: Verdict, message: str, **kw: Any) -> ProbeResult:
        return ProbeResult(name=name, kind=KIND, verdict=verdict, message=message, **kw)

    o = options
    w = inputs.weights
    if inputs.note is not None:
        return result(Verdict.SKIP, inputs.note)
    if w is None:
        return result(Verdict.ERROR, f"adapter_weights: {inputs.error}")
    if w.config is None:
        return result(
            Verdict.ERROR,
            f"adapter_weights: no adapter_config.json beside {w.path}, so the scale of "
            "dW = (alpha / r) * B @ A is unknown and the adapter cannot be loaded as is",
        )
    modules = list(w.modules)
    config = w.config
    base: dict[str, Any] = {
        "rules": o.rules,
        "num_modules": len(modules),
        "num_other_tensors": len(w.other_tensors),
        "tensor_bytes": w.tensor_bytes,
        "config": {
            "r": config.r,
            "lora_alpha": config.lora_alpha,
            "use_rslora": config.use_rslora,
            "use_dora": config.use_dora,
            "target_modules": list(config.target_modules),
            "modules_to_save": list(config.modules_to_save),
        },
    }
    if w.nonfinite_total:
        bad = [m.name for m in modules if m.nonfinite_a or m.nonfinite_b or m.magnitude_nonfinite]
        bad += [t.name for t in w.other_tensors if t.nonfinite]
        return result(
            Verdict.FAIL,
            f"nonfinite_weights: {w.nonfinite_total} NaN/inf values in {len(bad)} tensors "
            f"({_names_text(bad)}): the adapter is corrupt and produces NaN outputs",
            score=0.0,
            evidence={**base, "nonfinite_total": w.nonfinite_total, "nonfinite_modules": bad},
        )
    if not modules:
        return result(
            Verdict.SKIP,
            f"no LoRA factors in {w.path} (only {len(w.other_tensors)} other tensors), "
            "so there is no dW to judge",
            evidence=base,
        )

    norms = [m.delta_fro or 0.0 for m in modules]
    energy = [n * n for n in norms]
    total_energy = math.fsum(energy)
    median = statistics.median(norms)
    dead = [
        m.name
        for m, n in zip(modules, norms, strict=True)
        if n == 0.0 or (median > 0.0 and n <= o.dead_relative_norm * median)
    ]
    ranked = sorted(zip(modules, energy, strict=True), key=lambda item: -item[1])
    top = [
        {"module": m.name, "share": e / total_energy if total_energy > 0 else 0.0}
        for m, e in ranked[:5]
    ]
    layer_energy = {str(layer.layer): layer.delta_fro_sq for layer in w.layers}
    used = [m.rank_used for m in modules if m.rank_used is not None]
    evidence = {
        **base,
        "total_delta_fro": math.sqrt(total_energy),
        "layer_delta_energy": layer_energy,
        "top_modules": top,
        "dead_modules": dead,
        "rank_configured": config.r,
        "rank_used": {
            "min": min(used, default=None),
            "median": statistics.median(used) if used else None,
            "max": max(used, default=None),
        },
        "stable_rank_median": statistics.median(m.stable_rank for m in modules),
    }
    if len(dead) == len(modules):
        return result(
            Verdict.FAIL,
            f"dead_adapter: every one of the {len(modules)} LoRA modules has dW = 0 "
            "(lora_B never moved from its zero init): the adapter changes nothing",
            score=0.0,
            evidence=evidence,
        )

    findings: list[tuple[Verdict, str, str]] = []
    if dead:
        findings.append(
            (
                Verdict.WARN,
                "dead_modules",
                f"{len(dead)} of {len(modules)} modules have dW = 0: {_names_text(dead)}",
            )
        )
    if len(modules) >= o.min_modules_for_share and total_energy > 0:
        k = max(1, len(modules) // 20)
        share = math.fsum(e for _, e in ranked[:k]) / total_energy
        if share > o.max_top_share:
            names = [m.name for m, _ in ranked[:k]]
            findings.append(
                (
                    Verdict.WARN,
                    "concentrated",
                    f"{k} of {len(modules)} modules hold {share:.0%} of the dW energy "
                    f"(more than {o.max_top_share:.0%}): {_names_text(names)}",
                )
            )
    if previous is not None and previous.weights is not None:
        evidence["previous_version"] = str(previous.adapter)
        before = math.sqrt(math.fsum((m.delta_fro or 0.0) ** 2 for m in previous.weights.modules))
        evidence["total_delta_fro_previous"] = before
        if _fingerprint(previous.weights) == _fingerprint(w):
            findings.append(
                (
                    Verdict.WARN,
                    "unchanged",
                    f"identical to the previous version {Path(previous.adapter).name}: "
                    "no module's ||A|| or ||B|| changed, so this version trained nothing new",
                )
            )

    summary = (
        f"{len(modules)} LoRA modules in {len(w.layers) or 'no'} layers, "
        f"||dW|| {math.sqrt(total_energy):.4g}, rank used "
        f"{evidence['rank_used']['min']}-{evidence['rank_used']['max']} of {config.r}"
    )
    if findings:
        worst = max((v for v, _, _ in findings), key=lambda v: v.severity)
        message = "; ".join(f"{rule}: {text}" for _, rule, text in findings)
        evidence["findings"] = [
            {"rule": r, "verdict": v.value, "message": t} for v, r, t in findings
        ]
        return result(worst, f"{message} ({summary})", score=0.5, evidence=evidence)
    evidence["findings"] = []
    return result(Verdict.PASS, summary, score=1.0, evidence=evidence)
