"""Turn a batch of discovered targets into records: one call into the Rust
scan pass (``records`` in the core), which gathers each target's inputs,
judges them with the probes' verdict kernels and assembles its records on
every core with the GIL released.

The local scan and each Ray task call :func:`judge_batch`; the single
probes (``ap.training_drift(...)`` and its kin) call the same kernels, so no
path can disagree with another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import adapterprobe._core as _core
from adapterprobe.probes.options import ProbeOptions
from adapterprobe.records import ScanRecord

#: Layouts of what the walk could not enter (see ``rust/store/scan.rs``):
#: each is one ``discovery`` record (an error for a directory that cannot
#: be listed, a skip for a link not followed out of the root).
WALK_PROBLEMS = ("unreadable", "outside-root")
#: The ``probe`` of those records.
DISCOVERY = "discovery"


def judge_batch(
    targets: Sequence[Any],
    probes: Sequence[str],
    options: Mapping[str, ProbeOptions],
    workers: int | None = None,
    *,
    json: bool = False,
) -> list[ScanRecord]:
    """The records of a batch of targets, in order. ``options`` holds one
    resolved options object per probe (only those in ``probes`` run);
    ``json``: also write each record's JSON text in the pass (what
    ``to_json`` then returns without further work)."""
    made = _core.scan_records(
        list(targets), {p: options[p] for p in probes}, workers=workers, json=json
    )
    wrap = ScanRecord._from_core
    return [wrap(fields) for fields in made]
