"""The GitHub Action's install steps (``action.yml``,
``scripts/github_action_install.sh``), run without GitHub in a fresh virtual
environment, offline: the package index is a folder (``PIP_NO_INDEX``,
``PIP_FIND_LINKS``) holding a real adapterprobe wheel of this version or
nothing. adapterprobe's own dependencies come from the test environment: a
``.pth`` file in the fresh environment names a folder of links to their
installed files, so pip finds them installed and fetches nothing.

The wheel is the one CI built (``ADAPTERPROBE_WHEEL_DIR``), else one built
here with maturin (slower), as in tests/test_wheel.py. The build from the
checkout (the ``source`` form) compiles the Rust core for minutes; docs/ci.md
gives its measured time."""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest
import test_github_action as action
from packaging.requirements import Requirement

REPO = action.REPO
INSTALL = next(s for s in action.STEPS if s.get("id") == "install")
BUILD = next(s for s in action.STEPS if s.get("id") == "build")
CACHE = next(s for s in action.STEPS if "actions/cache" in s.get("uses", ""))
VERSION = re.search(
    r'^\[project\][^\[]*?^version = "([^"]+)"',
    (REPO / "pyproject.toml").read_text(encoding="utf-8"),
    re.M | re.S,
)[1]  # type: ignore[index]


def requirements(name: str, seen: set[str]) -> None:
    """`name` and what it needs here, recursively (markers evaluated)."""
    key = name.lower().replace("_", "-")
    if key in seen:
        return
    seen.add(key)
    for text in metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            requirements(req.name, seen)


def link_dependencies(into: Path) -> Path:
    """A folder of links to the installed files of adapterprobe's
    dependencies (numpy, rich and theirs): their packages and dist-info."""
    needed: set[str] = set()
    for text in metadata.requires("adapterprobe") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            requirements(req.name, needed)
    into.mkdir()
    for name in needed:
        dist = metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = base / top
            if top != ".." and source.exists() and not (into / top).exists():
                (into / top).symlink_to(source)
    return into


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding adapterprobe's wheel of this version and nothing else."""
    given = os.environ.get("ADAPTERPROBE_WHEEL_DIR")
    if given:
        wheels = sorted(Path(given).glob(f"adapterprobe-{VERSION}-*.whl"))
    else:
        built = tmp_path_factory.mktemp("built")
        maturin = shutil.which("maturin") or pytest.fail("maturin is needed to build the wheel")
        subprocess.run([maturin, "build", "--out", str(built), "-q"], cwd=REPO, check=True)
        wheels = sorted(built.glob(f"adapterprobe-{VERSION}-*.whl"))
    assert len(wheels) == 1, wheels
    index = tmp_path_factory.mktemp("index")
    shutil.copy(wheels[0], index)
    return index


@pytest.fixture(scope="module")
def sdist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding adapterprobe's sdist of this version and no wheel (a
    release whose wheels do not fit the runner)."""
    given = os.environ.get("ADAPTERPROBE_WHEEL_DIR")
    if given:
        found = sorted(Path(given).glob(f"adapterprobe-{VERSION}.tar.gz"))
    else:
        built = tmp_path_factory.mktemp("sdist")
        maturin = shutil.which("maturin") or pytest.fail("maturin is needed to build the sdist")
        subprocess.run([maturin, "sdist", "--out", str(built)], cwd=REPO, check=True)
        found = sorted(built.glob(f"adapterprobe-{VERSION}.tar.gz"))
    assert len(found) == 1, found
    index = tmp_path_factory.mktemp("sdist-index")
    shutil.copy(found[0], index)
    return index


@pytest.fixture(scope="module")
def dependencies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return link_dependencies(tmp_path_factory.mktemp("deps") / "site")


class Install:
    """A fresh environment (its python first on PATH, as setup-python's is)
    and the runner around it."""

    def __init__(self, tmp_path: Path, dependencies: Path, index: Path) -> None:
        self.env_dir = tmp_path / "venv"
        venv.create(self.env_dir, with_pip=True)
        (site,) = self.env_dir.glob("lib/python*/site-packages")
        (site / "dependencies.pth").write_text(f"{dependencies}\n", encoding="utf-8")
        workspace = tmp_path / "workspace"
        workspace.mkdir()
        self.runner = action.Runner(workspace)
        self.runner.env.update(
            PATH=os.pathsep.join([str(self.env_dir / "bin"), os.environ.get("PATH", "")]),
            HOME=str(tmp_path / "home"),
            # rustup finds its toolchains under the real home
            RUSTUP_HOME=os.environ.get("RUSTUP_HOME", str(Path.home() / ".rustup")),
            CARGO_HOME=os.environ.get("CARGO_HOME", str(Path.home() / ".cargo")),
            PIP_NO_INDEX="1",
            PIP_FIND_LINKS=str(index),
            PIP_CONFIG_FILE=os.devnull,
            PIP_DISABLE_PIP_VERSION_CHECK="1",
        )
        self.runner.env.pop("VIRTUAL_ENV", None)

    def run(self, action_ref: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
        return self.runner.step(INSTALL, {}, {}, action_ref)

    def installed(self) -> str | None:
        """The adapterprobe version installed in the fresh environment."""
        done = subprocess.run(
            [
                str(self.env_dir / "bin" / "python"),
                "-c",
                "import importlib.metadata as m\n"
                "try:\n    print(m.version('adapterprobe'))\n"
                "except m.PackageNotFoundError:\n    print('')",
            ],
            capture_output=True,
            text=True,
            check=True,
            env={k: v for k, v in self.runner.env.items() if k != "PYTHONPATH"},
        )
        return done.stdout.strip() or None


def expected_key() -> str:
    toolchain = subprocess.run(["rustc", "-V"], capture_output=True, text=True).stdout.strip()
    lock = (REPO / "Cargo.lock").read_bytes()
    return hashlib.sha256(lock + f"{toolchain or 'no rustc'}\n".encode()).hexdigest()[:40]


def test_the_cache_and_the_build_run_only_when_no_wheel_was_installed() -> None:
    for step in (CACHE, BUILD):
        assert step["if"] == "steps.install.outputs.build == 'true'"
    paths = CACHE["with"]["path"].splitlines()
    assert paths[:2] == ["~/.cargo/registry", "~/.cargo/git"]
    assert paths[2] == "${{ steps.install.outputs.target-dir }}"
    assert "steps.install.outputs.cargo-key" in CACHE["with"]["key"]
    assert BUILD["env"]["CARGO_TARGET_DIR"] == "${{ steps.install.outputs.target-dir }}"
    # The order: install (wheel), cache, build, then the scan.
    ids = [s.get("id") or s.get("uses", "") for s in action.STEPS]
    assert ids.index("install") < ids.index("actions/cache@v4") < ids.index("build")
    assert ids.index("build") < ids.index("scan")


def test_at_the_release_tag_the_released_wheel_is_installed(
    tmp_path: Path, dependencies: Path, wheel_dir: Path
) -> None:
    install = Install(tmp_path, dependencies, wheel_dir)
    assert install.installed() is None
    done, outputs = install.run(f"v{VERSION}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert outputs["build"] == "false", done.stdout + done.stderr
    assert f"installed the released wheel of adapterprobe {VERSION}" in done.stdout
    assert install.installed() == VERSION
    scan = subprocess.run(
        [str(install.env_dir / "bin" / "adapterprobe"), "scan", "-q"],
        capture_output=True,
        text=True,
        env=install.runner.env,
        cwd=tmp_path,
    )
    assert scan.returncode == 1, scan.stderr  # the demo store's smoke test FAILs
    # The bare version names the tag too.
    again = Install(tmp_path / "bare", dependencies, wheel_dir)
    _, outputs = again.run(VERSION)
    assert outputs["build"] == "false" and again.installed() == VERSION


def test_at_the_release_tag_without_a_wheel_it_builds_from_the_checkout(
    tmp_path: Path, dependencies: Path, sdist_dir: Path
) -> None:
    """The index has the release's sdist but no wheel: it is not built (that
    would compile without cargo's cache); the checkout is, in the next step."""
    install = Install(tmp_path, dependencies, sdist_dir)
    done, outputs = install.run(f"v{VERSION}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert outputs == {
        "build": "true",
        "cargo-key": expected_key(),
        "target-dir": f"{install.runner.env['HOME']}/.cache/adapterprobe-action/target",
    }
    assert f"no released wheel of adapterprobe {VERSION} installs here" in done.stdout
    # pip's own words are kept, folded in the log.
    assert f"::group::pip install adapterprobe=={VERSION}" in done.stdout
    assert "::endgroup::" in done.stdout
    assert "build dependencies" not in done.stdout  # the sdist was left alone
    assert install.installed() is None


def test_elsewhere_it_builds_from_the_checkout_without_asking_the_index(
    tmp_path: Path, dependencies: Path, wheel_dir: Path
) -> None:
    """A branch carries the last release's version on newer code, and a SHA
    may be any code: the wheel of that version is not this checkout."""
    install = Install(tmp_path, dependencies, wheel_dir)
    for ref in ("main", "", "3f2c1a0b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a", "v0.0.9", f"v{VERSION}.1"):
        done, outputs = install.run(ref)
        assert done.returncode == 0, done.stdout + done.stderr
        assert outputs["build"] == "true" and outputs["cargo-key"] == expected_key()
        assert f"not at the release tag v{VERSION}" in done.stdout, ref
        assert "pip install" not in done.stdout
        assert install.installed() is None  # the wheel in the index was not taken


def test_a_checkout_without_a_version_is_an_error(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "x"\n', encoding="utf-8")
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "github_action_install.sh")],
        env={**os.environ, "AP_ACTION_PATH": str(checkout), "GITHUB_OUTPUT": os.devnull},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "::error title=adapterprobe::no version" in done.stdout
