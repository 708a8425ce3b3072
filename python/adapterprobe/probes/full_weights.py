"""full_weights: is a full fine-tune's checkpoint sound, from its weights alone?

Half of HF Trainer runs train the whole model, not a LoRA adapter, so there
is no ``lora_B`` to find dead; but a bad step that left NaN or inf in the
weights breaks a full model just the same, and is invisible in a loss log
that filters non-finite losses. This probe streams every float tensor of a
checkpoint's ``model.safetensors`` (or of its shards, through
``model.safetensors.index.json``) in Rust, in bounded memory with the GIL
released, and reports:

- any non-finite value: FAIL, naming the tensors;
- otherwise PASS, with per-layer L2 norms (and the norms of the tensors
  outside the layers: embeddings, head, final norm) as evidence;
- ``pytorch_model.bin`` (pickled: unpickling runs code), Lightning ``.ckpt``
  files, adapters (``adapter_weights`` checks those) and log-only
  checkpoints: SKIP with the reason; an unreadable file: ERROR.

Not in the default probe set (it reads every byte of the model): ask for it
with ``--probes full_weights`` or ``scan(probes=[..., "full_weights"])``.
The rule sets do not differ here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapterprobe import _core
from adapterprobe.probes.options import ProbeOptions, Rule, option, resolve
from adapterprobe.probes.result import ProbeResult, Verdict

KIND = "full_weights"


@dataclass(frozen=True)
class FullWeightsOptions(ProbeOptions):
    """Options of :func:`full_weights`; None takes the default."""

    max_listed: int = option(
        Rule(int, low=1),
        "tensors named in a non-finite finding's message (all are in the evidence)",
        robust=6,
        sway=6,
    )


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


def full_weights(
    checkpoint_path: str | Path,
    *,
    rules: str | None = None,
    max_listed: int | None = None,
    options: FullWeightsOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the weights of one full fine-tune checkpoint: a ``checkpoint-N/``
    (or any directory) holding ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``, or either file itself.

    Raises UsageError only for invalid options; every problem with the
    checkpoint is reported in the returned result.
    """
    resolved = resolve(FullWeightsOptions, options, rules, {"max_listed": max_listed})
    inputs = _core.full_weights_input(Path(checkpoint_path).expanduser())
    return judge_full_weights(inputs, resolved, name=name)
