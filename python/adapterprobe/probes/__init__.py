"""The probes: each reads one kind of artifact and returns a :class:`ProbeResult`.

``PROBES`` lists them with their options class and judge, so ``scan``, the
Ray engine and the CLI treat every probe the same way; ``DEFAULT_PROBES``
are those a scan runs unless told otherwise (``full_weights``, which reads
every byte of a full model, is opt-in).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from adapterprobe.errors import UsageError
from adapterprobe.probes.drift import DriftOptions, judge_drift, training_drift
from adapterprobe.probes.full_weights import (
    FullWeightsOptions,
    full_weights,
    judge_full_weights,
)
from adapterprobe.probes.gap import GapOptions, gap_monitor, judge_gap
from adapterprobe.probes.ghost import GhostOptions, gradient_ghost, judge_ghost
from adapterprobe.probes.options import RULE_SETS, ProbeOptions
from adapterprobe.probes.result import ProbeResult, Verdict
from adapterprobe.probes.weights import WeightsOptions, adapter_weights, judge_weights


@dataclass(frozen=True)
class ProbeSpec:
    """How a scan runs one probe: its options class, its judge, whether it
    judges a whole store ("store") or each adapter version ("adapter"), and
    which field of the gathered ``TargetInputs`` holds its inputs."""

    name: str
    options: type[ProbeOptions]
    judge: Callable[..., ProbeResult]
    scope: str
    inputs: str


PROBES: dict[str, ProbeSpec] = {
    spec.name: spec
    for spec in (
        ProbeSpec("adapter_weights", WeightsOptions, judge_weights, "adapter", "weights"),
        ProbeSpec("gradient_ghost", GhostOptions, judge_ghost, "adapter", "ghosts"),
        ProbeSpec("training_drift", DriftOptions, judge_drift, "store", "drift"),
        ProbeSpec("gap_monitor", GapOptions, judge_gap, "store", "gap"),
        ProbeSpec(
            "full_weights", FullWeightsOptions, judge_full_weights, "adapter", "full_weights"
        ),
    )
}
#: The probes a scan runs when none are named.
DEFAULT_PROBES: tuple[str, ...] = (
    "adapter_weights",
    "gradient_ghost",
    "training_drift",
    "gap_monitor",
)


def resolve_options(
    probes: tuple[str, ...], options: Mapping[str, Any] | None, rules: str | None = None
) -> dict[str, ProbeOptions]:
    """One validated options object per probe, under one rule set.

    ``options`` maps probe names to an options object or a mapping of option
    values; probes not named get their defaults. ``rules`` (default
    "robust") applies to every probe; an options object or mapping that
    names a different rule set is a UsageError.
    """
    unknown = [p for p in probes if p not in PROBES]
    if unknown or not probes:
        raise UsageError(
            f"probes must be a non-empty subset of {tuple(PROBES)}, got {list(probes)}"
        )
    options = dict(options or {})
    extra = sorted(set(options) - set(PROBES))
    if extra:
        raise UsageError(f"options given for unknown probe(s): {', '.join(extra)}")
    if rules is not None and rules not in RULE_SETS:
        raise UsageError(
            f"rules must be one of {', '.join(map(repr, RULE_SETS))}, got {rules!r}",
            option="rules",
        )
    resolved: dict[str, ProbeOptions] = {}
    for name, spec in PROBES.items():
        given = options.get(name)
        if isinstance(given, spec.options):
            chosen = given
        elif given is None or isinstance(given, Mapping):
            values = dict(given or {})
            values.setdefault("rules", rules or "robust")
            chosen = spec.options.from_mapping(values)
        else:
            raise UsageError(
                f"options for {name} must be a {spec.options.__name__} or a mapping, "
                f"got {type(given).__name__}"
            )
        if rules is not None and chosen.rules != rules:
            raise UsageError(
                f"options for {name} use rules={chosen.rules!r} but the scan runs rules={rules!r}"
            )
        resolved[name] = chosen
    rule_sets = {o.rules for o in resolved.values()}
    if len(rule_sets) > 1:
        raise UsageError(f"all probes must use one rule set, got {sorted(rule_sets)}")
    return resolved


__all__ = [
    "DEFAULT_PROBES",
    "PROBES",
    "RULE_SETS",
    "DriftOptions",
    "FullWeightsOptions",
    "GapOptions",
    "GhostOptions",
    "ProbeOptions",
    "ProbeResult",
    "ProbeSpec",
    "Verdict",
    "WeightsOptions",
    "adapter_weights",
    "full_weights",
    "gap_monitor",
    "gradient_ghost",
    "resolve_options",
    "training_drift",
]
