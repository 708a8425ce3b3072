"""gradient_ghost: what the optimizer state says about how an adapter trained.

Reads the optimizer state saved beside an adapter version
(``training_state.pt``) with the Rust reader, without torch and without
running any pickle code, and judges it under one of two rule sets
(``rules=``):

- ``"robust"`` (default): FAIL for a smoke-test-length run
  (``global_step`` below ``min_steps_threshold``), for NaN/inf second
  moments and for second moments that are all exactly zero (no gradient
  ever reached the optimizer: a dead adapter). The per-layer checks compare
  like with like, each tensor (module and LoRA factor) with the same tensor
  in other layers, and WARN for:

  - exploding layers (``exploding_layers``, see :mod:`.layer_lift`): on a
    log scale, a layer whose tensors (at least ``layer_lift_share``, 90%,
    of them) sit more than ``layer_lift_decades`` (1.0: 10x) above the
    median of the same tensor in its 4 nearest layers, their 2 highest set
    aside (a second exploding layer, a naturally busy one); layer 0, which
    reads the embeddings and is busier in healthy runs, above
    ``first_layer_lift_decades`` (1.5). The margins come from the spread
    of 59 healthy states of real runs (other layers: mean -0.09, sd 0.24
    decades; layer 0: +0.34, sd 0.32), so a healthy run warns about once
    in 5,000, while 50x on one or two layers (gradients 7x) is caught in
    98% and 96% of the healthy states it was injected into
    (``benches/bench_ghost_layers.py``). WARN, not FAIL: Adam normalises
    its update by this very moment, so the adapter may still be fine (the
    loss stays finite); it is a precursor of instability to look at.
  - a layer whose tensors are typically (median of their ratios) above
    ``layer_outlier_ratio`` (1000x) the median of the same tensor across
    layers (``layer_outliers``; kept from before, subsumed in practice);
  - a tensor that got no gradient in some layers while its peers did.

  They need an exact attribution of optimizer ids to layers and at least
  ``min_layers_compared`` (3) layers (which of two layers is the outlier
  cannot be told); otherwise they are reported as not checked, with the
  reason, never silently passed. Missing or unreadable adapter weights are
  an ERROR.
- ``"sway"``: dlm-sway's gradient_ghost exactly: the step floor, all-NaN
  second moments, then each layer's mean second moment against the calmest
  layer's (``undertrained_layer_ratio``, ``layer_failure_frac``).

Under both rule sets, a state holding values no optimizer writes (a
negative ``exp_avg_sq``, an ``exp_avg`` beyond the bound Adam guarantees
from ``exp_avg_sq`` and the group's betas, an impossible ``step``) FAILs
first as a "corrupted or tampered optimizer state". A missing state file is
a SKIP; an unreadable, hostile or foreign one is an ERROR result, never an
exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe.probes.options import ProbeOptions, Rule, option, resolve
from adapterprobe.probes.result import ProbeResult

KIND = "gradient_ghost"
#: How a state holding values no optimizer writes is reported (see
#: ``rust/store/plausibility.rs`` and ``rust/analysis/adam_bound.rs``).
TAMPERED = "corrupted or tampered optimizer state"


@dataclass(frozen=True)
class GhostOptions(ProbeOptions):
    """Thresholds of :func:`gradient_ghost`; None takes the rule set's default."""

    min_steps_threshold: int = option(
        Rule(int, low=1),
        "global_step below this: FAIL (a smoke test, severely undertrained)",
        robust=20,
        sway=50,
    )
    # rules="sway"
    undertrained_layer_ratio: float = option(
        Rule(float, low=1, low_open=True),
        "a layer's mean exp_avg_sq above this many times the calmest layer's is flagged",
        sway=2.0,
    )
    layer_failure_frac: float = option(
        Rule(float, low=0, high=1), "more than this share of layers flagged: FAIL", sway=0.3
    )
    # rules="robust"
    layer_outlier_ratio: float = option(
        Rule(float, low=1, low_open=True),
        "a layer whose tensors' exp_avg_sq are typically (median over its tensors) this many "
        "times the median of the same tensor across layers: WARN",
        robust=1000.0,
    )
    min_layers_compared: int = option(
        Rule(int, low=3), "fewer attributed layers than this: per-layer check not done", robust=3
    )
    layer_lift_decades: float = option(
        Rule(float, low=0, low_open=True),
        "a layer whose tensors' exp_avg_sq sit more than this many decades (log10) above the "
        "same tensors in its 4 nearest layers (their median, the 2 highest set aside): "
        "WARN (exploding gradients)",
        robust=1.0,
    )
    first_layer_lift_decades: float = option(
        Rule(float, low=0, low_open=True),
        "the same for layer 0, the block that reads the embeddings (busier than its peers "
        "in healthy runs)",
        robust=1.5,
    )
    layer_lift_share: float = option(
        Rule(float, low=0, low_open=True, high=1),
        "... lifted in at least this share of the layer's tensors",
        robust=0.9,
    )


def judge_ghost(inputs: Any, options: GhostOptions, *, name: str = KIND) -> ProbeResult:
    """The verdict for one adapter from its gathered inputs: a ``GhostInput``,
    or any object with its attributes (plain data shaped like one, read by
    ``_core.ghost_input_of``). The rules run in Rust
    (``rust/verdicts/ghost/``), their one implementation."""
    if not isinstance(inputs, _core.GhostInput):
        inputs = _core.ghost_input_of(inputs)
    return ProbeResult.judged(name, KIND, _core.judge_ghost(inputs, options))


def gradient_ghost(
    adapter_path: str | Path,
    *,
    rules: str | None = None,
    min_steps_threshold: int | None = None,
    undertrained_layer_ratio: float | None = None,
    layer_failure_frac: float | None = None,
    layer_outlier_ratio: float | None = None,
    min_layers_compared: int | None = None,
    layer_lift_decades: float | None = None,
    first_layer_lift_decades: float | None = None,
    layer_lift_share: float | None = None,
    options: GhostOptions | None = None,
    name: str = KIND,
) -> ProbeResult:
    """Judge the optimizer state of one adapter version dir (or its ``.pt`` file).

    ``rules``: ``"robust"`` (default) or ``"sway"`` (see the module doc).
    Thresholds left as None take the rule set's default (see
    :class:`GhostOptions`); ``options`` passes a whole :class:`GhostOptions`.
    Raises UsageError only for invalid options.
    """
    given = {
        "min_steps_threshold": min_steps_threshold,
        "undertrained_layer_ratio": undertrained_layer_ratio,
        "layer_failure_frac": layer_failure_frac,
        "layer_outlier_ratio": layer_outlier_ratio,
        "min_layers_compared": min_layers_compared,
        "layer_lift_decades": layer_lift_decades,
        "first_layer_lift_decades": first_layer_lift_decades,
        "layer_lift_share": layer_lift_share,
    }
    resolved = resolve(GhostOptions, options, rules, given)
    inputs = _core.ghost_input(Path(adapter_path).expanduser())
    return judge_ghost(inputs, resolved, name=name)
