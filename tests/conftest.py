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


#: The subset the session trains: every fault class, the layouts (LoRA, full,
#: resumed) and the healthy traps (small-batch noise, RL losses, a 0.0 loss).
FIELD_SUBSET = [
    "lora-b2-log1",
    "full-b2-log1",
    "lora-resumed-b8-log1",
    "rl-reinforce-b8-log1",
    "lora-prompt-only-rows-b2-log1",
    "lr-too-high-full-adam1-log1",
    "nan-empty-batch-b2-log1",
    "nan-empty-batch-nofilter-log1",
    "nan-logged-weights-fine-nofilter",
    "frozen-lora-b-b8-log5",
    "overfit-full-32seq-eval20",
    "dead-relu-sgd-log1",
    "no-progress-full-lr1e-9-b4-log1",
    "no-progress-lr-horizon-log10",
    "too-few-steps-full-log1",
    "too-few-steps-lora-log10",
]


@pytest.fixture(scope="session")
def field_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FIELD_SUBSET of the field corpus (tools/realruns/field.py), trained once
    per session with the real transformers.Trainer (about 40 s of CPU)."""
    for module in ("torch", "safetensors", "transformers", "peft"):
        pytest.importorskip(module)
    from realruns import field

    root = tmp_path_factory.mktemp("field")
    field.write_field_corpus(root, FIELD_SUBSET)
    return root
