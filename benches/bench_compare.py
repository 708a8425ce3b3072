"""``similar`` over a store of 1,000 adapters against a numpy reference that
forms every dense ΔW, in the same run.

    python benches/bench_compare.py [--adapters 1000] [--layers 32] [--hidden 128]
                                    [--reference-subset 100]

The store: one real PEFT save (``save_pretrained`` of a Llama-shaped LoRA,
r=16 on the seven projections q/k/v/o/gate/up/down of every layer) is the
template; each adapter is written with ``safetensors`` under the same keys,
shapes, dtype (F32) and ``adapter_config.json``, with its own random factors.
Every 50th adapter is a copy of the one before with a 1e-3 relative
perturbation (a planted near-duplicate). Generated once into
``benches/.data/compare/``.

Ours: ``_core.similar_adapters(root, threshold=0.99)`` in a process of its
own (RAYON_NUM_THREADS=2, page cache warm, best of 2), and that process's
peak RSS, and the CPU time it used (half of it is what two idle cores would
take at best). Target: < 10 s. The machine's load average is printed: on a shared
machine both sides slow down alike, so the ratio is the figure to compare.

Reference: numpy (float64, BLAS) on a subset of ``--reference-subset``
adapters: read every factor with ``safetensors.numpy``, form each module's
dense ΔW = s·B·A and accumulate the Gram matrix of the flattened updates
module by module (so it never holds all dense ΔW either), then the cosines.
Its cost has a part linear in the adapters (reading, forming ΔW) and a
quadratic one (the Gram); both are timed and extrapolated to the full store
(linear x n/k, quadratic x (n/k)²). The pairs both find on the subset are
checked to agree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from _timing import report

DATA = Path(__file__).parent / ".data" / "compare"
THRESHOLD = 0.99
PLANT_EVERY = 50


# Ours in a process of its own (so its peak RSS is its own): warm the page
# cache once, then the best of two.
OURS = """
import json, resource, sys, time
from adapterprobe import _core
root, threshold = sys.argv[1], float(sys.argv[2])
_core.similar_adapters(root, threshold=threshold)
best, cpu = float("inf"), float("inf")
for _ in range(2):
    start, start_cpu = time.perf_counter(), time.process_time()
    r = _core.similar_adapters(root, threshold=threshold)
    best = min(best, time.perf_counter() - start)
    cpu = min(cpu, time.process_time() - start_cpu)
print(json.dumps({"seconds": best, "cpu": cpu, "adapters": r.adapters, "pairs": len(r.pairs),
    "exact": r.pairs_exact, "considered": r.pairs_considered,
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_store(n: int, layers: int, hidden: int, rank: int) -> Path:
    """`n` PEFT-format adapters (see the module doc), written once."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    root = DATA / f"store-{n}-{layers}-{hidden}-{rank}"
    if (root / "done.json").is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    from bench_weights import save_peft_adapter

    template = save_peft_adapter(
        DATA / f"template-{layers}-{hidden}-{rank}",
        hidden=hidden,
        intermediate=int(hidden * 2.6875),
        layers=layers,
        r=rank,
    )
    shapes = {k: v.shape for k, v in load_file(template / "adapter_model.safetensors").items()}
    config = (template / "adapter_config.json").read_text(encoding="utf-8")
    rng = np.random.default_rng(0)
    previous: dict[str, np.ndarray] = {}
    for i in range(n):
        out = root / f"adapter-{i:05d}"
        out.mkdir(parents=True)
        if i % PLANT_EVERY == 1:
            tensors = {
                k: (v + 1e-3 * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
                for k, v in previous.items()
            }
        else:
            tensors = {
                k: (rng.standard_normal(s, dtype=np.float32) * 0.02) for k, s in shapes.items()
            }
        save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
        (out / "adapter_config.json").write_text(config, encoding="utf-8")
        previous = tensors
    (root / "done.json").write_text(json.dumps({"adapters": n}), encoding="utf-8")
    return root


def reference(paths: list[Path]) -> tuple[set[tuple[str, str]], float, float]:
    """Pairs at or above THRESHOLD among `paths` by dense ΔW; (pairs, linear
    seconds, quadratic seconds)."""
    import numpy as np
    from safetensors.numpy import load_file

    t0 = time.perf_counter()
    factors = []
    for p in paths:
        cfg = json.loads((p / "adapter_config.json").read_text(encoding="utf-8"))
        scale = cfg["lora_alpha"] / cfg["r"]
        t = load_file(str(p / "adapter_model.safetensors"))
        factors.append((scale, t))
    keys = sorted(k for k in factors[0][1] if ".lora_A." in k)
    n = len(paths)
    gram = np.zeros((n, n))
    linear = quadratic = 0.0
    linear += time.perf_counter() - t0
    for key in keys:
        t1 = time.perf_counter()
        dense = np.stack(
            [
                (
                    s
                    * (
                        t[key.replace("lora_A", "lora_B")].astype(np.float64)
                        @ t[key].astype(np.float64)
                    )
                ).ravel()
                for s, t in factors
            ]
        )
        t2 = time.perf_counter()
        gram += dense @ dense.T
        t3 = time.perf_counter()
        linear += t2 - t1
        quadratic += t3 - t2
    norms = np.sqrt(np.diag(gram))
    cos = gram / np.outer(norms, norms)
    pairs = {
        (str(paths[i]), str(paths[j]))
        for i in range(n)
        for j in range(i + 1, n)
        if cos[i, j] >= THRESHOLD
    }
    return pairs, linear, quadratic


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--reference-subset", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "2")

    t = time.perf_counter()
    root = make_store(args.adapters, args.layers, args.hidden, args.rank)
    print(f"store: {root} ({time.perf_counter() - t:.1f} s to make or find)", flush=True)
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", OURS, str(root), str(THRESHOLD)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    ours = json.loads(done.stdout)
    seconds = ours["seconds"]
    print(
        f"ours: {ours['adapters']} adapters, {ours['pairs']} pairs >= {THRESHOLD} "
        f"({ours['exact']} of {ours['considered']} pairs computed exactly), "
        f"{seconds:.2f} s on {os.environ['RAYON_NUM_THREADS']} threads "
        f"({ours['cpu']:.2f} s of CPU: at least {ours['cpu'] / 2:.2f} s on 2 idle cores), "
        f"peak RSS of its process {ours['rss_mib']:.0f} MiB",
        flush=True,
    )
    from adapterprobe import _core

    k = min(args.reference_subset, args.adapters)
    subset = sorted(p.parent for p in root.glob("adapter-*/adapter_model.safetensors"))[:k]
    ref_pairs, linear, quadratic = reference(subset)
    scale = args.adapters / k
    estimate = linear * scale + quadratic * scale**2
    ours_subset = _core.similar_adapters(paths=subset, threshold=THRESHOLD)
    got = {(str(p.a), str(p.b)) for p in ours_subset.pairs}
    assert got == ref_pairs, (sorted(got), sorted(ref_pairs))
    print(
        f"reference on {k} adapters: {linear:.2f} s linear (read, form ΔW) + {quadratic:.2f} s "
        f"quadratic (Gram); {len(ref_pairs)} pairs, the same as ours on the subset",
        flush=True,
    )
    report(
        f"similar over {args.adapters} adapters (r={args.rank}, 7 modules x {args.layers} layers)",
        seconds,
        f"numpy dense-ΔW reference extrapolated from {k} "
        f"(x{scale:g} linear, x{scale**2:g} quadratic)",
        estimate,
    )


if __name__ == "__main__":
    main()
