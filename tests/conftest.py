"""Shared test set-up: the tools/ folder (real training runs) on sys.path, and
the paths every test module uses.

The tests import the installed adapterprobe (the wheel in CI), never the
python/ source tree; ``realruns`` (tools/realruns) makes real artifacts by
training tiny models with torch, transformers and PEFT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))


@pytest.fixture
def demo_store() -> Path:
    """The demo store bundled inside the installed package."""
    from adapterprobe.scan import DEMO_STORE

    return DEMO_STORE
