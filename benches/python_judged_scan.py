"""The scan as it ran before the Rust scan pass, for ``bench_scan.py`` to
time beside it in the same run: the core gathers each batch (in a thread,
GIL released, while Python judges the previous one), each probe is judged
by a call from Python (through the kernels' wrappers), and the records are
written as ``adapterprobe scan ROOT --format json`` writes them (with their
root).

    python benches/python_judged_scan.py ROOT > scan.json
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reference.scan_records import records_for

from adapterprobe import _core
from adapterprobe.comparison.baseline import root_of
from adapterprobe.probes import DEFAULT_PROBES, resolve_options
from adapterprobe.probes.drift import judge_drift
from adapterprobe.probes.full_weights import judge_full_weights
from adapterprobe.probes.ghost import judge_ghost
from adapterprobe.probes.weights import judge_weights
from adapterprobe.records import json_chunks
from adapterprobe.scan import BATCH, discover

JUDGES = {
    "training_drift": judge_drift,
    "gradient_ghost": judge_ghost,
    "full_weights": judge_full_weights,
    "adapter_weights": judge_weights,
}


def main() -> None:
    root = sys.argv[1]
    probes = DEFAULT_PROBES
    options = resolve_options(probes, None, "robust")
    targets = discover(root).targets
    batches = [targets[i : i + BATCH] for i in range(0, len(targets), BATCH)]

    def gather(batch):
        return _core.probe_targets(batch, drift=True, ghost=True, weights=True)

    out = sys.stdout
    first = True
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = [pool.submit(gather, batches[0])] if batches else []
        for i in range(len(batches)):
            gathered = pending.pop().result()
            if i + 1 < len(batches):
                pending.append(pool.submit(gather, batches[i + 1]))
            records = [
                r.replace(root=root_of(r.store, [root]))
                for inputs in gathered
                for r in records_for(inputs, probes, options, JUDGES)
            ]
            out.writelines(json_chunks(records, first=first, last=False))
            first = False
    out.write("\n]\n" if not first else "[]\n")


if __name__ == "__main__":
    main()
