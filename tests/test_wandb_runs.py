"""W&B run directories, written by the real ``wandb`` SDK in offline mode and
read by the Rust core without importing wandb: every run (``wandb/run-*/``,
``offline-run-*/``) is a store judged on the loss in its ``run-<id>.wandb``
log. The reference the reader is held to is wandb's own protobuf decoder
over a plain-Python reading of the log's block framing.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import adapterprobe as ap

wandb = pytest.importorskip("wandb")


def log_run(
    root: Path, name: str, rows: list[dict[str, float]], step_key: str | None = None
) -> Path:
    """Log `rows` offline under root/wandb/ and return the run directory."""
    run = wandb.init(
        project="probe-tests",
        name=name,
        mode="offline",
        dir=str(root),
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        reinit="create_new",
    )
    for i, row in enumerate(rows):
        if step_key is None:
            run.log(row)
        else:
            run.log({**row, step_key: i})
    run.finish()
    return Path(run.dir).parent


def decaying(n: int) -> list[float]:
    return [2.0 * math.exp(-i / 12) + 0.4 for i in range(n)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    os.environ["WANDB_SILENT"] = "true"
    root = tmp_path_factory.mktemp("wandb-store")
    out = {}
    # HF's callback: train/* rows and eval/* rows keyed by train/global_step.
    rows: list[dict[str, float]] = []
    for i, loss in enumerate(decaying(60)):
        rows.append(
            {
                "train/loss": loss,
                "train/learning_rate": 1e-4,
                "train/grad_norm": 1.2,
                "train/reward": 1.0 - loss / 3,
            }
        )
        if i % 10 == 9:
            rows.append({"eval/loss": loss * 1.1})
    hf = []
    step = 0
    for row in rows:
        if "train/loss" in row:
            step += 10
        hf.append({**row, "train/global_step": step})
    out["healthy"] = log_run(root, "healthy", hf)
    out["diverged"] = log_run(root, "lr-too-high", [{"loss": 1.0 + 0.08 * i} for i in range(50)])
    out["nan"] = log_run(
        root, "nan", [{"train_loss_step": x} for x in decaying(40) + [float("nan")] * 3]
    )
    out["no-loss"] = log_run(root, "metrics-only", [{"accuracy": 0.5 + i / 100} for i in range(10)])
    out["root"] = root
    return out


def test_each_run_is_a_store_judged_on_its_loss(runs):
    report = ap.scan(runs["root"], probes=["training_drift"])
    by_store = {Path(r.store): r for r in report}
    wanted = {runs[k] for k in ("healthy", "diverged", "nan", "no-loss")}
    # latest-run, W&B's link to the newest run, is not a fifth store.
    assert set(by_store) == wanted
    assert {r.layout for r in report} == {"wandb"}
    healthy = by_store[runs["healthy"]]
    assert healthy.verdict.value == "pass", healthy.message
    assert healthy.evidence["series"] == "train/loss"
    assert healthy.evidence["log_source"] == "wandb"
    assert healthy.evidence["num_steps"] == 60
    run_id = runs["healthy"].name.rsplit("-", 1)[-1]
    assert healthy.evidence["run"] == f"probe-tests/healthy ({run_id})"
    assert by_store[runs["diverged"]].verdict.value == "fail"
    assert by_store[runs["nan"]].verdict.value == "fail"
    skip = by_store[runs["no-loss"]]
    assert skip.verdict.value == "skip", skip.message
    assert "accuracy" in skip.message


def test_side_series_are_read_at_the_trainers_step(runs):
    curve = ap.read_loss_curve(runs["healthy"])
    assert curve.source == "wandb" and curve.series == "train/loss"
    assert list(curve.steps) == list(range(10, 610, 10))
    # Eval rows are W&B steps of their own but share the optimizer step.
    assert [s for s, _ in curve.eval_loss] == list(range(100, 610, 100))
    assert len(curve.grad_norm) == 60 and len(curve.learning_rate) == 60
    assert len(curve.reward) == 60 and curve.reward[0] == (10, pytest.approx(1.0 - 2.4 / 3))
    other = ap.read_loss_curve(runs["healthy"], tag="eval/loss")
    assert other.series == "eval/loss" and len(other) == 6
    with pytest.raises(ap.UsageError, match="train/loss"):
        ap.read_loss_curve(runs["healthy"], tag="no-such-series")


def reference_series(log: Path) -> dict[str, list[tuple[int, float]]]:
    """The history of a run log as wandb's own protobuf classes decode it,
    framed by a plain-Python reading of the LevelDB-style blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = log.read_bytes()
    assert data[:7] == b":W&B\xe1\xbe\x00"
    at, block, pending, records = 7, 32768, b"", []
    while at + 7 <= len(data):
        if block - at % block < 7:
            at += block - at % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[at : at + 7])
        payload = data[at + 7 : at + 7 + length]
        assert zlib.crc32(bytes([kind]) + payload) == crc
        at += 7 + length
        if kind == 1:
            records.append(payload)
        elif kind == 2:
            pending = payload
        elif kind in (3, 4):
            pending += payload
            if kind == 4:
                records.append(pending)
    out: dict[str, list[tuple[int, float]]] = {}
    for raw in records:
        record = pb.Record.FromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        items = {
            (item.key or ".".join(item.nested_key)): item.value_json for item in record.history.item
        }
        step = int(float(items["train/global_step"])) if "train/global_step" in items else None
        if step is None:
            step = record.history.step.num
        for key, text in items.items():
            if key.startswith("_") or key == "train/global_step":
                continue
            out.setdefault(key, []).append((step, float(text)))
    return out


@pytest.mark.parametrize("which", ["healthy", "diverged", "nan"])
def test_the_reader_agrees_with_wandbs_own_decoder(runs, which):
    run_dir = runs[which]
    (log,) = run_dir.glob("run-*.wandb")
    reference = reference_series(log)
    curve = ap.read_loss_curve(run_dir)
    points = dict(reference[curve.series])
    assert list(curve.steps) == sorted(points)
    for step, loss in zip(curve.steps, curve.losses, strict=True):
        want = points[step]
        assert loss == want or (math.isinf(loss) and not math.isfinite(want))


def test_a_run_still_writing_is_read_up_to_its_torn_tail(runs, tmp_path):
    (log,) = runs["healthy"].glob("run-*.wandb")
    copy = tmp_path / "offline-run-20260101_000000-torn"
    copy.mkdir()
    data = log.read_bytes()
    (copy / log.name).write_bytes(data[: len(data) * 2 // 3])
    curve = ap.read_loss_curve(copy)
    assert 0 < len(curve) < 60
    assert curve.torn_files == [copy / log.name]
    record = ap.training_drift(copy)
    assert record.verdict.value in {"pass", "warn"}, record.message


def test_hostile_run_logs_get_an_error_not_a_crash(tmp_path):
    run = tmp_path / "run-20260101_000000-bad"
    run.mkdir()
    for junk in [b"", b"not a log", b":W&B\xe1\xbe\x07" + os.urandom(4000), os.urandom(70000)]:
        (run / "run-bad.wandb").write_bytes(junk)
        record = ap.training_drift(run)
        assert record.verdict.value in {"error", "skip"}, record.message


def test_the_reader_does_not_import_wandb(runs):
    """A child process with wandb made unimportable reads the same run."""
    code = (
        "import sys; sys.modules['wandb'] = None\n"
        "import adapterprobe as ap\n"
        f"print(ap.scan({str(runs['root'])!r}, probes=['training_drift']).counts)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pass" in out.stdout


def hf_train(out: Path, monkeypatch, **overrides):
    """A tiny LLaMA trained by the real HF Trainer with report_to="wandb",
    W&B offline and its run folder inside the output dir."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_integrations import TokenData
    from test_monitor import tiny_llama

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(out))
    monkeypatch.setenv("WANDB_PROJECT", "probe-tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # settings are read once per process: take these
    torch.manual_seed(0)
    settings = dict(
        output_dir=str(out),
        max_steps=12,
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=3e-3,
        report_to="wandb",
        run_name="hf-tiny",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    settings.update(overrides)
    trainer = transformers.Trainer(
        model=tiny_llama(),
        args=transformers.TrainingArguments(**settings),
        train_dataset=TokenData(32, 8, 64),
    )
    trainer.train()
    trainer.save_model()
    wandb.finish()  # as the process's exit would: the SDK writes the log behind
    return trainer


def test_a_trainer_run_logged_only_to_wandb_is_judged_from_its_run(tmp_path, monkeypatch):
    """save_strategy="no" leaves no trainer_state.json: the W&B run inside
    the output dir is the run's log, and part of its store."""
    out = tmp_path / "out"
    trainer = hf_train(out, monkeypatch)
    (run_dir,) = [p for p in (out / "wandb").glob("*run-*") if not p.is_symlink()]
    report = ap.scan(out, probes=["training_drift"])
    (record,) = list(report)
    assert Path(record.store) == out and record.layout == "hf-trainer"
    assert record.evidence.get("log_source") == "wandb", (record.verdict, record.message)
    assert record.evidence["series"] == "train/loss"
    assert record.evidence["num_steps"] == 12
    assert record.evidence["run"].startswith("probe-tests/hf-tiny (")
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    curve = ap.read_loss_curve(run_dir)
    assert list(curve.steps) == list(range(1, 13))
    assert list(curve.losses) == pytest.approx(logged, rel=1e-6)


def test_a_wandb_run_beside_checkpoints_is_no_store_of_its_own(tmp_path, monkeypatch):
    out = tmp_path / "out"
    hf_train(out, monkeypatch, save_strategy="steps", save_steps=6)
    report = ap.scan(out, probes=["training_drift"])
    (record,) = list(report)
    assert Path(record.store) == out and record.layout == "hf-trainer"
    # The checkpoints' trainer_state.json is the richer log, and read first.
    assert record.evidence["log_source"] == "trainer_state", record.message


def test_every_output_names_a_tracker_run_by_its_name(runs, tmp_path):
    """A W&B run's store path holds only its id (offline-run-<time>-<id>):
    the table's rows and per-store lines, the markdown summary and the HTML
    report name the run as W&B does, project/name (id) (issue 56, item 3)."""

    def adapterprobe(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "adapterprobe", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert done.returncode == 1, done.stderr
        return done.stdout

    both = (str(runs["diverged"]), str(runs["healthy"]))
    table = adapterprobe("scan", *both, "--format", "table").splitlines()
    rows = [line for line in table if "training_drift" in line]
    assert rows and "[probe-tests/lr-too-high (" in rows[0], table
    per_store = table[table.index("per store:") + 1 :]
    assert "[probe-tests/lr-too-high (" in per_store[0], table
    assert "[probe-tests/healthy (" in per_store[1], table
    markdown = adapterprobe("scan", *both, "--format", "markdown")
    assert "\\[probe-tests/lr-too-high \\(" in markdown, markdown  # escaped markdown
    page = tmp_path / "report.html"
    adapterprobe("report", *both, "-o", str(page))
    html = page.read_text(encoding="utf-8")
    assert html.count("[probe-tests/lr-too-high (") >= 1
    assert "[probe-tests/healthy (" in html


def test_a_run_reported_to_wandb_and_mlflow_is_one_run_judged_once(tmp_path, monkeypatch):
    """The HF Trainer started in a project folder with output_dir="out",
    reporting to W&B (offline) and MLflow (file store), both in the project
    folder as by default: one run on disk three times. The scan judges the
    output folder, and each tracker run is a skip that names it, since the
    output_dir its callback logged is that folder (issue 52, item 1)."""
    pytest.importorskip("mlflow")
    import mlflow

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (project / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "probe-tests")
    try:
        hf_train(
            Path("out"),
            monkeypatch,
            report_to=["wandb", "mlflow"],
            save_strategy="steps",
            save_steps=12,
        )
    finally:
        mlflow.end_run()
        mlflow.set_tracking_uri(None)
    monkeypatch.setenv("WANDB_DIR", str(project))  # hf_train put W&B under out/: move it
    (project / "out" / "wandb").rename(project / "wandb")
    records = list(ap.scan(project, probes=["training_drift"]))
    by_layout = {r.layout: r for r in records}
    assert set(by_layout) == {"hf-trainer", "wandb", "mlflow"}, [r.store for r in records]
    folder = by_layout["hf-trainer"]
    assert Path(folder.store).name == "out"
    assert folder.verdict.value != "skip", folder.message
    also = folder.evidence["also_logged_as"]
    assert any(a.startswith("W&B: probe-tests/hf-tiny") for a in also), also
    assert any(a.startswith("MLflow: probe-tests/hf-tiny") for a in also), also
    for layout in ("wandb", "mlflow"):
        twin = by_layout[layout]
        assert twin.verdict.value == "skip", twin.message
        assert twin.evidence["same_run_as"] == folder.store
        assert "the same run as" in twin.message
    # The summary counts them as judged elsewhere, not as stores never judged.
    done = subprocess.run(
        [sys.executable, "-m", "adapterprobe", "scan", str(project), "--probes", "training_drift"],
        capture_output=True,
        text=True,
    )
    summary = " ".join(done.stdout.split())
    assert "2 tracker runs judged as the output folder they logged" in summary, done.stdout
    assert "had nothing judged" not in summary, done.stdout


def test_a_bare_adapter_folder_with_its_log_is_judged_on_the_log_too(tmp_path):
    """A PEFT adapter saved with its W&B run in the same folder (WANDB_DIR
    set to it, no trainer state): the weights are not all that is judged;
    the run's log is read and its climb FAILs (issue 52, item 4)."""
    peft = pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from test_monitor import tiny_llama

    adapter = tmp_path / "adapter"
    model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    model.save_pretrained(adapter)
    (record, *_) = ap.scan(adapter, probes=["training_drift"])
    assert record.layout == "peft" and record.verdict.value == "skip"
    assert "no training log is saved with it" in record.message
    log_run(adapter, "climbing", [{"train/loss": 1.0 + 0.05 * i} for i in range(40)])
    (record,) = list(ap.scan(adapter, probes=["training_drift"]))
    assert record.layout == "peft", record.store
    assert record.evidence.get("log_source") == "wandb", record.message
    assert record.verdict.value == "fail", record.message
