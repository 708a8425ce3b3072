"""The command line as a new user and a CI log see it: 80 columns, pipes,
exit codes, thresholds from flags and config files, Markdown and HTML."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adapterprobe as ap

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cli(*args: str, cwd: Path | None = None, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def tree(tmp_path, demo_store) -> Path:
    """The demo stores under long, deep names (as real store trees have)."""
    root = tmp_path / "a-team-with-a-long-name" / "adapters-for-customer-support-and-billing"
    for i, name in enumerate(sorted(p.name for p in demo_store.iterdir())):
        shutil.copytree(demo_store / name, root / f"{name}-store-with-a-very-long-name-{i:03d}")
    return root


def test_table_fits_80_columns_in_a_ci_log(tree):
    done = cli("scan", str(tree), "--format", "table")
    assert done.returncode == 1, done.stderr
    lines = ANSI.sub("", done.stdout).splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert "\x1b[" not in done.stdout  # no colour codes in a log
    assert lines[-2].startswith("12 records from 4 stores") or lines[-1].startswith(
        "12 records from 4 stores"
    )
    assert any(line.startswith("per store:") for line in lines)
    # every message is there in full, wrapped, not cut to one character
    record = next(r for r in ap.scan(tree) if r.verdict.value == "fail")
    joined = " ".join(" ".join(lines).split())
    assert " ".join(record.message.split()) in joined


def test_only_filters_output_not_the_exit_code(tree):
    done = cli("scan", str(tree), "--format", "json", "--only", "fail")
    records = json.loads(done.stdout)
    assert {r["verdict"] for r in records} == {"fail"}
    assert done.returncode == 1
    quiet = cli("scan", str(tree), "--format", "json", "--only", "pass", "--fail-on", "warn")
    assert {r["verdict"] for r in json.loads(quiet.stdout)} == {"pass"}
    assert quiet.returncode == 1
    assert cli("scan", str(tree), "--only", "bogus").returncode == 2


def test_markdown_summary(tree):
    done = cli("scan", str(tree), "--format", "markdown", "--set", "training_drift.min_steps=30")
    text = done.stdout
    assert text.startswith("## adapterprobe scan")
    assert "**12 records from 4 stores**" in text
    assert "| verdict | probe | store | adapter | message |" in text
    assert "FAIL | gradient_ghost" in text
    assert "min_steps=30" in text  # the settings used are shown


def test_pipe_to_head_exits_quietly(tmp_path, demo_store):
    for i in range(60):
        shutil.copytree(demo_store / "healthy", tmp_path / f"s{i:03d}")
    done = subprocess.run(
        f"{sys.executable} -m adapterprobe scan {tmp_path} --format json | head -2",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stdout.startswith("[")


def test_thresholds_from_set_and_config_files(tmp_path, demo_store):
    store = tmp_path / "store"
    shutil.copytree(demo_store / "healthy", store)
    default = json.loads(cli("scan", str(store), "--format", "json").stdout)
    drift = next(r for r in default if r["probe"] == "training_drift")
    assert drift["verdict"] == "pass"
    flagged = cli("scan", str(store), "--format", "json", "--set", "training_drift.min_steps=500")
    drift = next(r for r in json.loads(flagged.stdout) if r["probe"] == "training_drift")
    assert drift["verdict"] == "skip" and "min_steps=500" in drift["message"]
    # pyproject.toml in the working directory
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.adapterprobe]\nfail_on = "warn"\n\n'
        "[tool.adapterprobe.training_drift]\nmin_steps = 500\n"
    )
    from_project = cli("scan", str(store), "--format", "json", cwd=project)
    drift = next(r for r in json.loads(from_project.stdout) if r["probe"] == "training_drift")
    assert drift["verdict"] == "skip"
    assert from_project.returncode == 0  # nothing warned; fail_on came from the file
    # --config, overridden by --set
    config = tmp_path / "gate.toml"
    config.write_text("rules = 'robust'\n[training_drift]\nmin_steps = 500\n")
    both = cli(
        "scan",
        str(store),
        "--format",
        "json",
        "--config",
        str(config),
        "--set",
        "training_drift.min_steps=10",
    )
    drift = next(r for r in json.loads(both.stdout) if r["probe"] == "training_drift")
    assert drift["verdict"] == "pass"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "training_drift.min_steps=1"], "min_steps"),
        (["--set", "training_drift.no_such_option=1"], "no_such_option"),
        (["--set", "nonsense"], "PROBE.OPTION=VALUE"),
        (["--set", "training_drift.spike_sigma=4"], "applies only to rules='sway'"),
        (["--address", "10.0.0.1:6379"], "--engine ray"),
        (["--workers", "20000"], "workers"),
    ],
)
def test_bad_settings_are_usage_errors(demo_store, args, needle):
    done = cli("scan", str(demo_store), *args)
    assert done.returncode == 2
    assert needle in done.stderr


def test_sway_thresholds_are_settable_under_sway(demo_store):
    done = cli("scan", str(demo_store), "--rules", "sway", "--set", "training_drift.spike_sigma=4")
    assert done.returncode == 1, done.stderr


def test_exit_codes_are_documented():
    for args in (["--help"], ["scan", "--help"]):
        text = cli(*args).stdout
        assert "exit codes" in text
        for code in ("0", "1", "2", "3"):
            assert re.search(rf"\b{code}\b", text.split("exit codes", 1)[1])


def test_check_names_the_store(demo_store):
    done = cli("check", str(demo_store / "healthy"), "--format", "table")
    assert done.returncode == 0
    assert "healthy" in done.stdout
    assert not re.search(r"^\S+\s+\S+\s+\.\s", done.stdout, re.M)


def test_python_scan_without_a_root_scans_the_demo(demo_store):
    report = ap.scan()
    assert {Path(r.store).parent for r in report} == {demo_store}
    assert report.settings["rules"] == "robust"
    assert report.settings["training_drift"]["min_steps"] == 3


def test_introspection_without_torch():
    code = (
        "import sys, io, contextlib; sys.modules['torch'] = None\n"
        "import adapterprobe as ap\n"
        "with contextlib.redirect_stdout(io.StringIO()): help(ap)\n"
        "assert hasattr(ap, 'GAPMonitor') and 'extract_lora' in dir(ap)\n"
        "try:\n"
        "    ap.extract_lora('a', 'b', 'c')\n"
        "except ap.MissingExtraError as e:\n"
        "    assert 'pip install torch' in str(e) and \"'.[torch]'\" in str(e), e\n"
        "    assert 'adapterprobe[' not in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no MissingExtraError')\n"
        "ap.scan()\n"
        "sys.exit(int('torch' in sys.modules and sys.modules['torch'] is not None))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_report_command_writes_a_page_a_browser_opens(tmp_path, tree):
    from browser import load_page

    page = tmp_path / "health.html"
    done = cli("report", str(tree), "-o", str(page), "--set", "training_drift.min_steps=30")
    assert done.returncode == 1, done.stderr
    html = page.read_text()
    assert "min_steps" in html and "30" in html
    result = load_page(page, timeout=60)
    assert result.errors == []
    assert result.screenshot is None or len(result.screenshot) > 1000


def test_report_from_python(tmp_path, demo_store):
    report = ap.scan(demo_store)
    path = report.to_html(tmp_path / "r.html")
    assert path.read_text().startswith("<!DOCTYPE html>")
    assert "## adapterprobe scan" in report.to_markdown()


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab c-\t\n\u00e9xyz  .")), max_size=200),
    width=st.integers(1, 60),
)
def test_table_wrap_is_textwraps(text, width):
    import textwrap

    from adapterprobe.reports.table import wrap

    expected = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    assert wrap(text, width) == expected


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab/c-/\t\n.x/  _")), max_size=200),
    width=st.integers(1, 60),
)
def test_long_paths_are_cut_before_their_slashes(text, width):
    """A word wider than the line (a path) is cut before a '/' as close to
    the width as it can; a word that fits is never cut; nothing is lost."""
    import textwrap

    from adapterprobe.reports.table import wrap

    lines = wrap(text, width)
    assert "".join("".join(lines).split()) == "".join(text.split())
    whole = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    for line in lines:
        # A run of slashes is one separator: a cut goes before its first '/'.
        run_starts = [i for i in range(1, len(line)) if line[i] == "/" and line[i - 1] != "/"]
        assert len(line) <= width or not [i for i in run_starts if i <= width], (line, width)
        # A cut piece never ends in '/': the slash starts the next piece.
        # (The last piece ends where its word does, trailing '/' or not.)
        last_piece = any(w.endswith(line) for w in whole)
        assert line in whole or not line.endswith("/") or set(line) == {"/"} or last_piece, line
    # Only the lines textwrap leaves too wide are cut.
    cut = sum(len(wrap(w, width)) - 1 for w in whole if len(w) > width)
    assert len(lines) - len(whole) == cut


def test_a_long_path_in_a_message_keeps_to_80_columns(tmp_path):
    """A 91-column path in a message at 80 columns: cut before a '/'."""
    from adapterprobe.reports.table import wrap

    path = "/data/team/experiments/2026-11/llama-3-8b-lora-sweep/run-0042/checkpoint-1200/adapter"
    lines = wrap(f"cannot read {path}/adapter_model.safetensors: truncated", 74)
    assert all(len(line) <= 74 for line in lines), lines
    assert any(line.startswith("/") for line in lines[1:]), lines


def _short_path_by_relpath(path, base):
    if path is None:
        return "-"
    try:
        rel = os.path.relpath(path, base) if base else path
    except ValueError:
        return path
    if rel in (".", ""):
        return os.path.basename(os.path.normpath(path)) or path
    return path if rel.startswith("..") else rel


_part = st.sampled_from(["a", "b", ".data", "..", ".", "store-1", "v0001", ""])


@settings(max_examples=400, deadline=None)
@given(
    base=st.lists(_part, max_size=4),
    rest=st.lists(_part, max_size=4),
    absolute=st.booleans(),
)
def test_table_short_path_is_relpaths(base, rest, absolute):
    from adapterprobe.reports.table import short_path

    lead = "/" if absolute else ""
    b = lead + "/".join(base)
    p = lead + "/".join(base + rest)
    assert short_path(p, b) == _short_path_by_relpath(p, b)


def test_install_hints_name_packages_that_install_today():
    # adapterprobe is not on PyPI: `pip install 'adapterprobe[x]'` would fail.
    from adapterprobe.errors import install_hint

    for extra, wanted in [("peft", ["torch", "transformers", "peft"]), ("pandas", ["pandas"])]:
        hint = install_hint(extra)
        assert hint.startswith("pip install "), hint
        assert all(name in hint.split("(")[0].split() for name in wanted), hint
        assert "adapterprobe[" not in hint and f"'.[{extra}]'" in hint


@pytest.mark.parametrize(
    "command", ["scan", "report", "compare", "similar", "check", "extract", "watch"]
)
def test_help_prints_no_control_characters(command):
    out = cli(command, "--help")
    assert out.returncode == 0, out.stderr
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out.stdout), [
        line for line in out.stdout.splitlines() if not line.isprintable()
    ]


def test_one_folded_skip_is_one_record():
    from adapterprobe.reports.table import summary_text
    from adapterprobe.tally import Tally

    text = summary_text(Tally(), "fail", folded=1)
    assert "1 skipped record folded into its store" in text and "1 skipped records" not in text
    assert "2 skipped records folded into their stores" in summary_text(Tally(), "fail", folded=2)


def test_exclude_keeps_the_walk_out_of_matching_folders(tmp_path):
    from adapterprobe.scan import DEMO_STORE

    for where in ("team/keep", "team/wandb/run-1", "outputs/old/a"):
        shutil.copytree(DEMO_STORE / "healthy", tmp_path / where)
    done = cli(
        "scan", str(tmp_path), "--format", "json", "--exclude", "wandb", "--exclude", "outputs/old"
    )
    assert done.returncode == 0, done.stderr
    stores = {Path(r["store"]).relative_to(tmp_path).as_posix() for r in json.loads(done.stdout)}
    assert stores == {"team/keep"}
    explained = cli("scan", str(tmp_path), "-v", "--exclude", "wandb", "--exclude", "outputs/old")
    assert "excluded by --exclude wandb" in explained.stderr
    bad = cli("scan", str(tmp_path), "--exclude", "[")
    assert bad.returncode == 2 and "--exclude" in bad.stderr and "Traceback" not in bad.stderr
    everything = cli("scan", str(tmp_path), "--format", "json")
    assert len({r["store"] for r in json.loads(everything.stdout)}) == 3


def test_check_on_a_tree_says_one_thing_and_points_at_scan(demo_store, tmp_path):
    done = cli("check", str(demo_store))
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # not also "nothing to probe"
    assert "holds 4 stores below it" in lines[0] and "adapterprobe scan" in lines[0]
    empty = cli("check", str(tmp_path))
    assert empty.returncode == 3 and "nothing to probe" in empty.stderr


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("--fial-on", "--fail-on"), ("--fromat=json", "--format"), ("--exlude", "--exclude")],
)
def test_a_mistyped_option_names_the_one_meant_under_its_subcommand(demo_store, typed, meant):
    args = [typed, "warn"] if "=" not in typed else [typed]
    done = cli("scan", str(demo_store), *args)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: adapterprobe scan"), done.stderr
    assert f"unrecognized arguments: {typed}" in done.stderr
    assert f"did you mean {meant}?" in done.stderr


def test_an_option_near_none_is_only_named():
    done = cli("scan", "--zzzzzz")
    assert done.returncode == 2 and "unrecognized arguments: --zzzzzz" in done.stderr
    assert "did you mean" not in done.stderr


def test_nothing_to_probe_lists_every_layout_a_line(tmp_path):
    done = cli("scan", str(tmp_path))
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert "nothing to probe" in lines[0]
    listed = [line for line in lines if line.startswith("  - ")]
    assert len(listed) >= 6 and all(len(line) <= 150 for line in listed), listed
    for layout in ("dlm", "HF Trainer", "LLaMA-Factory", "Lightning", "W&B", "MLflow"):
        assert any(layout in line for line in listed), layout
    assert any("TensorBoard" in line for line in listed)
    assert any("PEFT" in line for line in listed)


def test_nothing_to_probe_names_the_files_it_saw_and_lfs_pointers(tmp_path):
    """A folder of files no layout reads says which (issue 54, item 5): a
    Git LFS pointer left by a clone without ``git lfs pull`` is named as
    one; exit 3 stays. (Adapter weights left as a pointer make a store,
    whose record names the pointer.)"""
    pointer = (
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 16777216\n"
    )
    (tmp_path / "train.parquet").write_text(pointer)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("hello")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    done = cli("scan", str(tmp_path))
    assert done.returncode == 3
    seen = done.stderr.split("reads none of them:\n")[1].rstrip().splitlines()
    assert seen[0].startswith("  - train.parquet: a Git LFS pointer"), seen
    assert "git lfs pull" in seen[0]
    assert seen[1].startswith("  - notes/README.txt (5 bytes)"), seen
    assert seen[1].endswith("not a format adapterprobe reads"), seen
    assert not any(".git" in line for line in seen)


def test_a_bare_model_folder_says_its_weights_are_read_inside_a_run(tmp_path):
    """What save_pretrained leaves of a full fine-tune, with no trainer state
    or checkpoint around it, is no store; the files are named with what a
    run of them would need, not as a format adapterprobe does not read."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import numpy as np

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "vocab_size": 64}')
    safetensors_numpy.save_file(
        {"w": np.zeros((2, 2), dtype=np.float32)}, str(model / "model.safetensors")
    )
    done = cli("scan", str(model))
    assert done.returncode == 3
    seen = done.stderr.split("reads none of them:\n")[1].rstrip().splitlines()
    by_name = {line.split(" (")[0].strip(" -"): line for line in seen}
    assert "a model config" in by_name["config.json"], seen
    assert "checkpoint-N/" in by_name["model.safetensors"], seen
    assert not any("not a format" in line for line in seen), seen


def test_similar_on_a_folder_without_adapters_says_one_thing(tmp_path):
    (tmp_path / "x").mkdir()
    done = cli("similar", str(tmp_path))
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        f"adapterprobe: no adapters found under {tmp_path}"
    ], done.stderr


@given(
    text=st.text(alphabet="ab/_-.0123456789", min_size=0, max_size=200), room=st.integers(1, 120)
)
@settings(max_examples=300, deadline=None)
def test_a_path_is_cut_in_the_middle_within_its_room(text, room):
    from adapterprobe.reports.shaping import clip_middle as _clip_middle

    cut = _clip_middle(text, room)
    assert len(cut) <= max(room, 1)
    if len(text) <= room:
        assert cut == text
    elif room >= 12:
        head, _, tail = cut.partition("…")
        assert text.startswith(head) and text.endswith(tail) and head and tail


def test_two_runs_rows_keep_what_tells_them_apart():
    """Lightning rows of two runs both printed '…logs/version_0 / checkpoints/
    epoch=1-step=104.ckpt': the start that differs was what the table cut
    (issue 56, item 3)."""
    from adapterprobe.reports.shaping import clip_middle as _clip_middle

    tail = "/lightning_logs/version_0 / checkpoints/epoch=1-step=104.ckpt"
    a, b = (_clip_middle(run + tail, 48) for run in ("l-diverge", "l-healthy"))
    assert a != b and a.startswith("l-diverge/") and b.startswith("l-healthy/")
    assert a.endswith("epoch=1-step=104.ckpt") and len(a) <= 48


def test_adapter_weights_left_as_an_lfs_pointer_are_a_store_naming_it(tmp_path):
    pointer = (
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "cd" * 32 + "\nsize 709058851\n"
    )
    (tmp_path / "adapter_model.bin").write_text(pointer)
    done = cli("scan", str(tmp_path), "-v", "--probes", "adapter_weights")
    assert done.returncode == 1, done.stderr
    assert "Git LFS pointer" in " ".join(done.stdout.split()), done.stdout


@given(
    here=st.lists(st.sampled_from(["work", "main", "a b", "ü", "runs"]), min_size=0, max_size=3),
    rest=st.lists(st.sampled_from(["run", "version_0", "x.y", "main2", ".."]), max_size=4),
    outside=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_a_store_is_named_from_the_working_directory(here, rest, outside):
    """A store below the working directory is named by the rest of its path,
    one elsewhere (or a URL) by its whole path; never '.' or empty."""
    from adapterprobe.reports.shaping import store_name

    cwd = "/" + "/".join(here)
    tail = "/".join(p for p in rest if p != "..")
    if outside:
        path = "/elsewhere/" + tail if tail else "/elsewhere"
        assert store_name(path, cwd) == path or cwd == "/"
        assert store_name("s3://bucket/" + tail, cwd) == "s3://bucket/" + tail
    else:
        path = os.path.join(cwd, tail) if tail else cwd
        name = store_name(path, cwd)
        assert name == (tail or os.path.basename(cwd) or path)
        assert store_name(tail or ".", cwd) == name  # relative, as typed from there
    assert store_name(path, cwd) not in ("", ".")
    if cwd != "/":
        assert store_name(cwd + "2", cwd) == cwd + "2"  # a sibling is not below it


def test_the_bundled_demo_is_named_by_its_folders_wherever_it_is_installed(tmp_path, demo_store):
    """`adapterprobe scan` with no ROOT scans the demo inside the installed
    package: its rows are `smoke-test`, not `.venv/lib/.../demo_store/smoke-test`."""
    done = cli("scan", "--format", "table", cwd=tmp_path)
    per_store = ANSI.sub("", done.stdout).split("per store:\n")[1].splitlines()[:4]
    assert sorted(line.split()[1] for line in per_store) == sorted(
        p.name for p in demo_store.iterdir()
    ), per_store
