"""Reading tracker stores: adapterprobe's Rust readers against the trackers'
own Python clients, on the same stores, in the same run.

    python benches/bench_trackers.py [--runs 20] [--points 2000] [--repeat 3]

MLflow file store (`mlruns/`), written by the real `mlflow` client: `--runs`
runs of `--points` steps each, logging `train/loss`, `eval_loss` and
`learning_rate`. Timed, best of `--repeat`:

- ours: `adapterprobe.read_loss_curve(run_dir)` for every run (the loss with
  its side series, as a scan reads it);
- reference: `MlflowClient().get_metric_history(run_id, key)` for the same
  three metrics of every run.

Prints both times and the ratio reference/ours.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import adapterprobe as ap


def write_store(root: Path, runs: int, points: int) -> list[tuple[str, Path]]:
    import mlflow
    from mlflow.entities import Metric

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    mlflow.set_tracking_uri(root.as_uri())
    client = mlflow.MlflowClient()
    experiment = client.create_experiment("bench")
    out = []
    for r in range(runs):
        run = client.create_run(experiment, run_name=f"run-{r}")
        metrics = []
        for step in range(points):
            loss = 2.0 * math.exp(-step / (points / 4)) + 0.3
            metrics += [
                Metric("train/loss", loss, 0, step),
                Metric("eval_loss", loss * 1.05, 0, step),
                Metric("learning_rate", 1e-4, 0, step),
            ]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000])
        out.append((run.info.run_id, root / experiment / run.info.run_id))
    return out


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--points", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "mlruns"
        runs = write_store(root, args.runs, args.points)
        client = mlflow.MlflowClient()

        def ours() -> None:
            for _, path in runs:
                curve = ap.read_loss_curve(path)
                assert len(curve) == args.points

        def theirs() -> None:
            for run_id, _ in runs:
                for key in ("train/loss", "eval_loss", "learning_rate"):
                    assert len(client.get_metric_history(run_id, key)) == args.points

        t_ours, t_ref = best(ours, args.repeat), best(theirs, args.repeat)
        print(
            f"MLflow file store, {args.runs} runs x {args.points} steps x 3 metrics: "
            f"ours {t_ours:.4f} s, MlflowClient.get_metric_history {t_ref:.4f} s, "
            f"ratio {t_ref / t_ours:.1f}x"
        )


if __name__ == "__main__":
    main()
