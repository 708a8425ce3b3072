"""Scan settings from a config file and the command line.

Thresholds are set the same way everywhere: in Python (``scan(options=...)``),
in ``pyproject.toml``, in a TOML file given with ``--config``, or one at a
time with ``--set probe.option=value``. Later sources win (defaults, then
the config file, then ``--set``), and every value is validated by the
probe's own options class, so a typo or an out-of-range value is a
UsageError naming the option. The TOML shape::

    [tool.adapterprobe]            # in pyproject.toml; a --config file may also
    rules = "robust"               # put these keys at its top level
    fail_on = "warn"

    [tool.adapterprobe.training_drift]
    spike_z = 7
    min_steps = 30
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapterprobe.errors import UsageError
from adapterprobe.probes import DEFAULT_PROBES, PROBES, RULE_SETS, resolve_options
from adapterprobe.probes.options import ProbeOptions
from adapterprobe.records import FAIL_ON

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Top-level keys a config may hold besides one table per probe.
TOP_KEYS = ("rules", "fail_on")


@dataclass
class Settings:
    """What a scan runs with, and where each part came from."""

    rules: str = "robust"
    fail_on: str | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def resolved(self, probes: Sequence[str]) -> dict[str, ProbeOptions]:
        """One validated options object per probe."""
        return resolve_options(tuple(probes), self.options, self.rules)

    def to_dict(self, probes: Sequence[str] = DEFAULT_PROBES) -> dict[str, Any]:
        """The resolved settings, as the reports show them."""
        out: dict[str, Any] = {"rules": self.rules}
        if self.sources:
            out["sources"] = list(self.sources)
        for name, options in self.resolved(probes).items():
            if name in probes:
                values = options.to_dict()
                values.pop("rules", None)
                out[name] = values
        return out


def _merge(settings: Settings, table: Mapping[str, Any], source: str) -> None:
    unknown = sorted(set(table) - set(TOP_KEYS) - set(PROBES))
    if unknown:
        raise UsageError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; expected "
            f"{', '.join(TOP_KEYS)} or a table per probe ({', '.join(PROBES)})"
        )
    if "rules" in table:
        if table["rules"] not in RULE_SETS:
            raise UsageError(f"{source}: rules must be one of {RULE_SETS}, got {table['rules']!r}")
        settings.rules = table["rules"]
    if "fail_on" in table:
        if table["fail_on"] not in FAIL_ON:
            raise UsageError(
                f"{source}: fail_on must be one of {FAIL_ON}, got {table['fail_on']!r}"
            )
        settings.fail_on = table["fail_on"]
    for probe in PROBES:
        if probe in table:
            values = table[probe]
            if not isinstance(values, Mapping):
                raise UsageError(f"{source}: [{probe}] must be a table of options")
            settings.options.setdefault(probe, {}).update(values)
    settings.sources.append(source)


def read_config(path: str | Path) -> Mapping[str, Any]:
    """The adapterprobe table of a TOML file: ``[tool.adapterprobe]`` when the
    file has one (a ``pyproject.toml``), else the file's top level."""
    p = Path(path).expanduser()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError("config file not found", path=p) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the config file: {exc}", path=p) from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file is not valid TOML: {exc}", path=p) from exc
    tool = data.get("tool")
    if isinstance(tool, Mapping) and "adapterprobe" in tool:
        table = tool["adapterprobe"]
        if not isinstance(table, Mapping):
            raise UsageError("[tool.adapterprobe] must be a table", path=p)
        return table
    if p.name == "pyproject.toml":
        return {}
    return data


def parse_value(text: str) -> Any:
    """A ``--set`` value as TOML would read it: numbers, booleans, strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_sets(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``["training_drift.spike_z=7", ...]`` as ``{"training_drift": {"spike_z": 7}}``."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        probe, dot, option = key.strip().partition(".")
        if not sep or not dot or not option:
            raise UsageError(
                f"--set {item!r}: expected PROBE.OPTION=VALUE, e.g. training_drift.spike_z=7"
            )
        if probe not in PROBES:
            raise UsageError(f"--set {item!r}: unknown probe {probe!r}; one of {', '.join(PROBES)}")
        out.setdefault(probe, {})[option] = parse_value(value.strip())
    return out


def load_settings(
    *,
    config: str | Path | None = None,
    sets: Iterable[str] = (),
    rules: str | None = None,
    cwd: str | Path | None = None,
) -> Settings:
    """Settings from (in order) ``pyproject.toml`` in ``cwd`` (when no
    ``config`` is given), the ``config`` file, ``--set`` items and an explicit
    ``rules``. Validated before they are returned."""
    settings = Settings()
    if config is not None:
        _merge(settings, read_config(config), str(config))
    else:
        project = Path(cwd or Path.cwd()) / "pyproject.toml"
        if project.is_file():
            table = read_config(project)
            if table:
                _merge(settings, table, str(project))
    overrides = parse_sets(sets)
    if overrides:
        _merge(settings, overrides, "--set")
    if rules is not None:
        settings.rules = rules
    settings.resolved(tuple(PROBES))  # validate every option now
    return settings
