"""Local threads vs `--engine ray` on the same machine, and Ray's fixed start-up cost.

    python benches/bench_ray.py [--stores 2000]

Prints wall times for both engines over the same tree, the cost of starting
Ray and running one empty task, and from that the tree size at which Ray's
per-store speed would pay for its start-up on this machine (on one machine
Ray only adds overhead; its gain is more machines).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _timing import report
from bench_scan import make_tree

import adapterprobe as ap


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", type=int, default=2000)
    args = parser.parse_args()
    import ray

    root = make_tree(args.stores)
    ap.scan(root)  # warm the page cache for both engines
    start = time.perf_counter()
    local = ap.scan(root)
    local_s = time.perf_counter() - start

    start = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.get(ray.remote(lambda: None).remote())
    startup_s = time.perf_counter() - start
    start = time.perf_counter()
    on_ray = ap.scan(root, engine="ray")
    ray_s = time.perf_counter() - start
    ray.shutdown()
    assert on_ray.to_dicts() == local.to_dicts()

    print(f"ray start-up (init + first task): {startup_s:.2f} s")
    report(f"scan {args.stores} stores, ray engine (warm)", ray_s, "local engine", local_s)
    report(
        f"scan {args.stores} stores, ray engine incl. start-up", ray_s + startup_s, "local", local_s
    )
    per_store_local = local_s / args.stores
    per_store_ray = ray_s / args.stores
    if per_store_ray < per_store_local:
        breakeven = startup_s / (per_store_local - per_store_ray)
        print(f"ray pays off on this machine above about {breakeven:,.0f} stores")
    else:
        print(
            "on one machine ray is slower per store too; it pays off only with more machines "
            f"(local {per_store_local * 1e3:.2f} ms/store, ray {per_store_ray * 1e3:.2f} ms/store)"
        )


if __name__ == "__main__":
    main()
