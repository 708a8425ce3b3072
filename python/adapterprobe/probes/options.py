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


def option(default: Any, rule: Rule, help: str) -> Any:
    """A dataclass field with its default, its rule and a one-line explanation."""
    return dataclasses.field(default=default, metadata={"rule": rule, "help": help})


@dataclass(frozen=True)
class ProbeOptions:
    """Base of the per-probe options classes."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            rule = f.metadata.get("rule")
            if rule is not None:
                object.__setattr__(self, f.name, rule.check(f.name, getattr(self, f.name)))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

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
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> dict[str, str]:
        """Each option's rule and help text, e.g. for ``--help`` or a report."""
        return {
            f.name: f"{f.metadata['help']} ({f.metadata['rule'].describe()})"
            for f in dataclasses.fields(self)
            if "rule" in f.metadata
        }


def with_overrides(options: _O, given: Mapping[str, Any]) -> _O:
    """``options`` with the non-None values of ``given`` replacing its fields (validated)."""
    changes = {k: v for k, v in given.items() if v is not None}
    return dataclasses.replace(options, **changes) if changes else options
