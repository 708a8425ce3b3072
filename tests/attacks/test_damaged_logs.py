"""Logs that lost records (issue 51, item 2).

A reader that passes over what it cannot read keeps a scan going, but a run
judged on the fraction of its log that survived must not read as a clean
verdict on the run. What was passed over is counted in the evidence
(``damage``) and said in the message; past 10% of the log the record is an
error, unless what is left already FAILs. A torn last record (a run still
writing) is said, never counted as damage.

Before: a diverging W&B run with a byte flipped in every block after the
first dropped three rows in four and read as PASS ("-74.9%"), exit 0.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

import adapterprobe as ap

BLOCK = 32 * 1024


def drift_of(store: Path) -> ap.ScanRecord:
    (record,) = [r for r in ap.scan(store).records if r.probe == "training_drift"]
    return record


def wandb_run(root: Path, losses: list[float]) -> Path:
    wandb = pytest.importorskip("wandb")
    os.environ["WANDB_SILENT"] = "true"
    run = wandb.init(
        project="damage",
        name="diverging",
        mode="offline",
        dir=str(root),
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        reinit="create_new",
    )
    for loss in losses:
        run.log({"loss": loss, "pad": "x" * 40})
    run.finish()
    # finish() can return while W&B's service still writes the log's tail
    # (CI saw it grow by a block between two reads): shut the service down,
    # which waits for it, so the log is whole before it is damaged.
    wandb.teardown()
    return Path(run.dir).parent


def flip_a_byte_per_block(log: Path, first: int) -> int:
    """Flip a byte of the first chunk's data in every block from block
    ``first`` on (its checksum then fails, and the block is lost from
    there); the number of blocks changed. A last block too short to hold
    that byte (W&B's log can end a few bytes into a new block) has its
    last byte flipped instead, so no block is left whole."""
    data = bytearray(log.read_bytes())
    changed = 0
    for start in range(first * BLOCK, len(data), BLOCK):
        data[min(start + 10, len(data) - 1)] ^= 0xFF
        changed += 1
    log.write_bytes(bytes(data))
    return changed


def test_a_wandb_log_that_lost_most_blocks_is_an_error_not_a_pass(tmp_path):
    # The loss falls over the first quarter, then climbs past its start: only
    # the first block's rows survive the damage, and they fall.
    losses = [2.0 - i / 1000 for i in range(500)] + [1.5 + i / 300 for i in range(1500)]
    run = wandb_run(tmp_path, losses)
    (log,) = run.glob("run-*.wandb")
    blocks = math.ceil(log.stat().st_size / BLOCK)
    assert blocks >= 10
    intact = drift_of(run)
    assert intact.verdict.value == "fail", intact.message
    assert "damage" not in intact.evidence
    assert flip_a_byte_per_block(log, first=1) == blocks - 1
    record = drift_of(run)
    # What is left (the first block's rows) falls: judged alone, a PASS.
    assert record.verdict.value == "error", record.message
    damage = record.evidence["damage"]
    assert damage["unit"] == "bytes of the W&B log"
    assert damage["seen"] == log.stat().st_size - 7  # all but the file header
    assert damage["share"] > 0.8
    assert "bytes of the W&B log could not be read and were passed over" in record.message
    assert record.message.startswith("the log is damaged")


def test_a_wandb_log_with_one_bad_block_keeps_its_verdict_and_says_so(tmp_path):
    losses = [2.0 * math.exp(-i / 300) + 0.4 for i in range(2000)]
    run = wandb_run(tmp_path, losses)
    (log,) = run.glob("run-*.wandb")
    blocks = math.ceil(log.stat().st_size / BLOCK)
    data = bytearray(log.read_bytes())
    data[blocks // 2 * BLOCK + 100] ^= 0xFF
    log.write_bytes(bytes(data))
    record = drift_of(run)
    assert record.verdict.value == "pass", record.message
    damage = record.evidence["damage"]
    assert 0 < damage["passed_over"] <= 2 * BLOCK and damage["share"] < 0.1
    assert "bytes of the W&B log could not be read and were passed over" in record.message


def dlm_store(root: Path, lines: list[str]) -> Path:
    store = root / "store"
    (store / "logs").mkdir(parents=True)
    (store / "logs" / "train-000001-20250301T090000.jsonl").write_text("\n".join(lines) + "\n")
    return store


def step_line(step: int, loss: float) -> str:
    return json.dumps({"type": "step", "step": step, "loss": loss})


def test_json_lines_that_do_not_parse_are_counted_and_past_a_tenth_refused(tmp_path):
    good = [step_line(s, 3.0 * math.exp(-s / 40) + 0.5) for s in range(1, 101)]
    # 5 garbled lines of 100: said, verdict kept
    few = [line if i % 20 != 7 else line[:-9] + "#garbled" for i, line in enumerate(good)]
    record = drift_of(dlm_store(tmp_path / "few", few))
    assert record.verdict.value == "pass", record.message
    assert record.evidence["damage"]["passed_over"] == 5
    assert "5 of 100 JSON lines could not be read" in record.message
    # 30 of 100: the rest may not be the run
    many = [line if i % 10 not in (3, 4, 5) else "{not json" for i, line in enumerate(good)]
    record = drift_of(dlm_store(tmp_path / "many", many))
    assert record.verdict.value == "error", record.message
    assert "30 of 100 JSON lines" in record.message


def test_a_torn_last_line_is_said_and_not_damage(tmp_path):
    lines = [step_line(s, 3.0 * math.exp(-s / 40) + 0.5) for s in range(1, 31)]
    store = dlm_store(tmp_path, lines)
    log = next((store / "logs").iterdir())
    log.write_text(log.read_text() + '{"type": "step", "step": 31, "lo')  # no line end
    record = drift_of(store)
    assert record.verdict.value == "pass", record.message
    assert "damage" not in record.evidence
    assert record.evidence["torn_log_files"] == 1
    assert "torn record" in record.message
