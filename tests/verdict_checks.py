"""What every verdict of every probe must look like, for the kernel tests
(test_drift_kernel, test_ghost_kernel, test_weights_kernel)."""

from __future__ import annotations

import json
from collections.abc import Collection

from adapterprobe.probes.result import ProbeResult

VERDICTS = {"pass", "warn", "fail", "error", "skip"}


def rules_of(result: ProbeResult) -> set[str]:
    """The rules a result's findings name."""
    return {f["rule"] for f in result.evidence.get("findings", [])}


def well_formed(result: ProbeResult, rules: Collection[str] | None = None) -> ProbeResult:
    """A verdict, a message, a score in [0, 1] and evidence JSON can carry;
    each finding a WARN or FAIL with its message (and one of ``rules``, when
    given). Returns ``result``."""
    assert result.verdict.value in VERDICTS
    assert isinstance(result.message, str)
    assert result.score is None or 0.0 <= result.score <= 1.0
    json.dumps(result.evidence)  # NaN allowed (Python's json writes it), no objects
    for finding in result.evidence.get("findings", []):
        assert finding["verdict"] in {"warn", "fail"} and finding["message"]
        assert rules is None or finding["rule"] in rules, finding
    return result
