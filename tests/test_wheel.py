"""The built abi3 wheel installs into a fresh venv without torch and scans the demo.

CI builds the wheel first and points ADAPTERPROBE_WHEEL_DIR at it; without
that variable this test builds one with maturin (slower).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("ADAPTERPROBE_WHEEL_DIR")
    if given:
        wheels = sorted(Path(given).glob("adapterprobe-*.whl"))
    else:
        out = tmp_path_factory.mktemp("dist")
        maturin = shutil.which("maturin") or pytest.fail("maturin is needed to build the wheel")
        subprocess.run([maturin, "build", "--out", str(out), "-q"], cwd=ROOT, check=True)
        wheels = sorted(out.glob("adapterprobe-*.whl"))
    assert len(wheels) == 1, wheels
    assert ("abi3" in wheels[0].name and "manylinux" in wheels[0].name) or not given
    return wheels[0]


def test_wheel_in_a_fresh_venv_without_torch(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True)
    probe = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "True", "the fresh venv must not have torch"
    scan = subprocess.run(
        [env_dir / "bin" / "adapterprobe", "scan", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert scan.returncode == 1, scan.stderr  # the demo's smoke-test adapter FAILs
    records = json.loads(scan.stdout)
    assert len(records) == 12
    assert {r["probe"] for r in records} == {"training_drift", "gradient_ghost", "adapter_weights"}
    assert all(Path(r["store"]).is_relative_to(env_dir) for r in records), "demo ships in the wheel"


def test_wheel_ships_no_test_tooling(wheel):
    """Fixture generators (tools/realruns) stay out of the runtime package."""
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith("adapterprobe/scan.py") for n in names)
    assert not [n for n in names if "storegen" in n or "realruns" in n]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    given = os.environ.get("ADAPTERPROBE_WHEEL_DIR")
    if given:
        found = sorted(Path(given).glob("adapterprobe-*.tar.gz"))
    else:
        out = tmp_path_factory.mktemp("sdist")
        maturin = shutil.which("maturin") or pytest.fail("maturin is needed to build the sdist")
        subprocess.run([maturin, "sdist", "--out", str(out)], cwd=ROOT, check=True)
        found = sorted(out.glob("adapterprobe-*.tar.gz"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.slow
def test_sdist_builds_and_installs_with_pip(sdist, tmp_path):
    """`pip install adapterprobe-X.tar.gz` compiles the Rust core and works.

    What is under test is that the sdist holds everything a build needs, not
    the release profile's code: the build skips fat LTO and most optimisation
    (about 3 minutes of CI's 2 cores otherwise)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    quick = {
        "CARGO_PROFILE_RELEASE_LTO": "off",
        "CARGO_PROFILE_RELEASE_CODEGEN_UNITS": "256",
        "CARGO_PROFILE_RELEASE_OPT_LEVEL": "0",
        "CARGO_INCREMENTAL": "0",
    }
    subprocess.run(
        [python, "-m", "pip", "install", "-q", str(sdist)],
        check=True,
        env={**os.environ, **quick},
    )
    scan = subprocess.run(
        [env_dir / "bin" / "adapterprobe", "scan", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert scan.returncode in (0, 1), scan.stderr
    assert {r["probe"] for r in json.loads(scan.stdout)} >= {"training_drift", "gradient_ghost"}
