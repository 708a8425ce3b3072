"""The adapterprobe command line, run as a user would (a subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from adapterprobe.scan import DEMO_STORE


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "adapterprobe", *args], capture_output=True, text=True, cwd=cwd
    )


def test_no_root_scans_the_demo_and_says_so():
    out = cli("scan", "--format", "json")
    assert out.returncode == 1
    assert "demo store" in out.stderr
    records = json.loads(out.stdout)
    # The smoke-test store is judged on its 5 records now (a pass), so no skip.
    assert {r["verdict"] for r in records} == {"pass", "warn", "fail"}


@pytest.mark.parametrize("fail_on, code", [("warn", 1), ("fail", 0), ("never", 0)])
def test_fail_on_thresholds(fail_on, code):
    out = cli("scan", str(DEMO_STORE / "spiky-nan"), "--fail-on", fail_on, "--format", "json")
    assert out.returncode == code, out.stderr


def test_error_always_reaches_fail_on(tmp_path):
    store = tmp_path / "s"
    shutil.copytree(DEMO_STORE / "healthy", store)
    for log in (store / "logs").iterdir():
        log.write_bytes(b"\x00\x01\n")
    out = cli("scan", str(store), "--format", "json")
    assert out.returncode == 1
    assert any(r["verdict"] == "error" for r in json.loads(out.stdout))


def test_usage_errors_exit_2_without_traceback(tmp_path):
    for args in (
        ("scan", str(tmp_path / "nope")),
        ("check", str(tmp_path / "nope")),
        ("scan", "--workers", "0"),
    ):
        out = cli(*args)
        assert out.returncode == 2, args
        assert "Traceback" not in out.stderr


def test_nothing_to_probe_is_exit_3_for_scan_and_check_alike(tmp_path):
    (tmp_path / "notes.txt").write_text("not a store")
    for command in ("scan", "check"):
        out = cli(command, str(tmp_path))
        assert out.returncode == 3, (command, out.stderr)
        assert "nothing to probe" in out.stderr
        assert "Traceback" not in out.stderr


def test_table_and_csv_formats():
    table = cli("scan", str(DEMO_STORE), "--format", "table")
    assert table.returncode == 1
    assert "FAIL" in table.stdout and "records from 4 stores" in table.stdout
    first = table.stdout.index("FAIL")
    assert first < table.stdout.index("WARN") < table.stdout.index("PASS")  # worst first
    csv_out = cli("scan", str(DEMO_STORE), "--format", "csv")
    header = "store,adapter,layout,probe,verdict,score,message,evidence,checkpoint_kind"
    assert csv_out.stdout.splitlines()[0] == header


def test_check_one_store_and_one_version():
    store = cli(
        "check",
        str(DEMO_STORE / "healthy"),
        "--format",
        "json",
        "--probes",
        "gradient_ghost,training_drift",
    )
    assert store.returncode == 0
    assert len(json.loads(store.stdout)) == 2
    version = cli(
        "check",
        str(DEMO_STORE / "smoke-test" / "adapter" / "versions" / "v0001"),
        "--format",
        "json",
        "--probes",
        "gradient_ghost",
    )
    assert version.returncode == 1
    assert [r["probe"] for r in json.loads(version.stdout)] == ["gradient_ghost"]


def test_help_teaches_by_example():
    top = cli("--help")
    assert top.returncode == 0 and "examples:" in top.stdout
    scan_help = cli("scan", "--help")
    assert "--fail-on" in scan_help.stdout and "examples:" in scan_help.stdout
