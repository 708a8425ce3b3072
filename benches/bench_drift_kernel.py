"""training_drift's verdict: the Rust kernel (``_core.judge_drift``, what
``judge_drift`` and a scan call) against its plain-Python reference
(tests/reference/drift_rules.py, the rules as Python ran them before), on
the same gathered input, both rule sets, in one run.

    python benches/bench_drift_kernel.py [--records 100000] [--repeat 5]

The input is a noisy decaying loss curve with a few spikes and NaNs, and a
gradient norm, learning rate and eval loss logged beside it, built in memory
(no file reading is timed: both sides judge the same ``DriftInput``).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _timing import best_of, report
from reference import drift_rules

from adapterprobe import _core
from adapterprobe.probes.drift import DriftOptions, judge_drift


def make_input(records: int, seed: int = 0) -> object:
    rng = random.Random(seed)
    losses = [3.0 * 0.9995**i + 0.4 + 0.05 * rng.gauss(0, 1) for i in range(records)]
    for i in rng.sample(range(records), 5):
        losses[i] *= 4.0
    for i in rng.sample(range(records), 3):
        losses[i] = math.nan
    steps = range(records)
    curve = _core.loss_curve_from_records(
        list(zip(steps, losses, strict=True)),
        grad_norm=[(s, 1.0 + rng.random()) for s in steps],
        learning_rate=[(s, 1e-4 * (1 - s / records)) for s in steps],
        eval_loss=[(s, 3.0 * 0.9995**s + 0.5) for s in range(0, records, max(records // 50, 1))],
    )
    return _core.drift_input_from("/bench/run", _core.LogsStatus.Curve, curve=curve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    inputs = make_input(args.records)
    for rules in ("robust", "sway"):
        options = DriftOptions(rules=rules)
        ours = best_of(lambda o=options: judge_drift(inputs, o), args.repeat)
        ref = best_of(lambda o=options: drift_rules.judge_drift(inputs, o), args.repeat)
        verdict = judge_drift(inputs, options).verdict.value
        report(
            f"training_drift rules={rules}, {args.records:,} records ({verdict})",
            ours,
            "Python reference",
            ref,
        )


if __name__ == "__main__":
    main()
