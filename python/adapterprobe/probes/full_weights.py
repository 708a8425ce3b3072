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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe.probes.options import ProbeOptions, Rule, option, resolve
from adapterprobe.probes.result import ProbeResult

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


def judge_full_weights(
    inputs: Any, options: FullWeightsOptions, *, name: str = KIND
) -> ProbeResult:
    """The verdict for one checkpoint from its gathered inputs (a ``FullWeightsInput``).

    The rules run in the Rust kernel ``verdicts::full_weights`` (the same the
    scan pass runs), the one implementation of them.
    """
    return ProbeResult.judged(name, KIND, _core.judge_full_weights(inputs, options))


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
