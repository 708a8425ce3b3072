"""The HF Trainer / TensorBoard / optimizer.pt readers against the usual Python
route, each pair in the same run, each checked to give the same numbers.

    python benches/bench_readers.py [--entries 200000] [--mb 60] [--repeat 3]

1. `trainer_state.json` written by `transformers.TrainerState.save_to_json`
   with `--entries` log_history records shaped like the Trainer's own
   (loss, grad_norm, learning_rate, epoch, step; an eval record every 500):
   `ap.read_loss_curve` vs `json.load` + a Python loop over log_history.
2. A TensorBoard event file written by `torch.utils.tensorboard.SummaryWriter`
   with `--entries` scalars on `train/loss` (and as many on two other tags,
   as the Trainer's TensorBoard callback logs): `ap.read_loss_curve(tag=)`
   vs `tensorboard`'s `EventAccumulator` keeping every scalar.
3. A Lightning-shaped `metrics.csv` (csv.DictWriter, as CSVLogger writes
   it: epoch, step, train_loss_step on every row, val_loss every 100th,
   other cells empty) with `--entries` rows: `ap.read_loss_curve` (which
   also reads the held-out column beside the loss) vs `csv.DictReader` +
   a loop over both columns.
4. `optimizer.pt` written by `torch.save(AdamW.state_dict())` over
   LoRA-shaped parameters with `--mb` of moments: `ap.read_optimizer_state`
   vs `torch.load` + a float64 mean of each exp_avg_sq (what the probe needs).
5. A LoRA file laid out as kohya's sd-scripts saves one (`--lora-modules`
   `lora_unet_*` modules of rank 32 on 1280-wide projections, fp16 factors
   and alpha, ss_* header), written with `safetensors`: `ap.read_adapter_weights`
   (norms, ‖ΔW‖ and the spectrum of every module) vs safetensors' own
   `load_file` + torch's ‖(alpha/r)·up·down‖ of each module.
6. A LyCORIS LoHa file (half as many 1280 x 1280 modules, dim 8:
   hada_w1_a/b, hada_w2_a/b, alpha): `ap.read_adapter_weights`, which judges
   each update as an exact rank-64 product, vs forming every ΔW whole in
   torch, (w1a·w1b) ⊙ (w2a·w2b) · alpha/dim, and its norm.

All warm: files in the page cache, modules imported, best of `--repeat`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _timing import best_of, report

import adapterprobe as ap

DATA = Path(__file__).parent / ".data" / "readers"


def _loss(step: int) -> float:
    return 2.0 + 3.0 * math.exp(-step / 5000) + 0.05 * math.sin(step * 0.7)


def make_trainer_state(entries: int) -> Path:
    path = DATA / f"trainer_state-{entries}.json"
    if path.exists():
        return path
    from transformers import TrainerState

    history: list[dict[str, float | int]] = []
    for step in range(1, entries + 1):
        history.append(
            {
                "epoch": step / 1000,
                "grad_norm": 1.0 / (1 + step % 7),
                "learning_rate": 2e-4 * (1 - step / (entries + 1)),
                "loss": _loss(step),
                "step": step,
            }
        )
        if step % 500 == 0:
            history.append({"epoch": step / 1000, "eval_loss": _loss(step) + 0.1, "step": step})
    state = TrainerState(global_step=entries, max_steps=entries, log_history=history)
    DATA.mkdir(parents=True, exist_ok=True)
    state.save_to_json(str(path))
    return path


def make_events(entries: int) -> Path:
    folder = DATA / f"tb-{entries}"
    found = sorted(folder.glob("events.out.tfevents.*")) if folder.exists() else []
    if found:
        return found[0]
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for step in range(1, entries + 1):
        writer.add_scalar("train/loss", _loss(step), step)
        writer.add_scalar("train/grad_norm", 1.0 / (1 + step % 7), step)
        writer.add_scalar("train/learning_rate", 2e-4, step)
    writer.close()
    return sorted(folder.glob("events.out.tfevents.*"))[0]


def make_metrics_csv(entries: int) -> Path:
    path = DATA / f"metrics-{entries}.csv"
    if path.exists():
        return path
    import csv

    DATA.mkdir(parents=True, exist_ok=True)
    columns = ["epoch", "step", "train_loss_step", "val_loss"]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, columns)
        writer.writeheader()
        for step in range(1, entries + 1):
            row: dict[str, object] = {"epoch": step // 1000, "step": step}
            row["train_loss_step"] = _loss(step)
            if step % 100 == 0:
                row["val_loss"] = _loss(step) + 0.1
            writer.writerow(row)
    return path


def dict_reader(path: Path) -> tuple[list[int], list[float], list[float]]:
    import csv

    steps, losses, held_out = [], [], []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["train_loss_step"]:
                steps.append(int(row["step"]))
                losses.append(float(row["train_loss_step"]))
            if row["val_loss"]:
                held_out.append(float(row["val_loss"]))
    return steps, losses, held_out


def make_optimizer(mb: float) -> Path:
    hidden, rank, modules = 1536, 16, 7
    per_layer = modules * 2 * hidden * rank * 4 * 2
    layers = max(1, round(mb * 1e6 / per_layer))
    path = DATA / f"optimizer-{layers}layers.pt"
    if path.exists():
        return path
    import torch

    torch.manual_seed(0)
    params = []
    for _ in range(layers * modules):
        params.append(torch.nn.Parameter(torch.randn(rank, hidden) * 0.01))
        params.append(torch.nn.Parameter(torch.zeros(hidden, rank)))
    opt = torch.optim.AdamW(params, lr=1e-4)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt.step()
    DATA.mkdir(parents=True, exist_ok=True)
    torch.save(opt.state_dict(), path)
    return path


def json_loop(path: Path) -> tuple[list[int], list[float]]:
    with path.open() as fh:
        state = json.load(fh)
    steps, losses = [], []
    for entry in state["log_history"]:
        if "loss" in entry:
            steps.append(int(entry["step"]))
            losses.append(float(entry["loss"]))
    return steps, losses


def event_accumulator(path: Path, tag: str) -> tuple[list[int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars(tag)
    return [e.step for e in events], [e.value for e in events]


def torch_means(path: Path) -> list[float]:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)["state"]
    return [float(state[k]["exp_avg_sq"].double().mean()) for k in sorted(state)]


def make_kohya_file(modules: int) -> Path:
    import torch
    from safetensors.torch import save_file

    path = DATA / f"kohya_{modules}.safetensors"
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(modules):
        name = f"lora_unet_down_blocks_{i // 20}_attentions_{i % 20}_to_q"
        tensors[f"{name}.lora_down.weight"] = torch.randn(32, 1280, generator=gen).half()
        tensors[f"{name}.lora_up.weight"] = (0.01 * torch.randn(1280, 32, generator=gen)).half()
        tensors[f"{name}.alpha"] = torch.tensor(16.0).half()
    save_file(tensors, str(path), metadata={"ss_network_dim": "32", "ss_steps": "1000"})
    return path


def torch_kohya_norms(path: Path) -> dict[str, float]:
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    out = {}
    for key, down in tensors.items():
        if key.endswith(".lora_down.weight"):
            module = key[: -len(".lora_down.weight")]
            up = tensors[f"{module}.lora_up.weight"].double()
            scale = float(tensors[f"{module}.alpha"]) / down.shape[0]
            out[module] = float(torch.linalg.matrix_norm(scale * (up @ down.double())))
    return out


def make_loha_file(modules: int, dim: int = 8) -> Path:
    """A LyCORIS LoHa file as its networks save one: hada_w1_a/b, hada_w2_a/b
    and alpha per module (1280 x 1280, SD's attention projections)."""
    import torch
    from safetensors.torch import save_file

    path = DATA / f"loha_{modules}_{dim}.safetensors"
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    for i in range(modules):
        name = f"lycoris_down_blocks_{i // 20}_attentions_{i % 20}_to_k"
        tensors[f"{name}.hada_w1_a"] = 0.1 * torch.randn(1280, dim, generator=gen)
        tensors[f"{name}.hada_w1_b"] = 0.1 * torch.randn(dim, 1280, generator=gen)
        tensors[f"{name}.hada_w2_a"] = 0.1 * torch.randn(1280, dim, generator=gen)
        tensors[f"{name}.hada_w2_b"] = 0.1 * torch.randn(dim, 1280, generator=gen)
        tensors[f"{name}.alpha"] = torch.tensor(float(dim) / 2)
    save_file(tensors, str(path))
    return path


def torch_loha_norms(path: Path) -> dict[str, float]:
    """Each LoHa module's update formed whole in torch (LyCORIS's forward:
    (w1a w1b) * (w2a w2b) * alpha / dim), and its Frobenius norm."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    out = {}
    for key in tensors:
        if key.endswith(".hada_w1_a"):
            module = key[: -len(".hada_w1_a")]
            w1 = tensors[f"{module}.hada_w1_a"].double() @ tensors[f"{module}.hada_w1_b"].double()
            w2 = tensors[f"{module}.hada_w2_a"].double() @ tensors[f"{module}.hada_w2_b"].double()
            scale = float(tensors[f"{module}.alpha"]) / tensors[f"{module}.hada_w1_b"].shape[0]
            out[module] = float(torch.linalg.matrix_norm(w1 * w2 * scale))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--mb", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lora-modules", type=int, default=140)
    args = parser.parse_args()

    state_path = make_trainer_state(args.entries)
    curve = ap.read_loss_curve(state_path)
    steps, losses = json_loop(state_path)
    assert curve.steps.tolist() == steps and np.allclose(curve.losses, losses)
    ours = best_of(lambda: ap.read_loss_curve(state_path), args.repeat)
    theirs = best_of(lambda: json_loop(state_path), args.repeat)
    size = state_path.stat().st_size / 1e6
    name = f"trainer_state.json {size:.0f} MB, {args.entries} steps"
    report(name, ours, "json.load + loop", theirs)

    events = make_events(args.entries)
    curve = ap.read_loss_curve(events, tag="train/loss")
    steps, values = event_accumulator(events, "train/loss")
    assert curve.steps.tolist() == steps and np.allclose(curve.losses, values)
    ours = best_of(lambda: ap.read_loss_curve(events, tag="train/loss"), args.repeat)
    theirs = best_of(lambda: event_accumulator(events, "train/loss"), args.repeat)
    size = events.stat().st_size / 1e6
    report(f"tfevents {size:.0f} MB, {3 * args.entries} scalars", ours, "EventAccumulator", theirs)

    metrics = make_metrics_csv(args.entries)
    curve = ap.read_loss_curve(metrics)
    steps, losses, held_out = dict_reader(metrics)
    assert curve.steps.tolist() == steps and np.allclose(curve.losses, losses)
    assert [v for _, v in curve.eval_loss] == held_out
    ours = best_of(lambda: ap.read_loss_curve(metrics), args.repeat)
    theirs = best_of(lambda: dict_reader(metrics), args.repeat)
    size = metrics.stat().st_size / 1e6
    report(f"metrics.csv {size:.0f} MB, {args.entries} rows", ours, "csv.DictReader + loop", theirs)

    opt_path = make_optimizer(args.mb)
    state = ap.read_optimizer_state(opt_path)
    means = torch_means(opt_path)
    got = [p.exp_avg_sq_mean for p in sorted(state.per_param, key=lambda p: p.param_id)]
    assert np.allclose(got, means, rtol=1e-9, atol=0), "means differ"
    ours = best_of(lambda: ap.read_optimizer_state(opt_path), args.repeat)
    theirs = best_of(lambda: torch_means(opt_path), args.repeat)
    size = opt_path.stat().st_size / 1e6
    report(f"optimizer.pt {size:.0f} MB", ours, "torch.load + means", theirs)

    kohya = make_kohya_file(args.lora_modules)
    name = f"kohya LoRA {kohya.stat().st_size / 1e6:.0f} MB, {args.lora_modules} modules"
    bench_norms(name, kohya, torch_kohya_norms, "safetensors load_file + torch", 1e-9, args.repeat)

    modules = args.lora_modules // 2
    loha = make_loha_file(modules)
    name = f"LyCORIS LoHa {loha.stat().st_size / 1e6:.0f} MB, {modules} modules, dim 8"
    reference = "safetensors load_file + torch, dW formed"
    bench_norms(name, loha, torch_loha_norms, reference, 1e-6, args.repeat)


def bench_norms(name: str, path: Path, theirs_fn, reference: str, rel_tol: float, repeat: int):
    """``ap.read_adapter_weights`` of a LoRA file against ``theirs_fn``
    (module name to ‖ΔW‖), checked equal within ``rel_tol``, then timed."""
    got = {m.name: m.delta_fro for m in ap.read_adapter_weights(path).modules}
    norms = theirs_fn(path)
    assert got.keys() == norms.keys() and all(
        math.isclose(got[k], norms[k], rel_tol=rel_tol) for k in norms
    ), f"{name}: norms differ"
    ours = best_of(lambda: ap.read_adapter_weights(path), repeat)
    theirs = best_of(lambda: theirs_fn(path), repeat)
    report(name, ours, reference, theirs)


if __name__ == "__main__":
    main()
