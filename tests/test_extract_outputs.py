"""Where extraction writes: never over its inputs, through symbolic links, and bad
output paths as UsageError (the one atomic-write helper, adapterprobe._fs)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import adapterprobe  # noqa: E402
from adapterprobe import UsageError  # noqa: E402
from adapterprobe._fs import atomic_dir, atomic_write_bytes  # noqa: E402
from realruns.tiny import finetune, tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tiny_llama(0, tie_word_embeddings=False)
    tuned = finetune(base, steps=2)
    return base, tuned


def saved(pair, root):
    base, tuned = pair
    base.save_pretrained(root / "base")
    tuned.save_pretrained(root / "tuned", max_shard_size="40KB")
    return root / "base", root / "tuned"


def extract(base, tuned, out, **kwargs):
    return adapterprobe.extract_lora(base, tuned, out, min_rank=1, max_rank=4, **kwargs)


def listing(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("tuned", "is the input"),
        (".", "contains the input"),
        ("tuned/lora", "sits inside the input"),
        ("base", "is the input"),
    ],
)
def test_output_that_overlaps_an_input_is_refused_and_nothing_is_touched(
    pair, tmp_path, where, message
):
    base, tuned = saved(pair, tmp_path)
    before = listing(tmp_path)
    with pytest.raises(UsageError, match=message):
        extract(base, tuned, tmp_path / where, overwrite=True)
    assert listing(tmp_path) == before  # the checkpoints survive, no staging left behind


def test_output_holding_a_shard_named_by_an_index_file_is_refused(pair, tmp_path):
    _, tuned = saved(pair, tmp_path)
    index = tuned / "model.safetensors.index.json"
    with pytest.raises(UsageError, match="contains the input"):
        extract(pair[0], index, tuned, overwrite=True)
    assert index.is_file()


def test_a_sibling_output_is_fine(pair, tmp_path):
    base, tuned = saved(pair, tmp_path)
    rep = extract(base, tuned, tmp_path / "lora")
    assert rep.num_modules > 0 and (tmp_path / "lora" / "adapter_model.safetensors").is_file()


def test_symlinked_output_is_written_through_and_leaves_nothing_behind(pair, tmp_path):
    base, tuned = pair
    real = tmp_path / "disk" / "lora"
    real.mkdir(parents=True)
    (real / "old.txt").write_text("an earlier adapter")
    link = tmp_path / "lora"
    link.symlink_to(real, target_is_directory=True)
    extract(base, tuned, link, overwrite=True)
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert sorted(p.name for p in real.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "extraction_report.json",
    ]
    leftovers = [p.name for p in (*tmp_path.iterdir(), *real.parent.iterdir())]
    assert not [name for name in leftovers if name.startswith(".")]

    dangling = tmp_path / "later"
    dangling.symlink_to(tmp_path / "disk" / "not-yet", target_is_directory=True)
    extract(base, tuned, dangling)
    assert (tmp_path / "disk" / "not-yet" / "adapter_model.safetensors").is_file()


def test_bad_output_paths_are_usage_errors(pair, tmp_path):
    base, tuned = pair
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    cases = {
        blocker / "lora": "parent directory",  # was NotADirectoryError
        blocker / "deeper" / "lora": "parent directory",  # was FileExistsError/NotADirectory
        blocker: "not a directory",
    }
    for out, message in cases.items():
        with pytest.raises(UsageError, match=message) as err:
            extract(base, tuned, out, overwrite=True)
        assert err.value.path is not None
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(UsageError):
        extract(base, tuned, loop / "lora")
    assert blocker.read_text() == "not a directory"


def test_atomic_write_bytes_paths(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        atomic_write_bytes(tmp_path / "dir", b"x")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="parent directory"):
        atomic_write_bytes(tmp_path / "file" / "y", b"x")
    target = tmp_path / "real.bin"
    target.write_bytes(b"old")
    (tmp_path / "link.bin").symlink_to(target)
    atomic_write_bytes(tmp_path / "link.bin", b"new")
    assert (tmp_path / "link.bin").is_symlink() and target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file", "link.bin", "real.bin"]


def test_atomic_dir_failure_inside_leaves_the_old_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic_dir(out, overwrite=True) as tmp:
        (tmp / "new").write_text("half")
        raise RuntimeError("boom")
    assert os.listdir(out) == ["keep"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _crash_between_renames(base_dir, tuned_dir, out) -> int:
    """Run `extract --overwrite` in a child that dies (as if killed) right
    after the old output was moved aside and before the new one took its place."""
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent(
        f"""
        import os, sys
        import adapterprobe._fs as fs
        real = os.rename
        def rename(src, dst):
            real(src, dst)
            if ".old-" in os.fspath(dst):
                os._exit(9)
        fs.os.rename = rename
        from adapterprobe.cli import main
        sys.exit(main(["extract", "--base", {str(base_dir)!r}, "--tuned", {str(tuned_dir)!r},
                       "--out", {str(out)!r}, "--overwrite", "--min-rank", "1", "--max-rank", "4"]))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", child], capture_output=True, timeout=600
    ).returncode


def test_a_kill_between_the_two_renames_is_repaired_by_the_next_run(pair, tmp_path):
    base_dir, tuned_dir = saved(pair, tmp_path)
    out = tmp_path / "lora"
    extract(base_dir, tuned_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert _crash_between_renames(base_dir, tuned_dir, out) == 9
    stranded = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".lora."))
    assert not out.exists() and any(".old-" in n for n in stranded)
    assert any(n.endswith(".tmp") for n in stranded)
    # The next run (even one that then refuses to overwrite) puts the old
    # adapter back and removes the dead run's temporary directory.
    with pytest.raises(UsageError, match="not empty"):
        extract(base_dir, tuned_dir, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "lora", "tuned"]
    # Crash again, then a run with overwrite finishes the job: a fresh adapter,
    # nothing left beside it.
    assert _crash_between_renames(base_dir, tuned_dir, out) == 9
    extract(base_dir, tuned_dir, out, overwrite=True)
    assert (out / "adapter_model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "lora", "tuned"]
