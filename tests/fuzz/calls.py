"""What each fuzz target does with a case directory, inside the worker.

Each function reads the mutated file the way a user would, through the
public Python API, then touches every property of the result so that the
Rust-to-Python conversions run too. Several readers of one input all run:
an AdapterProbeError from one does not stop the next, and the first such
error is raised at the end. Any other exception propagates at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import adapterprobe as ap

EVENTS_NAME = "events.out.tfevents.1700000000.host.1.0"


def _touch(obj: Any, depth: int = 0) -> None:
    """Read every property of a Rust result object (and of the results in it)."""
    if depth > 8:
        return
    if isinstance(obj, (list, tuple)):
        for item in obj[:64]:
            _touch(item, depth + 1)
    elif isinstance(obj, dict):
        for item in list(obj.values())[:64]:
            _touch(item, depth + 1)
    elif type(obj).__module__ == "adapterprobe._core":
        for name in dir(obj):
            if not name.startswith("_"):
                value = getattr(obj, name)
                if not callable(value):
                    _touch(value, depth + 1)
        repr(obj)


def _each(*reads: Callable[[], Any]) -> None:
    first: ap.AdapterProbeError | None = None
    for read in reads:
        try:
            _touch(read())
        except ap.AdapterProbeError as exc:
            first = first or exc
    if first is not None:
        raise first


def _curve(source: Any, **kw: Any) -> Any:
    curve = ap.read_loss_curve(source, **kw)
    _touch(curve)
    len(curve)
    curve.metrics()
    curve.metrics(rolling_window=1, spike_sigma=0.5)
    robust = curve.robust()
    if robust is not None:
        robust.relative_drop()
        robust.relative_regression()
    return curve.sample(cap=3)


def safetensors_header(case: Path) -> None:
    _each(
        lambda: ap.read_safetensors_header(case / "adapter_model.safetensors"),
        lambda: ap.group_layers(case),
        lambda: ap.group_layers(case, num_params=4),
    )


def adapter_weights(case: Path) -> None:
    _each(lambda: ap.read_adapter_weights(case))


def full_weights(case: Path) -> None:
    """A full model's weights (one file, or an index and its shards): the
    reader behind the full_weights probe, and the probe itself (which turns
    bad input into an ERROR result, raised here as the fuzzer expects)."""
    _each(lambda: ap._core.full_weights_input(case))
    result = ap.full_weights(case)
    repr(result)
    if result.verdict == "error":
        raise ap.AdapterProbeError(result.message)


def dlm_log(case: Path) -> None:
    log = case / "train-000001-20250301T090000.jsonl"
    _each(lambda: _curve(log), lambda: _curve([log]))


def trainer_state(case: Path) -> None:
    path = case / "trainer_state.json"
    _each(lambda: _curve(path), lambda: _curve(path, tag="eval_loss"))


def trainer_log(case: Path) -> None:
    path = case / "trainer_log.jsonl"
    _each(lambda: _curve(path), lambda: _curve(path, tag="eval_loss"), lambda: _curve(case))


def wandb_log(case: Path) -> None:
    path = case / "run-seed.wandb"
    _each(lambda: _curve(path), lambda: _curve(path, tag="eval/loss"), lambda: _curve(case))


def mlflow_db(case: Path) -> None:
    path = case / "mlflow.db"

    def scan() -> Any:
        report = ap.scan(case, workers=1)
        report.to_json()
        return report

    _each(lambda: _curve(path), lambda: _curve(path, tag="eval_loss"), scan)


def tfevents(case: Path) -> None:
    path = case / EVENTS_NAME
    _each(lambda: _curve(path), lambda: _curve(path, tag="train/learning_rate"))


def csv(case: Path) -> None:
    path = case / "metrics.csv"
    _each(lambda: _curve(path), lambda: _curve(path, tag="train_loss_epoch"))


def optimizer_pt(case: Path) -> None:
    _each(lambda: ap.read_optimizer_state(case / "optimizer.pt"))


def training_state(case: Path) -> None:
    path = case / "training_state.pt"
    _each(lambda: ap.read_training_state(path), lambda: ap.read_optimizer_state(path))


def ckpt(case: Path) -> None:
    _each(lambda: ap.read_optimizer_state(case / "last.ckpt"))


def store_scan(case: Path) -> None:
    """A whole dlm store with one file mutated: discovery, the three probes, the report.

    The probes turn bad input into ERROR results, not exceptions; the first
    such result is raised as an AdapterProbeError so that the fuzzer counts
    it as an error and tells its messages apart.
    """
    version = case / "adapter" / "versions" / "v0001"
    results: list[Any] = []

    def scan() -> None:
        report = ap.scan(case, workers=1)
        report.to_json()
        report.to_csv()
        report.exit_code("warn")
        results.extend(report)

    def probe(fn: Callable[[Path], Any], path: Path) -> None:
        results.append(fn(path))

    _each(
        scan,
        lambda: probe(ap.training_drift, case),
        lambda: probe(ap.gradient_ghost, version),
        lambda: probe(ap.adapter_weights, version),
    )
    for r in results:
        repr(r)
        if r.verdict == "error":
            raise ap.AdapterProbeError(r.message)


def compare_updates(case: Path) -> None:
    """The mutated adapter compared with itself (update similarity, principal
    angles) and searched for twins among two copies of it."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("a", "b"):
            shutil.copytree(case, Path(tmp) / name)
        _each(
            lambda: ap.compare(case, case).to_dict(),
            lambda: ap.similar(tmp, threshold=-1.0, exhaustive=True),
            lambda: ap.similar(tmp, threshold=0.5, max_pairs=0),
        )


def _cli(*argv: str | Path) -> str:
    """``adapterprobe ARGV`` in this process: its stdout. Exit 2 (a usage
    error, printed by the command line) is raised as a UsageError so the
    fuzzer counts it as the error it is; anything that escapes the command
    line is the traceback a user would see."""
    import contextlib
    import io

    from adapterprobe.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    if code == 2:
        raise ap.UsageError(err.getvalue()[-500:])
    if code not in (0, 1, 3):
        raise RuntimeError(f"adapterprobe {argv[0]} exited {code}: {err.getvalue()[-500:]}")
    return out.getvalue()


def _saved_outputs(path: Path, tmp: Path) -> list[Any]:
    """The reads of a saved scan: ``scan --baseline`` (the bundled demo
    store against it, matched by store name, so a scan of the demo store
    saved anywhere is compared; and every saved record against the saved
    records, so both sides of a comparison are the mutated ones),
    ``report --from`` and the other renderings of its records."""
    from adapterprobe.comparison.baseline import Gate, load_saved_scan, records_from_saved
    from adapterprobe.records import ScanReport
    from adapterprobe.scan import DEMO_STORE

    def gate() -> Any:
        records = records_from_saved(load_saved_scan(path))
        roots = sorted({r.root for r in records if r.root is not None}) or ["/"]
        g = Gate(roots, baseline=path, match="name")
        return [g.record(r).to_dict() for r in records]

    def render() -> Any:
        report = ScanReport(records_from_saved(load_saved_scan(path)), [], {})
        report.to_html(tmp / "r.html")
        report.to_markdown()
        report.to_csv()
        report.to_json()
        report._repr_html_()
        return str(report)

    return [
        gate,
        render,
        lambda: _cli("scan", DEMO_STORE, "--baseline", path, "--match", "name", "--format", "json"),
        lambda: _cli("report", "--from", path, "-o", tmp / "cli.html"),
    ]


def saved_scan(case: Path) -> None:
    """A saved scan read back as ``scan --baseline`` and ``report --from`` do."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _each(*_saved_outputs(case / "scan.json", Path(tmp)))


def tracker_run(case: Path) -> None:
    """A tracker's run (a W&B offline run directory, an MLflow file store)
    with one file mutated, scanned as a store and in every output; then its
    saved scan (``scan --format json``) read back by ``scan --baseline`` of
    the same case and ``report --from``. An error record is raised as an
    AdapterProbeError, as :func:`store_scan` does."""
    import tempfile

    results: list[Any] = []

    def scan() -> None:
        report = ap.scan(case, workers=1)
        report.to_json()
        report.to_csv()
        report.to_markdown()
        report._repr_html_()
        str(report)
        results.extend(report)

    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "saved.json"

        def save() -> None:
            saved.write_text(_cli("scan", case, "--format", "json", "--workers", "1"))

        def compare() -> str:
            return _cli("scan", case, "--baseline", saved, "--format", "json", "--workers", "1")

        _each(scan, save, compare, *_saved_outputs(saved, Path(tmp)))
    for r in results:
        repr(r)
        if r.verdict == "error":
            raise ap.AdapterProbeError(r.message)


KERNELS = ("robust_curve", "curve_metrics", "count_spikes", "spike_indices")


def kernel_call(case: Path) -> None:
    """One kernel call described by call.json (for saved kernel cases; not a fuzz target)."""
    spec = json.loads((case / "call.json").read_text(encoding="utf-8"))
    if spec["function"] not in KERNELS:
        raise ValueError(f"not a kernel: {spec['function']!r}")
    fn = getattr(ap, spec["function"])
    _touch(fn(*spec.get("args", []), **spec.get("kwargs", {})))
