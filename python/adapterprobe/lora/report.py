"""What :func:`adapterprobe.extract_lora` did, per module, per tensor and per category.

A fine-tune changes more than Linear weights: embeddings and output heads, norm
weights and biases change too, and an adapter that leaves them out reproduces little
of the fine-tune even when every LoRA factor is exact. So the report accounts for every
changed tensor, by category (``linear``: LoRA-factored weights; ``embedding``:
embeddings and output heads; ``1-D``: norm weights and biases; ``other``: anything
else), with the share of the fine-tune's delta energy (``sum ||W_tuned - W_base||_F^2``)
each category holds and the share of it the adapter carries: LoRA factors keep
``energy_kept`` of their delta, tensors saved whole keep all of it, skipped ones none.
With ``verify`` it also holds the measured logit agreement (:mod:`.verify`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from adapterprobe._json import json_safe

__all__ = [
    "CATEGORIES",
    "CategoryReport",
    "ExtractionReport",
    "ModuleReport",
    "SavedTensor",
    "SkippedTensor",
]

#: Tensor categories, in report order.
CATEGORIES = ("linear", "embedding", "1-D", "other")

#: A verification that recovers less of the fine-tune's logit change than
#: this is poor: the adapter does not stand in for the fine-tune.
POOR_RECOVERY = 0.8

_HINTS = {
    "embedding": "embeddings='save' (--embeddings save) carries them",
    "1-D": "save_1d=True (the default) carries them",
}


def _fields_as_json(record: Any) -> dict[str, Any]:
    """A dataclass's fields in declaration order, as plain JSON values
    (tuples such as ``shape`` become lists)."""
    return json_safe({f.name: getattr(record, f.name) for f in fields(record)})


@dataclass
class ModuleReport:
    """One extracted module: its rank and how much of the delta the factors keep."""

    name: str
    shape: tuple[int, int]
    rank: int
    energy_kept: float
    rel_error: float
    delta_norm: float
    target_reached: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return _fields_as_json(self)


@dataclass
class SkippedTensor:
    """A tensor that is not in the adapter. ``delta_norm`` > 0 means it changed
    and the adapter does not reproduce that change; None when not measured."""

    name: str
    shape: tuple[int, ...]
    reason: str
    delta_norm: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _fields_as_json(self)


@dataclass
class SavedTensor:
    """A tensor stored whole in the adapter file (``key``), as PEFT loads it back."""

    name: str
    key: str
    shape: tuple[int, ...]
    reason: str
    delta_norm: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _fields_as_json(self)


@dataclass
class CategoryReport:
    """One category's tensors: how many changed, their delta energy, how much is kept."""

    name: str
    tensors: int = 0
    changed: int = 0
    delta_energy: float = 0.0
    captured_energy: float = 0.0
    lora: int = 0  # changed tensors factored
    saved: int = 0  # changed tensors stored whole
    missed: int = 0  # changed tensors left out

    @property
    def captured(self) -> float:
        """Share of this category's delta energy the adapter carries (1 when unchanged)."""
        return self.captured_energy / self.delta_energy if self.delta_energy > 0 else 1.0

    def add(self, energy: float, kept: float, how: str) -> None:
        """Count one tensor with delta energy ``energy`` of which ``kept`` is carried."""
        self.tensors += 1
        if energy <= 0:
            return
        self.changed += 1
        self.delta_energy += energy
        self.captured_energy += kept
        if how == "lora":
            self.lora += 1
        elif how == "saved":
            self.saved += 1
        else:
            self.missed += 1

    def to_dict(self, total_energy: float) -> dict[str, Any]:
        return json_safe(
            {
                "tensors": self.tensors,
                "changed": self.changed,
                "factored": self.lora,
                "saved_whole": self.saved,
                "missed": self.missed,
                "delta_energy": self.delta_energy,
                "energy_share": self.delta_energy / total_energy if total_energy > 0 else 0.0,
                "captured": self.captured,
            }
        )


@dataclass
class ExtractionReport:
    """What :func:`extract_lora` did: per module rank, energy kept and relative
    Frobenius error; tensors saved whole and skipped, with the reason; the delta
    energy per category and how much of it the adapter carries; the logit agreement
    measured with ``verify``; totals; seconds."""

    out_dir: str
    modules: list[ModuleReport] = field(default_factory=list)
    skipped: list[SkippedTensor] = field(default_factory=list)
    modules_to_save: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    device: str = "cpu"
    saved: list[SavedTensor] = field(default_factory=list)
    categories: dict[str, CategoryReport] = field(
        default_factory=lambda: {name: CategoryReport(name) for name in CATEGORIES}
    )
    tied: dict[str, str] = field(default_factory=dict)  # output head -> embedding it shares
    bias: str = "none"  # PEFT's bias setting: "lora_only" when LoRA modules' biases are saved
    verification: dict[str, Any] | None = None

    # ---- totals
    @property
    def num_modules(self) -> int:
        return len(self.modules)

    @property
    def ranks(self) -> dict[str, int]:
        return {m.name: m.rank for m in self.modules}

    @property
    def mean_rank(self) -> float:
        return sum(m.rank for m in self.modules) / len(self.modules) if self.modules else 0.0

    @property
    def lora_params(self) -> int:
        return sum(m.rank * (m.shape[0] + m.shape[1]) for m in self.modules)

    @property
    def energy_kept(self) -> float:
        """Energy kept over all extracted modules, weighted by each delta's energy."""
        total = sum(m.delta_norm**2 for m in self.modules)
        if total <= 0:
            return 1.0
        return sum(m.energy_kept * m.delta_norm**2 for m in self.modules) / total

    @property
    def rel_error(self) -> float:
        """Relative Frobenius error of all extracted deltas taken together."""
        total = sum(m.delta_norm**2 for m in self.modules)
        if total <= 0:
            return 0.0
        return math.sqrt(sum((m.rel_error * m.delta_norm) ** 2 for m in self.modules) / total)

    @property
    def delta_energy(self) -> float:
        """The fine-tune's whole delta energy (every category)."""
        return sum(c.delta_energy for c in self.categories.values())

    @property
    def energy_captured(self) -> float:
        """Share of the fine-tune's whole delta energy the adapter carries."""
        total = self.delta_energy
        kept = sum(c.captured_energy for c in self.categories.values())
        return kept / total if total > 0 else 1.0

    @property
    def logit_change_recovered(self) -> float | None:
        """Measured with ``verify``: 1 - ||L_adapter - L_tuned|| / ||L_tuned - L_base||."""
        if self.verification is None:
            return None
        value = self.verification.get("logit_change_recovered")
        return None if value is None else float(value)

    @property
    def missed_changes(self) -> list[SkippedTensor]:
        """Skipped tensors that did change (the adapter does not carry them)."""
        return [s for s in self.skipped if s.delta_norm is not None and s.delta_norm > 0]

    @property
    def warnings(self) -> list[str]:
        """What to act on, in words: a poor verification (under
        ``POOR_RECOVERY`` of the logit change) while changed embeddings or
        output heads were left out names the option that carries them."""
        recovered = self.logit_change_recovered
        left = [s.name for s in self.missed_changes if "embeddings='skip'" in s.reason]
        if recovered is None or recovered >= POOR_RECOVERY or not left:
            return []
        names = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        return [
            f"the adapter recovers only {recovered:.1%} of the fine-tune's logit change, and "
            f"{len(left)} changed embedding or output-head tensor{'s' if len(left) > 1 else ''} "
            f"were left out ({names}): --embeddings save (embeddings='save') carries them"
        ]

    def totals(self) -> dict[str, Any]:
        return {
            "modules": self.num_modules,
            "modules_to_save": len(self.modules_to_save),
            "saved_tensors": len(self.saved),
            "skipped": len(self.skipped),
            "missed_changes": len(self.missed_changes),
            "mean_rank": self.mean_rank,
            "min_rank": min((m.rank for m in self.modules), default=0),
            "max_rank": max((m.rank for m in self.modules), default=0),
            "target_not_reached": sum(not m.target_reached for m in self.modules),
            "lora_params": self.lora_params,
            "energy_kept": self.energy_kept,
            "rel_error": self.rel_error,
            "energy_captured": self.energy_captured,
            "logit_change_recovered": self.logit_change_recovered,
        }

    def to_dict(self) -> dict[str, Any]:
        total = self.delta_energy
        return json_safe(
            {
                "out_dir": self.out_dir,
                "device": self.device,
                "seconds": self.seconds,
                "settings": self.settings,
                "totals": self.totals(),
                "categories": {n: c.to_dict(total) for n, c in self.categories.items()},
                "verification": self.verification,
                "modules": [m.to_dict() for m in self.modules],
                "modules_to_save": self.modules_to_save,
                "tied": self.tied,
                "bias": self.bias,
                "saved": [s.to_dict() for s in self.saved],
                "skipped": [s.to_dict() for s in self.skipped],
                "warnings": self.warnings,
            }
        )

    def _category_lines(self) -> list[str]:
        total = self.delta_energy
        lines = ["  delta energy of the fine-tune, by category (share of all; carried):"]
        for name, c in self.categories.items():
            if not c.changed:
                lines.append(f"    {name:<10} {c.tensors:>5} tensors, none changed")
                continue
            how = []
            if c.lora:
                how.append(f"{c.lora} factored")
            if c.saved:
                how.append(f"{c.saved} saved whole")
            if c.missed:
                how.append(f"{c.missed} left out")
            share = c.delta_energy / total if total > 0 else 0.0
            line = (
                f"    {name:<10} {c.changed:>5}/{c.tensors} changed, {share:7.2%} of the energy, "
                f"{c.captured:7.2%} carried ({', '.join(how)})"
            )
            if c.missed and name in _HINTS:
                line += f"; {_HINTS[name]}"
            lines.append(line)
        lines.append(f"    overall: the adapter carries {self.energy_captured:.2%} of it")
        return lines

    def summary(self, max_rows: int = 20) -> str:
        t = self.totals()
        lines = [
            f"LoRA extracted to {self.out_dir}",
            f"  {t['modules']} modules, rank {t['min_rank']}-{t['max_rank']} "
            f"(mean {t['mean_rank']:.1f}), {t['lora_params']:,} parameters",
            f"  energy kept {t['energy_kept']:.4f}, relative error {t['rel_error']:.4f}; "
            f"{t['target_not_reached']} module(s) hit max_rank before the target",
        ]
        lines += self._category_lines()
        if self.verification is not None:
            v = self.verification
            recovered = v.get("logit_change_recovered")
            agree = v.get("top1_agreement")
            lines.append(
                f"  verified on {v['batches']} random batches of {v['batch_size']}x"
                f"{v['seq_len']} tokens: logit change recovered "
                + (
                    "n/a (the fine-tune changes no logit)"
                    if recovered is None
                    else f"{recovered:.4%}"
                )
                + (f", top-1 agreement {agree:.2%}" if agree is not None else "")
                + f", max |logit diff| {v['max_abs_diff']:.3g}"
            )
        lines += [f"  warning: {w}" for w in self.warnings]
        if self.modules_to_save:
            lines.append(f"  modules_to_save: {', '.join(self.modules_to_save)}")
        if self.tied:
            pairs = ", ".join(f"{a} = {b}" for a, b in self.tied.items())
            lines.append(f"  tied (saved under both names, ensure_weight_tying): {pairs}")
        missed = self.missed_changes
        lines.append(
            f"  {len(self.saved)} tensors saved whole; {t['skipped']} skipped, "
            f"{len(missed)} of them changed (not carried by the adapter)"
        )
        lines.append(f"  {self.seconds:.2f}s on {self.device}")
        if self.modules:
            width = min(60, max(len(m.name) for m in self.modules))
            lines.append(f"  {'module':<{width}}  rank  energy  rel_err")
            for m in self.modules[:max_rows]:
                flag = "" if m.target_reached else "  (max_rank)"
                lines.append(
                    f"  {m.name:<{width}}  {m.rank:>4}  {m.energy_kept:6.4f}  "
                    f"{m.rel_error:7.4f}{flag}"
                )
            if len(self.modules) > max_rows:
                lines.append(f"  ... {len(self.modules) - max_rows} more")
        for s in missed[:max_rows]:
            lines.append(f"  changed but skipped: {s.name} ({s.reason}, |dW|={s.delta_norm:.3g})")
        if len(missed) > max_rows:
            lines.append(f"  ... {len(missed) - max_rows} more changed tensors skipped")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
