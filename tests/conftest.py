"""Shared test set-up: the tools/ folder (real training runs) on sys.path, and
the paths every test module uses.

The tests import the installed adapterprobe (the wheel in CI), never the
python/ source tree; ``realruns`` (tools/realruns) makes real artifacts by
training tiny models with torch, transformers and PEFT.
"""

from __future__ import annotations

import json
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


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The labelled corpus of real training runs, written once per session (about a
    minute of CPU training): ``(root, {run name: label})``, labels read from disk."""
    for module in ("torch", "safetensors", "transformers", "peft"):
        pytest.importorskip(module)
    from realruns.corpus import write_corpus

    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root)
    labels = json.loads((root / "labels.json").read_text(encoding="utf-8"))
    return root, {name: info["label"] for name, info in labels.items()}
