"""Remote scans at a real store's latency: every answer waits `--latency-ms`.

    python benches/bench_remote_latency.py [--stores 1000] [--latency-ms 30]
                                           [--reference-stores 100]

The bucket is served by our own small S3-compatible server on 127.0.0.1
(`tests/attacks/hostile_s3.py`, started and stopped here) that sleeps
`--latency-ms` before each answer, the first-byte latency of a store in the
same region; moto answers at once, so `bench_remote.py` cannot see latency.
It holds `--stores` copies of the bundled demo stores (dlm layout, every
file: adapter, training_state.pt, logs).

Measured in the same run:

- ours: `ap.scan("s3://...")` with the default ADAPTERPROBE_REMOTE_CONCURRENCY
  (64 stores read at once);
- reference: the same scan with one store per core
  (ADAPTERPROBE_REMOTE_CONCURRENCY=2, what a scan did before), over the first
  `--reference-stores` stores, its time scaled to `--stores`;
- the latency floor: requests x latency / concurrency.

Printed: wall time, requests per store, the peak of requests in flight,
bytes fetched against the objects' size, the ratio to the floor, and whether
the verdicts equal a scan of the same tree on disk.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from _timing import report

import adapterprobe as ap
from adapterprobe.scan import DEMO_STORE
from tests.attacks.hostile_s3 import Behaviour, env, hostile_s3


def objects(stores: int) -> dict[str, bytes]:
    """`stores` stores: copies of the demo stores under runs/."""
    demos = sorted(p for p in DEMO_STORE.iterdir() if p.is_dir())
    files = {
        d: [
            (p.relative_to(d).as_posix(), p.read_bytes())
            for p in sorted(d.rglob("*"))
            if p.is_file()
        ]
        for d in demos
    }
    out = {}
    for i in range(stores):
        for rel, data in files[demos[i % len(demos)]]:
            out[f"runs/s{i:05d}/{rel}"] = data
    return out


def verdicts(report_: ap.ScanReport, root: str) -> Counter[tuple[str, str, str]]:
    """(store relative to the root, probe, verdict) of every record."""
    return Counter(
        (r.store.removeprefix(root).lstrip("/"), r.probe, r.verdict.value) for r in report_.records
    )


def remote_scan(objs: dict[str, bytes], latency: float, concurrency: int | None):
    behaviour = Behaviour(objects=objs, delay=latency)
    saved = {k: os.environ.get(k) for k in (*env("x"), "ADAPTERPROBE_REMOTE_CONCURRENCY")}
    try:
        with hostile_s3(behaviour) as url:
            os.environ.update(env(url))
            if concurrency is not None:
                os.environ["ADAPTERPROBE_REMOTE_CONCURRENCY"] = str(concurrency)
            start = time.perf_counter()
            result = ap.scan("s3://bkt/runs")
            records = list(result.records)
            wall = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return wall, behaviour, records, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--reference-stores", type=int, default=100)
    args = parser.parse_args()
    latency = args.latency_ms / 1000
    objs = objects(args.stores)
    size = sum(len(v) for v in objs.values())
    print(
        f"{args.stores} stores, {len(objs)} objects, {size} bytes; {args.latency_ms} ms a request"
    )

    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        for key, data in objs.items():
            path = Path(tmp) / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        on_disk = verdicts(ap.scan(Path(tmp) / "runs"), str(Path(tmp) / "runs"))

    wall, served, _, result = remote_scan(objs, latency, None)
    same = verdicts(result, "s3://bkt/runs") == on_disk
    concurrency = int(os.environ.get("ADAPTERPROBE_REMOTE_CONCURRENCY", "64"))
    floor = served.requests * latency / concurrency

    ref_objs = {k: v for k, v in objs.items() if int(k.split("/")[1][1:]) < args.reference_stores}
    ref_wall, ref_served, _, _ = remote_scan(ref_objs, latency, 2)
    ref_scaled = ref_wall * args.stores / args.reference_stores

    report(
        f"scan s3:// ({args.stores} stores at {args.latency_ms:g} ms)",
        wall,
        f"one store per core (2 in flight; {args.reference_stores} stores, scaled)",
        ref_scaled,
        f"same verdicts as on disk={same}",
    )
    print(
        f"requests per store: {served.requests / args.stores:.2f} "
        f"(one store per core: {ref_served.requests / args.reference_stores:.2f}); "
        f"peak in flight: {served.peak_in_flight} (one store per core: "
        f"{ref_served.peak_in_flight})"
    )
    print(
        f"bytes fetched: {served.bytes_sent} of {size} ({100 * served.bytes_sent / size:.0f}%); "
        f"latency floor {floor:.2f} s (requests x latency / {concurrency}), "
        f"wall / floor {wall / floor:.2f}x"
    )


if __name__ == "__main__":
    main()
