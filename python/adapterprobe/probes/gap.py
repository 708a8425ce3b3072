"""gap_monitor: the GAP monitor's statistics judged after (or while) a run trains.

:class:`adapterprobe.GAPMonitor` with a :class:`adapterprobe.JsonlSink` writes
``{"type": "gap"}`` records into the run's ``logs/train-*.jsonl`` on sampled
steps. This probe reads them back (the Rust reader keeps only the summary
statistics) and judges them with four rules, written once in Rust
(``rust/verdicts/gap/``):

- ``nonfinite`` (FAIL): NaN/inf in parameters or activations, or in the
  gradients at two sampled steps in a row or at the last one, naming the
  first such step and the layers or tensors the record names. One isolated
  step of non-finite gradients followed by finite ones is a WARN: under
  fp16 a loss scaler overflows now and then by design and skips the step.
- ``exploding_layer`` (WARN; FAIL at ``explode_fail_ratio`` or when it had
  not come back by the last sampled step): a layer whose gradient norm
  jumps ``explode_ratio`` above both its own recent level (the median of
  its last 8 samples) and its usual ratio to the median layer. A hard
  batch lifts every layer at once and moves no ratio; a layer that is
  always larger (the embeddings) is compared with its own usual ratio.
- ``vanishing_grads`` (WARN): a layer whose gradient is exactly zero at more
  than ``vanish_share`` of the sampled steps while the model's is not.
  Frozen layers have no gradient at all and are not in the records.
- ``activations_growing`` (WARN): the activations' RMS, overall or of one
  layer, ends ``activation_growth_decades`` orders of magnitude above where
  it started (medians of the first and last three samples).

A store whose logs hold no gap record gets no ``gap_monitor`` record from a
scan (a single call answers SKIP). Both rule sets judge alike: the seeds
never read the monitor's records, so there is no ``sway`` behaviour to keep.
The evidence carries ``layer_grad_norms`` (per layer, at most 64 layers and
256 points) for the report's plot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe.probes.options import ProbeOptions, Rule, option, resolve
from adapterprobe.probes.result import ProbeResult, Verdict

KIND = "gap_monitor"


@dataclass(frozen=True)
class GapOptions(ProbeOptions):
    """Thresholds of :func:`gap_monitor`; None takes the default."""

    explode_ratio: float = option(
        Rule(float, low=1, low_open=True),
        "a layer's gradient norm this many times both its recent level and its usual ratio "
        "to the other layers: WARN",
        robust=10.0,
        sway=10.0,
    )
    explode_fail_ratio: float = option(
        Rule(float, low=1, low_open=True),
        "... this many times: FAIL (as is a jump still there at the last sampled step)",
        robust=100.0,
        sway=100.0,
    )
    min_history: int = option(
        Rule(int, low=1), "earlier samples a layer needs before a jump is judged", robust=3, sway=3
    )
    vanish_share: float = option(
        Rule(float, low=0, high=1),
        "a layer with zero gradient at more than this share of sampled steps: WARN",
        robust=0.5,
        sway=0.5,
    )
    min_samples: int = option(
        Rule(int, low=1),
        "fewer sampled steps than this: vanishing and growth not judged",
        robust=4,
        sway=4,
    )
    activation_growth_decades: float = option(
        Rule(float, low=0, low_open=True),
        "activations' RMS ending this many orders of magnitude above its start: WARN",
        robust=3.0,
        sway=3.0,
    )


def judge_gap(inputs: Any, options: GapOptions, *, name: str = KIND) -> ProbeResult:
    """The verdict on a store's gathered GAP records (a ``_core.GapInput``,
    or None when its logs hold none: SKIP)."""
    if inputs is None:
        return ProbeResult(
            name, KIND, Verdict.SKIP, None, None, "no GAP monitor records in the logs", {}
        )
    return ProbeResult.judged(name, KIND, _core.judge_gap(inputs, options))


def gap_monitor(
    store_path: str | Path,
    *,
    rules: str | None = None,
    explode_ratio: float | None = None,
    explode_fail_ratio: float | None = None,
    min_history: int | None = None,
    vanish_share: float | None = None,
    min_samples: int | None = None,
    activation_growth_decades: float | None = None,
    options: GapOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the GAP monitor's records in ``store_path/logs/train-*.jsonl``
    (a dlm store, or a trainer's output dir the monitor wrote into).

    Thresholds left as None take their default (see :class:`GapOptions`).
    A store without gap records is a SKIP. Raises UsageError only for
    invalid options.
    """
    given = {
        "explode_ratio": explode_ratio,
        "explode_fail_ratio": explode_fail_ratio,
        "min_history": min_history,
        "vanish_share": vanish_share,
        "min_samples": min_samples,
        "activation_growth_decades": activation_growth_decades,
    }
    resolved = resolve(GapOptions, options, rules, given)
    inputs = _core.gap_input(Path(store_path).expanduser())
    return judge_gap(inputs, resolved, name=name)
