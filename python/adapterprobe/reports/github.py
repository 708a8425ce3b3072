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
import re
import stat
from collections.abc import Iterable
from typing import IO

from adapterprobe._fs import checkpoint_folders
from adapterprobe.escape import annotation_message, annotation_property
from adapterprobe.probes.result import Verdict
from adapterprobe.tally import ReportedRecord, regression_of

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


# A log file inside a logs folder: a dlm/GAP JSONL log, a TensorBoard event
# file, a Lightning/CSV log.
_LOG_FILE = re.compile(r"(train-.*\.jsonl|events\.out\.tfevents\..*|metrics\.csv|.*\.jsonl)")
#: Entries looked at below a logs folder for its newest log file.
_MAX_LOOKED_AT = 10_000


def _newest_log_in(folder: str) -> str | None:
    """The last log file (by name: runs number their logs) in `folder` or up
    to two levels below it, or None."""
    found: list[str] = []
    looked_at = 0
    level = [folder]
    for _ in range(3):
        below = []
        for current in level:
            try:
                entries = sorted(os.scandir(current), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                looked_at += 1
                if looked_at > _MAX_LOOKED_AT:
                    return found[-1] if found else None
                if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                    below.append(entry.path)
                elif entry.is_file() and _LOG_FILE.fullmatch(entry.name):
                    found.append(entry.path)
        if found:
            return found[-1]
        level = below
    return None


def _newest_checkpoint_state(run: str) -> str | None:
    """``checkpoint-N/trainer_state.json`` of the largest N in an HF output
    folder with no trainer state of its own (the Trainer saves one in each
    checkpoint): the file its training_drift verdict was read from."""
    best: tuple[int, str] | None = None
    for step, path in checkpoint_folders(run):
        state = os.path.join(path, "trainer_state.json")
        if (best is None or step > best[0]) and os.path.isfile(state):
            best = (step, state)
    return best[1] if best else None


def source_file(record: ReportedRecord) -> str:
    """The file a record's verdict came from (for a run's logs folder, its
    newest log file; for an HF run, the newest checkpoint's trainer state
    when the run folder has none of its own), else the store directory."""
    place = record.adapter or record.store
    if record.probe == "training_drift" and not os.path.isfile(
        os.path.join(place, "trainer_state.json")
    ):
        state = _newest_checkpoint_state(place)
        if state is not None:
            return state
    for name in SOURCES.get(record.probe, ()):
        candidate = os.path.join(place, name)
        try:  # one stat a candidate, not isdir's and then exists'
            mode = os.stat(candidate).st_mode
        except (OSError, ValueError):
            continue
        if stat.S_ISDIR(mode):
            log = _newest_log_in(candidate)
            if log is not None:
                return log
        else:
            return candidate
    return place


def _workspace_relative(path: str) -> str:
    """`path` relative to ``$GITHUB_WORKSPACE`` (else the working
    directory) when it lies inside it, else as it is."""
    base = os.path.abspath(os.environ.get("GITHUB_WORKSPACE") or os.getcwd())
    # Most paths are absolute and under the workspace: a prefix cut is
    # what relpath would give, without its normalising of both each time.
    inside = base.rstrip(os.sep) + os.sep
    cut = len(inside)
    if (
        path.startswith(inside)
        and len(path) > cut
        and path[cut] != os.sep
        and os.path.normpath(path) == path
    ):
        return path[cut:]
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def annotation(record: ReportedRecord, regression_gate: bool = False) -> str | None:
    """The workflow command for one record (None for pass and skip, unless
    the record regressed against the baseline and ``regression_gate``)."""
    level = LEVELS.get(record.verdict)
    regressed = regression_of(record) if regression_gate else None
    if level is None and regressed is None:
        return None
    where = record.store if record.adapter is None else record.adapter
    title = f"{record.probe} {record.verdict.value.upper()}"
    message = f"{where}: {record.message}"
    if regressed is not None:
        why = f"regressed against the baseline: {'; '.join(regressed)}"
        if level is None:
            title = f"{record.probe} REGRESSED"
            message = f"{where}: {why}"
        else:
            message += f" ({why})"
        level = "error"
    if level is None:
        return None
    props = f"file={annotation_property(_workspace_relative(source_file(record)))}"
    props += f",title={annotation_property(title)}"
    return f"::{level} {props}::{annotation_message(message)}\n"


def write_annotations(
    out: IO[str], records: Iterable[ReportedRecord], regression_gate: bool = False
) -> int:
    """Write the annotations of `records`; returns how many."""
    n = 0
    for r in records:
        line = annotation(r, regression_gate)
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
