"""Remote-scan benchmark: ranged reads from a bucket against downloading every file first.

    python benches/bench_remote.py [--adapters 1000] [--hf-copies 50] [--workers 16]

A real S3 server (moto, in server mode, on 127.0.0.1 at a free port; started
and stopped here) holds `--adapters` stores: copies of the bundled demo
stores (dlm layout), of which `--hf-copies` are replaced by copies of one
real HF Trainer LoRA run (checkpoints with optimizer.pt, scheduler, RNG
state; trained once, about 20 s of CPU). Every probe runs (`full_weights`
too). Measured in the same run:

- ours: `adapterprobe` scanning `s3://bucket/prefix`, reading by range;
- reference: the same objects downloaded whole first (boto3, the same
  number of threads), then the same scan of the local copy.

Printed: wall time of each with the ratio, bytes fetched by each with the
ratio, and that both gave the same verdicts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))

import s3_loopback
from _timing import report

from adapterprobe import remote
from adapterprobe.probes import PROBES
from adapterprobe.scan import DEMO_STORE, discover, scan, scan_batches

BUCKET = "bench"


def make_tree(root: Path, adapters: int, hf_copies: int) -> None:
    demos = sorted(p for p in DEMO_STORE.iterdir() if p.is_dir())
    hf_run = None
    if hf_copies:
        from realruns.hf import train_hf_run

        hf_run = train_hf_run(root.parent / "hf-run", steps=40, save_steps=20)
    for i in range(adapters):
        dest = root / f"store-{i:05d}"
        if hf_run is not None and i % max(1, adapters // hf_copies) == 0 and hf_copies > 0:
            shutil.copytree(hf_run, dest, copy_function=os.link)
            hf_copies -= 1
        else:
            shutil.copytree(demos[i % len(demos)], dest, copy_function=os.link)


def upload(s3: object, root: Path, workers: int) -> int:
    files = [p for p in root.rglob("*") if p.is_file()]

    def put(path: Path) -> int:
        data = path.read_bytes()
        key = f"runs/{path.relative_to(root).as_posix()}"
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)  # type: ignore[attr-defined]
        return len(data)

    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(put, files))


def download_all(s3: object, dest: Path, workers: int) -> int:
    keys: list[str] = []
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="runs/")  # type: ignore[attr-defined]
    for page in pages:
        keys += [o["Key"] for o in page.get("Contents", [])]

    def get(key: str) -> int:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()  # type: ignore[attr-defined]
        path = dest / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        return len(body)

    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(get, keys))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--hf-copies", type=int, default=50)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    probes = tuple(PROBES)
    with (
        tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp,
        s3_loopback.moto_server() as url,
    ):
        os.environ.update(s3_loopback.s3_env(url))
        s3 = s3_loopback.client(url)
        s3.create_bucket(Bucket=BUCKET)
        tree = Path(tmp) / "tree"
        make_tree(tree, args.adapters, args.hf_copies)
        uploaded = upload(s3, tree, args.workers)
        print(f"{args.adapters} stores, {uploaded} bytes in the bucket", flush=True)

        start = time.perf_counter()
        targets, _ = discover(f"s3://{BUCKET}/runs", workers=args.workers)
        records = [r for b in scan_batches(targets, probes=probes, workers=args.workers) for r in b]
        per_store = remote.fetched_per_store(r.store for r in records)
        ours = time.perf_counter() - start
        remote.release_all()
        fetched = sum(b for b, _ in per_store.values())
        requests = sum(n for _, n in per_store.values())

        start = time.perf_counter()
        local = Path(tmp) / "downloaded"
        downloaded = download_all(s3, local, args.workers)
        theirs = scan(local / "runs", probes=probes, workers=args.workers)
        reference = time.perf_counter() - start

    verdicts = Counter(r.verdict.value for r in records)
    same = verdicts == Counter(r.verdict.value for r in theirs)
    report(
        f"scan s3:// ({len(targets)} stores, all probes)",
        ours,
        "download whole then scan",
        reference,
        f"verdicts {dict(verdicts)} same={same}",
    )
    ratio = downloaded / fetched if fetched else float("inf")
    print(
        f"bytes fetched: ours {fetched} in {requests} range requests "
        f"({fetched / max(1, len(per_store)):.0f} per store), download whole {downloaded}, "
        f"ratio {ratio:.1f}x",
        flush=True,
    )


if __name__ == "__main__":
    main()
