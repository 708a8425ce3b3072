"""GitHub Actions output: one workflow-command annotation per problem record.

``::error file=runs/a/trainer_state.json,title=training_drift::loss diverged ...``
puts the problem on the run's page (and on the file in a pull request's diff
when the file is part of the repository). ``file=`` names the file behind the
verdict when it can be found (the log for training_drift, the weights for
adapter_weights, the optimizer state for gradient_ghost), relative to
``$GITHUB_WORKSPACE``; otherwise the store directory. A fail or error record
is an ``::error``, a warn a ``::warning``. Every value is encoded as the runner
expects (:mod:`adapterprobe.escape`), so a name cannot end a command or forge
another one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import IO

from adapterprobe.escape import annotation_message, annotation_property
from adapterprobe.probes.result import Verdict
from adapterprobe.tally import ReportedRecord

LEVELS = {Verdict.ERROR: "error", Verdict.FAIL: "error", Verdict.WARN: "warning"}

# Where the input of each probe usually lives, most specific first.
SOURCES = {
    "training_drift": (
        "trainer_state.json",
        "logs",
        "metrics.csv",
        "runs",
        "lightning_logs",
    ),
    "adapter_weights": ("adapter_model.safetensors", "adapter_model.bin"),
    "full_weights": ("model.safetensors", "model.safetensors.index.json"),
    "gradient_ghost": ("optimizer.pt", "training_state.pt"),
    "gap_monitor": ("logs",),
}


def source_file(record: ReportedRecord) -> str:
    """The file (or directory) a record's verdict came from."""
    place = record.adapter or record.store
    for name in SOURCES.get(record.probe, ()):
        candidate = os.path.join(place, name)
        if os.path.exists(candidate):
            return candidate
    return place


def _workspace_relative(path: str) -> str:
    base = os.environ.get("GITHUB_WORKSPACE") or os.getcwd()
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def annotation(record: ReportedRecord) -> str | None:
    """The workflow command for one record (None for pass and skip)."""
    level = LEVELS.get(record.verdict)
    if level is None:
        return None
    where = record.store if record.adapter is None else record.adapter
    title = f"{record.probe} {record.verdict.value.upper()}"
    message = f"{where}: {record.message}"
    props = f"file={annotation_property(_workspace_relative(source_file(record)))}"
    props += f",title={annotation_property(title)}"
    return f"::{level} {props}::{annotation_message(message)}\n"


def write_annotations(out: IO[str], records: Iterable[ReportedRecord]) -> int:
    """Write the annotations of `records`; returns how many."""
    n = 0
    for r in records:
        line = annotation(r)
        if line is not None:
            out.write(line)
            n += 1
    return n


def append_step_summary(markdown: str) -> bool:
    """Append to ``$GITHUB_STEP_SUMMARY`` when the runner set it; True when written."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    with open(path, "a", encoding="utf-8", errors="backslashreplace") as f:
        f.write(markdown.rstrip("\n") + "\n")
    return True
