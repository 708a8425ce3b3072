"""Property: the Rust r×r-space similarity (``_core.compare_adapter_updates``)
equals a float64 numpy reference that forms every dense ΔW, for random
ranks, shapes, scales, dtypes and module sets, on adapters written in PEFT's
format with the ``safetensors`` library."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapterprobe import _core

pytest.importorskip("safetensors")


def write(
    d: Path, modules: dict[str, tuple[np.ndarray, np.ndarray]], r: int, alpha: float, dtype: str
) -> None:
    from safetensors.numpy import save_file

    d.mkdir()
    tensors = {}
    for name, (a, b) in modules.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.astype(dtype)
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.astype(dtype)
    save_file(tensors, str(d / "adapter_model.safetensors"))
    ranks = {n: a.shape[0] for n, (a, _) in modules.items()}
    pattern = {n: k for n, k in ranks.items() if k != r}
    config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "rank_pattern": pattern}
    (d / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")


def reference(
    x: dict[str, tuple[np.ndarray, np.ndarray]],
    y: dict[str, tuple[np.ndarray, np.ndarray]],
    scale_x: dict[str, float],
    scale_y: dict[str, float],
    dtype: str,
) -> tuple[float | None, dict[str, float | None]]:
    def dense(m: tuple[np.ndarray, np.ndarray], s: float) -> np.ndarray:
        a, b = (t.astype(dtype).astype(np.float64) for t in m)
        return s * (b @ a)

    inner = ex = ey = 0.0
    cosines: dict[str, float | None] = {}
    for name in x.keys() & y.keys():
        wx, wy = dense(x[name], scale_x[name]), dense(y[name], scale_y[name])
        if wx.shape != wy.shape:
            continue
        i, nx, ny = float(np.sum(wx * wy)), float(np.sum(wx * wx)), float(np.sum(wy * wy))
        inner, ex, ey = inner + i, ex + nx, ey + ny
        cosines[name] = i / (nx * ny) ** 0.5 if nx > 0 and ny > 0 else None
    total = inner / (ex * ey) ** 0.5 if ex > 0 and ey > 0 else None
    return total, cosines


@st.composite
def adapters(draw: st.DrawFn) -> tuple:
    names = draw(st.lists(st.sampled_from(["q", "k", "v", "o", "up"]), min_size=1, unique=True))
    shapes = {n: (draw(st.integers(1, 24)), draw(st.integers(1, 24))) for n in names}
    dtype = draw(st.sampled_from(["float32", "float64", "float16"]))
    sides = []
    for _ in range(2):
        r = draw(st.integers(1, 8))
        alpha = draw(st.floats(0.5, 64))
        own = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        modules = {}
        for n in own:
            out, inp = shapes[n]
            if draw(st.booleans()):  # a different shape now and then
                inp += draw(st.integers(0, 2))
            k = draw(st.sampled_from([r, r, draw(st.integers(1, 8))]))
            magnitude = draw(st.sampled_from([1e-3, 1.0, 30.0]))
            modules[f"model.layers.0.{n}"] = (
                rng.standard_normal((k, inp)) * magnitude,
                rng.standard_normal((out, k)),
            )
        sides.append((modules, r, alpha))
    return sides, dtype


@settings(max_examples=60, deadline=None)
@given(adapters())
def test_rust_similarity_matches_dense_float64_reference(case: tuple) -> None:
    (x, rx, ax), (y, ry, ay) = case[0]
    dtype = case[1]
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp) / "x", x, rx, ax, dtype)
        write(Path(tmp) / "y", y, ry, ay, dtype)
        got = _core.compare_adapter_updates(Path(tmp) / "x", Path(tmp) / "y")
    sx = {n: ax / a.shape[0] for n, (a, _) in x.items()}
    sy = {n: ay / a.shape[0] for n, (a, _) in y.items()}
    total, cosines = reference(x, y, sx, sy, dtype)
    assert {m["module"] for m in got["modules"]} == set(cosines)
    for m in got["modules"]:
        want = cosines[m["module"]]
        if want is None:
            assert m["cosine"] is None
        else:
            assert m["cosine"] == pytest.approx(want, abs=1e-9)
    if total is None:
        assert got["similarity"] is None
    else:
        assert got["similarity"] == pytest.approx(total, abs=1e-9)
        assert -1.0 <= got["similarity"] <= 1.0
    shared = set(cosines)
    left = {e["module"] for e in got["left_out"]}
    assert left == (x.keys() | y.keys()) - shared
