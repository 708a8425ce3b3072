"""Benchmarks of the issue-2 kernels, each against its reference in the same run.

    python benches/bench_core.py [--lines 1000000] [--deltas 100000] [--files 2000]

- read_loss_curve on a dlm-style log vs a plain-Python json.loads loop (the
  seed's reader), an orjson loop and polars.read_ndjson;
- count_spikes vs the seed's per-point np.median loop;
- read_safetensors_header over many files vs safetensors.safe_open(...).keys().
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import seed_reference
from _timing import best_of, report

import adapterprobe as ap

DATA = Path(__file__).parent / ".data"


def make_log(path: Path, lines: int, nans: bool = True) -> None:
    """A dlm-like log: banner, `lines` sorted-key step records, a NaN now and then."""
    if path.exists() and path.stat().st_size > 0 and path.name.endswith(f"{lines}.jsonl"):
        return
    rng = random.Random(0)
    with path.open("w") as fh:
        banner = {"type": "banner", "run_id": 1, "seed": 0, "plan": {"type": "step", "lora_r": 8}}
        fh.write(json.dumps(banner, sort_keys=True) + "\n")
        for step in range(lines):
            loss = 4.0 * math.exp(-step / (lines / 5)) + rng.random() * 0.01
            record = {
                "type": "step",
                "step": step,
                "loss": math.nan if nans and step % 99_991 == 7 else loss,
                "lr": 1e-4 * (1 - step / lines),
                "grad_norm": rng.random() * 2,
                "tokens_per_sec": 1000 + rng.random() * 100,
                "val_loss": None,
                "timestamp": "2025-06-01T12:00:00",
            }
            fh.write(json.dumps(record, sort_keys=True) + "\n")


def orjson_loop(path: Path) -> dict[int, float]:
    import orjson

    out: dict[int, float] = {}
    with path.open("rb") as fh:
        for raw in fh:
            try:
                rec = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # orjson refuses NaN tokens: those lines are lost
            if isinstance(rec, dict) and rec.get("type") == "step":
                out[int(rec["step"])] = float(rec["loss"])
    return out


def polars_read(path: Path):
    import polars as pl

    df = pl.read_ndjson(path, infer_schema_length=None, ignore_errors=True)
    return df.filter(pl.col("type") == "step").select("step", "loss")


def bench_loss_curve(lines: int) -> None:
    DATA.mkdir(exist_ok=True)
    path = DATA / f"train-000001-20250101T000000-{lines}.jsonl"
    make_log(path, lines)
    size = path.stat().st_size
    import os

    threads = os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count()))
    ours = best_of(lambda: ap.read_loss_curve(path), repeat=5)
    gbps = size / ours / 1e9
    print(
        f"log: {lines} lines, {size / 1e6:.0f} MB; read_loss_curve {gbps:.2f} GB/s "
        f"({threads} threads)"
    )
    curve = ap.read_loss_curve(path)
    assert len(curve) == lines
    ref = best_of(lambda: seed_reference.collect_steps([path]), repeat=1)
    report("read_loss_curve", ours, "json.loads loop", ref)
    # orjson and polars reject the NaN tokens dlm writes: compare them on a
    # twin log without NaN (ours is timed again on that twin).
    twin = DATA / f"train-000001-20250101T000000-{lines}-finite.jsonl"
    make_log(twin, lines, nans=False)
    ours_twin = best_of(lambda: ap.read_loss_curve(twin), repeat=5)
    try:
        report(
            "read_loss_curve (NaN-free twin)",
            ours_twin,
            "orjson loop",
            best_of(lambda: orjson_loop(twin), 2),
        )
    except ImportError:
        print("read_loss_curve: orjson not installed, skipped")
    try:
        polars_s = best_of(lambda: polars_read(twin), 2)
        report("read_loss_curve (NaN-free twin)", ours_twin, "polars.read_ndjson", polars_s)
    except ImportError:
        print("read_loss_curve: polars not installed, skipped")


def bench_spikes(n: int) -> None:
    rng = np.random.default_rng(0)
    deltas = rng.standard_normal(n) * 0.01
    deltas[rng.integers(0, n, n // 1000)] += 1.0
    ours = best_of(lambda: ap.count_spikes(deltas), repeat=5)
    ref = best_of(lambda: seed_reference.count_spikes(deltas, 10, 3.0), repeat=1)
    assert ap.count_spikes(deltas) == len(seed_reference.count_spikes(deltas, 10, 3.0))
    report(f"count_spikes ({n} deltas)", ours, "seed np.median loop", ref)


def bench_headers(files: int) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    folder = DATA / f"headers-{files}"
    if not folder.exists():
        folder.mkdir(parents=True)
        tensors = {
            f"base_model.model.model.layers.{layer}.self_attn.{m}.lora_{f}.weight": np.zeros(
                (8, 64), dtype=np.float32
            )
            for layer in range(24)
            for m in ("q_proj", "k_proj", "v_proj", "o_proj")
            for f in ("A", "B")
        }
        for i in range(files):
            save_file(tensors, str(folder / f"{i:05d}.safetensors"))
    paths = sorted(str(p) for p in folder.glob("*.safetensors"))

    def ours():
        for p in paths:
            ap.read_safetensors_header(p).tensors.keys()

    def theirs():
        for p in paths:
            with safe_open(p, framework="numpy") as fh:
                fh.keys()

    report(
        f"read_safetensors_header ({files} files)",
        best_of(ours),
        "safe_open().keys()",
        best_of(theirs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--deltas", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=2000)
    args = parser.parse_args()
    bench_spikes(args.deltas)
    bench_headers(args.files)
    bench_loss_curve(args.lines)


if __name__ == "__main__":
    main()
