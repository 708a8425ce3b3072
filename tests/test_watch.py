"""`adapterprobe watch`: stores re-judged by the guard as their real log files grow.

Every store here is a directory of log files in a format a trainer writes
(dlm JSONL, an HF Trainer ``checkpoint-N/trainer_state.json``), grown
between polls the way a training run grows it. ``age`` sets the files'
times a minute back, as the next poll of a real watch (30 s later) would
find them: a file modified within ``RACY_NS`` of a read is read again.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from adapterprobe.cli import main
from adapterprobe.cli.watch import line
from adapterprobe.errors import UsageError
from adapterprobe.watch import Watcher

LOG = "logs/train-000001-20260101T000000.jsonl"


def healthy(steps: range) -> list[float]:
    return [2.0 * 0.97**s + 0.5 for s in steps]


def dlm_run(root: Path, name: str, losses: list[float], first: int = 1) -> Path:
    """A dlm store whose log holds a banner and one step record per loss
    (``first`` > 1: appended to the log, as a trainer writes on)."""
    store = root / name
    log = store / LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        if first == 1:
            f.write(json.dumps({"type": "banner", "run_id": 1, "seed": 0}) + "\n")
        for step, loss in enumerate(losses, start=first):
            record = {"type": "step", "step": step, "loss": loss, "lr": 1e-4, "grad_norm": 1.0}
            f.write(json.dumps(record, sort_keys=True) + "\n")  # NaN as the bare token
    return store


def hf_checkpoint(out: Path, step: int, masked_from: int | None = None) -> None:
    """``out/checkpoint-<step>/trainer_state.json`` as the HF Trainer saves it;
    from ``masked_from`` on the weights are NaN: loss 0.0, grad_norm NaN."""
    history = []
    for s in range(1, step + 1):
        if masked_from is not None and s >= masked_from:
            history.append({"step": s, "loss": 0.0, "grad_norm": math.nan, "learning_rate": 1e-4})
        else:
            history.append(
                {"step": s, "loss": 2.0 * 0.97**s + 0.5, "grad_norm": 1.0, "learning_rate": 1e-4}
            )
    state = {"global_step": step, "max_steps": 100, "log_history": history}
    (out / f"checkpoint-{step}").mkdir(parents=True)
    (out / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(state, indent=2))


def age(root: Path, seconds: float = 60.0) -> None:
    """Every file and folder under ``root`` last modified ``seconds`` ago."""
    then = time.time() - seconds
    for path in [root, *root.rglob("*")]:
        os.utime(path, (then, then))


def by_store(changes) -> dict:
    return {c.store: c for c in changes}


def test_a_healthy_run_passes_then_fails_when_its_loss_turns_nan(tmp_path):
    store = dlm_run(tmp_path, "run-a", healthy(range(1, 41)))
    age(tmp_path)
    watcher = Watcher(tmp_path)
    (first,) = watcher.poll()
    assert (first.store, first.old, first.new, first.step) == ("run-a", None, "pass", 40)
    assert watcher.poll() == [] and watcher.judged == 0
    dlm_run(tmp_path, "run-a", [math.nan] * 4, first=41)
    (change,) = watcher.poll()
    assert (change.store, change.old, change.new, change.step) == ("run-a", "pass", "fail", 44)
    assert change.message.startswith("nonfinite_loss since step 41"), change.message
    assert change.path == store
    printed = line(change)
    assert "  run-a  PASS -> FAIL  nonfinite_loss" in printed, printed
    assert watcher.verdicts == {"run-a": "fail"} and watcher.reaching("fail") == ["run-a"]


def test_an_unchanged_store_is_not_read_again(tmp_path):
    dlm_run(tmp_path, "quiet", healthy(range(1, 31)))
    dlm_run(tmp_path, "busy", healthy(range(1, 31)))
    age(tmp_path)
    watcher = Watcher(tmp_path)
    assert {c.store: c.new for c in watcher.poll()} == {"busy": "pass", "quiet": "pass"}
    assert watcher.judged == 2
    assert watcher.poll() == [] and watcher.judged == 0
    dlm_run(tmp_path, "busy", healthy(range(31, 36)), first=31)  # grows; still healthy
    assert watcher.poll() == []  # the verdict is the same: nothing to print
    assert watcher.judged == 1 and watcher.judged_total == 3  # only busy was read


def test_a_log_written_just_before_its_read_is_read_once_more(tmp_path):
    """A write landing while the log was read leaves a stat the read may
    not have seen: the store is read again on the next poll, then left."""
    dlm_run(tmp_path, "fresh", healthy(range(1, 31)))
    watcher = Watcher(tmp_path)
    watcher.poll()
    assert watcher.judged == 1
    age(tmp_path)  # the next poll is a while later; the log did not change
    assert watcher.poll() == [] and watcher.judged == 1
    assert watcher.poll() == [] and watcher.judged == 0


def test_a_run_that_starts_under_the_root_is_picked_up_and_one_that_goes_is_said(tmp_path):
    dlm_run(tmp_path, "first", healthy(range(1, 31)))
    age(tmp_path)
    watcher = Watcher(tmp_path)
    watcher.poll()
    dlm_run(tmp_path, "team/second", healthy(range(1, 31)))
    (change,) = watcher.poll()
    assert (change.store, change.old, change.new) == ("team/second", None, "pass")
    assert watcher.judged == 1  # first was not read again
    for f in sorted((tmp_path / "first").rglob("*"), reverse=True):
        f.rmdir() if f.is_dir() else f.unlink()
    (tmp_path / "first").rmdir()
    (gone,) = watcher.poll()
    assert (gone.store, gone.old, gone.new) == ("first", "pass", None)
    assert "PASS -> gone" in line(gone)
    assert watcher.verdicts == {"team/second": "pass"}


def test_a_checkpoint_with_masked_nan_losses_fails_the_hf_run(tmp_path):
    """The Trainer saves checkpoint-20 after the weights went NaN: its log
    shows loss 0.0 with NaN gradient norms, which no later record can undo."""
    out = tmp_path / "out"
    hf_checkpoint(out, 10)
    watcher = Watcher(tmp_path)
    assert [(c.store, c.new) for c in watcher.poll()] == [("out", "pass")]
    age(tmp_path)
    hf_checkpoint(out, 20, masked_from=15)
    (change,) = watcher.poll()
    assert (change.old, change.new, change.step) == ("pass", "fail", 20)
    assert change.message.startswith("nan_masked since step 15"), change.message


def test_a_corrupt_log_is_a_reason_line_and_the_other_stores_go_on(tmp_path):
    dlm_run(tmp_path, "good", healthy(range(1, 31)))
    bad = tmp_path / "bad" / LOG
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\x00\xff this is no JSON {{{\n")
    watcher = Watcher(tmp_path)
    changes = by_store(watcher.poll())
    assert changes["good"].new == "pass"
    assert changes["bad"].new == "error"
    assert changes["bad"].message.startswith(f"its log cannot be read: {LOG}: "), changes[
        "bad"
    ].message
    assert "not valid JSON" in changes["bad"].message
    age(tmp_path)
    dlm_run(tmp_path, "good", [math.nan] * 4, first=31)
    assert [(c.store, c.new) for c in watcher.poll()] == [("good", "fail")]
    bad.unlink()  # the trainer starts the log again, cleanly
    dlm_run(tmp_path, "bad", healthy(range(1, 31)))
    assert [(c.store, c.old, c.new) for c in watcher.poll()] == [("bad", "error", "pass")]


def test_a_short_curve_is_a_skip_until_it_can_be_judged(tmp_path):
    dlm_run(tmp_path, "young", healthy(range(1, 3)))
    watcher = Watcher(tmp_path)
    (change,) = watcher.poll()
    assert change.new == "skip" and "2 loss records so far; judged from 3" in change.message
    dlm_run(tmp_path, "young", healthy(range(3, 6)), first=3)
    (change,) = watcher.poll()
    assert (change.old, change.new) == ("skip", "pass")


def test_a_climbing_loss_is_held_at_warn_while_the_run_trains(tmp_path):
    dlm_run(tmp_path, "climb", [1.0 + 0.05 * s for s in range(1, 61)])
    (change,) = Watcher(tmp_path).poll()
    assert change.new == "warn" and change.message.startswith("diverged"), change.message


def test_a_store_named_with_an_escape_sequence_is_printed_escaped(tmp_path, capsys):
    dlm_run(tmp_path, "evil\x1b]0;owned\x07\x1b[2J", healthy(range(1, 31)))
    assert main(["watch", str(tmp_path), "--once"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b]0;owned\\x07\\x1b[2J  PASS" in out, out


def test_the_cli_exit_code_is_the_scans_gate(tmp_path, capsys):
    dlm_run(tmp_path, "ok", healthy(range(1, 31)))
    assert main(["watch", str(tmp_path), "--once"]) == 0
    out = capsys.readouterr().out
    assert "ok  PASS  30 loss records, to step 30" in out
    assert "done after 1 poll: 1 store (1 pass); 1 store read." in out
    dlm_run(tmp_path, "climb", [1.0 + 0.05 * s for s in range(1, 61)])
    assert main(["watch", str(tmp_path), "--once"]) == 0  # warn: below --fail-on fail
    assert main(["watch", str(tmp_path), "--once", "--fail-on", "warn"]) == 1
    assert "reached --fail-on warn (climb)" in capsys.readouterr().out
    dlm_run(tmp_path, "nan", healthy(range(1, 31)) + [math.nan] * 3)
    assert main(["watch", str(tmp_path), "--once"]) == 1
    assert main(["watch", str(tmp_path), "--once", "--fail-on", "never"]) == 0
    bad = tmp_path / "bad" / LOG
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"garbage\n")
    assert main(["watch", str(tmp_path / "bad"), "--once"]) == 1  # error counts as failure
    capsys.readouterr()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["watch", str(empty), "--once"]) == 3
    assert "nothing to watch" in capsys.readouterr().err
    assert main(["watch", str(tmp_path / "missing"), "--once"]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_stop_on_ends_the_watch_at_the_first_poll_that_reaches_it(tmp_path, capsys):
    dlm_run(tmp_path, "climb", [1.0 + 0.05 * s for s in range(1, 61)])
    argv = ["watch", str(tmp_path), "--max-cycles", "3", "--interval", "0.01"]
    assert main([*argv, "--stop-on", "fail"]) == 0
    assert "done after 3 polls" in capsys.readouterr().out
    assert main([*argv, "--stop-on", "warn"]) == 1
    out = capsys.readouterr().out
    assert "stopped on warn after 1 poll" in out
    assert "--stop-on warn ended the watch (climb)" in out, out
    # Stopped by --stop-on fail, the line says so, not --fail-on (issue 53, item 1).
    dlm_run(tmp_path / "nan", "nan", [float("nan")] * 40)
    assert main(["watch", str(tmp_path / "nan"), *argv[2:], "--stop-on", "fail"]) == 1
    out = capsys.readouterr().out
    assert "Exit 1: --stop-on fail ended the watch (nan)" in out, out
    assert "reached --fail-on" not in out


def test_ctrl_c_ends_with_a_summary_and_130(tmp_path, capsys, monkeypatch):
    dlm_run(tmp_path, "run", healthy(range(1, 31)))

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupted)
    assert main(["watch", str(tmp_path)]) == 130
    captured = capsys.readouterr()
    assert "run  PASS" in captured.out
    assert "interrupted after 1 poll: 1 store (1 pass)" in captured.out
    assert "every 30 s (Ctrl-C ends)" in captured.err


def test_thresholds_come_from_set_and_bad_options_are_usage_errors(tmp_path, capsys):
    dlm_run(tmp_path, "run", healthy(range(1, 6)))
    assert main(["watch", str(tmp_path), "--once"]) == 0
    assert "run  PASS" in capsys.readouterr().out
    assert main(["watch", str(tmp_path), "--once", "--set", "training_drift.min_steps=10"]) == 0
    assert "judged from 10" in capsys.readouterr().out
    assert main(["watch", str(tmp_path), "--once", "--set", "training_drift.spike_sigma=3"]) == 2


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_a_bad_interval_is_refused(tmp_path, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["watch", str(tmp_path), "--interval", value])
    assert exit_.value.code == 2
    assert "--interval" in capsys.readouterr().err


def test_a_remote_root_is_refused():
    with pytest.raises(UsageError, match="local files"):
        Watcher("s3://bucket/runs")


def test_help_teaches_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["watch", "--help"])
    out = capsys.readouterr().out
    for words in ("examples:", "exit codes", "--stop-on", "--once", "130", "Guard"):
        assert words in out, words


def test_an_hf_run_keeps_its_name_when_its_first_checkpoint_makes_the_output_folder_a_store(
    tmp_path,
):
    """The real HF Trainer logging to TensorBoard: before the first save the
    run is its TensorBoard folder (judged from its first records); the
    first checkpoint
    makes the output folder the store. The watch says the run moved, with
    the verdict it had, and does not call it gone."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    from test_integrations import TokenData
    from test_monitor import tiny_llama

    out = tmp_path / "runs-root" / "out"
    watcher = Watcher(tmp_path / "runs-root")
    seen: dict[int, list] = {}

    class Poll(transformers.TrainerCallback):
        """Polls the watch after the TensorBoard callback wrote the step
        (callbacks given to the Trainer run after its reporting ones)."""

        tensorboard = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.global_step in (12, 24) and "loss" in (logs or {}):
                self.tensorboard.tb_writer.flush()
                seen[state.global_step] = watcher.poll()

    poll = Poll()

    torch.manual_seed(0)
    trainer = transformers.Trainer(
        model=tiny_llama(),
        args=transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=24,
            per_device_train_batch_size=4,
            logging_steps=1,
            learning_rate=1e-3,
            save_strategy="steps",
            save_steps=20,
            report_to=["tensorboard"],
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=TokenData(96, 8, 64),
        callbacks=[poll],
    )
    poll.tensorboard = next(
        c for c in trainer.callback_handler.callbacks if type(c).__name__ == "TensorBoardCallback"
    )
    trainer.train()
    (first,) = seen[12]
    assert first.store.startswith("out/runs/") and first.old is None, first
    assert first.new in {"pass", "warn"}, first
    assert first.step == 12
    (moved,) = seen[24]
    assert moved.store == "out" and moved.was == first.store, moved
    assert moved.old == first.new and moved.new in {"pass", "warn"}
    assert f"out (was {first.store})" in line(moved)
    assert list(watcher.verdicts) == ["out"]
