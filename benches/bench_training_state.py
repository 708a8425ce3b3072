"""read_training_state vs torch.load on a dlm-style AdamW state, in the same run.

    python benches/bench_training_state.py [--mb 60] [--repeat 5]
    (or ADAPTERPROBE_BENCH_STATE_MB=60)

The state is real: LoRA-shaped float32 parameters (r=16, hidden 1536, seven
target modules per layer, as in a ~1.5B model's adapter) get two AdamW steps,
and realruns.dlm.save_training_state writes the payload with torch.save plus its
sha256 sidecar. Layers are added until exp_avg + exp_avg_sq reach --mb.

Comparisons (each printed as `name: ours X s, reference Y s, ratio Z x`):

1. whole process: `python -c` that reads the state and prints every
   per-param exp_avg_sq mean, ours vs `import torch; torch.load(...)` plus the
   same means computed in torch (float64);
2. in process, warm (file in the page cache, modules imported): ours vs
   torch.load + per-tensor float64 mean, with GB/s of exp_avg_sq storage bytes
   reduced;
3. the same with the sha256 sidecar verified, against torch.load + hashlib.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from _timing import best_of, report

DATA = Path(__file__).parent / ".data" / "training_state"

HIDDEN = 1536
RANK = 16
MODULES = 7  # q, k, v, o, gate, up, down


def make_state(mb: float) -> tuple[Path, Path]:
    """Write (or reuse) the state; return (plain .pt, .pt with a sidecar beside it)."""
    per_layer_bytes = MODULES * 2 * HIDDEN * RANK * 4 * 2  # A and B; exp_avg + exp_avg_sq
    layers = max(1, round(mb * 1e6 / per_layer_bytes))
    verified_dir = DATA / f"layers{layers}"
    verified = verified_dir / "training_state.pt"
    plain = DATA / f"layers{layers}-plain.pt"
    if not (verified.exists() and plain.exists()):
        import torch

        from realruns.dlm import save_training_state

        torch.manual_seed(0)
        params = []
        for _ in range(layers * MODULES):
            params.append(torch.nn.Parameter(torch.randn(RANK, HIDDEN) * 0.01))  # lora_A
            params.append(torch.nn.Parameter(torch.zeros(HIDDEN, RANK)))  # lora_B
        opt = torch.optim.AdamW(params, lr=1e-4)
        for _ in range(2):
            for p in params:
                p.grad = torch.randn_like(p) * 1e-3
            opt.step()
        save_training_state(
            verified,
            opt,
            global_step=2,
            epoch=0.1,
            best_val_loss=None,
            use_qlora=False,
            versions={"torch": str(torch.__version__)},
        )
        plain.unlink(missing_ok=True)
        os.link(verified, plain)  # same bytes, no sidecar beside it
    return plain, verified


OURS_SCRIPT = """
import sys
from adapterprobe._core import read_training_state
s = read_training_state(sys.argv[1])
print(s.global_step, s.epoch, s.best_val_loss, s.use_qlora)
for p in s.per_param:
    print(p.param_id, p.exp_avg_sq_mean)
"""

TORCH_SCRIPT = """
import sys, torch
s = torch.load(sys.argv[1], weights_only=True)
print(s["global_step"], s["epoch"], s["best_val_loss"], s["use_qlora"])
for pid, st in sorted(s["optimizer_state_dict"]["state"].items()):
    print(pid, torch.mean(st["exp_avg_sq"], dtype=torch.float64).item())
"""


def run_script(script: str, path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    return done.stdout


def torch_means(path: Path) -> list[float]:
    import torch

    s = torch.load(path, weights_only=True)
    return [
        torch.mean(st["exp_avg_sq"], dtype=torch.float64).item()
        for _, st in sorted(s["optimizer_state_dict"]["state"].items())
    ]


def our_means(path: Path) -> list[float]:
    from adapterprobe._core import read_training_state

    return [p.exp_avg_sq_mean for p in read_training_state(path).per_param]


def torch_means_hashed(path: Path) -> list[float]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    recorded = Path(str(path) + ".sha256").read_text().split()[0]
    if digest != recorded:
        raise RuntimeError("sidecar mismatch")
    return torch_means(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mb",
        type=float,
        default=float(os.environ.get("ADAPTERPROBE_BENCH_STATE_MB", 60)),
        help="optimizer state size (exp_avg + exp_avg_sq) in MB",
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    plain, verified = make_state(args.mb)
    import torch

    state: Any = torch.load(plain, weights_only=True)
    tensors = [s["exp_avg_sq"] for s in state["optimizer_state_dict"]["state"].values()]
    reduced_bytes = sum(t.numel() * t.element_size() for t in tensors)
    del state, tensors
    print(
        f"state: {plain.stat().st_size / 1e6:.1f} MB file, {reduced_bytes / 1e6:.1f} MB of "
        f"exp_avg_sq reduced, torch {torch.__version__}, {os.cpu_count()} CPUs",
        flush=True,
    )

    # Same answers first: a benchmark of a wrong reader is worthless.
    ours, ref = our_means(plain), torch_means(plain)
    assert len(ours) == len(ref)
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref, strict=True) if b)
    print(f"check: {len(ours)} per-param means agree with torch (max rel diff {worst:.1e})")

    # 1. whole process, cold interpreter each time, file in the page cache.
    assert run_script(OURS_SCRIPT, plain).splitlines()[1:] != []
    t_ours = best_of(lambda: run_script(OURS_SCRIPT, plain), args.repeat)
    t_ref = best_of(lambda: run_script(TORCH_SCRIPT, plain), max(2, args.repeat // 2))
    report("whole process (read + print means)", t_ours, "python+torch.load+mean", t_ref)

    # 2. in process, warm.
    our_means(plain)
    torch_means(plain)
    t_ours = best_of(lambda: our_means(plain), args.repeat)
    t_ref = best_of(lambda: torch_means(plain), args.repeat)
    report(
        "in process, warm (read + per-param means)",
        t_ours,
        "torch.load+mean",
        t_ref,
        f"ours {reduced_bytes / t_ours / 1e9:.2f} GB/s, "
        f"torch {reduced_bytes / t_ref / 1e9:.2f} GB/s",
    )

    # 3. in process, warm, with the sha256 sidecar checked by both sides.
    t_ours = best_of(lambda: our_means(verified), args.repeat)
    t_ref = best_of(lambda: torch_means_hashed(verified), args.repeat)
    report(
        "in process, warm, sha256 sidecar verified",
        t_ours,
        "hashlib+torch.load+mean",
        t_ref,
        f"ours {reduced_bytes / t_ours / 1e9:.2f} GB/s of exp_avg_sq",
    )


if __name__ == "__main__":
    main()
