"""adapter_weights: is the adapter itself sound, from its weights alone?

The most common broken LoRA adapter shows in no log: ``lora_B`` never moved
from its zero init (so the adapter changes nothing), or a bad step left NaN
or inf in the weights. This probe reads ``adapter_model.safetensors`` (or
``adapter_model.bin``, through the allow-listed pickle reader that never runs
the pickle) and ``adapter_config.json`` in Rust (bounded memory, GIL released) and computes
per LoRA module ``||A||``, ``||B||`` and ``||dW||_F`` with ``dW = s * B @ A``
(through the r x r Gram matrices, never forming the product), the singular
values of dW, and non-finite counts. Verdicts, worst first:

- missing or unreadable weights or config, or a config that disagrees with
  the weights: ERROR;
- any non-finite value: FAIL;
- every module's dW zero (a dead adapter): FAIL;
- some modules dead, or a few modules holding almost all of the dW energy:
  WARN, naming them;
- with ``--all-versions``, a version identical to the previous one: WARN;
- otherwise PASS.

dlm-sway has no weight-space probe, so ``rules="sway"`` and ``"robust"``
run the same checks here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe.probes.options import ProbeOptions, Rule, option, resolve
from adapterprobe.probes.result import ProbeResult

KIND = "adapter_weights"


@dataclass(frozen=True)
class WeightsOptions(ProbeOptions):
    """Thresholds of :func:`adapter_weights`; None takes the default."""

    dead_relative_norm: float = option(
        Rule(float, low=0),
        "a module whose ||dW|| is at most this fraction of the median module's is dead "
        "(0: exactly zero only)",
        robust=1e-6,
        sway=1e-6,
    )
    max_top_share: float = option(
        Rule(float, low=0, low_open=True, high=1),
        "WARN when the top 5% of modules (at least one) hold more than this share of the dW energy",
        robust=0.9,
        sway=0.9,
    )
    min_modules_for_share: int = option(
        Rule(int, low=2),
        "adapters with fewer modules than this are not judged on energy concentration",
        robust=8,
        sway=8,
    )


def judge_weights(
    inputs: Any, options: WeightsOptions, *, previous: Any = None, name: str = KIND
) -> ProbeResult:
    """The verdict for one adapter version from its gathered inputs (a
    ``WeightsInput``); ``previous`` is the version before it, when known.

    The rules run in the Rust kernel ``verdicts::weights`` (the same the
    scan pass runs), the one implementation of them.
    """
    return ProbeResult.judged(name, KIND, _core.judge_weights(inputs, options, previous))


def adapter_weights(
    adapter_path: str | Path,
    *,
    rules: str | None = None,
    dead_relative_norm: float | None = None,
    max_top_share: float | None = None,
    min_modules_for_share: int | None = None,
    options: WeightsOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the weights of one adapter: a PEFT adapter directory (or its
    ``adapter_model.safetensors`` or ``adapter_model.bin``), e.g. a dlm version dir, an HF
    ``checkpoint-N/`` or a bare ``save_pretrained`` output.

    Thresholds left as None take their default (see :class:`WeightsOptions`).
    Raises UsageError only for invalid options; every problem with the
    adapter is reported in the returned result.
    """
    given = {
        "dead_relative_norm": dead_relative_norm,
        "max_top_share": max_top_share,
        "min_modules_for_share": min_modules_for_share,
    }
    resolved = resolve(WeightsOptions, options, rules, given)
    inputs = _core.weights_input(Path(adapter_path).expanduser())
    return judge_weights(inputs, resolved, name=name)
