"""How trustworthy the verdicts are: both rule sets on the labelled corpus of
real runs, and spike detection against three public rules, in one run.

    python benches/bench_verdicts.py [--corpus DIR] [--trials 400] [--seed 0]

1. Confusion matrix of rules="robust" and rules="sway" on the corpus
   (tools/realruns/corpus.py; by default the committed fixture the tests
   judge, tests/fixtures/realruns/corpus): a healthy run with any
   warn/fail/error is a false alarm; a faulty run with none is a miss.
2. Spike detection on real loss curves (the corpus's healthy runs and its
   loss-spikes run) with spikes injected at known steps: precision, recall
   and detection delay of the robust rule next to
   - OLMo-core's rule: loss > mean + 6 sigma of the last 128 losses,
   - Lightning's SpikeDetection: rtol=2 against a running mean of 10 (a rise
     of 2x the mean above it), not counting improvements,
   - Megatron's: loss > 10x the largest loss so far.
3. Kernel time: the robust analysis of a 100k-point curve against today's
   sway spike kernel (count_spikes) on the same curve. Target: within 2x.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from _timing import best_of, report

import adapterprobe as ap

DATA = Path(__file__).parent / ".data"
COMMITTED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "realruns" / "corpus"
ALARMS = {"warn", "fail", "error"}


def ensure_corpus(path: Path | None) -> Path:
    root = path or (COMMITTED if (COMMITTED / "labels.json").exists() else DATA / "corpus")
    if not (root / "labels.json").exists():
        from realruns.corpus import write_corpus

        print(f"generating the corpus into {root} (about a minute of CPU training) ...")
        root.mkdir(parents=True, exist_ok=True)
        write_corpus(root)
    return root


def confusion(root: Path) -> None:
    labels = {k: v["label"] for k, v in json.loads((root / "labels.json").read_text()).items()}
    print(
        f"\n1. verdicts on {len(labels)} real runs ({sum(v == 'healthy' for v in labels.values())}"
        " healthy)"
    )
    for rules in ("robust", "sway"):
        alarms: dict[str, set[str]] = defaultdict(set)
        for record in ap.scan(root, rules=rules):
            if record.verdict.value in ALARMS:
                alarms[Path(record.store).name].add(f"{record.probe}:{record.verdict.value}")
        healthy = [r for r, lab in labels.items() if lab == "healthy"]
        faulty = [r for r, lab in labels.items() if lab != "healthy"]
        false_alarms = [r for r in healthy if alarms[r]]
        missed = [r for r in faulty if not alarms[r]]
        flagged = f"{len(false_alarms)}/{len(healthy)}"
        print(
            f"  rules={rules:6s}  healthy flagged (false alarms): {flagged}"
            f"   faulty missed: {len(missed)}/{len(faulty)}"
        )
        by_class: dict[str, list[str]] = defaultdict(list)
        for run in faulty:
            by_class[labels[run]].append(", ".join(sorted(alarms[run])) or "MISSED")
        for label, caught in sorted(by_class.items()):
            print(f"      {label:26s} {' | '.join(caught)}")
        for run in false_alarms:
            print(f"      false alarm {run}: {', '.join(sorted(alarms[run]))}")


# ---- spike rules, each returning the indices it flags ----


def robust_rule(curve: np.ndarray) -> set[int]:
    found = ap.robust_curve(curve)
    return set() if found is None else {s.peak for s in found.spikes}


def olmo_rule(curve: np.ndarray, window: int = 128, sigmas: float = 6.0) -> set[int]:
    out = set()
    for i in range(20, len(curve)):
        past = curve[max(0, i - window) : i]
        if curve[i] > past.mean() + sigmas * past.std():
            out.add(i)
    return out


def lightning_rule(curve: np.ndarray, window: int = 10, rtol: float = 2.0) -> set[int]:
    out, kept, last = set(), [], 0.0
    for i, x in enumerate(curve):
        if i >= 1 and kept:
            mean = float(np.mean(kept[-window:]))
            if not x - last <= 0 and abs(x - mean) >= rtol * mean:
                out.add(i)
                continue
        kept.append(x)
        last = x
    return out


def megatron_rule(curve: np.ndarray, factor: float = 10.0) -> set[int]:
    out, top = set(), -math.inf
    for i, x in enumerate(curve):
        if i and x > factor * top:
            out.add(i)
        top = max(top, x)
    return out


RULES = {
    "robust (ours)": robust_rule,
    "OLMo-core 6 sigma/128": olmo_rule,
    "Lightning rtol=2": lightning_rule,
    "Megatron 10x max": megatron_rule,
}


def spike_detection(root: Path, trials: int, seed: int) -> None:
    labels = {k: v["label"] for k, v in json.loads((root / "labels.json").read_text()).items()}
    curves = []
    for run, label in labels.items():
        if label == "healthy":
            losses = ap.read_loss_curve(root / run).losses
            curves.append(np.where(np.isfinite(losses), losses, np.nan))
    rng = np.random.default_rng(seed)
    cases = []
    for t in range(trials):
        base = curves[t % len(curves)].copy()
        n = len(base)
        k = int(rng.integers(1, 4))
        at = sorted(rng.choice(np.arange(15, n - 5), size=k, replace=False).tolist())
        for i in at:
            base[i] *= 1.0 + rng.uniform(0.5, 3.0)  # +50% .. +300% over the curve
        cases.append((base, set(at)))
    # the real spike run: corrupted batches at known steps
    from realruns.corpus import CORPUS

    for spec in CORPUS:
        if spec.spike_steps and (root / spec.name).exists():
            curve = ap.read_loss_curve(root / spec.name)
            steps = curve.steps.tolist()
            injected = {steps.index(s) for s in spec.spike_steps if s in steps}
            cases.append((curve.losses.copy(), injected))
    print(
        f"\n2. spike detection: {len(cases)} real curves, "
        f"{sum(len(s) for _, s in cases)} injected spikes (+50%..+300%)"
    )
    print(f"  {'rule':24s} {'precision':>9s} {'recall':>7s} {'mean delay':>10s} {'false pos':>9s}")
    for name, rule in RULES.items():
        tp = fp = fn = 0
        delays = []
        for curve, truth in cases:
            found = rule(curve)
            matched = set()
            for f in sorted(found):
                hit = next((s for s in sorted(truth) if 0 <= f - s <= 2 and s not in matched), None)
                if hit is None:
                    fp += 1
                else:
                    matched.add(hit)
                    tp += 1
                    delays.append(f - hit)
            fn += len(truth - matched)
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        delay = f"{np.mean(delays):.2f}" if delays else "-"
        print(f"  {name:24s} {precision:9.3f} {recall:7.3f} {delay:>10s} {fp:9d}")


def kernel_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 100_000
    level = 0.5 + 4.0 * np.exp(-np.arange(n) / 20_000)
    curve = level * (1 + 0.02 * rng.standard_normal(n))
    deltas = np.diff(curve)
    ours = best_of(lambda: ap.robust_curve(curve), 7)
    today = best_of(lambda: ap.count_spikes(deltas, window=10, sigma=3.0), 7)
    print("\n3. kernel time")
    ratio = report(
        f"robust_curve, {n} points",
        ours,
        "sway count_spikes (window 10)",
        today,
        "(target: ours within 2x, i.e. ratio >= 0.5x)",
    )
    print(f"  robust analysis costs {1 / ratio:.2f}x the sway spike kernel")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    root = ensure_corpus(args.corpus)
    confusion(root)
    spike_detection(root, args.trials, args.seed)
    kernel_time(args.seed)
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
