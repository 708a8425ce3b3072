"""Adapters whose numbers reach the edge of the float range (``lora_alpha:
1e308``): ``compare`` and its report answer, with non-finite figures shown
as such, never an OverflowError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import adapterprobe as ap
from tests.attacks import fs_attacks as fa


def overflowing_pair(root: Path, demo_store: Path) -> tuple[Path, Path]:
    version = demo_store / "healthy" / "adapter" / "versions" / "v0001"
    pair = []
    for name in ("a", "b"):
        out = root / name
        out.mkdir(parents=True)
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy(version / f, out / f)
        pair.append(out)
    config = json.loads((pair[1] / "adapter_config.json").read_text())
    config["lora_alpha"] = 1e308
    (pair[1] / "adapter_config.json").write_text(json.dumps(config))
    return pair[0], pair[1]


def test_compare_answers_on_an_alpha_at_the_float_range(tmp_path, demo_store):
    a, b = overflowing_pair(tmp_path, demo_store)
    result = ap.compare(a, b)
    assert result is not None
    for fmt in ("table", "json", "html"):
        out = tmp_path / f"cmp.{fmt}"
        args = ["compare", a, b, "--format", fmt]
        run = fa.cli(*args, *(["-o", out] if fmt == "html" else []), timeout=120)
        assert "Traceback" not in run.stderr and "OverflowError" not in run.stderr, run.stderr
        assert run.returncode in (0, 1), (fmt, run.returncode, run.stderr)
