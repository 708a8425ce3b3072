"""A guard fed a very long run (issue 51, item 8).

Before, the guard kept every record: 10^7 observations held 0.85 GB and a
single judging call at 10^6 records took 130 ms, growing with the run. Now
each series is kept whole up to 65,536 records and thinned past it (an even
sample, the newest record, the non-finite losses and jumps beside it, exact
counts of what was read). These tests hold what a user sees: the history is
thinned (memory no longer grows with the run), the counts stay exact, and the
verdict is the offline verdict of the whole logged run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import adapterprobe as ap

RECORDS = 150_000


def loss_at(step: int, nan_every: int) -> float:
    if nan_every and step % nan_every == 7:
        return math.nan
    return 2.0 * math.exp(-step / 50_000) + 1.0 + 0.05 * math.sin(step * 0.7)


def write_log(store: Path, losses: list[float]) -> None:
    logs = store / "logs"
    logs.mkdir(parents=True)
    lines = [json.dumps({"type": "step", "step": s, "loss": v}) for s, v in enumerate(losses)]
    (logs / "train-000001-20260101T000000.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("nan_every", [0, 100, 10])
def test_a_long_run_is_judged_on_a_bounded_history_as_the_whole_log_is(
    tmp_path: Path, nan_every: int
) -> None:
    losses = [loss_at(s, nan_every) for s in range(RECORDS)]
    guard = ap.Guard()
    for step, loss in enumerate(losses):
        guard.observe(step, loss)
    assert guard.num_records == RECORDS
    online = guard.result()
    # thinned: every 2nd (or 4th) record kept, the counts still of the whole run
    assert online.evidence["thinned"] >= 2
    assert online.evidence["num_records"] == RECORDS
    write_log(tmp_path, losses)
    offline = ap.training_drift(tmp_path)
    assert "thinned" not in offline.evidence
    assert online.verdict == offline.verdict, (online.message, offline.message)
    rules = [(f["rule"], f["verdict"]) for f in online.evidence["findings"]]
    assert rules == [(f["rule"], f["verdict"]) for f in offline.evidence["findings"]]
    if nan_every:
        # 1% stays a WARN and 10% a FAIL: shares of what was read, not kept
        (nonfinite,) = [f for f in online.evidence["findings"] if f["rule"] == "nonfinite_loss"]
        assert nonfinite["verdict"] == ("warn" if nan_every == 100 else "fail")
        assert nonfinite["message"].startswith(f"{RECORDS // nan_every} NaN/inf losses")
