"""Scanning object-store roots: a bucket on a real S3 server (moto, on
127.0.0.1 at a free port, started and stopped here) gives the same records
as the same tree on disk, reads by range, and fails clearly."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import adapterprobe as ap
from adapterprobe import remote
from adapterprobe.probes import PROBES
from adapterprobe.scan import discover, scan_batches

# A build without the `object-store` cargo feature cannot run these: fail at
# collection, saying how to rebuild, rather than skip.
if not ap._core.remote_supported():
    raise RuntimeError(
        "this adapterprobe build has no object stores: rebuild with "
        "`maturin develop --release --features python,object-store`"
    )

pytest.importorskip("moto")
pytest.importorskip("boto3")
s3_loopback = pytest.importorskip("s3_loopback")

BUCKET = "adapters"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_loopback.moto_server() as url:
        s3_loopback.client(url).create_bucket(Bucket=BUCKET)
        yield url


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The S3 client; the scan's environment points at the loopback server."""
    for key, value in s3_loopback.s3_env(endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ADAPTERPROBE_REMOTE_TIMEOUT", "10")
    yield s3_loopback.client(endpoint)
    assert not [a for a in remote.active() if a.staged is not None], "staging left behind"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _as_remote(value: Any, local: str, url: str) -> Any:
    """A local record's value with the local root written as the URL."""
    if isinstance(value, str):
        return value.replace(local + os.sep, url + "/").replace(local, url)
    if isinstance(value, dict):
        return {k: _as_remote(v, local, url) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_remote(v, local, url) for v in value]
    return value


def assert_same_records(local_root: Path, url: str, probes: tuple[str, ...]) -> list[Any]:
    here = ap.scan(local_root, probes=probes)
    there = ap.scan(url, probes=probes)
    assert len(here) > 0
    assert len(there) == len(here)
    for mine, theirs in zip(here, there, strict=True):
        expected = _as_remote(mine._plain(), str(local_root), url)
        got = theirs._plain()
        assert _same(got, expected), (expected, got)
    assert [_as_remote(list(p), str(local_root), url) for p in here.problems] == [
        list(p) for p in there.problems
    ]
    return list(there)


def test_demo_store_in_a_bucket_reads_as_on_disk(s3, demo_store, tmp_path):
    # The demo store, plus a copy whose adapter weights are cut short (a
    # truncated object): the same error record as on disk.
    tree = tmp_path / "tree"
    shutil.copytree(demo_store, tree / "demo")
    shutil.copytree(demo_store / "healthy", tree / "cut" / "healthy")
    weights = next((tree / "cut").rglob("adapter_model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    s3_loopback.upload_tree(s3, BUCKET, tree, "demo-runs")
    records = assert_same_records(tree, f"s3://{BUCKET}/demo-runs", tuple(PROBES))
    assert all(r.store.startswith(f"s3://{BUCKET}/demo-runs/") for r in records)
    cut = [r for r in records if "/cut/" in r.store and r.probe == "adapter_weights"]
    assert cut and cut[0].verdict.value == "error", cut
    assert f"s3://{BUCKET}/demo-runs/cut/" in cut[0].message


def test_hf_trainer_runs_in_a_bucket_read_as_on_disk(s3, field_root):
    s3_loopback.upload_tree(s3, BUCKET, field_root, "field")
    records = assert_same_records(field_root, f"s3://{BUCKET}/field", tuple(PROBES))
    layouts = {r.layout for r in records}
    assert "hf-trainer" in layouts
    assert {r.checkpoint_kind for r in records} >= {"adapter", "full"}


def _fetched(url: str, probes: tuple[str, ...]) -> tuple[list[Any], dict[str, tuple[int, int]]]:
    targets, _problems = discover(url)
    try:
        records = [r for batch in scan_batches(targets, probes=probes) for r in batch]
        files: dict[str, tuple[int, int]] = {}
        for alias in remote.active():
            if alias.staged is not None:
                for path, nbytes, requests in ap._core.remote_fetched(alias.staged):
                    files[remote.rename_path(str(path), [alias])] = (nbytes, requests)
        return records, files
    finally:
        remote.release_all()


def test_reads_are_ranged_and_bounded(s3, field_root):
    s3_loopback.upload_tree(s3, BUCKET, field_root, "ranged")
    url = f"s3://{BUCKET}/ranged"
    default = ("adapter_weights", "gradient_ghost", "training_drift")
    _records, files = _fetched(url, default)
    sizes = {
        f"{url}/{p.relative_to(field_root).as_posix()}": p.stat().st_size
        for p in field_root.rglob("*")
        if p.is_file()
    }
    assert files, "nothing was fetched"
    for name, (nbytes, requests) in files.items():
        assert nbytes <= sizes[name], name  # never a byte twice
        assert requests >= 1
    # A full fine-tune's weights are only named (the header), never read
    # whole, unless full_weights is asked for.
    full_models = [n for n in files if n.endswith("/model.safetensors") and "full" in n]
    assert full_models
    for name in full_models:
        assert files[name][0] <= 64 * 1024 < sizes[name], (name, files[name], sizes[name])
    # Files no probe reads are not fetched at all.
    assert not [n for n in files if n.endswith(("rng_state.pth", "scheduler.pt"))]
    assert sum(b for b, _ in files.values()) < sum(sizes.values()) / 2
    assert any(n.endswith("/optimizer.pt") for n in files)


def test_zip_entries_are_read_by_range(s3, tmp_path):
    # A real AdamW state (torch.save, 4 MiB: over the size read whole): the
    # central directory is read first, then only the entries the reader needs
    # (both moments: exp_avg_sq, and exp_avg for the Adam plausibility bound;
    # not the pickle's other entries read twice), and the values are those
    # read from disk.
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 256)).pow(2).mean().backward()
    opt.step()
    run = tmp_path / "ckpt"
    run.mkdir()
    torch.save(opt.state_dict(), run / "optimizer.pt")
    size = (run / "optimizer.pt").stat().st_size
    s3_loopback.upload_tree(s3, BUCKET, run, "zip")
    staged, _ = remote.stage(f"s3://{BUCKET}/zip")
    try:
        there = ap._core.read_optimizer_state(staged / "optimizer.pt")
        ((_, nbytes, requests),) = ap._core.remote_fetched(staged)
    finally:
        remote.release_all()
    here = ap._core.read_optimizer_state(run / "optimizer.pt")
    fields = ("param_id", "numel", "shape", "exp_avg_sq_mean", "nonfinite")
    assert [[getattr(p, f) for f in fields] for p in there.per_param] == [
        [getattr(p, f) for f in fields] for p in here.per_param
    ]
    moments = 2 * sum(p.numel * 4 for p in here.per_param)
    assert moments <= nbytes <= size, (nbytes, size)
    assert requests < 64  # whole 64 KiB+ blocks, as the reader walks the two moments


def test_verbose_cli_reports_bytes_fetched(s3, demo_store, endpoint):
    s3_loopback.upload_tree(s3, BUCKET, demo_store, "cli")
    env = {**os.environ, **s3_loopback.s3_env(endpoint)}
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "scan", f"s3://{BUCKET}/cli", "-v", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    records = json.loads(done.stdout)
    stores = {r["store"] for r in records}
    assert stores and all(s.startswith(f"s3://{BUCKET}/cli/") for s in stores)
    for store in stores:
        line = re.search(
            rf"fetched (\d+) bytes in (\d+) range requests from {store}$", done.stderr, re.M
        )
        assert line and int(line[1]) > 0 and int(line[2]) > 0, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        ("http://example.invalid/x", "unsupported URL scheme http://"),
        ("ftp://host/x", "unsupported URL scheme ftp://"),
    ],
)
def test_unsupported_schemes_are_refused_without_a_request(root, expected):
    with pytest.raises(ap.UsageError, match=expected):
        ap.scan(root)


def test_file_urls_are_local_paths(demo_store):
    here = ap.scan(demo_store)
    there = ap.scan(demo_store.as_uri())
    assert [r._plain() for r in here] == [r._plain() for r in there] or all(
        _same(a._plain(), b._plain()) for a, b in zip(here, there, strict=True)
    )


def test_missing_bucket_and_empty_prefix_are_usage_errors(s3):
    with pytest.raises(ap.UsageError, match="cannot list") as missing:
        ap.scan("s3://no-such-bucket/runs")
    assert "s3://no-such-bucket/runs" in str(missing.value)
    with pytest.raises(ap.UsageError, match="no such prefix"):
        ap.scan(f"s3://{BUCKET}/nothing-here")


def test_cli_errors_are_one_line_not_a_traceback(s3, endpoint):
    env = {**os.environ, **s3_loopback.s3_env(endpoint)}
    for root in ("s3://no-such-bucket/x", "gopher://x/y"):
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", "scan", root],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert root.split("/")[0] in done.stderr


def test_bad_credentials_are_a_clear_error(tmp_path):
    # A server that checks signatures: any request signed with unknown keys
    # is refused.
    with s3_loopback.moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as url:
        env = {**s3_loopback.s3_env(url), "AWS_SECRET_ACCESS_KEY": "wrong"}
        code = (
            "import adapterprobe as ap, sys\n"
            "try:\n ap.scan(sys.argv[1])\n"
            "except ap.UsageError as e:\n print('USAGE', e)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, f"s3://{BUCKET}/x"],
            capture_output=True,
            text=True,
            env={**os.environ, **env, "ADAPTERPROBE_REMOTE_RETRIES": "0"},
            timeout=120,
        )
    assert done.stdout.startswith("USAGE"), (done.stdout, done.stderr)
    assert "cannot list" in done.stdout and "403" in done.stdout, done.stdout
    # Profiles are not read, and the hint says how to export one's credentials
    # rather than naming AWS_PROFILE as if it worked.
    assert "AWS_PROFILE, ~/.aws/config) is not read" in done.stdout, done.stdout
    assert "aws configure export-credentials" in done.stdout


def test_an_object_gone_after_listing_is_an_error_record(s3, demo_store, tmp_path):
    s3_loopback.upload_tree(s3, BUCKET, demo_store, "gone")
    url = f"s3://{BUCKET}/gone"
    targets, _ = discover(url)
    try:
        key = "gone/healthy/adapter/versions/v0001/adapter_model.safetensors"
        listed = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="gone/")["Contents"]]
        key = next(k for k in listed if k.endswith("adapter_model.safetensors"))
        s3.delete_object(Bucket=BUCKET, Key=key)
        records = [r for b in scan_batches(targets, probes=tuple(PROBES)) for r in b]
    finally:
        remote.release_all()
    bad = [r for r in records if r.verdict.value == "error" and "gone" in r.message]
    assert bad, [r.message for r in records]
    assert f"s3://{BUCKET}/{key}" in bad[0].message
    assert "object is gone" in bad[0].message
    # The scan went on: the other stores got their verdicts.
    assert any(r.verdict.value != "error" for r in records)


def test_an_object_shrunk_after_listing_is_an_error_record(s3, demo_store):
    s3_loopback.upload_tree(s3, BUCKET, demo_store, "shrunk")
    targets, _ = discover(f"s3://{BUCKET}/shrunk")
    try:
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="shrunk/")["Contents"]
        key = next(o["Key"] for o in listed if o["Key"].endswith("adapter_model.safetensors"))
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"\x08" + b"\x00" * 7 + b"{}")
        records = [r for b in scan_batches(targets, probes=tuple(PROBES)) for r in b]
    finally:
        remote.release_all()
    bad = [r for r in records if r.verdict.value == "error" and key.split("/")[1] in r.store]
    assert any("remote object" in r.message for r in bad), [r.message for r in records]


class _Stall:
    """A TCP server on 127.0.0.1 that accepts and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for c in self.held:
            c.close()
        self.sock.close()


def test_a_stalled_server_times_out(monkeypatch):
    stall = _Stall()
    try:
        for key, value in s3_loopback.s3_env(stall.url).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_TIMEOUT", "1")
        monkeypatch.setenv("ADAPTERPROBE_REMOTE_RETRIES", "1")
        start = time.monotonic()
        with pytest.raises(ap.UsageError, match="cannot list"):
            ap.scan(f"s3://{BUCKET}/runs")
        assert time.monotonic() - start < 30
    finally:
        stall.close()


def test_a_local_scan_starts_no_network_runtime(demo_store):
    code = (
        "import adapterprobe as ap, os, sys\n"
        "ap.scan(sys.argv[1])\n"
        "names = [open(f'/proc/self/task/{t}/comm').read().strip()"
        " for t in os.listdir('/proc/self/task')]\n"
        "print(sum(n.startswith('adapterprobe-re') for n in names))\n"
    )
    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs /proc to list threads")
    done = subprocess.run(
        [sys.executable, "-c", code, str(demo_store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "0", (done.stdout, done.stderr)


def test_remote_roots_stay_on_the_local_engine(s3, demo_store):
    s3_loopback.upload_tree(s3, BUCKET, demo_store, "ray")
    with pytest.raises(ap.UsageError, match="local engine"):
        ap.scan(f"s3://{BUCKET}/ray", engine="ray")
