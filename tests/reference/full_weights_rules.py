"""Plain-Python reference of full_weights' rules (the rule sets do not
differ).

This is the rule code the probe ran before its rules became the Rust kernel
``verdicts::full_weights`` (``_core.judge_full_weights``);
tests/test_weights_kernel.py compares the two on arbitrary models and options
and on every real checkpoint the repository has. It reads the same gathered
inputs (``FullWeightsInput`` and its ``FullWeights``) through their Python API.
"""

from __future__ import annotations

import math
from typing import Any

from adapterprobe import _core
from adapterprobe.probes.full_weights import KIND, FullWeightsOptions
from adapterprobe.probes.result import ProbeResult, Verdict


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def judge_full_weights(
    inputs: Any, options: FullWeightsOptions, *, name: str = KIND
) -> ProbeResult:
    """The verdict for one checkpoint from its gathered inputs (a ``FullWeightsInput``)."""

    def result(verdict: Verdict, message: str, **kw: Any) -> ProbeResult:
        return ProbeResult(name=name, kind=KIND, verdict=verdict, message=message, **kw)

    if inputs.note is not None:
        return result(Verdict.SKIP, inputs.note)
    w = inputs.weights
    if w is None:
        return result(Verdict.ERROR, f"full_weights: {inputs.error}")
    layers = list(w.layers)
    evidence: dict[str, Any] = {
        "rules": options.rules,
        "model_file": None if inputs.model_file is None else str(inputs.model_file),
        "files": [str(f) for f in w.files],
        "num_tensors": len(w.tensors),
        "num_layers": len(layers),
        "tensor_bytes": w.tensor_bytes,
        "skipped_tensors": [{"name": n, "dtype": d} for n, d in w.skipped],
        "total_norm": _finite_or_none(w.total_norm),
        "other_norm": _finite_or_none(w.other_norm),
        "layer_l2_norm": {str(layer.layer): _finite_or_none(layer.norm) for layer in layers},
        "nonfinite_total": w.nonfinite_total,
    }
    if w.nonfinite_total:
        bad = [t for t in w.tensors if t.nonfinite]
        shown = ", ".join(
            f"{_core.excerpt(t.name)} ({t.nonfinite})" for t in bad[: options.max_listed]
        )
        more = f" and {len(bad) - options.max_listed} more" if len(bad) > options.max_listed else ""
        evidence["nonfinite_tensors"] = {t.name: t.nonfinite for t in bad}
        evidence["nonfinite_layers"] = [layer.layer for layer in layers if layer.nonfinite]
        return result(
            Verdict.FAIL,
            f"nonfinite_weights: {w.nonfinite_total} NaN/inf values in {len(bad)} of "
            f"{len(w.tensors)} tensors ({shown}{more}): the model is corrupt and produces "
            "NaN outputs",
            score=0.0,
            evidence=evidence,
        )
    if not w.tensors:
        return result(
            Verdict.SKIP,
            f"no float tensors in {inputs.model_file} ({len(w.skipped)} of other dtypes), "
            "so there are no weights to check",
            evidence=evidence,
        )
    norms = [layer.norm for layer in layers]
    spread = (
        f", layer norms {min(norms):.4g}-{max(norms):.4g} over {len(layers)} layers"
        if norms
        else ""
    )
    return result(
        Verdict.PASS,
        f"{len(w.tensors)} tensors in {len(w.files)} file(s), all finite; "
        f"||W|| {w.total_norm:.4g}{spread}",
        score=1.0,
        evidence=evidence,
    )
