"""Hostile inputs to the GitHub Action (issue 51, item 9).

The runner parses what the action's steps write: ``$GITHUB_OUTPUT`` line by
line (a line break in a value adds outputs: a second ``exit-code=0`` passes a
failing scan), stdout and stderr for workflow commands (a line break in a
message starts one: ``::add-mask::``, ``::stop-commands::``), and a ``run:``
script is the text left after ``${{ }}`` is filled in (``exit-code=$(cmd)0``
would run ``cmd`` in the gate step). The action's steps run as in
``tests/test_github_action.py``, whose harness reads ``$GITHUB_OUTPUT`` as
the runner does.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import test_github_action as action

from adapterprobe.scan import DEMO_STORE

LINE_BREAKS = ["\n", "\r", "\r\n"]
COMMAND_LINE = re.compile(r"^::(?!error |error::|warning |warning::)", re.M)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    shutil.copytree(DEMO_STORE, tmp_path / "runs")
    (tmp_path / "empty").mkdir()
    return tmp_path


def lines(text: str) -> list[str]:
    return re.split(r"\r\n|\r|\n", text)


def forged_commands(printed: str) -> list[str]:
    """Lines the runner would take for a workflow command other than the
    annotations adapterprobe and the action write."""
    return [line for line in lines(printed) if COMMAND_LINE.match(line)]


def test_no_expression_is_spliced_into_a_run_script() -> None:
    # Inputs, paths and step outputs reach the scripts through env only.
    for step in action.STEPS:
        if "run" in step:
            assert "${{" not in step["run"], step


@pytest.mark.parametrize("line_break", LINE_BREAKS, ids=["LF", "CR", "CRLF"])
def test_a_line_break_in_report_cannot_set_the_exit_code(workspace: Path, line_break: str) -> None:
    job = action.run_action(workspace, roots="runs", report=f"r.html{line_break}exit-code=0")
    assert job.code != 0 and job.outputs["exit-code"] != "0", job.outputs  # the demo store fails
    assert job.outputs == {"exit-code": "2", "report": ""}
    assert "::error title=adapterprobe::the report input holds a line break" in job.printed
    assert sorted(p.name for p in workspace.iterdir()) == ["empty", "runs"]


def test_a_line_break_in_report_cannot_run_a_command_in_the_gate(workspace: Path) -> None:
    job = action.run_action(
        workspace, roots="runs", fail_on="never", report="r.html\nexit-code=$(touch pwned)0"
    )
    assert not (workspace / "pwned").exists()
    assert job.code == 2 and job.outputs["exit-code"] == "2"


@pytest.mark.parametrize("code", ["0", "1", "2", "3", "255"])
def test_the_gate_exits_with_the_scan_step_exit_code(workspace: Path, code: str) -> None:
    done, _ = action.Runner(workspace).step(action.GATE_STEP, {}, {"exit-code": code})
    assert done.returncode == int(code), done.stderr


@pytest.mark.parametrize(
    "hostile",
    [
        "$(touch pwned)0",
        "`touch pwned`",
        "0; touch pwned",
        '0" ; touch pwned ; "',
        "256",  # exit 256 is exit 0
        "512",
        "-1",
        "1 0",
        "0x1",
        "1\n0",
        " 1",
        "",
    ],
)
def test_the_gate_takes_nothing_but_an_exit_code(workspace: Path, hostile: str) -> None:
    done, _ = action.Runner(workspace).step(action.GATE_STEP, {}, {"exit-code": hostile})
    assert not (workspace / "pwned").exists()
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "::error title=adapterprobe::" in done.stdout


@pytest.mark.parametrize("line_break", LINE_BREAKS, ids=["LF", "CR", "CRLF"])
@pytest.mark.parametrize("command", ["::add-mask::runs", "::stop-commands::endtoken"])
def test_roots_cannot_print_a_workflow_command(
    workspace: Path, line_break: str, command: str
) -> None:
    job = action.run_action(workspace, roots=f"empty{line_break}{command}")
    assert job.code in (2, 3) and job.outputs["exit-code"] == str(job.code)
    assert "::error title=adapterprobe::scan exited" in job.printed
    assert forged_commands(job.printed) == [], job.printed


@pytest.mark.parametrize(
    ("given", "encoded"),
    [
        ("no%0Athere", "no%250Athere"),  # %: data, not an escape
        ("no\rthere", "no%0Dthere"),
        ("no\nthere", "no%0Athere"),
        ("no\r\nthere", "no%0D%0Athere"),
    ],
)
def test_roots_in_a_message_are_workflow_command_data(
    workspace: Path, given: str, encoded: str
) -> None:
    job = action.run_action(workspace, roots=given)
    assert job.code == 2 and job.outputs["exit-code"] == "2"
    (error,) = [line for line in lines(job.printed) if "scan exited 2" in line]
    assert error.startswith("::error title=adapterprobe::") and error.endswith(
        f"under {encoded})"
    ), error


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("args", "-q\n::add-mask::x"),
        ("args", "--exclude\r::stop-commands::t"),
        ("fail-on", "warn\n::add-mask::x"),
        ("report", "r.html\n::add-mask::x"),
        ("report", "r.html\r::stop-commands::t"),
    ],
)
def test_no_input_prints_a_workflow_command(workspace: Path, name: str, value: str) -> None:
    job = action.run_action(workspace, roots="runs", **{name.replace("-", "_"): value})
    assert job.code != 0 and job.outputs["exit-code"] == str(job.code)  # the demo store fails
    assert forged_commands(job.printed) == [], job.printed


def test_fail_on_never_in_args_turns_the_gate_off_as_the_docs_say(workspace: Path) -> None:
    job = action.run_action(workspace, roots="runs", args="--fail-on never")
    assert job.code == 0 and job.outputs["exit-code"] == "0"  # the demo store fails otherwise
    assert job.outputs["report"] == "adapterprobe-report.html"
    assert (workspace / job.outputs["report"]).is_file()
    said = "`--fail-on never` here turns the gate off"
    assert said in action.ACTION["inputs"]["args"]["description"]
    ci = " ".join((action.REPO / "docs" / "ci.md").read_text(encoding="utf-8").split())
    assert "`--fail-on never` in `args` turns the gate off" in ci
