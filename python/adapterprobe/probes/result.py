"""What every probe returns: a verdict, a score and the evidence behind it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from adapterprobe._json import json_safe


class Verdict(str, enum.Enum):
    """Outcome of a probe. A ``str`` enum, so ``result.verdict == "pass"`` holds."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    @property
    def severity(self) -> int:
        """Rank for sorting reports worst first (error > fail > warn > skip > pass)."""
        return _SEVERITY[self]


_SEVERITY = {
    Verdict.PASS: 0,
    Verdict.SKIP: 1,
    Verdict.WARN: 2,
    Verdict.FAIL: 3,
    Verdict.ERROR: 4,
}


@dataclass
class ProbeResult:
    """One probe's answer about one adapter or run.

    ``score`` is in [0, 1] (higher is healthier) or None when the probe did not
    reach a judgement; ``raw`` is the probe's headline number before scoring.
    """

    name: str
    kind: str
    verdict: Verdict
    score: float | None = None
    raw: float | None = None
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: NaN and infinities become None."""
        return json_safe(
            {
                "name": self.name,
                "kind": self.kind,
                "verdict": self.verdict.value,
                "score": self.score,
                "raw": self.raw,
                "message": self.message,
                "evidence": self.evidence,
            }
        )
