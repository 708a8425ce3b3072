"""The GitHub Action (``action.yml``) and the pre-commit hook
(``.pre-commit-hooks.yaml``), run without GitHub: each ``run`` step of the
action is executed in order with its ``${{ ... }}`` expressions filled in
as the runner fills them, on a copy of the demo store (the ``uses`` steps,
setup-python and upload-artifact, are GitHub's own; the install step builds
this checkout, which the test environment has already installed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from adapterprobe.scan import DEMO_STORE

REPO = Path(__file__).resolve().parent.parent
ACTION = yaml.safe_load((REPO / "action.yml").read_text(encoding="utf-8"))
EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def fill(text: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    """``${{ inputs.x }}``, ``${{ github.action_path }}`` and
    ``${{ steps.scan.outputs.x }}`` as the runner substitutes them."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "github.action_path":
            return str(REPO)
        if name.startswith("inputs."):
            return inputs[name.removeprefix("inputs.")]
        if name.startswith("steps.scan.outputs."):
            return outputs.get(name.removeprefix("steps.scan.outputs."), "")
        raise AssertionError(f"unexpected expression {name}")

    return EXPRESSION.sub(value, text)


def run_action(tmp_path: Path, **given: str) -> tuple[int, str, dict[str, str], Path]:
    """Run the action's steps; (the job's exit code, what the scan printed,
    the scan step's outputs, the step summary)."""
    inputs = {k: str(v.get("default", "")) for k, v in ACTION["inputs"].items()}
    inputs.update({k.replace("_", "-"): v for k, v in given.items()})
    github_output = tmp_path / "github_output"
    summary = tmp_path / "step_summary"
    bin_dir = str(Path(sys.executable).parent)
    base_env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "GITHUB_ACTIONS": "true",
        "GITHUB_OUTPUT": str(github_output),
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_WORKSPACE": str(tmp_path),
    }
    outputs: dict[str, str] = {}
    printed = ""
    for step in ACTION["runs"]["steps"]:
        if "uses" in step or step.get("name") == "install adapterprobe":
            continue
        assert step["shell"] == "bash"
        env = {**base_env, **{k: fill(v, inputs, outputs) for k, v in step.get("env", {}).items()}}
        github_output.write_text("", encoding="utf-8")
        done = subprocess.run(
            ["bash", "-c", fill(step["run"], inputs, outputs)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if step.get("id") == "scan":
            assert done.returncode == 0, done.stderr  # the gate step fails the job, not this one
            printed = done.stdout
            for line in github_output.read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition("=")
                outputs[key] = value
        elif done.returncode != 0:
            return done.returncode, printed, outputs, summary
    return 0, printed, outputs, summary


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    shutil.copytree(DEMO_STORE, tmp_path / "runs")
    return tmp_path


def test_the_action_annotates_reports_and_fails_the_job_on_the_gate(workspace: Path) -> None:
    code, printed, outputs, summary = run_action(workspace, roots="runs")
    assert code == 1 and outputs["exit-code"] == "1"  # the demo store has failures
    assert re.search(r"^::error file=runs/\S+,title=\w+ FAIL::", printed, re.M), printed
    assert "## adapterprobe scan" in summary.read_text(encoding="utf-8")
    report = workspace / outputs["report"]
    assert outputs["report"] == "adapterprobe-report.html" and report.is_file()
    assert report.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html>")
    # The upload step runs whenever a report was written, gate or not.
    upload = next(s for s in ACTION["runs"]["steps"] if s.get("name") == "upload the report")
    assert upload["if"].startswith("always()")
    assert "steps.scan.outputs.report" in upload["with"]["path"]


def test_fail_on_never_passes_the_job_and_extra_args_reach_the_scan(workspace: Path) -> None:
    code, printed, outputs, _ = run_action(
        workspace, roots="runs", fail_on="never", args="--probes training_drift", report=""
    )
    assert code == 0 and outputs["exit-code"] == "0" and outputs["report"] == ""
    titles = set(re.findall(r"title=(\w+) ", printed))
    assert titles == {"training_drift"}, printed


def test_nothing_to_scan_fails_the_job_with_the_reason(workspace: Path) -> None:
    (workspace / "empty").mkdir()
    code, printed, outputs, _ = run_action(workspace, roots="empty")
    assert code == 3 and outputs["exit-code"] == "3"
    assert "::error title=adapterprobe::scan exited 3" in printed


def test_the_pre_commit_hook_runs_the_scan_it_declares(workspace: Path) -> None:
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
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
