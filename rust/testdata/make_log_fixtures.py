"""Generate the loss-log fixtures under rust/testdata/logs/ with the real writers.

Run it with a Python that has torch, transformers, tensorboard and lightning:

    /work/main/.venv/bin/python rust/testdata/make_log_fixtures.py

Every fixture is written by the library that writes such files in the wild
(transformers.Trainer, torch's SummaryWriter, tensorboard's own protos and
EventFileWriter, lightning.Trainer with CSVLogger). Next to each fixture a
`*.expected.json` sidecar holds the points the reference Python reader gets
(json.loads + a loop over log_history, tensorboard's EventFileLoader, the
csv module), so the Rust tests compare against the library, not against
numbers typed by hand. Floats in sidecars are `repr()` strings ("nan",
"inf", "0.1234") so that plain serde_json can read them back exactly.

Files are renamed to stable names (event file names carry a timestamp, the
host name and a pid) so regenerating does not leave stale copies behind;
the names keep their chronological order.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

OUT = Path(__file__).resolve().parent / "logs"
SEED = 1234


def rep(x: float) -> str:
    return repr(float(x))


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def event_points(path: Path) -> dict[str, list[list]]:
    """(step, value) per scalar tag in file order, read by tensorboard itself."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    points: dict[str, list[list]] = {}
    for event in EventFileLoader(str(path)).Load():
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                v = value.simple_value
            elif kind == "tensor":
                plugin = value.metadata.plugin_data.plugin_name
                if plugin not in ("", "scalars"):
                    continue
                array = tensor_util.make_ndarray(value.tensor)
                # One float32/float64 element, as the scalars plugin reads it.
                if array.size != 1 or array.dtype.name not in ("float32", "float64"):
                    continue
                v = float(array.reshape(()))
            else:
                continue
            points.setdefault(value.tag, []).append([event.step, rep(v)])
    return points


def stable_event_names(src_dir: Path, dst_dir: Path, first_time: int) -> list[Path]:
    """Copy event files in name (= time) order to stable, still ordered names."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for i, src in enumerate(sorted(src_dir.glob("events.out.tfevents.*"))):
        dst = dst_dir / f"events.out.tfevents.{first_time + 100 * i}.fixturehost.1000.{i}"
        shutil.copyfile(src, dst)
        copied.append(dst)
    return copied


# --------------------------------------------------------------------------
# 1. A real transformers.Trainer run: trainer_state.json + TensorBoard events
# --------------------------------------------------------------------------


def hf_trainer_run(work: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int, seed: int):
            g = torch.Generator().manual_seed(seed)
            self.ids = torch.randint(0, 64, (n, 16), generator=g)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    # Step (1-based) whose loss is +inf. Adding a constant leaves the
    # gradients finite, so training goes on; only the loss the Trainer sums
    # is not. The Trainer then logs `inf` at that step and NaN at every later
    # step (it resets its running sum with `tr_loss -= tr_loss`, and
    # inf - inf is NaN), which is what such a run really looks like.
    nonfinite_at = {27: float("inf")}

    class InjectingTrainer(Trainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            bad = nonfinite_at.get(self.state.global_step + 1)
            if model.training and bad is not None:
                loss = loss + torch.tensor(bad)
            return loss

    out = work / "hf_out"
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=30,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        logging_steps=1,
        # The default (True) hides NaN/inf losses behind a running mean.
        logging_nan_inf_filter=False,
        eval_strategy="steps",
        eval_steps=10,
        per_device_eval_batch_size=4,
        save_strategy="steps",
        save_steps=20,
        report_to=["tensorboard"],
        use_cpu=True,
        seed=SEED,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = InjectingTrainer(
        model=model, args=args, train_dataset=Tokens(64, 1), eval_dataset=Tokens(8, 2)
    )
    trainer.train()
    trainer.save_state()

    dst = OUT / "hf_run"
    dst.mkdir(parents=True)
    shutil.copyfile(out / "trainer_state.json", dst / "trainer_state.json")
    (dst / "checkpoint-20").mkdir()
    shutil.copyfile(
        out / "checkpoint-20" / "trainer_state.json",
        dst / "checkpoint-20" / "trainer_state.json",
    )
    run_dirs = sorted((out / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs
    events = stable_event_names(
        run_dirs[0], dst / "runs" / "Jan01_00-00-00_fixturehost", 1700000000
    )

    for state_file in [dst / "trainer_state.json", dst / "checkpoint-20" / "trainer_state.json"]:
        state = json.loads(state_file.read_text())
        train, evals = [], []
        for entry in state["log_history"]:
            if "loss" in entry and "step" in entry:
                train.append([entry["step"], rep(entry["loss"])])
            if "eval_loss" in entry and "step" in entry:
                evals.append([entry["step"], rep(entry["eval_loss"])])
        write_json(
            state_file.with_name("trainer_state.expected.json"),
            {
                "global_step": state["global_step"],
                "epoch": rep(state["epoch"]),
                "max_steps": state["max_steps"],
                "logging_steps": state["logging_steps"],
                "train_points": train,
                "eval_points": evals,
            },
        )
    write_json(dst / "runs" / "events.expected.json", {e.name: event_points(e) for e in events})


# --------------------------------------------------------------------------
# 2. torch SummaryWriter: old-style simple_value, NaN/inf, new-style tensors,
#    a histogram, and a resumed run (a second file repeating steps)
# --------------------------------------------------------------------------


def torch_writer_run(work: Path) -> None:
    import numpy as np
    from torch.utils.tensorboard import SummaryWriter

    log_dir = work / "torch_writer"
    rng = np.random.default_rng(SEED)

    first = SummaryWriter(log_dir=str(log_dir))
    for step in range(0, 12):
        loss = 2.0 * math.exp(-step / 8) + 0.01 * step
        if step == 5:
            loss = float("nan")
        if step == 8:
            loss = float("inf")
        first.add_scalar("loss", loss, step)
        first.add_scalar("lr", 1e-3 * (1 - step / 20), step)
        first.add_scalar("tensor_loss", loss, step, new_style=True)
        first.add_scalar("tensor_loss_f64", loss, step, new_style=True, double_precision=True)
        if step % 4 == 0:
            first.add_histogram("weights", rng.normal(size=64), step)
    first.add_text("note", "first run", 0)
    first.close()

    # A resumed run appends a new file; it repeats steps 9..11 with new values.
    second = SummaryWriter(log_dir=str(log_dir))
    for step in range(9, 16):
        second.add_scalar("loss", 0.5 + 0.01 * step, step)
        second.add_scalar("lr", 1e-4, step)
    second.close()

    dst = OUT / "torch_writer"
    events = stable_event_names(log_dir, dst, 1700001000)
    assert len(events) == 2, events
    write_json(dst / "events.expected.json", {e.name: event_points(e) for e in events})


# --------------------------------------------------------------------------
# 3. TF2-style tensor scalars without TensorFlow: tensorboard's own
#    scalar_pb (float_val), make_tensor_proto (double_val), and one record
#    built from tensorboard.compat.proto messages with tensor_content, as
#    TF2's C++ summary writer stores 0-d tensors. Written with tensorboard's
#    EventFileWriter (the same record framing TF uses).
# --------------------------------------------------------------------------


def tf2_tensor_file(work: Path) -> None:
    import numpy as np
    from tensorboard.compat.proto import (
        event_pb2,
        summary_pb2,
        tensor_pb2,
        tensor_shape_pb2,
        types_pb2,
    )
    from tensorboard.plugins.scalar import summary_v2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    log_dir = work / "tf2"
    writer = EventFileWriter(str(log_dir))
    scalars_meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    )
    for step in range(0, 10):
        loss = 1.5 / (1 + step)
        summary = summary_v2.scalar_pb("train_loss", np.float32(loss))
        # TF2 writers put the plugin metadata on a tag's first event only.
        double_value = summary_pb2.Summary.Value(
            tag="val_loss_f64", tensor=tensor_util.make_tensor_proto(np.float64(loss * 1.1))
        )
        content = summary_pb2.Summary.Value(
            tag="content_loss",
            tensor=tensor_pb2.TensorProto(
                dtype=types_pb2.DT_FLOAT,
                tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                tensor_content=np.float32(loss * 0.9).tobytes(),
            ),
        )
        if step == 0:
            double_value.metadata.CopyFrom(scalars_meta)
            content.metadata.CopyFrom(scalars_meta)
        summary.value.extend([double_value, content])
        # A 1-d float tensor (not a scalar) and a string tensor (text plugin).
        summary.value.add(
            tag="not_scalar", tensor=tensor_util.make_tensor_proto(np.array([1.0, 2.0], np.float32))
        )
        text = summary.value.add(
            tag="text_note", tensor=tensor_util.make_tensor_proto(np.array("hi"))
        )
        text.metadata.plugin_data.plugin_name = "text"
        writer.add_event(event_pb2.Event(wall_time=1700002000.0 + step, step=step, summary=summary))
    writer.close()

    dst = OUT / "tf2"
    events = stable_event_names(log_dir, dst, 1700002000)
    write_json(dst / "events.expected.json", {e.name: event_points(e) for e in events})


# --------------------------------------------------------------------------
# 4. A real lightning.Trainer run with CSVLogger (and TensorBoardLogger)
# --------------------------------------------------------------------------


def lightning_run(work: Path) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    L.seed_everything(SEED, verbose=False)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            logged = loss.detach()
            if self.global_step == 6:
                logged = logged + float("nan")
            self.log("train_loss", logged, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(48, 4, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(48, 1, generator=g)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:16], y[:16]), batch_size=8)

    save = work / "lightning"
    trainer = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        log_every_n_steps=1,
        logger=[CSVLogger(str(save), name="csv"), TensorBoardLogger(str(save), name="tb")],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), train, val)

    dst = OUT / "lightning"
    (dst / "version_0").mkdir(parents=True)
    metrics = dst / "version_0" / "metrics.csv"
    shutil.copyfile(save / "csv" / "version_0" / "metrics.csv", metrics)
    events = stable_event_names(save / "tb" / "version_0", dst / "tb", 1700003000)

    columns = {}
    with open(metrics, newline="") as f:
        for row in csv.DictReader(f):
            for name, cell in row.items():
                if name != "step" and cell not in ("", None):
                    columns.setdefault(name, []).append([int(row["step"]), rep(float(cell))])
    write_json(dst / "version_0" / "metrics.expected.json", columns)
    write_json(dst / "tb" / "events.expected.json", {e.name: event_points(e) for e in events})


def main() -> int:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.pop("TENSORBOARD_LOGGING_DIR", None)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        hf_trainer_run(work)
        torch_writer_run(work)
        tf2_tensor_file(work)
        lightning_run(work)
    total = 0
    for path in sorted(OUT.rglob("*")):
        if path.is_file():
            total += path.stat().st_size
            print(f"{path.stat().st_size:8d}  {path.relative_to(OUT)}")
    print(f"{total:8d}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
