"""Corrupt and hostile saved scans given to ``scan --baseline`` and
``report --from``: each is refused with a usage error (exit 2) naming what is
wrong, never a traceback; a valid one still reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attacks import fs_attacks as fa


@pytest.fixture
def saved(demo_store, tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("saved")
    run = fa.cli("scan", demo_store, "--format", "json", cwd=out)
    records = json.loads(run.stdout)
    assert records and run.returncode == 1
    return out, records


def variants(records: list[dict]) -> dict[str, str]:
    one = records[0]

    def with_(**changes) -> str:
        return json.dumps([{**one, **changes}, *records[1:]])

    return {
        "deep nesting": "[" * 100_000 + "]" * 100_000,
        "a huge integer": "[" + "9" * 5000 + "]",
        "list schema_version": with_(schema_version=[1]),
        "string schema_version": with_(schema_version="1"),
        "boolean schema_version": with_(schema_version=True),
        "list root": with_(root=["/"]),
        "non-string adapter": with_(adapter=7),
        "non-dict evidence": with_(evidence=[1, 2]),
        "400-digit loss": with_(evidence={"head_loss": int("9" * 400)}),
        "deep evidence": with_(evidence=json.loads("{" + '"a":{' * 60 + "}" * 61)),
        "unknown verdict": with_(verdict="great"),
        "huge score": with_(score=int("9" * 40)),
        "not records": json.dumps({"records": records}),
        "not UTF-8": "[\xff]",
    }


@pytest.mark.parametrize("command", ["baseline", "report"])
def test_every_corrupt_saved_scan_is_a_usage_error(saved, demo_store, command, tmp_path):
    out, records = saved
    for name, text in variants(records).items():
        path = tmp_path / "bad.json"
        path.write_bytes(b"[\xff]" if name == "not UTF-8" else text.encode())
        if command == "baseline":
            run = fa.cli("scan", demo_store, "--baseline", path, "--format", "json", cwd=out)
        else:
            run = fa.cli("report", "--from", path, "-o", tmp_path / "r.html", cwd=out)
        assert "Traceback" not in run.stderr, (name, run.stderr[-800:])
        assert run.returncode == 2, (name, run.returncode, run.stderr[-400:])
        assert "saved scan" in run.stderr, (name, run.stderr)
    # the string "1" is named as what it is, not "has 1; reads 1"
    path = tmp_path / "bad.json"
    path.write_text(variants(records)["string schema_version"])
    run = fa.cli("report", "--from", path, "-o", tmp_path / "r.html", cwd=out)
    assert 'schema_version "1"' in run.stderr and "the integer 1" in run.stderr


def test_a_valid_saved_scan_still_reads_and_size_is_capped(saved, demo_store, tmp_path):
    out, records = saved
    path = tmp_path / "good.json"
    path.write_text(json.dumps(records))
    run = fa.cli("report", "--from", path, "-o", tmp_path / "r.html", cwd=out)
    assert run.returncode in (0, 1), run.stderr
    big = tmp_path / "big.json"
    big.write_text(json.dumps(records * 2000))  # a few MB
    assert big.stat().st_size > 2 << 20
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "report", "--from", str(big), "-o", "r2.html"],
        env={**os.environ, "ADAPTERPROBE_MAX_SAVED_SCAN_MB": "1"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "MAX_SAVED_SCAN_MB" in done.stderr, done.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as Linux applies it")
def test_a_saved_scan_is_read_record_by_record_not_whole(saved, tmp_path):
    # A bad first record followed by 700 MB (a sparse tail of NULs): read
    # whole, the file's bytes and its text alone pass the 1.5 GB limit;
    # streamed, the first record is refused after the first megabyte.
    _, records = saved
    path = tmp_path / "huge.json"
    head = ("[" + json.dumps({**records[0], "verdict": "sideways"}) + ",").encode()
    with path.open("wb") as f:
        f.write(head)
        f.truncate(len(head) + (700 << 20))
    limit = 1536 << 20

    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "report", "--from", str(path), "-o", "r.html"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
        cwd=tmp_path,
        env={**os.environ, "ADAPTERPROBE_MAX_SAVED_SCAN_MB": "1024"},
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-600:])
    assert "record 0" in done.stderr and "Traceback" not in done.stderr, done.stderr[-600:]


def test_extreme_but_valid_values_of_a_saved_scan_render():
    # Each was a traceback of ``report --from`` found by the fuzzer (the
    # saved_scan target): a name with 5,000 digits (int() refuses it), tick
    # loops over steps near the float range (an int step of 1e300 digits,
    # a loop whose float never moved), a log axis asked to place 0 and
    # decades beyond the float range, and an infinite tick label.
    from adapterprobe.reports.shaping import natural_key
    from adapterprobe.reports.svg import Scale, log_ticks, nice_ticks, num

    names = ["run" + "7" * 5000, "run10", "run9", "run007"]
    assert sorted(names, key=natural_key) == ["run007", "run9", "run10", names[0]]
    for lo, hi in [(0.0, 1.7e308), (-1.7e308, 1.7e308), (1e20, 1e20 + 4096), (0.0, 5.0)]:
        for integer in (False, True):
            ticks = nice_ticks(lo, hi, 6, integer)
            assert 1 <= len(ticks) <= 15, (lo, hi, integer, len(ticks))
            assert all(isinstance(t, float) and abs(t) < float("inf") for t in ticks)
    assert all(0 < t < float("inf") for t in log_ticks(-400.0, 400.0))
    axis = Scale(1e-3, 1e3, 0.0, 100.0, log=True)
    assert axis(0.0) == 0.0 and axis(float("inf")) == 100.0
    assert num(float("inf")) == "inf"
