"""read_adapter_weights against the same numbers computed with safetensors +
torch (and + numpy), in the same run.

    python benches/bench_weights.py [--adapters 1000] [--layers 8] [--hidden 2048]

1. Whole process over a store tree of `--adapters` real PEFT adapters
   (small ones, as most stores hold): `adapterprobe scan --probes
   adapter_weights` vs one `python -c` that imports torch and safetensors and
   computes, per adapter, every module's ||A||, ||B||, ||s*B@A||_F and the
   singular values of s*B@A (the numpy twin too). Target: >= 5x.
2. In process, warm, one core (RAYON_NUM_THREADS=1): one large adapter
   (Llama-7B-shaped modules, rank 16 on all seven projections) read by
   `read_adapter_weights` vs safetensors+torch and safetensors+numpy doing the
   same, with GB/s of tensor data. Target: >= 1 GB/s per core.
Each figure is printed as a ratio against its reference measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from _timing import best_of, report

DATA = Path(__file__).parent / ".data" / "weights"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_peft_adapter(out: Path, *, hidden: int, intermediate: int, layers: int, r: int) -> Path:
    """A real PEFT save of a LoRA adapter with the given shapes. The base model
    is built on the meta device (no memory), the LoRA factors are filled with
    random values, and PEFT's own save_pretrained writes the files."""
    import peft
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 128),
        num_key_value_heads=max(1, hidden // 128),
        vocab_size=128,
    )
    with torch.device("meta"):
        base = transformers.LlamaForCausalLM(config)
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(TARGETS))
    )
    gen = torch.Generator().manual_seed(0)
    for name, param in list(model.named_parameters()):
        if "lora_" in name:
            owner = model.get_submodule(name.rsplit(".", 1)[0])
            real = torch.randn(tuple(param.shape), generator=gen) * 0.01
            owner.weight = torch.nn.Parameter(real)
    model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)
    return out


def make_tree(n: int) -> Path:
    """`n` dlm-layout stores, each pointing at a hard-linked copy of one of four
    small real adapters (hidden 256, 2 layers, rank 8)."""
    root = DATA / f"tree-{n}"
    if root.exists() and sum(1 for _ in root.iterdir()) == n:
        return root
    shutil.rmtree(root, ignore_errors=True)
    sources = [
        save_peft_adapter(DATA / f"small-{i}", hidden=256, intermediate=512, layers=2, r=8)
        for i in range(4)
    ]
    for i in range(n):
        version = root / f"store-{i:05d}" / "adapter" / "versions" / "v0001"
        shutil.copytree(sources[i % 4], version, copy_function=os.link)
        (version.parent.parent / "current.txt").write_text("versions/v0001")
    return root


REFERENCE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import {lib}
    from safetensors.{st} import load_file
    out = []
    for store in sorted(Path(sys.argv[1]).iterdir()):
        folder = store / "adapter" / "versions" / "v0001"
        cfg = json.loads((folder / "adapter_config.json").read_text())
        scale = cfg["lora_alpha"] / cfg["r"]
        t = load_file(str(folder / "adapter_model.safetensors"))
        mods = {{}}
        for key in t:
            if ".lora_A." in key:
                mods[key.split(".lora_A.")[0]] = (t[key], t[key.replace("lora_A", "lora_B")])
        for name, (a, b) in mods.items():
            {compute}
            out.append((name, na, nb, nd, sv[0]))
    print(len(out))
    """
)
# The same numbers, computed the efficient way (as ours does): the singular
# values of s*B@A from the r x r Gram matrices, ||dW||_F from their trace.
TORCH = (
    "a = a.double(); b = b.double(); g = a @ a.T; h = b.T @ b; "
    "na, nb = float(a.norm()), float(b.norm()); ev = torch.linalg.eigvals(g @ h).real; "
    "sv = sorted((scale * ev.clamp(min=0).sqrt()).tolist(), reverse=True); "
    "nd = float(scale * torch.trace(g @ h).clamp(min=0).sqrt())"
)
NUMPY = (
    "a = a.astype('f8'); b = b.astype('f8'); g = a @ a.T; h = b.T @ b; "
    "na, nb = float(numpy.linalg.norm(a)), float(numpy.linalg.norm(b)); "
    "ev = numpy.linalg.eigvals(g @ h).real; "
    "sv = sorted((scale * numpy.sqrt(numpy.clip(ev, 0, None))).tolist(), reverse=True); "
    "nd = float(scale * numpy.sqrt(max(numpy.trace(g @ h), 0)))"
)


def whole_process(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{cmd[:3]} failed: {done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    tree = make_tree(args.adapters)
    ours_cmd = [
        sys.executable,
        "-m",
        "adapterprobe",
        "scan",
        str(tree),
        "--probes",
        "adapter_weights",
        "--format",
        "json",
    ]
    torch_cmd = [
        sys.executable,
        "-c",
        REFERENCE.format(lib="torch", st="torch", compute=TORCH),
        str(tree),
    ]
    numpy_cmd = [
        sys.executable,
        "-c",
        REFERENCE.format(lib="numpy", st="numpy", compute=NUMPY),
        str(tree),
    ]
    whole_process(ours_cmd)  # warm the page cache
    # Best of --repeat for each command, interleaved round by round, so a
    # disturbance on this machine hits all three alike.
    ours = ref_torch = ref_numpy = float("inf")
    for _ in range(args.repeat):
        ours = min(ours, whole_process(ours_cmd))
        ref_torch = min(ref_torch, whole_process(torch_cmd))
        ref_numpy = min(ref_numpy, whole_process(numpy_cmd))
    name = f"adapter_weights scan, {args.adapters} adapters (whole process)"
    report(name, ours, "safetensors + torch", ref_torch, "(target >= 5x)")
    report(name, ours, "safetensors + numpy", ref_numpy, "(same target, stricter reference)")

    big = DATA / f"big-{args.layers}x{args.hidden}"
    if not (big / "adapter_model.safetensors").exists():
        shutil.rmtree(big, ignore_errors=True)
        save_peft_adapter(
            big,
            hidden=args.hidden,
            intermediate=int(args.hidden * 2.6875),
            layers=args.layers,
            r=16,
        )
    size = (big / "adapter_model.safetensors").stat().st_size
    warm = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _timing import best_of
        import adapterprobe as ap
        path = {str(big)!r}
        w = ap.read_adapter_weights(path)
        print(best_of(lambda: ap.read_adapter_weights(path), {args.repeat}), w.tensor_bytes)
        """
    )
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", warm], capture_output=True, text=True, env=env, check=True
    )
    ours_warm, data_bytes = (float(x) for x in done.stdout.split())

    import numpy
    import torch
    from safetensors.numpy import load_file as load_numpy
    from safetensors.torch import load_file as load_torch

    torch.set_num_threads(1)
    cfg = json.loads((big / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    weights = str(big / "adapter_model.safetensors")

    def with_torch() -> None:
        t = load_torch(weights)
        for key in [k for k in t if ".lora_A." in k]:
            a, b = t[key].double(), t[key.replace("lora_A", "lora_B")].double()
            float(a.norm()), float(b.norm())
            # ||s B A||_F and the spectrum through the r x r Grams, as ours does
            g, h = a @ a.T, b.T @ b
            torch.linalg.eigvalsh(g @ h * scale * scale)

    def with_numpy() -> None:
        t = load_numpy(weights)
        for key in [k for k in t if ".lora_A." in k]:
            a, b = t[key].astype("f8"), t[key.replace("lora_A", "lora_B")].astype("f8")
            float(numpy.linalg.norm(a)), float(numpy.linalg.norm(b))
            g, h = a @ a.T, b.T @ b
            numpy.linalg.eigvals(g @ h * scale * scale)

    with_torch()
    ref_warm_torch = best_of(with_torch, args.repeat)
    ref_warm_numpy = best_of(with_numpy, args.repeat)
    gbps = data_bytes / ours_warm / 1e9
    name = f"read_adapter_weights, {size / 1e6:.0f} MB adapter (warm, 1 core)"
    report(name, ours_warm, "safetensors + torch (1 thread)", ref_warm_torch, f"{gbps:.2f} GB/s")
    report(name, ours_warm, "safetensors + numpy", ref_warm_numpy, "(target >= 1 GB/s per core)")


if __name__ == "__main__":
    main()
