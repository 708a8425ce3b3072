"""training_drift's whole verdict: the Rust kernel (``_core.judge_drift``, what
``judge_drift`` and a scan call) against one step any trend judge needs, a
rolling median of the same curve (numpy, window 11, NaN left in), both rule
sets, in one run. A ratio above 1 means the verdict costs less than that step.

    python benches/bench_drift_kernel.py [--records 100000] [--repeat 5]

The input is a noisy decaying loss curve with a few spikes and NaNs, and a
gradient norm, learning rate and eval loss logged beside it, built in memory
(no file reading is timed).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np
from _timing import best_of, report

from adapterprobe import _core
from adapterprobe._core import _testing
from adapterprobe.probes.drift import DriftOptions, judge_drift


def make_losses(records: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    losses = [3.0 * 0.9995**i + 0.4 + 0.05 * rng.gauss(0, 1) for i in range(records)]
    for i in rng.sample(range(records), 5):
        losses[i] *= 4.0
    for i in rng.sample(range(records), 3):
        losses[i] = math.nan
    return losses


def make_input(records: int, seed: int = 0) -> object:
    rng = random.Random(seed + 1)
    losses = make_losses(records, seed)
    steps = range(records)
    curve = _testing.loss_curve_from_records(
        list(zip(steps, losses, strict=True)),
        grad_norm=[(s, 1.0 + rng.random()) for s in steps],
        learning_rate=[(s, 1e-4 * (1 - s / records)) for s in steps],
        eval_loss=[(s, 3.0 * 0.9995**s + 0.5) for s in range(0, records, max(records // 50, 1))],
    )
    return _testing.drift_input_from("/bench/run", _core.LogsStatus.Curve, curve=curve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    inputs = make_input(args.records)
    curve = np.asarray(make_losses(args.records))

    def rolling_median() -> object:
        return np.median(np.lib.stride_tricks.sliding_window_view(curve, 11), axis=1)

    for rules in ("robust", "sway"):
        options = DriftOptions(rules=rules)
        ours = best_of(lambda o=options: judge_drift(inputs, o), args.repeat)
        ref = best_of(rolling_median, args.repeat)
        verdict = judge_drift(inputs, options).verdict.value
        report(
            f"training_drift rules={rules}, {args.records:,} records ({verdict})",
            ours,
            "numpy rolling median",
            ref,
        )


if __name__ == "__main__":
    main()
