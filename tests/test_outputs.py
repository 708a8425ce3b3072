"""Output that fits the place: the table on pipes and terminals, JSON/JSONL for
programs, -q/-v, -o, GitHub annotations and step summaries, JUnit XML, roll-ups.

The CLI runs as a subprocess, on a pipe and under a pseudo-terminal, on the
bundled demo store (written by real PEFT/torch runs) and on a bare PEFT
adapter copied out of it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import xmlschema
from hypothesis import given
from hypothesis import strategies as st

import adapterprobe as ap
from adapterprobe.scan import DEMO_STORE

SCHEMA = Path(__file__).parent / "schemas" / "junit.xsd"
ANNOTATION = re.compile(r"^::(error|warning) file=([^,:]*),title=([^:]*)::(.*)$")


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    full_env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "CI")}
    full_env.pop("GITHUB_STEP_SUMMARY", None)
    full_env.pop("FORCE_COLOR", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


def under_pty(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI with stdout on a pseudo-terminal; (exit code, what it printed)."""
    master, slave = pty.openpty()
    full_env = {**os.environ, **(env or {})}
    full_env.pop("GITHUB_ACTIONS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapterprobe", *args],
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=full_env,
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError("the CLI printed nothing for 120 s under a pty")
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


def demo_records() -> list[dict]:
    return json.loads(cli("scan", str(DEMO_STORE), "--json").stdout)


# ---------------------------------------------------------------------------
# The table is the default wherever stdout goes


def test_a_pipe_gets_the_table_not_json():
    done = cli("scan", str(DEMO_STORE))
    assert done.returncode == 1
    assert not done.stdout.lstrip().startswith("[")
    assert "FAIL   gradient_ghost" in done.stdout
    assert "12 records from 4 stores" in done.stdout
    assert "\x1b[" not in done.stdout  # no colour in a log
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_ci_variables_change_nothing_but_github_gets_annotations():
    plain = cli("scan", str(DEMO_STORE), env={"CI": "true"})
    assert plain.stdout.splitlines()[0].startswith("FAIL")
    github = cli("scan", str(DEMO_STORE), env={"GITHUB_ACTIONS": "true"})
    assert any(line.startswith("::error ") for line in github.stdout.splitlines())
    assert "12 records from 4 stores" in github.stdout  # the table is still there


def test_json_and_jsonl_on_request():
    records = demo_records()
    assert len(records) == 12
    lines = cli("scan", str(DEMO_STORE), "--format", "jsonl").stdout.splitlines()
    assert [json.loads(line) for line in lines] == records


def test_a_terminal_gets_colour_and_force_color_works_on_a_pipe():
    code, text = under_pty("scan", str(DEMO_STORE))
    assert code == 1
    assert "\x1b[1;31mFAIL" in text
    code, text = under_pty("scan", str(DEMO_STORE), env={"NO_COLOR": "1"})
    assert "\x1b[" not in text
    forced = cli("scan", str(DEMO_STORE), env={"FORCE_COLOR": "1"})
    assert "\x1b[1;31mFAIL" in forced.stdout


def test_quiet_shows_problems_and_the_summary_only():
    done = cli("scan", str(DEMO_STORE), "-q")
    heads = [line for line in done.stdout.splitlines() if re.match(r"^[A-Z]{4,5} ", line)]
    verdicts = {line.split()[0] for line in heads}
    assert verdicts <= {"WARN", "FAIL", "ERROR"} and verdicts
    assert "12 records from 4 stores" in done.stdout
    assert "healthy" not in done.stdout.split("per store:")[-1].split("\n\n")[0]


def test_verbose_shows_evidence():
    quiet = cli("scan", str(DEMO_STORE))
    loud = cli("scan", str(DEMO_STORE), "-v")
    assert "noise=" not in quiet.stdout
    assert "noise=" in loud.stdout and "global_step=80" in loud.stdout


def test_narrow_terminal_keeps_the_score_and_whole_words():
    done = cli("scan", str(DEMO_STORE), env={"COLUMNS": "60"})
    lines = done.stdout.splitlines()
    heads = [line for line in lines if line.startswith(("PASS ", "WARN ", "FAIL "))]
    assert heads and all(re.search(r"\d\.\d\d ", line) for line in heads[:12] if "/" in line)
    # a path in a message is cut only where it is wider than the line, and
    # then before a '/', never after one
    assert not any(line.rstrip().endswith("/") for line in lines)
    assert all(len(line) <= 60 for line in lines if "/" in line.strip()[1:]), lines


# ---------------------------------------------------------------------------
# Files: -o, --junit, step summary


def test_output_file_is_atomic_complete_and_world_readable(tmp_path):
    target = tmp_path / "scan.json"
    done = cli("scan", str(DEMO_STORE), "--json", "-o", str(target))
    assert done.returncode == 1 and done.stdout == ""
    assert len(json.loads(target.read_text())) == 12
    old_umask = os.umask(0o022)
    os.umask(old_umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~old_umask
    assert [p.name for p in tmp_path.iterdir()] == ["scan.json"]  # no temporaries left


def test_a_killed_scan_leaves_the_old_output_whole(tmp_path, demo_store):
    root = tmp_path / "root"
    for i in range(300):
        shutil.copytree(demo_store / "healthy", root / f"s{i:03d}")
    target = tmp_path / "scan.json"
    target.write_text("[]\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapterprobe", "scan", str(root), "--json", "-o", str(target)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Kill it while it writes: the staged file appears beside the target.
    for _ in range(600):
        if any(p.name.endswith(".tmp") for p in tmp_path.iterdir()) or proc.poll() is not None:
            break
        select.select([], [], [], 0.05)
    proc.kill()
    proc.wait()
    text = target.read_text()
    assert text == "[]\n" or len(json.loads(text)) == 900  # the old file, or the whole new one
    # The next run cleans up what the killed one left behind.
    cli("scan", str(DEMO_STORE), "--json", "-o", str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root", "scan.json"]


def test_report_output_rules(tmp_path):
    # A new folder in one that exists is made, as mkdir would ...
    fresh = tmp_path / "reports" / "x.html"
    done = cli("report", str(DEMO_STORE), "-o", str(fresh))
    assert done.returncode == 1 and fresh.is_file(), done.stderr
    # ... a tree of them is a typo, refused.
    missing = tmp_path / "nonexist" / "deeper" / "x.html"
    done = cli("report", str(DEMO_STORE), "-o", str(missing))
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert not missing.parent.parent.exists()
    assert (
        cli(
            "report", str(DEMO_STORE), "-o", str(tmp_path / "r.html"), "--format", "markdown"
        ).returncode
        == 2
    )
    page = tmp_path / "r.html"
    assert cli("report", str(DEMO_STORE), "-o", str(page)).returncode == 1
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(page.stat().st_mode) == 0o666 & ~mask


def test_junit_is_valid_and_matches_the_records(tmp_path):
    records = demo_records()
    for fail_on, failing in (("fail", {"fail"}), ("warn", {"warn", "fail"})):
        report = tmp_path / f"junit-{fail_on}.xml"
        done = cli("scan", str(DEMO_STORE), "-q", "--fail-on", fail_on, "--junit", str(report))
        assert done.returncode == 1
        xmlschema.XMLSchema(SCHEMA).validate(str(report))
        doc = xmlschema.XMLSchema(SCHEMA).to_dict(str(report))
        cases = [c for suite in doc["testsuite"] for c in suite["testcase"]]
        assert len(cases) == len(records) == doc["@tests"]
        failed = [c for c in cases if "failure" in c]
        assert len(failed) == sum(r["verdict"] in failing for r in records) == doc["@failures"]
        assert {c["@classname"] for c in cases} == {r["store"] for r in records}


def test_github_annotations_and_step_summary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    done = cli(
        "scan",
        str(DEMO_STORE),
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
        cwd=DEMO_STORE.parent.parent.parent,
    )
    found = [m for line in done.stdout.splitlines() if (m := ANNOTATION.match(line))]
    records = demo_records()
    assert len(found) == sum(r["verdict"] in ("warn", "fail", "error") for r in records)
    for m in found:
        level, file, title, _ = m.groups()
        assert (DEMO_STORE.parent.parent.parent / file).exists(), file
        assert not Path(file).is_absolute()
        assert title.split()[0] in {"training_drift", "gradient_ghost", "adapter_weights"}
        assert level == ("error" if title.endswith("FAIL") else "warning")
    ghost = next(m for m in found if m.group(3).startswith("gradient_ghost"))
    assert ghost.group(2).endswith("training_state.pt")
    text = summary.read_text()
    assert text.startswith("earlier step\n## adapterprobe scan")
    assert "| verdict | probe |" in text


# ---------------------------------------------------------------------------
# Roll-ups


def test_a_bare_adapter_is_one_line_and_passes(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    version = DEMO_STORE / "healthy" / "adapter" / "versions" / "v0001"
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy(version / name, bare / name)
    done = cli("scan", str(bare), cwd=tmp_path)
    heads = [line for line in done.stdout.splitlines() if re.match(r"^[A-Z]{4,5} ", line)]
    assert next(h.split()[:2] for h in heads if "adapter_weights" in h or "SKIP" in h) == [
        "PASS",
        "adapter_weights",
    ]
    assert not any(h.startswith("SKIP") for h in heads)
    assert "PASS   bare  (peft: 1 pass, 2 skip)" in done.stdout
    assert "Stores by their worst record: 1 pass" in done.stdout
    verbose = cli("scan", str(bare), "-v")
    assert sum(line.startswith("SKIP") for line in verbose.stdout.splitlines()) == 2
    assert ap.scan(bare).store_verdicts() == {str(bare): ap.Verdict.PASS}
    assert "nothing judged" not in done.stdout


def test_a_store_where_nothing_was_judged_is_said_not_passed(tmp_path):
    # Two records far apart: too short a curve to judge, and nothing else.
    logs = tmp_path / "short" / "logs"
    logs.mkdir(parents=True)
    records = ((100, 3.0), (200, 2.5))
    lines = [json.dumps({"type": "step", "step": s, "loss": v}) for s, v in records]
    (logs / "train-000001-20260101T000000.jsonl").write_text("\n".join(lines) + "\n")
    done = cli("scan", str(tmp_path / "short"))
    said = " ".join(done.stdout.split())  # the summary is wrapped to the terminal
    assert "Stores by their worst record: 1 skip." in said, said
    assert "1 store had nothing judged (every record skipped): not a pass." in said


def test_store_roll_up_is_skip_only_when_every_record_skipped():
    from adapterprobe.records import rollup

    assert rollup(["pass", "skip", "pass"]) is ap.Verdict.PASS
    assert rollup(["skip", "warn"]) is ap.Verdict.WARN
    assert rollup(["skip", "skip"]) is ap.Verdict.SKIP
    assert rollup(["error", "fail"]) is ap.Verdict.ERROR
    assert rollup([]) is None


# ---------------------------------------------------------------------------
# Python API


def test_reprs_are_short_and_print_shows_the_table():
    report = ap.scan(DEMO_STORE)
    assert len(repr(report)) < 120 and "12 records from 4 stores" in repr(report)
    assert all(len(repr(r)) < 300 for r in report)
    result = ap.training_drift(DEMO_STORE / "spiky-nan")
    assert "WARN" in repr(result) and len(repr(result)) < 250
    assert "per store:" in str(report) and "FAIL   gradient_ghost" in str(report)


def test_scan_takes_a_list_of_roots_and_refuses_other_things():
    both = ap.scan([DEMO_STORE / "healthy", DEMO_STORE / "spiky-nan"])
    assert len({r.store for r in both}) == 2
    with pytest.raises(ap.UsageError, match="a root must be a path"):
        ap.scan(42)  # type: ignore[arg-type]


def test_to_pandas_flattens_evidence_and_orders_verdicts():
    frame = ap.scan(DEMO_STORE).to_pandas()
    assert "evidence" not in frame.columns and "evidence.noise" in frame.columns
    assert list(frame["verdict"].cat.categories) == ["pass", "skip", "warn", "fail", "error"]
    assert set(frame[frame["verdict"] >= "warn"]["verdict"]) == {"warn", "fail"}
    drift = frame[frame["probe"] == "training_drift"]
    assert drift["evidence.num_steps"].notna().all()


def test_describe_prints_text():
    text = ap.DriftOptions().describe()
    assert isinstance(text, str) and "spike_z = " in text and "\n" in text
    assert set(ap.DriftOptions().option_help()) <= set(ap.DriftOptions().to_dict())


def test_verbose_says_which_directories_were_passed_over_and_why(tmp_path):
    shutil.copytree(DEMO_STORE / "healthy", tmp_path / "healthy")
    (tmp_path / "empty").mkdir()
    (tmp_path / ".cache").mkdir()
    quiet = cli("scan", str(tmp_path))
    assert "passed over" not in quiet.stderr
    loud = cli("scan", str(tmp_path), "-v")
    said = dict(
        line.removeprefix("adapterprobe: passed over ").split(": ", 1)
        for line in loud.stderr.splitlines()
        if line.startswith("adapterprobe: passed over ")
    )
    assert set(said) == {str(tmp_path / "empty"), str(tmp_path / ".cache")}
    assert "empty" in said[str(tmp_path / "empty")] and "hidden" in said[str(tmp_path / ".cache")]


# The CSV writer quotes rows itself (csv.writer's per-character pass over the
# evidence cell cost more than the scan): it must write what csv.writer does.
_CSV_CELL = st.text(st.characters(exclude_characters="\r"), max_size=30)


@given(st.lists(_CSV_CELL, min_size=2, max_size=9))
def test_csv_rows_are_what_csv_writer_writes(cells):
    from adapterprobe.records import csv_row

    expected = io.StringIO()
    csv.writer(expected, lineterminator="\n").writerow(cells)
    assert csv_row(cells) == expected.getvalue()


def test_csv_output_reads_back_as_the_json_records(demo_store):
    text = cli("scan", str(demo_store), "--format", "csv").stdout
    records = json.loads(cli("scan", str(demo_store), "--format", "json").stdout)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(records) > 0
    for row, record in zip(rows, records, strict=True):
        assert json.loads(row["evidence"]) == json.loads(json.dumps(record["evidence"]))
        assert row["probe"] == record["probe"] and row["verdict"] == record["verdict"]
        score = record["score"]
        assert row["score"] == ("" if score is None else str(score))


def test_ctrl_c_takes_the_progress_bar_down_before_saying_so(tmp_path):
    # A scan big enough for the bar (200+ stores), its stderr on a terminal.
    demos = sorted(p for p in DEMO_STORE.iterdir() if p.is_dir())
    for i in range(2000):
        shutil.copytree(demos[i % len(demos)], tmp_path / f"s{i:04d}", copy_function=os.link)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapterprobe", "scan", str(tmp_path), "--format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    out, sent = b"", False
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        assert ready, "nothing on the terminal for 120 s"
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
        if not sent and b"scanning stores" in out:
            proc.send_signal(signal.SIGINT)
            sent = True
    os.close(master)
    assert proc.wait(timeout=60) == 130 and sent
    # The bar is gone (cursor shown again) and nothing is drawn after the word.
    assert out.endswith(b"interrupted\r\n"), out[-200:]
    assert b"\x1b[?25h" in out


def test_a_training_drift_annotation_points_at_the_log_file():
    # Not at the logs/ folder: GitHub puts an annotation on a file.
    out = cli("scan", str(DEMO_STORE), "--format", "github").stdout
    drift = [m for m in map(ANNOTATION.match, out.splitlines()) if m and "training_drift" in m[3]]
    assert drift, out
    for m in drift:
        path = Path(m[2])
        assert path.is_file() and path.name.startswith("train-"), m[0]
        assert path.suffix == ".jsonl"


@given(
    parts=st.lists(st.sampled_from(["a", "b", "..", ".", "", "ws", "c d"]), max_size=6),
    absolute=st.booleans(),
    workspace=st.sampled_from(["/ws", "/ws/", "/w", "/", "/ws/a/.."]),
)
def test_annotation_paths_are_relative_to_the_workspace_as_relpath_says(parts, absolute, workspace):
    """The prefix cut of github's file= is os.path.relpath's answer, and a
    path outside the workspace stays as it is."""
    from adapterprobe.reports.github import _workspace_relative

    path = ("/" if absolute else "") + "/".join(parts)
    if not path:
        return
    rel = os.path.relpath(path, workspace)
    before = os.environ.get("GITHUB_WORKSPACE")
    os.environ["GITHUB_WORKSPACE"] = workspace
    try:
        got = _workspace_relative(path)
    finally:
        if before is None:
            del os.environ["GITHUB_WORKSPACE"]
        else:
            os.environ["GITHUB_WORKSPACE"] = before
    assert got == (path if rel.startswith("..") else rel)


def test_a_drift_annotation_of_an_hf_run_points_at_its_newest_checkpoints_state(tmp_path):
    """An HF output folder whose trainer state lives only in its checkpoints:
    file= named the run folder (issue 56, item 6), where GitHub can put no
    annotation; it names the newest checkpoint's trainer_state.json."""
    from adapterprobe.reports.github import source_file

    run = tmp_path / "run"
    for step in (5, 40, 100):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (run / "checkpoint-200").mkdir()  # no state in it: not the source
    (run / "runs").mkdir()

    class Drift:
        adapter = None
        store = str(run)
        probe = "training_drift"
        message = "m"

    assert source_file(Drift()) == str(run / "checkpoint-100" / "trainer_state.json")
    (run / "trainer_state.json").write_text("{}")  # a state of its own wins
    assert source_file(Drift()) == str(run / "trainer_state.json")


@given(st.lists(st.text(max_size=40), max_size=60), st.integers(1, 100))
def test_pieces_are_written_whole_in_bounded_writes(pieces: list[str], limit: int) -> None:
    from adapterprobe.cli import render

    writes: list[str] = []

    class Out(io.StringIO):
        def write(self, s: str) -> int:
            writes.append(s)
            return super().write(s)

    out = Out()
    old = render.WRITE_CHARS
    render.WRITE_CHARS = limit
    try:
        render.write_in_parts(out, iter(pieces))
    finally:
        render.WRITE_CHARS = old
    assert out.getvalue() == "".join(pieces)
    # Each write stops at the first piece that reaches the limit.
    assert all(len(w) < limit + 40 for w in writes)
    assert len(writes) >= len("".join(pieces)) // (limit + 40)
