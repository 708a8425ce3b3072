"""Exploding layers: where gradient_ghost's per-layer margin comes from, and
what it catches, on real runs.

    python benches/bench_ghost_layers.py [--corpus DIR] [--spread DIR]

Healthy runs are the labelled corpus (tools/realruns/corpus.py) and the
spread runs (tools/realruns/spread.py: dlm stores of 3 to 24 layers and HF
Trainer dirs, every saved version), generated into benches/.data when
missing (a few minutes of CPU training).

1. Healthy spread, on a log scale: per tensor (module and LoRA factor), how
   far a layer sits from the median of its layers, in decades and in robust
   z (1.4826 MAD across the layers); then the rule's score, each layer's
   lift over its peers (see adapterprobe/probes/layer_lift.py), for the first
   layer and the others, and the false-alarm estimate at the threshold.
2. Verdicts: healthy versions that warn (must be 0); the corpus's faulty
   runs; the spread runs trained with one or two exploding layers (named?).
3. Injected: every healthy version with 3+ layers, its exp_avg_sq times
   20, 50 and 100 on every single layer and every pair of layers (pairs
   with 4+ layers): share caught with exactly those layers named; and, for
   x50, what a per-run robust scale (thresholds times max(1, 1.4826 MAD of
   the other layers' lifts)) would catch instead.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from bench_verdicts import DATA, ensure_corpus

import adapterprobe as ap
from adapterprobe import _core
from adapterprobe.probes.ghost import GhostOptions, judge_ghost
from adapterprobe.probes.layer_lift import FIRST_LAYER

ALARMS = {"warn", "fail", "error"}
OPTIONS = GhostOptions()


def ensure_spread(path: Path | None) -> Path:
    root = path or DATA / "spread"
    from realruns.spread import LABELS, write_spread

    listed = root / "labels.json"
    if not listed.exists() or len(json.loads(listed.read_text())) < len(LABELS):
        print(f"training the spread runs into {root} (a few minutes of CPU) ...")
        write_spread(root)
    return root


def labels_of(root: Path) -> dict[str, str]:
    return {k: v["label"] for k, v in json.loads((root / "labels.json").read_text()).items()}


def versions(store: Path) -> list[Path]:
    """Every saved optimizer state of a run (dlm versions, HF checkpoints)."""
    found = [p.parent for p in store.rglob("training_state.pt")]
    found += [p.parent for p in store.rglob("optimizer.pt")]
    return sorted(found)


def log_matrix(inputs: Any) -> dict[int, dict[int, float]] | None:
    """slot -> layer -> log10 exp_avg_sq, when every tensor is attributed and positive."""
    a = inputs.attribution
    if inputs.state is None or a is None or len(a.layer_indices) < 3:
        return None
    value = {p.param_id: p.exp_avg_sq_mean for p in inputs.state.per_param}
    out: dict[int, dict[int, float]] = {}
    for ps in a.params:
        v = value[ps.param_id]
        if not (v > 0 and math.isfinite(v)):
            return None
        out.setdefault(ps.slot, {})[ps.layer] = math.log10(v)
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    i = int(pos)
    j = min(i + 1, len(ordered) - 1)
    return ordered[i] + (ordered[j] - ordered[i]) * (pos - i)


def healthy_spread(healthy: list[tuple[str, Any]]) -> None:
    decades, zs = [], []
    first, rest = [], []
    for _, inputs in healthy:
        matrix = log_matrix(inputs)
        if matrix is None:
            continue
        for logs in matrix.values():
            med = statistics.median(logs.values())
            mad = 1.4826 * statistics.median(abs(x - med) for x in logs.values())
            far = max(abs(x - med) for x in logs.values())
            decades.append(far)
            zs.append(far / mad if mad > 0 else math.inf)
        result = judge_ghost(inputs, OPTIONS)
        for layer, lift in result.evidence["layer_log_lift"].items():
            (first if int(layer) == FIRST_LAYER else rest).append(lift)
    n_states = sum(log_matrix(i) is not None for _, i in healthy)
    print(
        f"\n1. healthy spread: {n_states} healthy versions with 3+ layers, "
        f"{len(first) + len(rest)} layers, {len(decades)} (version, tensor) pairs"
    )
    print(
        "  per tensor, max |log10 v - median over layers|: "
        f"median {statistics.median(decades):.2f}, q90 {quantile(decades, 0.9):.2f}, "
        f"max {max(decades):.2f} decades; in robust z (1.4826 MAD): median "
        f"{statistics.median(zs):.1f}, q90 {quantile(zs, 0.9):.1f}, max {max(zs):.1f}"
    )
    print(f"  layer lift over its peers, decades (x50 = {math.log10(50):.2f}):")
    tails = {}
    for name, lifts, t in (
        ("layer 0", first, OPTIONS.first_layer_lift_decades),
        ("other layers", rest, OPTIONS.layer_lift_decades),
    ):
        mu, sd = statistics.fmean(lifts), statistics.stdev(lifts)
        tails[name] = _tail((t - mu) / sd)
        print(
            f"    {name:12s} n={len(lifts):3d}  median {statistics.median(lifts):+.2f}  "
            f"q99 {quantile(lifts, 0.99):+.2f}  max {max(lifts):+.2f}  mean {mu:+.2f} "
            f"sd {sd:.2f}; WARN above {t:g}: {sum(x > t for x in lifts)} above, margin "
            f"{t - max(lifts):.2f}, threshold at {(t - mu) / sd:.1f} sd (normal tail "
            f"{tails[name]:.1e})"
        )
    for layers in (4, 32):
        rate = 1 - (1 - tails["layer 0"]) * (1 - tails["other layers"]) ** (layers - 1)
        print(
            f"  expected false alarms per healthy {layers}-layer version (normal tails): {rate:.0e}"
        )
    print(
        f"  measured: 0 allowed; 95% upper bound from 0 of {n_states} versions (rule of "
        f"three): {3 / n_states:.1%}"
    )


def _tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def verdicts(corpus: Path, spread: Path) -> None:
    print("\n2. gradient_ghost verdicts (rules=robust, every saved version)")
    for root in (corpus, spread):
        labels = labels_of(root)
        by_run: dict[str, list[Any]] = defaultdict(list)
        for record in ap.scan(root, probes=["gradient_ghost"], all_versions=True):
            by_run[Path(record.store).name].append(record)
        healthy = [r for r, lab in labels.items() if lab == "healthy"]
        states = [rec for r in healthy for rec in by_run[r]]
        alarms = [rec for rec in states if rec.verdict.value in ALARMS]
        print(
            f"  {root.name}: healthy runs warning: {len({Path(a.store).name for a in alarms})}/"
            f"{len(healthy)} ({len(alarms)}/{len(states)} versions)"
        )
        for a in alarms:
            print(f"      false alarm {Path(a.store).name}: {a.message[:160]}")
        for run, label in sorted(labels.items()):
            if label == "healthy":
                continue
            last = by_run[run][-1]
            named = last.evidence.get("exploding_layers")
            named_text = f", exploding layers named {named}" if named else ""
            print(f"      {label:24s} {run:34s} {last.verdict.value}{named_text}")


def injected(healthy: list[tuple[str, Any]]) -> None:
    print(
        "\n3. injected: exp_avg_sq times k on layers of healthy versions "
        "(caught: WARN naming exactly those layers)"
    )
    cases: dict[tuple[int, str], list[bool]] = defaultdict(list)
    four: dict[tuple[int, ...], list[bool]] = defaultdict(list)
    for _, inputs in healthy:
        if log_matrix(inputs) is None:
            continue
        layers = inputs.attribution.layer_indices
        for k in (1, 2):
            if k == 2 and len(layers) < 4:
                continue
            for bad in itertools.combinations(layers, k):
                for factor in (20, 50, 100):
                    r = judge_ghost(_scaled(inputs, set(bad), factor), OPTIONS)
                    ok = r.verdict.value == "warn" and r.evidence["exploding_layers"] == list(bad)
                    cases[(k, f"x{factor}")].append(ok)
                    if factor == 50:
                        mad_ok = _mad_scaled(r.evidence["layer_log_lift"]) == set(bad)
                        cases[(k, "x50, per-run MAD scale")].append(mad_ok)
                        if len(layers) == 4:
                            cases[(k, "x50 of 4, per-run MAD scale")].append(mad_ok)
                    if len(layers) == 4:
                        cases[(k, f"x{factor} of 4")].append(ok)
                        if factor == 50:
                            four[bad].append(ok)
    for (k, what), oks in sorted(cases.items()):
        print(
            f"  {k} layer(s) {what:28s}: caught {sum(oks)}/{len(oks)} = {sum(oks) / len(oks):.1%}"
        )
    print(
        "  x50 in 4-layer versions, by layers: "
        + ", ".join(f"{bad}: {sum(oks)}/{len(oks)}" for bad, oks in sorted(four.items()))
    )


def _mad_scaled(lifts: dict[str, float]) -> set[int]:
    """The layers the rule would flag with a per-run robust scale: each
    threshold times max(1, 1.4826 MAD of the other layers' lifts)."""
    flagged = set()
    for layer, lift in lifts.items():
        others = [v for k, v in lifts.items() if k != layer]
        med = statistics.median(others)
        scale = max(1.0, 1.4826 * statistics.median(abs(v - med) for v in others))
        first = int(layer) == FIRST_LAYER
        limit = OPTIONS.first_layer_lift_decades if first else OPTIONS.layer_lift_decades
        if lift > limit * scale:
            flagged.add(int(layer))
    return flagged


def _scaled(inputs: Any, layers: set[int], factor: float) -> Any:
    """``inputs`` with the exp_avg_sq of ``layers``' tensors times ``factor``."""
    scaled_ids = {ps.param_id for ps in inputs.attribution.params if ps.layer in layers}
    state = inputs.state
    per_param = [
        SimpleNamespace(
            param_id=p.param_id,
            exp_avg_sq_mean=p.exp_avg_sq_mean * (factor if p.param_id in scaled_ids else 1),
            nonfinite=p.nonfinite,
        )
        for p in state.per_param
    ]
    fields = ("global_step", "epoch", "best_val_loss", "use_qlora")
    new_state = SimpleNamespace(per_param=per_param, **{f: getattr(state, f) for f in fields})
    keep = ("note", "error", "optimizer", "attribution", "attribution_error", "weights_error")
    return SimpleNamespace(state=new_state, **{f: getattr(inputs, f) for f in keep})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--spread", type=Path, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    corpus = ensure_corpus(args.corpus)
    spread = ensure_spread(args.spread)
    healthy = []
    for root in (corpus, spread):
        for run, label in labels_of(root).items():
            if label == "healthy":
                healthy += [(run, _core.ghost_input(v)) for v in versions(root / run)]
    healthy_spread(healthy)
    verdicts(corpus, spread)
    injected(healthy)
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
