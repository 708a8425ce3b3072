"""Where a scan's time goes, per store, in one process: CPU time of each
phase of the Rust scan pass on one thread, best of `--repeat` rounds with
the phases interleaved, and each as a share of the whole pass (the
reference the ratios are against).

    python benches/bench_scan_profile.py [--stores 2000] [--repeat 5]

Phases: discovery; gathering each probe's inputs alone (`probe_targets`);
the pass without JSON (gather + verdict kernels + records handed to
Python); the pass with each record's JSON text; Python wrapping the records
(`judge_batch`). Stores are the hard-linked demo copies of bench_scan.py.
Then the JSON text a store makes, and the share of it that the sampled
series of the evidence (`*_sampled`) take.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_scan import make_tree

from adapterprobe import _core
from adapterprobe.judge import judge_batch
from adapterprobe.probes import DEFAULT_PROBES, resolve_options
from adapterprobe.scan import BATCH, discover


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stores", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = make_tree(args.stores)
    options = resolve_options(DEFAULT_PROBES, None, "robust")
    chosen = {p: options[p] for p in DEFAULT_PROBES}
    targets = discover(root).targets
    batches = [targets[i : i + BATCH] for i in range(0, len(targets), BATCH)]
    flags = {"training_drift": "drift", "gradient_ghost": "ghost", "adapter_weights": "weights"}

    def gather_only(probe: str):
        wanted = {flag: name == probe for name, flag in flags.items()}
        return lambda b: _core.probe_targets(b, workers=1, **wanted)

    phases = {
        "discovery (whole walk)": None,
        **{f"gather: {p}": gather_only(p) for p in DEFAULT_PROBES},
        "gather: all three": lambda b: _core.probe_targets(b, workers=1),
        "pass without JSON": lambda b: _core.scan_records(b, chosen, workers=1),
        "pass with JSON text": lambda b: _core.scan_records(b, chosen, workers=1, json=True),
        "pass + Python records": lambda b: judge_batch(b, DEFAULT_PROBES, options, 1, json=True),
    }
    best = dict.fromkeys(phases, float("inf"))
    for _ in range(args.repeat):
        for name, fn in phases.items():
            start = cpu()
            if fn is None:
                discover(root)
            else:
                for b in batches:
                    fn(b)
            best[name] = min(best[name], cpu() - start)
    whole = best["pass + Python records"]
    n = len(targets)
    print(f"{n:,} stores, CPU time per store on one thread, best of {args.repeat}:")
    for name, t in best.items():
        print(f"  {name:<24} {t / n * 1e6:7.1f} us  ({t / whole:5.1%} of the whole pass)")
    records = judge_batch(batches[0], DEFAULT_PROBES, options, 1, json=True)
    text = sum(len(r.to_json()) for r in records)
    sampled = sum(
        len(json.dumps(v)) for r in records for k, v in r.evidence.items() if k.endswith("_sampled")
    )
    stores = len(batches[0])
    print(
        f"JSON text: {text / stores / 1000:.1f} kB a store, {sampled / text:.0%} of it the "
        "sampled series (curve, trend, gradient norm, learning rate, held-out loss)"
    )


if __name__ == "__main__":
    main()
