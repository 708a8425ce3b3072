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


def short_repr(
    cls: str, kind: str, verdict: Verdict, score: float | None, message: str, limit: int = 80
) -> str:
    """``Cls(kind: VERDICT 0.93, 'message...'`` — the open start of a repr that
    never prints evidence (a loss curve is thousands of numbers)."""
    text = message if len(message) <= limit else message[: limit - 1] + "…"
    shown = "" if score is None else f" {score:.2f}"
    return f"{cls}({kind}: {verdict.value.upper()}{shown}, {text!r}"


@dataclass(repr=False)
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

    @classmethod
    def judged(cls, name: str, kind: str, made: tuple[Any, ...]) -> ProbeResult:
        """The result of a verdict kernel (``_core.judge_*``): its
        ``(verdict, score, raw, message, evidence)``, named ``name``."""
        verdict, score, raw, message, evidence = made
        return cls(name, kind, Verdict(verdict), score, raw, message, evidence)

    def __repr__(self) -> str:
        return short_repr(
            type(self).__name__, self.kind, self.verdict, self.score, self.message
        ) + (f", evidence: {len(self.evidence)} keys)")

    def _repr_html_(self) -> str:
        """The verdict, message and the report's charts, for notebooks."""
        from adapterprobe.reports.notebook import result_html

        return result_html(
            self.kind, self.verdict.value, self.score, self.message, self.evidence, self.name
        )

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
