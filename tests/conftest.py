"""Shared test set-up: the tools/ folder (real training runs) on sys.path, and
the paths every test module uses.

The tests import the installed adapterprobe (the wheel in CI), never the
python/ source tree; ``realruns`` (tools/realruns) makes real artifacts by
training tiny models with torch, transformers and PEFT. The labelled runs the
verdict tests judge were trained once and committed (tests/fixtures/realruns,
written by tools/realruns/fixtures.py), so a verdict test fails only when the
product changed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# Under pytest-xdist (`-n 2`, as CI runs the suite) each worker's torch and
# BLAS keep to one thread: two workers of two threads each on two cores
# would fight over them. Read by torch and OpenBLAS when they load, so it is
# set before any test module imports them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from realruns.fixtures import FIXTURES, SOURCE_ENV, write_part  # noqa: E402


@pytest.fixture
def demo_store() -> Path:
    """The demo store bundled inside the installed package."""
    from adapterprobe.scan import DEMO_STORE

    return DEMO_STORE


def realruns_source() -> str:
    """Where the labelled real runs come from: "committed" (the default), "fresh"
    (trained in this session on the installed torch) or a folder."""
    return os.environ.get(SOURCE_ENV, "committed") or "committed"


def _realruns(part: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = realruns_source()
    if source == "committed":
        return FIXTURES / part
    if source != "fresh":
        return Path(source) / part
    for module in ("torch", "safetensors", "transformers", "peft"):
        pytest.importorskip(module)
    root = tmp_path_factory.mktemp(part)
    write_part(part, root)
    return root


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The labelled corpus of real training runs (tools/realruns/corpus.py):
    ``(root, {run name: label})``, labels read from disk. The committed fixture
    unless ADAPTERPROBE_REALRUNS says otherwise (see realruns_source)."""
    root = _realruns("corpus", tmp_path_factory)
    labels = json.loads((root / "labels.json").read_text(encoding="utf-8"))
    return root, {name: info["label"] for name, info in labels.items()}


@pytest.fixture(scope="session")
def field_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FIELD_SUBSET of the field corpus (tools/realruns/field.py): real
    transformers.Trainer output dirs; committed, as ``corpus``."""
    return _realruns("field", tmp_path_factory)


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium for the HTML tests (tests/browser.py); a missing
    browser fails the test, it never skips."""
    import browser

    try:
        path = browser.find_browser()
    except browser.BrowserMissing as exc:
        pytest.fail(f"{exc}. The HTML report tests need a real browser.")
    with browser.Browser(path) as b:
        yield b
