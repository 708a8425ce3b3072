"""The online guard replayed on the labelled public runs, record by record.

    python benches/bench_guard.py [--corpora DIR]

Each store of ``../shared/corpora`` (public-a to public-d) that holds a loss
curve is replayed through ``ap.Guard`` in step order, every logged value
of a step handed over at once, as a trainer callback would see it. Printed:

1. **false stops**: healthy runs the guard put at FAIL ("stop now") at any
   record; target 0. Beside it, the reference: Lightning's own
   ``SpikeDetection`` (fabric's, defaults: window 10, rtol 2.0, warm-up 1)
   fed the same losses, and the healthy runs it would have stopped.
2. **the contract**: stores where ``guard.result().verdict`` after the last
   record differs from ``training_drift`` on the logged run; target 0.
3. **detection**: of the runs the offline rules flag (warn or fail), how
   many the guard flagged before their last record, and the median point
   of the first flag as a share of the run's records.
4. **speed and memory at length**: a 10,000,000-record run (``--records``)
   through one guard: microseconds per ``observe`` (mean and the slowest
   call), ``result()`` at the end, and how far the process's resident memory grew (sampled);
   the reference is the same loop with the ``observe`` call left out, in
   the same process. The history is kept whole up to 65,536 records and
   thinned past it, so memory and the slowest call stay flat in the length.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import adapterprobe as ap
from adapterprobe import _core

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPORA = ROOT.parent / "shared" / "corpora"
#: The labelled corpora replayed (those present).
CORPORA = ("public-a", "public-b", "public-c", "public-d")


def spike_detection_stops(losses: list[float], skip_file: Path) -> bool:
    """Whether Lightning's SpikeDetection raises on these per-record losses."""
    import torch
    from lightning.fabric.utilities.spike import SpikeDetection, TrainingSpikeException

    strategy = SimpleNamespace(
        root_device=torch.device("cpu"),
        barrier=lambda *a, **k: None,
        reduce_boolean_decision=lambda decision, all=True: decision,
    )
    fabric = SimpleNamespace(strategy=strategy, global_rank=0)
    detector = SpikeDetection(exclude_batches_path=skip_file)
    try:
        for i, loss in enumerate(losses):
            detector.on_train_batch_end(fabric, torch.tensor(loss), None, i)
    except TrainingSpikeException:
        return True
    return False


def stores(corpora: Path) -> list[tuple[str, Path, str]]:
    out = []
    for corpus in CORPORA:
        if not (corpora / corpus / "labels.json").is_file():
            continue
        labels = json.loads((corpora / corpus / "labels.json").read_text(encoding="utf-8"))
        for name, info in labels.items():
            out.append((f"{corpus}/{name}", corpora / corpus / name, info["label"]))
    return out


def rss_mb() -> float:
    """The process's resident memory now, in MB (Linux's /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def speed(records: int) -> dict[str, float]:
    """One guard fed `records` records; the same loop without it beside."""
    clock = time.perf_counter

    def loss_at(i: int) -> float:
        return 2.0 + 1.0 / (i + 1) + 0.01 * ((i * 7919) % 13)

    before = rss_mb()
    most = before
    guard = ap.Guard()
    observe = guard.observe
    worst = 0.0
    start = clock()
    for i in range(records):
        loss = loss_at(i)
        t = clock()
        observe(i, loss)
        took = clock() - t
        if took > worst:
            worst = took
        if not i & 0xFFFFF:
            most = max(most, rss_mb())
    ours = clock() - start
    t = clock()
    verdict = guard.result().verdict.value
    result_s = clock() - t
    grown = max(most, rss_mb()) - before
    start = clock()
    for i in range(records):
        loss = loss_at(i)
        t = clock()
        took = clock() - t
        if took > worst + 1.0:  # the same work as above, never true
            worst = took
        if not i & 0xFFFFF:
            most = max(most, before)
    bare = clock() - start
    return {
        "records": records,
        "us_per_record": (ours - bare) / records * 1e6,
        "loop_us": ours / records * 1e6,
        "bare_us": bare / records * 1e6,
        "worst_ms": worst * 1e3,
        "result_ms": result_s * 1e3,
        "rss_growth_mb": grown,
        "verdict": verdict,
        "num_records": guard.num_records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", type=Path, default=DEFAULT_CORPORA)
    parser.add_argument(
        "--records", type=int, default=10_000_000, help="length of the run timed (default 10^7)"
    )
    args = parser.parse_args()
    false_stops: list[str] = []
    spike_stops: list[str] = []
    broken_contract: list[str] = []
    flagged, caught, shares = 0, 0, []
    healthy = 0
    with tempfile.TemporaryDirectory() as tmp:
        skip_file = Path(tmp) / "skip_batches.json"
        for name, path, label in stores(args.corpora):
            inputs = _core.drift_input(path.resolve())
            if inputs.curve is None or len(inputs.curve) < 3:
                continue
            guard, changes = ap.Guard.replay(path)
            offline = ap.training_drift(path).verdict.value
            result = guard.result().verdict.value
            if result != offline:
                broken_contract.append(f"{name}: guard {result}, offline {offline}")
            steps = inputs.curve.steps.tolist()
            if label == "healthy":
                healthy += 1
                stop = next((s for s, v in changes if v == "fail"), None)
                if stop is not None:
                    false_stops.append(f"{name}: FAIL at step {stop} of {steps[-1]}")
                losses = [v for v in inputs.curve.losses.tolist() if math.isfinite(v)]
                if spike_detection_stops(losses, skip_file):
                    spike_stops.append(name)
            if offline in ("warn", "fail"):
                flagged += 1
                first = next((s for s, v in changes if v in ("warn", "fail")), None)
                if first is not None and first < steps[-1]:
                    caught += 1
                    shares.append((steps.index(first) + 1) / len(steps) if first in steps else 1.0)
    print(f"healthy runs replayed: {healthy}")
    print(f"false stops (guard at FAIL mid-run): {len(false_stops)} of {healthy}")
    for line in false_stops:
        print(f"    {line}")
    print(
        f"Lightning SpikeDetection (reference) would have stopped: {len(spike_stops)} of "
        f"{healthy}: {', '.join(spike_stops)}"
    )
    print(
        "contract (result() == training_drift after the last record): "
        f"{len(broken_contract)} differ"
    )
    for line in broken_contract:
        print(f"    {line}")
    median = statistics.median(shares) if shares else float("nan")
    print(
        f"runs the offline rules flag: {flagged}; flagged by the guard before their last "
        f"record: {caught}; median first flag at {median:.0%} of the run's records"
    )
    m = speed(args.records)
    print(
        f"observe over {m['records']:,} records: {m['us_per_record']:.2f} us per record "
        f"(loop {m['loop_us']:.2f} us against the bare loop's {m['bare_us']:.2f} us, "
        f"{m['loop_us'] / m['bare_us']:.1f}x; target < 20 us); slowest call "
        f"{m['worst_ms']:.1f} ms; result() {m['result_ms']:.1f} ms ({m['verdict']}, "
        f"{m['num_records']:,} records); resident memory grew {m['rss_growth_mb']:.1f} MB"
    )


if __name__ == "__main__":
    main()
