"""gap_monitor's false alarms and detections on runs trained here, on CPU.

    python benches/bench_gap_monitor.py [--seeds 4] [--steps 150]

No public corpus holds the GAP monitor's records, so this trains them: small
networks in a plain loop monitored by the real ``GAPMonitor`` (sink
``JsonlSink.for_store``), then judged by ``ap.gap_monitor``. Printed:

1. **false alarms**: healthy runs (MLPs with tanh/ReLU/GELU, SGD/Adam/AdamW,
   learning rates 1e-3..1e-2 with constant, warm-up and cosine schedules,
   batches of 4 to 64, sampling every 1, 2 or 5 steps, several seeds) that
   got anything but PASS; target 0. Beside it, the reference: the detector
   teams write by hand, "a layer's gradient norm 10x its previous sample",
   on the same records.
2. **detections**: faults produced by training, each with the rule that
   must fire: a NaN written into a weight (``nonfinite`` FAIL), a dead ReLU
   (``vanishing_grads``), a buggy gradient hook that multiplies one
   layer's gradient by 1000 from mid-run (``exploding_layer``), a learning
   rate that climbs until the activations blow up (``activations_growing``
   or ``nonfinite``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import tempfile
from pathlib import Path

import torch

import adapterprobe as ap
from adapterprobe import GAPMonitor
from adapterprobe.sinks import JsonlSink

ACTS = {"tanh": torch.tanh, "relu": torch.relu, "gelu": torch.nn.functional.gelu}


class Net(torch.nn.Module):
    def __init__(self, act: str, width: int, depth: int, dead: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(16 if i == 0 else width, width) for i in range(depth)]
        )
        self.head = torch.nn.Linear(width, 1)
        self.act = ACTS[act]
        self.dead = dead
        if dead:
            with torch.no_grad():
                self.layers[1].bias.fill_(-100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x)) if self.dead and i == 1 else self.act(layer(x))
        return self.head(x)


def train(store: Path, cfg: dict) -> None:
    torch.manual_seed(cfg["seed"])
    net = Net(cfg["act"], cfg["width"], cfg["depth"], cfg.get("dead", False))
    make = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    opt = make[cfg["opt"]](net.parameters(), lr=cfg["lr"])
    steps = cfg["steps"]
    if cfg.get("hook_from") is not None:
        layer = net.layers[cfg["depth"] // 2]
        start = cfg["hook_from"]
        for p in layer.parameters():
            p.register_hook(lambda g: g * 1000.0 if state["step"] >= start else g)
    monitor = GAPMonitor(net, interval=cfg["interval"], sink=JsonlSink.for_store(store, 1))
    gen = torch.Generator().manual_seed(cfg["seed"] + 100)
    w = torch.randn(16, 1, generator=gen)
    state = {"step": 0}
    for step in range(1, steps + 1):
        state["step"] = step
        frac = step / steps
        scale = {
            "constant": 1.0,
            "warmup": min(1.0, step / (0.1 * steps)),
            "cosine": 0.5 * (1 + math.cos(math.pi * frac)),
            "climb": cfg.get("climb", 1.0) ** step,
        }[cfg["schedule"]]
        for group in opt.param_groups:
            group["lr"] = cfg["lr"] * scale
        x = torch.randn(cfg["batch"], 16, generator=gen)
        y = torch.tanh(x @ w) + 0.1 * torch.randn(cfg["batch"], 1, generator=gen)
        with monitor.step(step):
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        if cfg.get("nan_at") == step:
            with torch.no_grad():
                net.layers[-1].weight[0, 0] = float("nan")
        monitor.log_step(step, loss.item())
    monitor.close()


def naive_alarm(store: Path) -> bool:
    """Any layer's gradient norm 10x its previous sample (a hand-written check)."""
    last: dict[str, float] = {}
    for log in sorted((store / "logs").glob("train-*.jsonl")):
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") != "gap":
                continue
            for key, value in rec["stats"].items():
                if key.startswith("gap/summary/grads/layers/") and key.endswith("/l2_norm"):
                    if not math.isfinite(value):
                        return True
                    prev = last.get(key)
                    if prev and value > 10 * prev:
                        return True
                    last[key] = value
    return False


def healthy_configs(seeds: int, steps: int) -> list[dict]:
    grid = itertools.product(
        ["tanh", "relu", "gelu"],
        [("sgd", 1e-2), ("adam", 1e-3), ("adamw", 3e-3)],
        ["constant", "warmup", "cosine"],
        [4, 64],
    )
    out = []
    for i, (act, (opt, lr), schedule, batch) in enumerate(grid):
        for seed in range(seeds):
            out.append(
                {
                    "act": act,
                    "opt": opt,
                    "lr": lr,
                    "schedule": schedule,
                    "batch": batch,
                    "seed": seed,
                    "width": (16, 32)[(i + seed) % 2],
                    "depth": (3, 4, 6)[(i + seed) % 3],
                    "interval": (1, 2, 5)[(i + 2 * seed) % 3],
                    "steps": steps,
                }
            )
    return out


FAULTS = {
    "nan-weight": ({"nan_at": 60}, {"nonfinite"}, "fail"),
    "dead-relu": ({"dead": True}, {"vanishing_grads"}, "warn"),
    "buggy-grad-hook-1000x": ({"hook_from": 75}, {"exploding_layer"}, None),
    "lr-climb": (
        {"schedule": "climb", "climb": 1.06, "opt": "sgd", "lr": 1e-2},
        {"activations_growing", "nonfinite", "exploding_layer"},
        None,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        healthy = healthy_configs(args.seeds, args.steps)
        ours, naive, messages = 0, 0, []
        for i, cfg in enumerate(healthy):
            store = Path(tmp) / f"healthy-{i}"
            train(store, cfg)
            result = ap.gap_monitor(store)
            if result.verdict != "pass":
                ours += 1
                messages.append(f"  {cfg}: {result.verdict}: {result.message[:160]}")
            naive += naive_alarm(store)
        print(f"healthy runs: {len(healthy)}")
        print(f"  false alarms, gap_monitor (warn or fail): {ours}")
        print(f"  false alarms, reference (a layer's grad norm 10x its previous sample): {naive}")
        print("\n".join(messages))
        print("faults trained (rule expected -> verdict, rules fired):")
        caught = 0
        for seed in range(args.seeds):
            for name, (change, rules, verdict) in FAULTS.items():
                cfg = {**healthy[seed * 7 % len(healthy)], "act": "tanh", "depth": 4}
                cfg.update(change, seed=seed)
                store = Path(tmp) / f"{name}-{seed}"
                train(store, cfg)
                result = ap.gap_monitor(store)
                fired = {f["rule"] for f in result.evidence.get("findings", [])}
                ok = bool(fired & rules) and (verdict is None or result.verdict == verdict)
                caught += ok
                mark = "ok" if ok else "MISSED"
                print(f"  {name} seed {seed}: {result.verdict} {sorted(fired)} {mark}")
        print(f"faults caught: {caught} of {args.seeds * len(FAULTS)}")


if __name__ == "__main__":
    main()
