"""The GitHub Action (``action.yml``) and the pre-commit hook
(``.pre-commit-hooks.yaml``), run without GitHub: each ``run`` step of the
action is executed in order with its ``${{ ... }}`` expressions filled in
as the runner fills them, on a copy of the demo store (the ``uses`` steps,
setup-python, the cache and upload-artifact, are GitHub's own; the install
steps, run in tests/test_github_action_install.py, put adapterprobe where
the test environment has it already). Each
step's ``$GITHUB_OUTPUT`` is read as the runner reads it, and every
``adapterprobe`` command a step runs is logged (the action scans once)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from adapterprobe.scan import DEMO_STORE

REPO = Path(__file__).resolve().parent.parent
ACTION = yaml.safe_load((REPO / "action.yml").read_text(encoding="utf-8"))
EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
STEPS: list[dict[str, Any]] = ACTION["runs"]["steps"]
SCAN_STEP = next(s for s in STEPS if s.get("id") == "scan")
# The steps that install adapterprobe (tests/test_github_action_install.py
# runs them); the test environment has it installed already.
INSTALL_STEPS = ("install", "build")
GATE_STEP = next(s for s in STEPS if s.get("name") == "gate")
BIN = Path(sys.executable).parent


def fill(
    text: str, inputs: dict[str, str], outputs: dict[str, str], action_ref: str = "main"
) -> str:
    """``${{ inputs.x }}``, ``${{ github.action_path }}``,
    ``${{ github.action_ref }}`` (the ref the workflow named the action at)
    and ``${{ steps.scan.outputs.x }}`` as the runner substitutes them."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "github.action_path":
            return str(REPO)
        if name == "github.action_ref":
            return action_ref
        if name.startswith("inputs."):
            return inputs[name.removeprefix("inputs.")]
        if name.startswith("steps.scan.outputs."):
            return outputs.get(name.removeprefix("steps.scan.outputs."), "")
        raise AssertionError(f"unexpected expression {name}")

    return EXPRESSION.sub(value, text)


def read_outputs(text: str) -> dict[str, str]:
    """A step's ``$GITHUB_OUTPUT`` as the runner reads it: a line ends at LF,
    CR or CRLF; ``NAME=VALUE``, or ``NAME<<DELIMITER`` then the value's lines
    up to the line ``DELIMITER``; a later line for a name replaces it."""
    lines = re.split(r"\r\n|\r|\n", text)
    outputs: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        equals, heredoc = line.find("="), line.find("<<")
        if equals >= 0 and (heredoc < 0 or equals < heredoc):
            key, value = line[:equals], line[equals + 1 :]
        else:
            assert heredoc > 0, f"not an output line: {line!r}"
            key, delimiter = line[:heredoc], line[heredoc + 2 :]
            assert delimiter, line
            body: list[str] = []
            while True:
                assert i < len(lines), f"{key}: no line {delimiter!r} ends its value"
                line = lines[i]
                i += 1
                if line == delimiter:
                    break
                body.append(line)
            value = "\n".join(body)
        assert key, text
        outputs[key] = value
    return outputs


class Runner:
    """The runner's side of a job in `workspace`: its files, its environment,
    and a logging ``adapterprobe`` first on PATH."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.home = workspace.parent / f"{workspace.name}-runner"
        shim = self.home / "bin"
        self.temp = self.home / "temp"
        shim.mkdir(parents=True, exist_ok=True)
        self.temp.mkdir(exist_ok=True)
        self.calls = self.home / "adapterprobe-calls"
        self.calls.write_text("", encoding="utf-8")
        (shim / "adapterprobe").write_text(
            "#!/usr/bin/env bash\n"
            f"printf '%s\\n' \"$*\" >> '{self.calls}'\n"
            f"exec '{BIN / 'adapterprobe'}' \"$@\"\n",
            encoding="utf-8",
        )
        (shim / "adapterprobe").chmod(0o755)
        self.github_output = self.home / "github_output"
        self.summary = self.home / "step_summary"
        self.env = {
            **os.environ,
            "PATH": os.pathsep.join([str(shim), str(BIN), os.environ.get("PATH", "")]),
            "GITHUB_ACTIONS": "true",
            "GITHUB_STEP_SUMMARY": str(self.summary),
            "GITHUB_WORKSPACE": str(workspace),
            "RUNNER_TEMP": str(self.temp),
        }

    def step(
        self,
        step: dict[str, Any],
        inputs: dict[str, str],
        outputs: dict[str, str],
        action_ref: str = "main",
    ) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
        """Run one ``run`` step; (the process, the outputs it set)."""
        assert step["shell"] == "bash"
        self.github_output.write_text("", encoding="utf-8")  # a file per step
        env = {
            **self.env,
            "GITHUB_OUTPUT": str(self.github_output),
            **{k: fill(v, inputs, outputs, action_ref) for k, v in step.get("env", {}).items()},
        }
        done = subprocess.run(
            [
                "bash",
                "--noprofile",
                "--norc",
                "-eo",
                "pipefail",
                "-c",
                fill(step["run"], inputs, outputs),
            ],
            cwd=self.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done, read_outputs(self.github_output.read_text(encoding="utf-8"))

    def adapterprobe_calls(self) -> list[str]:
        return self.calls.read_text(encoding="utf-8").splitlines()


class Job(NamedTuple):
    code: int  # the job's: the first failing step's exit code, else 0
    printed: str  # what the scan step wrote, stdout then stderr (the runner reads both)
    outputs: dict[str, str]  # the scan step's outputs
    summary: Path
    runner: Runner


def run_action(workspace: Path, **given: str) -> Job:
    """Run the action's ``run`` steps in order."""
    inputs = {k: str(v.get("default", "")) for k, v in ACTION["inputs"].items()}
    inputs.update({k.replace("_", "-"): v for k, v in given.items()})
    runner = Runner(workspace)
    outputs: dict[str, str] = {}
    printed = ""
    for step in STEPS:
        if "uses" in step or step.get("id") in INSTALL_STEPS:
            continue
        done, set_here = runner.step(step, inputs, outputs)
        if step is SCAN_STEP:
            assert done.returncode == 0, done.stderr  # the gate step fails the job, not this one
            printed = done.stdout + done.stderr
            outputs = set_here
        elif done.returncode != 0:
            return Job(done.returncode, printed, outputs, runner.summary, runner)
    return Job(0, printed, outputs, runner.summary, runner)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    shutil.copytree(DEMO_STORE, tmp_path / "runs")
    return tmp_path


def test_the_action_annotates_reports_and_fails_the_job_on_the_gate(workspace: Path) -> None:
    job = run_action(workspace, roots="runs")
    assert job.code == 1 and job.outputs["exit-code"] == "1"  # the demo store has failures
    assert re.search(r"^::error file=runs/\S+,title=\w+ FAIL::", job.printed, re.M), job.printed
    assert "## adapterprobe scan" in job.summary.read_text(encoding="utf-8")
    report = workspace / job.outputs["report"]
    assert job.outputs["report"] == "adapterprobe-report.html" and report.is_file()
    assert report.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html>")
    # One scan; the report is rendered from its records.
    (scan, render) = job.runner.adapterprobe_calls()
    assert scan.startswith("scan runs ") and render.startswith("report --from ")
    assert not any(job.runner.temp.iterdir())  # the saved scan is cleaned up
    # The upload step runs whenever a report was written, gate or not.
    upload = next(s for s in STEPS if s.get("name") == "upload the report")
    assert upload["if"].startswith("always()")
    assert "steps.scan.outputs.report" in upload["with"]["path"]


def test_fail_on_never_passes_the_job_and_extra_args_reach_the_scan(workspace: Path) -> None:
    job = run_action(
        workspace, roots="runs", fail_on="never", args="--probes training_drift", report=""
    )
    assert job.code == 0 and job.outputs["exit-code"] == "0" and job.outputs["report"] == ""
    titles = set(re.findall(r"title=(\w+) ", job.printed))
    assert titles == {"training_drift"}, job.printed
    assert len(job.runner.adapterprobe_calls()) == 1


# `args` as users write them: (args, the job's exit code on the demo store,
# the probes the report holds). The demo store's training_drift has a fail
# (the 5-step smoke test: tiny_run) and a warn.
EVERY_PROBE = {"adapter_weights", "gradient_ghost", "training_drift"}
USER_ARGS = [
    ("-q", 1, EVERY_PROBE),
    ("--only fail", 1, EVERY_PROBE),
    ("-q --only warn,fail", 1, EVERY_PROBE),
    ("--format json", 1, EVERY_PROBE),
    ("--json", 1, EVERY_PROBE),
    ("--probes training_drift", 1, {"training_drift"}),
    ("--probes training_drift --fail-on never", 0, {"training_drift"}),
    ("--fail-on never", 0, EVERY_PROBE),
    ("--probes training_drift --fail-on warn", 1, {"training_drift"}),
]


@pytest.mark.parametrize(("args", "exit_code", "probes"), USER_ARGS)
def test_args_reach_the_one_scan_and_the_report_is_always_written(
    workspace: Path, args: str, exit_code: int, probes: set[str]
) -> None:
    job = run_action(workspace, roots="runs", args=args)
    assert job.code == exit_code and job.outputs["exit-code"] == str(exit_code), job.printed
    assert "could not be written" not in job.printed, job.printed
    # Annotations and the step summary whatever --format args asks for.
    assert re.search(r"^::(error|warning) file=runs/", job.printed, re.M), job.printed
    assert "## adapterprobe scan" in job.summary.read_text(encoding="utf-8")
    # One scan, with args; the report rendered from it.
    calls = job.runner.adapterprobe_calls()
    assert len(calls) == 2 and calls[0].startswith("scan runs ") and f" {args} " in calls[0]
    assert calls[1].startswith("report --from "), calls
    # The report holds every record of that scan, whatever --only or -q showed.
    assert job.outputs["report"] == "adapterprobe-report.html"
    page = (workspace / job.outputs["report"]).read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html>")
    assert {p for p in EVERY_PROBE if p in page} == probes
    assert "healthy" in page  # the passing store too


def test_a_usage_error_in_args_fails_the_job_without_a_report(workspace: Path) -> None:
    job = run_action(workspace, roots="runs", args="--no-such-option")
    assert job.code == 2 and job.outputs == {"exit-code": "2", "report": ""}
    assert "::error title=adapterprobe::scan exited 2" in job.printed
    assert not (workspace / "adapterprobe-report.html").exists()


def test_roots_and_args_may_span_lines(workspace: Path) -> None:
    shutil.copytree(workspace / "runs" / "healthy", workspace / "more")
    job = run_action(workspace, roots="runs/healthy\nmore\n", args="-q\r\n--probes training_drift")
    assert job.code == 0 and job.outputs["exit-code"] == "0"
    (scan, _) = job.runner.adapterprobe_calls()
    assert scan.startswith("scan runs/healthy more --fail-on fail -q --probes training_drift ")


def test_nothing_to_scan_fails_the_job_with_the_reason(workspace: Path) -> None:
    (workspace / "empty").mkdir()
    job = run_action(workspace, roots="empty")
    assert job.code == 3 and job.outputs == {"exit-code": "3", "report": ""}
    assert "::error title=adapterprobe::scan exited 3" in job.printed


def pre_commit_hook(hook_id: str) -> dict[str, Any]:
    """The hook of that id in ``.pre-commit-hooks.yaml``."""
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    (hook,) = [h for h in hooks if h["id"] == hook_id]
    return hook


def test_the_pre_commit_hook_runs_the_scan_it_declares(workspace: Path) -> None:
    hook = pre_commit_hook("adapterprobe-scan")
    assert hook["id"] == "adapterprobe-scan" and hook["pass_filenames"] is False
    entry = hook["entry"].split()
    assert shutil.which(entry[0], path=str(Path(sys.executable).parent)), entry
    done = subprocess.run(
        [str(Path(sys.executable).parent / entry[0]), *entry[1:], *hook["args"]],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr  # pre-commit fails the commit on it
    assert "FAIL" in done.stdout and "Exit 1" in " ".join(done.stdout.split())


def test_the_pre_commit_hook_passes_a_repository_with_nothing_to_scan(tmp_path: Path) -> None:
    """The common case of a repository that has no runs committed yet: the
    hook's own args (--allow-empty) make that exit 0, where a bare scan
    exits 3 and would block every commit."""
    hook = pre_commit_hook("adapterprobe-scan")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hello')\n")
    entry = [str(Path(sys.executable).parent / hook["entry"].split()[0]), "scan"]
    done = subprocess.run(
        [*entry, *hook["args"]], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "--allow-empty" in done.stderr and "nothing to probe" in done.stderr
    bare = subprocess.run([*entry, "."], cwd=tmp_path, capture_output=True, text=True)
    assert bare.returncode == 3
