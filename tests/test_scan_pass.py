"""The Rust scan pass against the pipeline it replaced.

``_core.scan_records`` gathers, judges (the verdict kernels) and assembles
every target's records in one parallel pass. ``reference/scan_records.py``
builds the same records the old way: the core gathers, each probe's judge is
called from Python (the kernels' own wrappers: the rules live only in Rust),
Python orders. Both must give the same records, field for field, and the same JSON
text, byte for byte, over real stores: the demo store, runs trained with the
real HF Trainer and PEFT, the layouts the readers' fixtures hold, under both
rule sets and with every probe.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from reference.scan_records import reference_records

from adapterprobe.judge import judge_batch
from adapterprobe.probes import PROBES, resolve_options
from adapterprobe.probes.drift import judge_drift
from adapterprobe.probes.full_weights import judge_full_weights
from adapterprobe.probes.gap import judge_gap
from adapterprobe.probes.ghost import judge_ghost
from adapterprobe.probes.weights import judge_weights
from adapterprobe.scan import discover

ROOT = Path(__file__).resolve().parents[1]
JUDGES = {
    "training_drift": judge_drift,
    "gradient_ghost": judge_ghost,
    "adapter_weights": judge_weights,
    "full_weights": judge_full_weights,
    "gap_monitor": judge_gap,
}
ALL_PROBES = tuple(PROBES)


def same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and tuples to lists (as JSON sees them)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def compare(root: Path, rules: str, all_versions: bool = False) -> int:
    targets = discover(root, all_versions=all_versions).targets
    assert targets, root
    options = resolve_options(ALL_PROBES, None, rules)
    ours = judge_batch(targets, ALL_PROBES, options, json=True)
    theirs = reference_records(targets, ALL_PROBES, options, JUDGES)
    assert [(r.store, r.adapter, r.probe) for r in ours] == [
        (r.store, r.adapter, r.probe) for r in theirs
    ]
    for a, b in zip(ours, theirs, strict=True):
        where = f"{a.probe} on {a.adapter or a.store}"
        for field in ("layout", "verdict", "message", "checkpoint_kind"):
            assert getattr(a, field) == getattr(b, field), (where, field)
        assert same(a.score, b.score), (where, a.score, b.score)
        assert same(a.evidence, b.evidence), where
        # The pass's JSON text, and the text made from the fields, both equal
        # the reference record's.
        assert a.to_json() == b.to_json(), where
        assert a.replace(message=a.message).to_json() == b.to_json(), where
    return len(ours)


@pytest.mark.parametrize("rules", ["robust", "sway"])
def test_demo_store(demo_store, rules):
    assert compare(demo_store, rules) >= 12


@pytest.mark.parametrize("rules", ["robust", "sway"])
def test_reader_fixtures(rules):
    roots = [ROOT / "rust/testdata" / sub for sub in ("logs", "optim", "weights")]
    scanned = [r for r in roots if discover(r, all_versions=True).targets]
    assert scanned
    assert sum(compare(r, rules, all_versions=True) for r in scanned) > 0


@pytest.mark.parametrize("rules", ["robust", "sway"])
def test_real_training_runs(field_root, rules):
    assert compare(field_root, rules, all_versions=True) > 20
