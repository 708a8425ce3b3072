"""`scan(engine="ray")` on a real local Ray instance (no mocks of Ray)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

import adapterprobe as ap
from adapterprobe.ray_engine import failed_records
from adapterprobe.scan import DEMO_STORE, discover

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def make_tree(root, copies):
    demos = sorted(p for p in DEMO_STORE.iterdir() if p.is_dir())
    for i in range(copies):
        shutil.copytree(
            demos[i % len(demos)], root / f"g{i % 7}" / f"store-{i:04d}", copy_function=os.link
        )
    broken = root / "g0" / "zz-broken"
    shutil.copytree(DEMO_STORE / "healthy", broken)
    (broken / "adapter" / "current.txt").write_text("versions/v0042")
    for log in (broken / "logs").iterdir():
        log.write_bytes(b"\x00 not json\n")
    return root


def test_same_records_and_order_as_local(ray_instance, tmp_path):
    tree = make_tree(tmp_path, 40)
    local = ap.scan(tree)
    on_ray = ap.scan(tree, engine="ray")
    assert on_ray.to_dicts() == local.to_dicts()
    assert on_ray.exit_code() == local.exit_code() == 1
    seen = []
    ap.scan(tree, engine="ray", progress=lambda done, total: seen.append((done, total)))
    assert seen[0] == (0, 41) and seen[-1] == (41, 41)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def _kill_running_tasks(stop: threading.Event, killed: list) -> None:
    """SIGKILL the first worker seen executing a scan batch."""
    while not stop.is_set() and not killed:
        for proc in psutil.process_iter(["cmdline"]):
            title = " ".join(proc.info["cmdline"] or [])
            if title.startswith("ray::_scan_batch"):
                try:
                    proc.kill()
                    killed.append(proc.pid)
                except psutil.Error:
                    continue
                break
        time.sleep(0.002)


@pytest.mark.parametrize("max_retries", [3, 0])
def test_a_worker_killed_mid_task_loses_nothing(ray_instance, tmp_path, max_retries):
    from adapterprobe.ray_engine import run_on_ray

    tree = make_tree(tmp_path, 1500)
    targets, _ = discover(tree)
    local = ap.scan(tree, probes=("gradient_ghost", "training_drift")).to_dicts()
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_running_tasks, args=(stop, killed))
    killer.start()
    try:
        records = run_on_ray(
            targets, ("gradient_ghost", "training_drift"), {}, max_retries=max_retries
        )
    finally:
        stop.set()
        killer.join()
    assert killed, "no task was caught running; the tree is too small for this machine"
    got = [r.to_dict() for r in records]
    assert len(got) == len(local)
    if max_retries:
        assert got == local  # Ray re-ran the killed batch
    else:
        # No retries: the batch was split into per-store tasks; every store is
        # either probed as locally or reported as an error naming the cause.
        for mine, theirs in zip(got, local, strict=True):
            assert (mine["store"], mine["adapter"], mine["probe"]) == (
                theirs["store"],
                theirs["adapter"],
                theirs["probe"],
            )
            assert mine == theirs or (mine["verdict"] == "error" and "cluster" in mine["message"])


def test_failed_records_match_the_local_record_shape():
    targets, _ = discover(DEMO_STORE, all_versions=True)
    for target in targets:
        local = ap.scan(target.store, all_versions=True)
        failed = failed_records(target, ap.probes.DEFAULT_PROBES, "boom")
        assert [(r.store, r.adapter, r.probe) for r in failed] == [
            (r.store, r.adapter, r.probe) for r in local
        ]
        assert all(r.verdict == "error" and "boom" in r.message for r in failed)


def test_missing_ray_extra_exits_2_with_install_hint(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from adapterprobe.cli import main\n"
        f"sys.exit(main(['scan', {str(DEMO_STORE)!r}, '--engine', 'ray']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert "pip install ray (or, in a checkout of adapterprobe: pip install '.[ray]')" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_engine_ray_json(ray_instance):
    # The CLI in this process joins the running instance (ray.is_initialized()).
    from contextlib import redirect_stdout
    from io import StringIO

    from adapterprobe.cli import main

    buf = StringIO()
    with redirect_stdout(buf):
        code = main(["scan", str(DEMO_STORE), "--engine", "ray", "--format", "json"])
    assert code == 1
    saved = json.loads(buf.getvalue())
    # The CLI writes a saved scan: every record also carries schema_version
    # and the root it was found under (for scan --baseline, report --from).
    assert all(r.pop("schema_version") == 1 and r.pop("root") == str(DEMO_STORE) for r in saved)
    assert saved == ap.scan(DEMO_STORE).to_dicts()
