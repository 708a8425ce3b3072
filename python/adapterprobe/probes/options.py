"""Probe options: one frozen dataclass per probe, each option with one rule.

The same options object is used by the probe function, ``scan``, the Ray
engine and the CLI, so an option is defined, defaulted and validated in
exactly one place. A field's rule lives in its metadata (``option(...)``);
``ProbeOptions.__post_init__`` applies every rule, so an invalid options
object cannot exist.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from adapterprobe.errors import UsageError

_O = TypeVar("_O", bound="ProbeOptions")


@dataclass(frozen=True)
class Rule:
    """What values one option accepts: its type and an optional range."""

    kind: type  # int or float
    low: float | None = None
    low_open: bool = False  # True: value must be > low; False: >= low
    high: float | None = None

    def describe(self) -> str:
        """The rule in words, for error messages and help text."""
        what = "an integer" if self.kind is int else "a number"
        if self.low is not None and self.high is not None:
            left = "(" if self.low_open else "["
            return f"{what} in {left}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {self.low:g}"
        return what

    def check(self, name: str, value: Any) -> Any:
        """``value`` converted to the option's type, or UsageError naming the rule."""
        wrong_type = isinstance(value, bool) or not isinstance(value, (int, float))
        if self.kind is int and not wrong_type and not isinstance(value, int):
            wrong_type = not (isinstance(value, float) and value.is_integer())
        if wrong_type:
            raise UsageError(f"{name} must be {self.describe()}, got {value!r}", option=name)
        converted = self.kind(value)
        if isinstance(converted, float) and not math.isfinite(converted):
            raise UsageError(f"{name} must be {self.describe()}, got {value!r}", option=name)
        too_low = self.low is not None and (
            converted <= self.low if self.low_open else converted < self.low
        )
        too_high = self.high is not None and converted > self.high
        if too_low or too_high:
            raise UsageError(f"{name} must be {self.describe()}, got {value!r}", option=name)
        return converted


#: The verdict rule sets. "robust" (the default) is built to be gated on in
#: CI; "sway" reproduces dlm-sway's probes exactly.
RULE_SETS = ("robust", "sway")


def option(rule: Rule, help: str, **defaults: Any) -> Any:
    """A dataclass field with its rule, a one-line explanation and its default
    under each rule set that uses it (``robust=..., sway=...``). A rule set
    without a default does not use the option."""
    return dataclasses.field(
        default=None, metadata={"rule": rule, "help": help, "defaults": defaults}
    )


@dataclass(frozen=True)
class ProbeOptions:
    """Base of the per-probe options classes: ``rules`` picks the rule set,
    and every option left as None takes that rule set's default."""

    rules: str = "robust"

    def __post_init__(self) -> None:
        if self.rules not in RULE_SETS:
            raise UsageError(
                f"rules must be one of {', '.join(map(repr, RULE_SETS))}, got {self.rules!r}",
                option="rules",
            )
        for f in self._option_fields():
            defaults = f.metadata["defaults"]
            value = getattr(self, f.name)
            if self.rules not in defaults:
                if value is not None:
                    users = " or ".join(f"rules={r!r}" for r in defaults)
                    raise UsageError(
                        f"{f.name} applies only to {users}, not rules={self.rules!r}",
                        option=f.name,
                    )
                continue
            if value is None:
                value = defaults[self.rules]
            object.__setattr__(self, f.name, f.metadata["rule"].check(f.name, value))

    @classmethod
    def _option_fields(cls) -> list[dataclasses.Field[Any]]:
        return [f for f in dataclasses.fields(cls) if "rule" in f.metadata]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def names_for(cls, rules: str) -> tuple[str, ...]:
        """The options the rule set ``rules`` uses."""
        return tuple(f.name for f in cls._option_fields() if rules in f.metadata["defaults"])

    @classmethod
    def from_mapping(cls: type[_O], values: Mapping[str, Any] | None = None) -> _O:
        """Build from a mapping of option names; unknown names are a UsageError."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise UsageError(
                f"unknown option(s) {', '.join(unknown)} for {cls.__name__}; "
                f"known: {', '.join(cls.names())}"
            )
        return cls(**values)

    @classmethod
    def from_given(cls: type[_O], **given: Any) -> _O:
        """Build from keyword arguments where None means "use the default"."""
        return cls.from_mapping({k: v for k, v in given.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        """``rules`` and the options it uses, with their values."""
        out: dict[str, Any] = {"rules": self.rules}
        out.update({name: getattr(self, name) for name in self.names_for(self.rules)})
        return out

    def option_help(self) -> dict[str, str]:
        """Each option's help text and allowed values, by name."""
        return {
            f.name: f"{f.metadata['help']} ({f.metadata['rule'].describe()})"
            for f in self._option_fields()
            if self.rules in f.metadata["defaults"]
        }

    def describe(self) -> str:
        """Every option of this rule set with its value, meaning and allowed
        values, as text to print (``option_help()`` has the same as a dict)."""
        helps = self.option_help()
        lines = [f"{type(self).__name__} (rules={self.rules!r}):"]
        for name, text in helps.items():
            value = getattr(self, name)
            lines.append(f"  {name} = {value!r}")
            lines.extend(f"      {line}" for line in textwrap.wrap(text, 74))
        return "\n".join(lines)


def resolve(cls: type[_O], options: _O | None, rules: str | None, given: Mapping[str, Any]) -> _O:
    """The options a probe call runs with: ``options`` (or the defaults of
    ``rules``, robust when None) with the non-None ``given`` values on top."""
    if options is not None and not isinstance(options, cls):
        raise UsageError(f"options must be a {cls.__name__}, got {type(options).__name__}")
    if options is not None and rules is not None and rules != options.rules:
        raise UsageError(
            f"rules={rules!r} disagrees with the options given (rules={options.rules!r})"
        )
    base = options if options is not None else cls(rules=rules or "robust")
    changes = {k: v for k, v in given.items() if v is not None}
    return dataclasses.replace(base, **changes) if changes else base
