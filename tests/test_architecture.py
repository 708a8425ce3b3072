"""The package's shape: structured errors, one options object per probe,
no reaching into another module's private names, torch-free imports."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import adapterprobe as ap
from adapterprobe.probes import PROBES, DriftOptions, GhostOptions, resolve_options

PACKAGE = Path(ap.__file__).parent


def test_errors_carry_structured_fields(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\x01")
    with pytest.raises(ap.HeaderError) as err:
        ap.read_safetensors_header(bad)
    assert err.value.path == str(bad)
    assert "truncated" in err.value.reason
    assert str(err.value) == f"{bad}: {err.value.reason}"
    with pytest.raises(ap.MissingFileError) as missing:
        ap.read_training_state(tmp_path / "nope")
    assert missing.value.path == str(tmp_path / "nope")
    # Errors survive pickling (Ray ships them between processes) with their fields.
    again = pickle.loads(pickle.dumps(err.value))
    assert type(again) is ap.HeaderError
    assert (again.path, again.reason, str(again)) == (
        err.value.path,
        err.value.reason,
        str(err.value),
    )
    detailed = ap.UnsafePickleError("refused", path="/p", global_name="os.system")
    assert pickle.loads(pickle.dumps(detailed)).global_name == "os.system"


def test_every_error_is_an_adapterprobe_error():
    for name in ap.errors.__all__:
        assert issubclass(getattr(ap, name), ap.AdapterProbeError), name


@pytest.mark.parametrize(
    ("probe", "options_class"),
    [(ap.training_drift, DriftOptions), (ap.gradient_ghost, GhostOptions)],
)
def test_probe_keywords_are_exactly_the_options_fields(probe, options_class):
    params = inspect.signature(probe).parameters
    keywords = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    fields = [f.name for f in dataclasses.fields(options_class)]
    assert keywords == [*fields, "options", "name"]
    assert all(params[f].default is None for f in fields)


@pytest.mark.parametrize("spec", list(PROBES.values()), ids=list(PROBES))
def test_each_option_rejects_values_outside_its_rule(spec):
    for field in dataclasses.fields(spec.options):
        if field.name == "rules":
            with pytest.raises(ap.UsageError):
                spec.options(rules="lenient")
            continue
        rules = next(iter(field.metadata["defaults"]))  # a rule set that uses the option
        rule = field.metadata["rule"]
        bad = [True, "1", float("nan"), float("inf")]
        if rule.low is not None:
            bad.append(rule.low - 1)
            if rule.low_open:
                bad.append(rule.low)
        if rule.high is not None:
            bad.append(rule.high + 1)
        if rule.kind is int:
            bad.append(2.5)
        for value in bad:
            with pytest.raises(ap.UsageError) as err:
                spec.options(rules=rules, **{field.name: value})
            assert err.value.option == field.name
            assert field.name in str(err.value)


@pytest.mark.parametrize("spec", list(PROBES.values()), ids=list(PROBES))
def test_options_of_the_other_rule_set_are_refused(spec):
    for field in dataclasses.fields(spec.options):
        users = field.metadata.get("defaults", {})
        for rules in ("robust", "sway"):
            if field.name != "rules" and rules not in users:
                with pytest.raises(ap.UsageError, match="applies only to"):
                    spec.options(rules=rules, **{field.name: 1})


def test_scan_and_probe_share_one_options_object(demo_store):
    strict = DriftOptions(min_steps=1000)
    direct = ap.training_drift(demo_store / "healthy", options=strict)
    scanned = ap.scan(demo_store / "healthy", options={"training_drift": strict})
    (record,) = [r for r in scanned if r.probe == "training_drift"]
    assert direct.verdict == record.verdict == ap.Verdict.SKIP
    assert direct.message == record.message
    with pytest.raises(ap.UsageError, match="unknown option"):
        resolve_options(("training_drift",), {"training_drift": {"min_step": 3}})
    with pytest.raises(ap.UsageError, match="rolling_window"):
        ap.scan(demo_store, rules="sway", options={"training_drift": {"rolling_window": 1}})
    with pytest.raises(ap.UsageError, match="rules"):
        ap.scan(demo_store, rules="sway", options={"training_drift": strict})


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        # `from adapterprobe import _core` imports a private *module* of the
        # package, which is how the package is meant to reach its internals.
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("adapterprobe."):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}: from {node.module} import {alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    offenders = [hit for f in PACKAGE.rglob("*.py") for hit in _private_imports(f)]
    assert offenders == []


def test_importing_the_package_and_scanning_never_imports_torch(demo_store):
    code = (
        "import sys, adapterprobe as ap\n"
        f"ap.scan({str(demo_store)!r})\n"
        "sys.exit(int('torch' in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
