"""Reading tracker stores: adapterprobe's Rust readers against the trackers'
own Python readers, on the same stores, in the same run.

    python benches/bench_trackers.py [--runs 20] [--points 2000] [--repeat 3]

Each store holds `--runs` runs of `--points` steps, logging a training loss,
an eval loss and a learning rate, written by the real libraries. Timed,
best of `--repeat`, per store kind:

- MLflow file store (`mlruns/`) and MLflow SQLite store (`mlflow.db`):
  ours is `adapterprobe.read_loss_curve(run)` for every run (the loss with
  its side series, as a scan reads it); the reference is
  `MlflowClient.get_metric_history(run_id, key)` for the same three
  metrics of every run.
- W&B offline runs (`wandb/offline-run-*/run-<id>.wandb`): ours is
  `read_loss_curve(run_dir)`; wandb 0.19+ ships no Python reader of its run
  log (its DataStore moved into the Go `wandb-core`), so the reference is
  the closest one: wandb's own protobuf `Record` decoder (upb, in C) over
  the log's records, split from their 32 KiB blocks in Python, keeping the
  same three series.

Prints, per kind, the stores a scan finds, its records per probe and its
error records; then both times and the ratio reference/ours.
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import adapterprobe as ap

KEYS = ("train/loss", "eval_loss", "learning_rate")


def loss_at(step: int, points: int) -> float:
    return 2.0 * math.exp(-step / (points / 4)) + 0.3


def write_mlflow(uri: str, runs: int, points: int) -> list[str]:
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("bench")
    ids = []
    for r in range(runs):
        run = client.create_run(experiment, run_name=f"run-{r}")
        metrics = []
        for step in range(points):
            loss = loss_at(step, points)
            metrics += [
                Metric("train/loss", loss, 0, step),
                Metric("eval_loss", loss * 1.05, 0, step),
                Metric("learning_rate", 1e-4, 0, step),
            ]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000])
        ids.append(run.info.run_id)
    return ids


def write_wandb(root: Path, runs: int, points: int) -> list[Path]:
    import wandb

    os.environ["WANDB_SILENT"] = "true"
    out = []
    for r in range(runs):
        run = wandb.init(
            project="bench",
            name=f"run-{r}",
            mode="offline",
            dir=str(root),
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            reinit="create_new",
        )
        for step in range(points):
            loss = loss_at(step, points)
            run.log(
                {"train/loss": loss, "eval_loss": loss * 1.05, "learning_rate": 1e-4},
                step=step,
            )
        run.finish()
        out.append(Path(run.dir).parent)
    return out


def wandb_reference(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The three series of a run log through wandb's own protobuf decoder."""
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = run_dir.glob("run-*.wandb")
    data = log.read_bytes()
    at, block, pending = 7, 32768, b""
    series: dict[str, list[tuple[int, float]]] = {k: [] for k in KEYS}
    record = pb.Record()
    while at + 7 <= len(data):
        if block - at % block < 7:
            at += block - at % block
            continue
        length, kind = struct.unpack_from("<HB", data, at + 4)
        chunk = data[at + 7 : at + 7 + length]
        at += 7 + length
        if kind == 1:
            raw = chunk
        elif kind == 2:
            pending = chunk
            continue
        elif kind == 3:
            pending += chunk
            continue
        elif kind == 4:
            raw = pending + chunk
        else:
            continue
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        step = record.history.step.num
        for item in record.history.item:
            key = item.key or ".".join(item.nested_key)
            if key in series:
                series[key].append((step, float(item.value_json)))
    return series


def best(fn: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def found(kind: str, root: Path, expected: int) -> None:
    """Scan `root` as a user would: stores found, records per probe, errors."""
    report = ap.scan(root)
    stores = {r.store for r in report}
    per_probe = Counter(r.probe for r in report)
    errors = sum(r.verdict.value == "error" for r in report)
    print(
        f"{kind}: {len(stores)}/{expected} stores found; records: "
        + ", ".join(f"{n} {p}" for p, n in sorted(per_probe.items()))
        + f"; error records {errors}"
    )


def report(kind: str, runs: int, points: int, ours: float, ref: float, ref_name: str) -> None:
    print(
        f"{kind}, {runs} runs x {points} steps x 3 series: ours {ours:.4f} s, "
        f"{ref_name} {ref:.4f} s, ratio {ref / ours:.1f}x"
    )


def bench_mlflow(tmp: Path, args: argparse.Namespace) -> None:
    import mlflow

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    for kind, uri in [
        ("MLflow file store", (tmp / "mlruns").as_uri()),
        ("MLflow SQLite store", f"sqlite:///{tmp / 'mlflow.db'}"),
    ]:
        ids = write_mlflow(uri, args.runs, args.points)
        if uri.startswith("sqlite"):
            paths = [Path(r.store) for r in ap.scan(tmp / "mlflow.db", probes=["training_drift"])]
        else:
            paths = [p for p in (tmp / "mlruns").glob("*/*") if p.name in ids]
        assert len(paths) == args.runs, (kind, len(paths))
        found(kind, tmp / ("mlflow.db" if uri.startswith("sqlite") else "mlruns"), args.runs)
        client = mlflow.MlflowClient(tracking_uri=uri)

        def ours(paths: list[Path] = paths) -> None:
            for path in paths:
                curve = ap.read_loss_curve(path)
                assert len(curve) == args.points and len(curve.eval_loss) == args.points

        def theirs(ids: list[str] = ids, client: mlflow.MlflowClient = client) -> None:
            for run_id in ids:
                for key in KEYS:
                    assert len(client.get_metric_history(run_id, key)) == args.points

        report(
            kind,
            args.runs,
            args.points,
            best(ours, args.repeat),
            best(theirs, args.repeat),
            "MlflowClient.get_metric_history",
        )


def bench_wandb(tmp: Path, args: argparse.Namespace) -> None:
    run_dirs = write_wandb(tmp, args.runs, args.points)
    found("W&B offline runs", tmp, args.runs)

    def ours() -> None:
        for path in run_dirs:
            curve = ap.read_loss_curve(path)
            assert len(curve) == args.points and len(curve.eval_loss) == args.points

    def theirs() -> None:
        for path in run_dirs:
            assert all(len(v) == args.points for v in wandb_reference(path).values())

    report(
        "W&B offline runs",
        args.runs,
        args.points,
        best(ours, args.repeat),
        best(theirs, args.repeat),
        "wandb protobuf Record decoder",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--points", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench_mlflow(Path(tmp), args)
    with tempfile.TemporaryDirectory() as tmp:
        bench_wandb(Path(tmp), args)


if __name__ == "__main__":
    main()
