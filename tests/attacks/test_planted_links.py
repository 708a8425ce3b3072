"""Links planted where adapterprobe chooses a file's name (issue 51).

A run folder resumed from a shared or downloaded checkpoint, or a store
someone else filled, may carry a symbolic link under a name that one of our
writers chooses itself: the guard's ``adapterprobe-guard.json``, Lightning's
``guard-stop-step<N>.ckpt``, a GAP log and its side files, a gradient dump's
``step{N}/``, the ``.NAME.old-XXXX`` and ``.NAME.PID-XXXX.tmp`` leftovers the
atomic writers clean up. None of them may write, move or delete what such a
link points at: a file or folder written whole replaces the link itself, and
what is appended to refuses it with an error naming the link. (A path the user
names is theirs and stays written through: tests/test_extract_outputs.py.)
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest

import adapterprobe as ap
import adapterprobe.sinks
from adapterprobe._fs import atomic_dir, atomic_write_bytes, clean_leftovers
from adapterprobe.errors import MonitorConfigError
from adapterprobe.guard import GUARD_FILE

VICTIM_TEXT = "someone else's file\n"


def victim_file(base: Path) -> Path:
    """A file the training process can write, outside the run folder."""
    victim = base / "elsewhere" / "precious.txt"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text(VICTIM_TEXT)
    return victim


def victim_dir(base: Path) -> Path:
    """A folder outside the run folder, with a file in it."""
    victim = base / "elsewhere" / "precious"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text(VICTIM_TEXT)
    return victim


def assert_untouched_dir(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert (victim / "keep.txt").read_text() == VICTIM_TEXT
    assert stat.S_IMODE(victim.stat().st_mode) & 0o700 == 0o700


def no_leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def a_failing_guard() -> ap.Guard:
    guard = ap.Guard()
    for step in range(1, 6):
        guard.observe(step, loss=float("nan"))
    return guard


# -- the guard's file ---------------------------------------------------------------


def test_the_guard_replaces_a_planted_link_to_a_file_and_leaves_its_target(tmp_path):
    victim = victim_file(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / GUARD_FILE).symlink_to(victim)
    written = a_failing_guard().write(run, stopped_at=5)
    assert victim.read_text() == VICTIM_TEXT
    assert not (run / GUARD_FILE).is_symlink()
    assert written == run.resolve() / GUARD_FILE
    assert json.loads((run / GUARD_FILE).read_text())["stopped_at"] == 5
    assert no_leftovers(run) == []


def test_the_guard_replaces_a_dangling_link_without_creating_its_target(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    wished = tmp_path / "elsewhere" / "new-file"
    wished.parent.mkdir()
    (run / GUARD_FILE).symlink_to(wished)
    a_failing_guard().write(run)
    assert not wished.exists() and not os.path.lexists(wished)
    assert (run / GUARD_FILE).is_file() and not (run / GUARD_FILE).is_symlink()


def test_the_guard_replaces_a_link_to_a_folder_instead_of_failing(tmp_path):
    victim = victim_dir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / GUARD_FILE).symlink_to(victim, target_is_directory=True)
    a_failing_guard().write(run)
    assert_untouched_dir(victim)
    assert json.loads((run / GUARD_FILE).read_text())["verdict"] == "fail"


def test_the_guard_does_not_put_a_planted_old_copy_back_in_place(tmp_path):
    """``.NAME.old-XXXX`` is how a swap that a kill interrupted is settled:
    a link planted under that name is removed, never renamed to NAME."""
    victim = victim_file(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    planted = run / f".{GUARD_FILE}.old-deadbeef"
    planted.symlink_to(victim)
    clean_leftovers(run / GUARD_FILE)
    assert not os.path.lexists(run / GUARD_FILE)
    assert not os.path.lexists(planted)
    assert victim.read_text() == VICTIM_TEXT


@pytest.mark.slow
def test_the_lightning_callback_replaces_planted_links_in_a_resumed_run_folder(tmp_path):
    """The real Lightning Trainer, stopped by the guard (a next-token model at
    Adam lr=10: far above ln K, with finite weights, so a checkpoint is saved
    at the stop), in a folder that carries links under both names the guard
    writes: the verdict file and every ``guard-stop-step<N>.ckpt`` it could
    choose."""
    pytest.importorskip("lightning")
    from test_guard import lightning_lm_run

    file_victim = victim_file(tmp_path)
    dir_victim = victim_dir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / GUARD_FILE).symlink_to(file_victim)
    for step in range(61):
        (run / f"guard-stop-step{step}.ckpt").symlink_to(dir_victim, target_is_directory=True)
    _, callback = lightning_lm_run(run, lr=10.0)
    stopped = callback.stopped_at
    assert stopped is not None
    assert file_victim.read_text() == VICTIM_TEXT
    assert_untouched_dir(dir_victim)
    checkpoint = run / f"guard-stop-step{stopped}.ckpt"
    assert checkpoint.is_file() and not checkpoint.is_symlink()
    written = json.loads((run / GUARD_FILE).read_text())
    assert written["stopped_at"] == stopped and not (run / GUARD_FILE).is_symlink()


@pytest.mark.slow
def test_the_trainer_callback_replaces_a_planted_guard_file_link(tmp_path):
    """The real HF Trainer writes the verdict at the end of a healthy run."""
    pytest.importorskip("transformers")
    from test_guard import hf_run

    victim = victim_file(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / GUARD_FILE).symlink_to(victim)
    hf_run(out, lr=3e-3, max_steps=4)
    assert victim.read_text() == VICTIM_TEXT
    assert not (out / GUARD_FILE).is_symlink()
    assert json.loads((out / GUARD_FILE).read_text())["stopped_at"] is None


# -- the atomic writers, by who named the output -----------------------------------


def test_a_chosen_name_replaces_the_link_a_named_path_writes_through(tmp_path):
    victim = victim_file(tmp_path)
    link = tmp_path / "out.bin"
    link.symlink_to(victim)
    atomic_write_bytes(link, b"named by the user")  # the user's own link: written through
    assert link.is_symlink() and victim.read_bytes() == b"named by the user"
    atomic_write_bytes(link, b"a chosen name", replace_link=True)
    assert not link.is_symlink() and link.read_bytes() == b"a chosen name"
    assert victim.read_bytes() == b"named by the user"


def test_atomic_dir_settles_no_planted_leftover_through_its_link(tmp_path):
    """A ``.NAME.old-XXXX`` link is not renamed into place (where the new
    folder would then be refused, or swapped around it), and a dead
    writer's ``.NAME.PID-XXXX.tmp`` link is removed, not its target."""
    victim = victim_dir(tmp_path)
    other = tmp_path / "elsewhere" / "other"
    other.mkdir()
    (other / "keep.txt").write_text(VICTIM_TEXT)
    out = tmp_path / "out"
    (tmp_path / ".out.old-0badf00d").symlink_to(victim, target_is_directory=True)
    (tmp_path / ".out.99999999-abcd.tmp").symlink_to(other, target_is_directory=True)
    with atomic_dir(out) as staging:
        (staging / "new.txt").write_text("new")
    assert not out.is_symlink() and [p.name for p in out.iterdir()] == ["new.txt"]
    assert_untouched_dir(victim)
    assert_untouched_dir(other)
    assert no_leftovers(tmp_path) == []


# -- the GAP sinks ------------------------------------------------------------------


@pytest.fixture
def frozen_clock(monkeypatch):
    """``JsonlSink.for_store`` names the log by the UTC second: fix it."""
    from datetime import datetime, timezone

    import adapterprobe.sinks as sinks

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

    monkeypatch.setattr(sinks, "datetime", Frozen)
    return "train-000007-20260102T030405.jsonl"


def test_a_store_log_refuses_a_planted_link_and_appends_nothing(tmp_path, frozen_clock):
    from adapterprobe.sinks import JsonlSink

    victim = victim_file(tmp_path)
    store = tmp_path / "store"
    (store / "logs").mkdir(parents=True)
    link = store / "logs" / frozen_clock
    link.symlink_to(victim)
    with pytest.raises(MonitorConfigError, match="symbolic link") as err:
        JsonlSink.for_store(store, run_id=7)
    assert err.value.path == str(link)
    assert victim.read_text() == VICTIM_TEXT
    # Without the link the same log opens: the refusal is of the link alone.
    link.unlink()
    with JsonlSink.for_store(store, run_id=7) as sink:
        sink.write_step(adapterprobe.sinks.step_record(1, 0.5))
    assert link.is_file() and len(link.read_text().splitlines()) == 2


def test_a_store_log_refuses_a_fifo_at_its_name(tmp_path, frozen_clock):
    from adapterprobe.sinks import JsonlSink

    store = tmp_path / "store"
    (store / "logs").mkdir(parents=True)
    fifo = store / "logs" / frozen_clock
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so no version of the code can hang
    try:
        with pytest.raises(MonitorConfigError, match="not a regular file"):
            JsonlSink.for_store(store, run_id=7)
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)


def test_side_files_never_land_through_a_planted_link(tmp_path):
    pytest.importorskip("safetensors")
    from adapterprobe.sinks import JsonlSink

    stats = {"gap/summary/grads/l2_norm": 1.0, "gap/grads/model.w/var": 0.5}
    victim = victim_file(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    # A link at a side file's own name: the side file replaces the link.
    (logs / "a.tensors").mkdir()
    (logs / "a.tensors" / "step00000010.safetensors").symlink_to(victim)
    with JsonlSink(logs / "a.jsonl") as sink:
        sink.write_gap(10, stats)
    side = logs / "a.tensors" / "step00000010.safetensors"
    assert not side.is_symlink()
    assert adapterprobe.sinks.read_tensor_stats(side) == {"gap/grads/model.w/var": 0.5}
    assert victim.read_text() == VICTIM_TEXT
    # A link at the side-file folder: refused, naming it; nothing lands in its target.
    folder = victim_dir(tmp_path)
    (logs / "b.tensors").symlink_to(folder, target_is_directory=True)
    with JsonlSink(logs / "b.jsonl") as sink, pytest.raises(MonitorConfigError) as err:
        sink.write_gap(10, stats)
    assert err.value.path == str(logs / "b.tensors") and "symbolic link" in str(err.value)
    assert_untouched_dir(folder)


# -- gradient dumps -----------------------------------------------------------------


def test_a_gradient_dump_replaces_a_planted_step_link_and_keeps_its_target(tmp_path):
    torch = pytest.importorskip("torch")
    from adapterprobe import GradientDump

    victim = victim_dir(tmp_path)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "step3").symlink_to(victim, target_is_directory=True)
    wished = tmp_path / "elsewhere" / "not-yet"
    (dumps / "step4").symlink_to(wished, target_is_directory=True)
    dump = GradientDump(dumps)
    for step in (3, 4):
        final = dump.write(step, [("w", torch.ones(2, 2))])
        assert not final.is_symlink() and [p.name for p in final.iterdir()] == ["w.safetensors"]
    assert_untouched_dir(victim)
    assert not os.path.lexists(wished)
    assert no_leftovers(dumps) == []


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo process group, so the distributed dump paths run here."""
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of its own")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        from adapterprobe.monitor.distributed import World

        yield World(rank=0, size=1, timeout=None)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("first_n", [None, 1])
def test_a_distributed_dump_replaces_planted_links_and_keeps_their_targets(
    tmp_path, one_rank, first_n
):
    """``first_n=None``: a ``torch.distributed.checkpoint`` staged under
    ``.step{N}.dcp.tmp`` and swapped into ``step{N}``; ``first_n``: gathered
    and written by rank 0 through the atomic folder writer. Links at the
    step's name and at the staging name are replaced, never followed."""
    import torch

    from adapterprobe import GradientDump

    victim = victim_dir(tmp_path)
    staging_victim = tmp_path / "elsewhere" / "staging"
    staging_victim.mkdir()
    (staging_victim / "keep.txt").write_text(VICTIM_TEXT)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "step3").symlink_to(victim, target_is_directory=True)
    (dumps / ".step3.dcp.tmp").symlink_to(staging_victim, target_is_directory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's advice on single-rank saves
        final = GradientDump(dumps, first_n=first_n).write(
            3, [("w", torch.ones(2, 2))], world=one_rank
        )
    assert final.is_dir() and not final.is_symlink() and any(final.iterdir())
    assert_untouched_dir(victim)
    assert_untouched_dir(staging_victim)
    left = no_leftovers(dumps)
    assert left == ([] if first_n is None else [".step3.dcp.tmp"]), left
