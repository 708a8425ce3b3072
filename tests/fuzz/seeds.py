"""Seed files for the fuzzer, written by the real libraries, cached in a temp dir.

Mutating our own idea of a format would only test that idea, so every seed
is the output of the library that writes the format in the wild: PEFT's
``save_pretrained``, dlm's log and ``training_state.pt`` writers
(``tools/realruns/dlm.py``), ``torch.save`` of an optimizer state dict, a
real ``lightning.Trainer`` run (``.ckpt`` and ``CSVLogger`` ``metrics.csv``),
transformers' ``TrainerState.save_to_json`` and torch's ``SummaryWriter``.

Building imports torch, transformers, peft and lightning (tens of seconds),
so it runs once in a child process (`python -m <package>.seeds DIR`) and
the result is cached under the temp dir, keyed by the library versions and
this file's source. Kinds whose library is missing are left out.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = "seeds.json"
LIBRARIES = ("torch", "transformers", "peft", "safetensors", "lightning", "tensorboard")


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cache_key() -> str:
    """Changes when a seed-writing library or this builder changes."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(_versions(), sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _package() -> str:
    return __package__ or "tests.fuzz"


def _import_root() -> Path:
    """The sys.path entry that makes this package importable under its own name."""
    return Path(__file__).resolve().parents[_package().count(".") + 1]


def child_env() -> dict[str, str]:
    """Environment for child processes: this package and tools/ importable."""
    env = dict(os.environ)
    extra = [str(_import_root()), str(ROOT / "tools")]
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(extra + ([old] if old else []))
    return env


def ensure_seeds(cache_root: Path | None = None) -> dict[str, list[Path]]:
    """The seed files by kind, building them (in a child process) on first use."""
    base = Path(cache_root or tempfile.gettempdir()) / f"adapterprobe-fuzz-seeds-{cache_key()}"
    if not (base / MANIFEST).is_file():
        base.parent.mkdir(parents=True, exist_ok=True)
        with open(str(base) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (base / MANIFEST).is_file():
                staging = Path(tempfile.mkdtemp(prefix=base.name + ".", dir=base.parent))
                try:
                    subprocess.run(
                        [sys.executable, "-m", f"{_package()}.seeds", str(staging)],
                        check=True,
                        env=child_env(),
                        cwd=str(ROOT),
                        timeout=900,
                    )
                    shutil.rmtree(base, ignore_errors=True)
                    os.rename(staging, base)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
    manifest = json.loads((base / MANIFEST).read_text(encoding="utf-8"))
    return {kind: [base / rel for rel in files] for kind, files in manifest.items()}


# ---------------------------------------------------------------------------
# The builders (run in the child process).


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    yield


def _dlm(out: Path, seeds: dict[str, list[str]]) -> Any:
    """A PEFT adapter, its training_state.pt and its dlm logs, from a real tiny run."""
    import torch

    from realruns import dlm

    torch.manual_seed(0)
    run = dlm.train_tiny_lora(steps=4, layers=1, total_steps=8, nan_steps=(3,))
    version = dlm.write_adapter_version(out / "store", 1, run)
    rel = version.relative_to(out)
    seeds["safetensors"] = [str(rel / "adapter_model.safetensors")]
    seeds["adapter_config"] = [str(rel / "adapter_config.json")]
    seeds["training_state"] = [str(rel / "training_state.pt")]
    log = dlm.write_log(out / "store", 1, run.records, plan=dlm.training_plan(run))
    torn = dlm.write_log(
        out / "store",
        2,
        run.records,
        started=dlm.DEFAULT_START.replace(hour=12),
        complete=False,
        torn_tail=True,
    )
    seeds["dlm_log"] = [str(log.relative_to(out)), str(torn.relative_to(out))]

    # The same weights in half precision, written by safetensors itself.
    from safetensors.torch import load_file, save_file

    half = out / "half" / "adapter_model.safetensors"
    half.parent.mkdir()
    weights = load_file(str(out / rel / "adapter_model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, str(half))
    seeds["safetensors"].append(str(half.relative_to(out)))

    # The same state dict as PEFT's save_pretrained(safe_serialization=False)
    # writes it: torch.save of the tensors, read as adapter_model.bin.
    pickled = out / "pickled" / "adapter_model.bin"
    pickled.parent.mkdir()
    torch.save(weights, pickled)
    seeds["adapter_bin"] = [str(pickled.relative_to(out))]
    return run


def _optimizers(out: Path, run: Any, seeds: dict[str, list[str]]) -> None:
    """`torch.save(optimizer.state_dict())` as HF Trainer writes optimizer.pt."""
    import torch

    hf = out / "hf"
    hf.mkdir()
    torch.save(run.optimizer.state_dict(), hf / "optimizer.pt")
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for _ in range(2):
        sgd.zero_grad()
        sum((p**2).sum() for p in params).backward()
        sgd.step()
    torch.save(sgd.state_dict(), hf / "sgd_optimizer.pt")
    seeds["optimizer_pt"] = ["hf/optimizer.pt", "hf/sgd_optimizer.pt"]


def _trainer_state(out: Path, run: Any, seeds: dict[str, list[str]]) -> None:
    """transformers' own TrainerState writer, with the log_history a Trainer keeps."""
    from transformers import TrainerState

    history: list[dict[str, Any]] = []
    for rec in run.records:
        history.append(
            {
                "epoch": rec["step"] / len(run.records),
                "grad_norm": rec["grad_norm"],
                "learning_rate": rec["lr"],
                "loss": rec["loss"],
                "step": rec["step"],
            }
        )
        if rec["step"] % 2 == 0:
            history.append({"epoch": 1.0, "eval_loss": rec["loss"] * 1.1, "step": rec["step"]})
    history.append({"epoch": 1.0, "step": len(run.records), "train_loss": 1.5, "total_flos": 1})
    state = TrainerState(
        epoch=1.0,
        global_step=len(run.records),
        max_steps=len(run.records),
        logging_steps=1,
        log_history=history,
    )
    path = out / "hf" / "trainer_state.json"
    state.save_to_json(str(path))
    seeds["trainer_state"] = ["hf/trainer_state.json"]


def _trainer_log(out: Path, run: Any, seeds: dict[str, list[str]]) -> None:
    """LLaMA-Factory's trainer_log.jsonl, one json.dumps line a logging step
    as its LogCallback writes them (and an evaluation line every other step)."""
    lines = []
    total = len(run.records)
    for rec in run.records:
        common = {"current_steps": rec["step"], "total_steps": total, "epoch": rec["step"] / total}
        lines.append({**common, "loss": rec["loss"], "lr": rec["lr"], "percentage": 50.0})
        if rec["step"] % 2 == 0:
            lines.append({**common, "eval_loss": rec["loss"] * 1.1})
    path = out / "llamafactory" / "trainer_log.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    seeds["trainer_log"] = ["llamafactory/trainer_log.jsonl"]


def _wandb(out: Path, run: Any, seeds: dict[str, list[str]]) -> None:
    """A run log written by the real wandb SDK, offline: HF-style train and
    eval rows keyed by train/global_step."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    logged = wandb.init(
        project="fuzz-seed",
        name="seed",
        mode="offline",
        dir=str(out),
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        reinit="create_new",
    )
    for rec in run.records:
        row = {"train/loss": rec["loss"], "train/learning_rate": rec["lr"]}
        logged.log({**row, "train/global_step": rec["step"]})
        if rec["step"] % 2 == 0:
            logged.log({"eval/loss": rec["loss"] * 1.1, "train/global_step": rec["step"]})
    logged.finish()
    (log,) = Path(logged.dir).parent.glob("run-*.wandb")
    dest = out / "wandb_log" / "run-seed.wandb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log, dest)
    seeds["wandb_log"] = ["wandb_log/run-seed.wandb"]
    seeds[".scan_roots"].append(str(Path(logged.dir).parent.relative_to(out)))


#: Where the MLflow file store's seed run lies in a case (see ``_mlflow_files``).
MLFLOW_RUN = "mlruns/1/0123456789abcdef0123456789abcdef"


def _mlflow_files(out: Path, run: Any, seeds: dict[str, list[str]]) -> None:
    """An MLflow file store (``mlruns/``) written by the real client, as
    ``mlflow.log_metric`` leaves it: one run with a loss, an eval loss and a
    learning rate (a metric file each, one ``<ms> <value> <step>`` line a
    step) and its meta.yaml. MLflow 3 writes new file stores only when
    told to (``MLFLOW_ALLOW_FILE_STORE``)."""
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    root = out / "mlflow_files" / "mlruns"
    client = MlflowClient(tracking_uri=root.as_uri())
    experiment = client.create_experiment("fuzz-seed")
    logged = client.create_run(experiment, run_name="seed")
    metrics = []
    for rec in run.records:
        metrics.append(Metric("train/loss", rec["loss"], 1_700_000_000_000, rec["step"]))
        metrics.append(Metric("learning_rate", rec["lr"], 1_700_000_000_000, rec["step"]))
        if rec["step"] % 2 == 0:
            metrics.append(Metric("eval_loss", rec["loss"] * 1.1, 1_700_000_000_000, rec["step"]))
    client.log_batch(logged.info.run_id, metrics=metrics)
    client.set_terminated(logged.info.run_id)
    (run_dir,) = [p for p in root.glob(f"*/{logged.info.run_id}") if p.is_dir()]
    rel = run_dir.relative_to(out)
    seeds["mlflow_loss"] = [str(rel / "metrics" / "train" / "loss")]
    seeds["mlflow_eval"] = [str(rel / "metrics" / "eval_loss")]
    seeds["mlflow_lr"] = [str(rel / "metrics" / "learning_rate")]
    seeds["mlflow_meta"] = [str(rel / "meta.yaml")]
    seeds["mlflow_run_name"] = [str(rel / "tags" / "mlflow.runName")]
    seeds[".scan_roots"].append(str(root.relative_to(out)))


def _mlflow_db(out: Path, run: Any, seeds: dict[str, list[str]]) -> None:
    """An MLflow SQLite store (mlflow.db) written by the real client: one
    run with a loss, an eval loss and a learning rate."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    dest = out / "mlflow_db" / "mlflow.db"
    dest.parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{dest}")
    experiment = client.create_experiment("fuzz-seed")
    logged = client.create_run(experiment, run_name="seed")
    metrics = []
    for rec in run.records:
        metrics.append(Metric("train_loss", rec["loss"], 0, rec["step"]))
        metrics.append(Metric("learning_rate", rec["lr"], 0, rec["step"]))
        if rec["step"] % 2 == 0:
            metrics.append(Metric("eval_loss", rec["loss"] * 1.1, 0, rec["step"]))
    client.log_batch(logged.info.run_id, metrics=metrics)
    seeds["mlflow_db"] = ["mlflow_db/mlflow.db"]


def _tensorboard(out: Path, run: Any, seeds: dict[str, list[str]]) -> None:
    """An event file from torch's SummaryWriter: scalars old and new style, plus non-scalars."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    logdir = out / "tb"
    writer = SummaryWriter(str(logdir))
    for rec in run.records:
        writer.add_scalar("train/loss", rec["loss"], rec["step"])
        writer.add_scalar("train/learning_rate", rec["lr"], rec["step"], new_style=True)
    writer.add_text("note", "tiny run", 0)
    writer.add_histogram("weights", torch.arange(8.0), 0)
    writer.close()
    seeds["tfevents"] = [str(p.relative_to(out)) for p in sorted(logdir.iterdir())]


class UserConfig:
    """A user class Lightning pickles into hyper_parameters (the placeholder path)."""

    def __init__(self, width: int) -> None:
        self.width = width


def _lightning(out: Path, seeds: dict[str, list[str]]) -> None:
    """A few steps of a real lightning.Trainer: a .ckpt and CSVLogger's metrics.csv."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger

    class Module(L.LightningModule):
        def __init__(self, config: UserConfig) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(config.width, 1)

        def training_step(self, batch: Any, _index: int) -> Any:
            (x,) = batch
            loss = (self.layer(x) ** 2).mean()
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(12, 4)), batch_size=4
    )
    logger = CSVLogger(str(out / "lightning"), name="logs", version=0)
    trainer = L.Trainer(
        max_epochs=2,
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Module(UserConfig(4)), data)
    version = Path(logger.log_dir)
    seeds["csv"] = [str((version / "metrics.csv").relative_to(out))]
    seeds["ckpt"] = [str(p.relative_to(out)) for p in sorted(version.rglob("*.ckpt"))]


#: The shard names of the sharded model seed (see `_sharded_model`).
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def _sharded_model(out: Path, seeds: dict[str, list[str]]) -> None:
    """A full model saved by transformers' save_pretrained in two shards with
    their model.safetensors.index.json."""
    from realruns.tiny import tiny_llama

    model = tiny_llama(0, hidden=16, layers=2, vocab=32)
    dest = out / "sharded"
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(dest, max_shard_size=size * 2 // 3)
    shards = tuple(sorted(p.name for p in dest.glob("model-*.safetensors")))
    if shards != SHARDS:
        raise RuntimeError(f"expected shards {SHARDS}, save_pretrained wrote {shards}")
    seeds["model_index"] = [str((dest / "model.safetensors.index.json").relative_to(out))]
    for i, name in enumerate(SHARDS, 1):
        seeds[f"model_shard_{i}"] = [str((dest / name).relative_to(out))]


#: The wrong shapes an evidence value is given in the saved-scan seeds
#: (issue 51: a list, a string or ``true`` where an object is expected).
EVIDENCE_SHAPES: tuple[Any, ...] = ([1, 2], "x", True, None, {})


def _reshaped(records: list[dict[str, Any]], shape: Any, *, inner: bool) -> list[dict[str, Any]]:
    """The records with every evidence value (``inner``: every value one
    level inside each evidence value: an object's values, a list's first
    item) replaced by ``shape``."""
    out = []
    for r in records:
        evidence = dict(r.get("evidence") or {})
        for key, value in evidence.items():
            if not inner:
                evidence[key] = shape
            elif isinstance(value, dict):
                evidence[key] = dict.fromkeys(value, shape)
            elif isinstance(value, list) and value:
                evidence[key] = [shape, *value[1:]]
        out.append({**r, "evidence": evidence})
    return out


def _saved_scan(out: Path, seeds: dict[str, list[str]]) -> None:
    """What ``scan --format json`` saves (as ``scan --baseline`` and
    ``report --from`` read it back) of the bundled demo store (what the
    saved_scan target's ``scan --baseline`` compares with), the store the
    tiny run wrote and the W&B and MLflow runs; and each of them with its
    evidence values, and the values inside them, in every wrong shape of
    :data:`EVIDENCE_SHAPES`."""
    from adapterprobe.scan import DEMO_STORE

    folder = out / "saved"
    folder.mkdir()
    roots = [Path(DEMO_STORE), out / "store", *(out / r for r in seeds.pop(".scan_roots"))]
    seeds["saved_scan"] = []
    shaped = []
    for i, root in enumerate(roots):
        cmd = [sys.executable, "-m", "adapterprobe", "scan", str(root), "--format", "json"]
        done = subprocess.run(cmd, capture_output=True, check=False, timeout=300)
        records = json.loads(done.stdout)  # the seed is a saved scan
        if not records:
            raise RuntimeError(f"scan of {root} saved no records: {done.stderr[-500:]!r}")
        saved = folder / f"scan-{i}.json"
        saved.write_bytes(done.stdout)
        seeds["saved_scan"].append(str(saved.relative_to(out)))
        for k, shape in enumerate(EVIDENCE_SHAPES):
            for inner in (False, True):
                path = folder / f"scan-{i}-shape{k}{'-inner' if inner else ''}.json"
                path.write_text(json.dumps(_reshaped(records, shape, inner=inner)))
                shaped.append(str(path.relative_to(out)))
    seeds["saved_scan"] += shaped


def build(out: Path) -> dict[str, list[str]]:
    """Write every seed kind whose library is installed under `out`; return the manifest."""
    seeds: dict[str, list[str]] = {".scan_roots": []}
    with _quiet():
        run = _dlm(out, seeds)
        _optimizers(out, run, seeds)
        with contextlib.suppress(ImportError):
            _sharded_model(out, seeds)
        with contextlib.suppress(ImportError):
            _trainer_state(out, run, seeds)
        _trainer_log(out, run, seeds)
        with contextlib.suppress(ImportError):
            _tensorboard(out, run, seeds)
        with contextlib.suppress(ImportError):
            _wandb(out, run, seeds)
        with contextlib.suppress(ImportError):
            _mlflow_db(out, run, seeds)
        with contextlib.suppress(ImportError):
            _mlflow_files(out, run, seeds)
        with contextlib.suppress(ImportError):
            _lightning(out, seeds)
        _saved_scan(out, seeds)  # last: it scans the runs written above
    (out / MANIFEST).write_text(json.dumps(seeds, indent=1, sort_keys=True), encoding="utf-8")
    return seeds


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tools"))
    build(Path(sys.argv[1]))
