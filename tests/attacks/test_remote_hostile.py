"""A hostile S3 endpoint (our own server on 127.0.0.1, ``hostile_s3``):
endless pagination, a listing that starts over, keys no file can be named
after, and error answers carrying terminal escapes. Each ends in a clear
usage error within its bound, never a hang, a traceback or a raw escape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import adapterprobe as ap
from tests.attacks.hostile_s3 import Behaviour, env, hostile_s3

# A build without the `object-store` cargo feature cannot run these: fail at
# collection, saying how to rebuild, rather than skip.
if not ap._core.remote_supported():
    raise RuntimeError(
        "this adapterprobe build has no object stores: rebuild with "
        "`maturin develop --release --features python,object-store`"
    )

DEMO = Path(ap.__file__).resolve().parent / "demo_store" / "healthy"


def demo_objects() -> dict[str, bytes]:
    return {
        "runs/good/" + p.relative_to(DEMO).as_posix(): p.read_bytes()
        for p in sorted(DEMO.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def aws(monkeypatch):
    def use(endpoint: str) -> None:
        for key, value in env(endpoint).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_TIMEOUT", "5")
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_RETRIES", "0")

    return use


def test_the_server_itself_serves_a_scan(aws):
    behaviour = Behaviour(objects=demo_objects())
    with hostile_s3(behaviour) as url:
        aws(url)
        report = ap.scan("s3://bkt/runs")
    assert {r.verdict.value for r in report.records} == {"pass"}


def test_endless_pagination_is_bounded_in_time(aws, monkeypatch):
    behaviour = Behaviour(objects=demo_objects(), endless=True)
    with hostile_s3(behaviour) as url:
        aws(url)
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_LIST_TIMEOUT", "2")
        # the time bound alone (the count of empty pages would stop it first)
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES", "1000000")
        start = time.monotonic()
        with pytest.raises(ap.UsageError, match="took longer than 2 s"):
            ap.scan("s3://bkt/runs")
    assert time.monotonic() - start < 20
    assert behaviour.list_requests > 1


def test_endless_empty_pages_stop_after_a_bounded_count(aws, monkeypatch):
    """Empty pages, each with a fresh continuation token: stopped after
    ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES of them in a row, well before the
    listing's time limit (issue 51, item 10; it ran to the 900 s limit)."""
    behaviour = Behaviour(objects=demo_objects(), endless=True)
    with hostile_s3(behaviour) as url:
        aws(url)
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES", "20")
        with pytest.raises(ap.UsageError, match="20 list pages in a row with no key"):
            ap.scan("s3://bkt/runs")
    # the first page lists the keys, then 20 empty ones (no retries here)
    assert behaviour.list_requests == 21
    monkeypatch.setenv("ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES", "0")
    with pytest.raises(ap.UsageError, match="ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES must be"):
        ap.scan("s3://bkt/runs")


def test_a_listing_that_starts_over_is_stopped_at_the_first_repeated_key(aws):
    behaviour = Behaviour(objects=demo_objects(), endless=True, repeat=True)
    with hostile_s3(behaviour) as url:
        aws(url)
        with pytest.raises(ap.UsageError, match="listed this key twice"):
            ap.scan("s3://bkt/runs")
    assert behaviour.list_requests == 2


BAD_KEYS = ["runs/bad/../x", "runs/bad//y", "runs/./z", "runs/ctl\x01key", "runs/zz/../w"]


def test_keys_no_path_can_hold_are_problems_and_the_scan_goes_on(aws):
    # Legal in S3, refused by the client's path type: each used to fail the
    # whole listing page, and with it the scan (exit 2, no record).
    objects = demo_objects()
    for key in BAD_KEYS:
        objects[key] = b"x"
    with hostile_s3(Behaviour(objects=objects)) as url:
        aws(url)
        report = ap.scan("s3://bkt/runs")
    assert report.records and {r.verdict.value for r in report.records} == {"pass"}
    named = {path: why for path, why in report.problems}
    for key in BAD_KEYS:
        assert f"s3://bkt/{key}" in named, (key, named)
        assert "no valid object path" in named[f"s3://bkt/{key}"]


def test_a_key_no_path_can_hold_is_one_problem_line_on_the_command_line(tmp_path):
    objects = demo_objects()
    objects["runs/bad/../x"] = b"x"
    with hostile_s3(Behaviour(objects=objects)) as url:
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", "scan", "s3://bkt/runs", "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env(url), "ADAPTERPROBE_REMOTE_RETRIES": "0"},
            cwd=tmp_path,
        )
    # As a local file that cannot be searched: a problem line, the healthy
    # runs judged, the exit their verdicts give.
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "bad/../x" in line]
    assert len(lines) == 1 and "no valid object path" in lines[0], done.stderr
    assert json.loads(done.stdout)


def test_a_servers_error_text_reaches_stderr_escaped(tmp_path):
    hostile = "\x1b]0;pwned\x07\x1b[2J\x9b31m denied"
    with hostile_s3(Behaviour(error_body=hostile)) as url:
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", "scan", "s3://bkt/runs"],
            capture_output=True,
            text=True,
            env={**os.environ, **env(url), "ADAPTERPROBE_REMOTE_RETRIES": "0"},
            timeout=120,
            cwd=tmp_path,
        )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in done.stderr, repr(done.stderr)
    assert "denied" in done.stderr and "\\x1b" in done.stderr


def test_a_killed_scans_staging_directory_is_removed_by_the_next_scan(tmp_path):
    """``kill -9`` skips every cleanup: the next remote scan removes the
    staging directories whose pid is gone, and keeps a live scan's."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with hostile_s3(Behaviour(objects=demo_objects())) as url:
        environ = {**os.environ, **env(url), "TMPDIR": str(tmp)}
        script = "from adapterprobe import remote; remote.stage('s3://bkt/runs'); input()"
        victim = subprocess.Popen(
            [sys.executable, "-c", script], env=environ, stdin=subprocess.PIPE
        )
        deadline = time.monotonic() + 60
        while not list(tmp.glob(f"adapterprobe-remote-{victim.pid}-*")):
            assert time.monotonic() < deadline and victim.poll() is None
            time.sleep(0.1)
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        kept = tmp / f"adapterprobe-remote-{live.pid}-live"
        kept.mkdir()
        victim.kill()
        victim.wait()
        (left,) = tmp.glob(f"adapterprobe-remote-{victim.pid}-*")
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", "scan", "s3://bkt/runs", "-q"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        live.kill()
        live.wait()
    assert done.returncode == 0, done.stderr
    assert not left.exists() and kept.is_dir()
    assert not list(tmp.glob(f"adapterprobe-remote-{os.getpid()}-*"))


def test_a_remote_scan_keeps_many_requests_in_flight(aws, monkeypatch):
    # Each answer waits 50 ms, as a real store's first byte does: the scan
    # reads many stores at once (ADAPTERPROBE_REMOTE_CONCURRENCY), not one
    # per core, and gives the records a scan of the same tree on disk gives.
    objects = {}
    for i in range(12):
        for key, data in demo_objects().items():
            objects[key.replace("runs/good/", f"runs/s{i:02d}/")] = data
    behaviour = Behaviour(objects=objects, delay=0.05)
    with hostile_s3(behaviour) as url:
        aws(url)
        report = ap.scan("s3://bkt/runs")
    assert len({r.store for r in report.records}) == 12
    assert {r.verdict.value for r in report.records} == {"pass"}
    assert behaviour.peak_in_flight >= 8, behaviour.peak_in_flight

    one = Behaviour(objects=objects, delay=0.05)
    with hostile_s3(one) as url:
        aws(url)
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_CONCURRENCY", "1")
        ap.scan("s3://bkt/runs")
    assert one.peak_in_flight == 1
    from adapterprobe import remote

    for bad in ("0", "257", "many"):
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_CONCURRENCY", bad)
        with pytest.raises(ap.UsageError, match="REMOTE_CONCURRENCY"):
            remote.concurrency()


def test_remote_sidecars_are_checked_only_when_asked(aws, monkeypatch, tmp_path):
    # A tampered sidecar: on disk the state is an integrity error. Remotely
    # the check would fetch every state whole, so it runs only with
    # ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS=1, and the command line says so.
    objects = demo_objects()
    sidecars = [k for k in objects if k.endswith("training_state.pt.sha256")]
    assert sidecars
    for key in sidecars:
        objects[key] = b"0" * 64 + b"\n"
    states = sum(len(objects[k.removesuffix(".sha256")]) for k in sidecars)

    def ghost_errors(behaviour: Behaviour) -> list[str]:
        with hostile_s3(behaviour) as url:
            aws(url)
            report = ap.scan("s3://bkt/runs")
        return [r.message for r in report.records if r.verdict.value == "error"]

    quiet = Behaviour(objects=objects)
    assert not any("sha256" in m for m in ghost_errors(quiet))
    monkeypatch.setenv("ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS", "1")
    checked = Behaviour(objects=objects)
    assert any("sha256" in m for m in ghost_errors(checked))
    # Checking fetches each state whole; not checking fetches less.
    assert checked.bytes_sent - quiet.bytes_sent > 0
    assert checked.bytes_sent >= states

    with hostile_s3(Behaviour(objects=objects)) as url:
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", "scan", "s3://bkt/runs"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env(url), "ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS": ""},
            cwd=tmp_path,
        )
    assert "ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS=1 checks them" in done.stderr, done.stderr
