"""How much second moments differ between the layers of healthy runs, and runs
whose layers' gradients were made to explode.

The corpus (:mod:`realruns.corpus`) holds six healthy runs with three or
more layers: too few to set the margin of a per-layer rule. This adds
healthy runs of many shapes, all really trained: dlm stores (3 to 24
layers; q/v, attention or all seven projections; rank 4 to 16; with and
without clipping; three schedules) and HF Trainer output dirs (Llama, Qwen2
and GPT-2, every saved checkpoint).

The exploding runs are healthy runs whose chosen layers get their LoRA
gradients multiplied by ``sqrt(50)`` in every step. Adam's update does not
change when one parameter's gradients are scaled, so without clipping such
a run trains as its healthy twin does, while those layers' ``exp_avg_sq``
end exactly 50x higher: the fault seen in real runs, made by training.
With the Trainer's clipping (global norm 1.0) the other layers' gradients
shrink a little too; the exploding layers still end about 50x above them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from adapterprobe._fs import atomic_write_text
from adapterprobe.errors import UsageError
from realruns.corpus import ALL_PROJ, QV, RunSpec, write_run

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
FACTOR = 50**0.5  # gradients x7.07: second moments x50

# (layers, targets, rank, lr, steps, schedule, batch, max_grad_norm); seed 100 + row.
_SHAPES: tuple[tuple[int, tuple[str, ...], int, float, int, str, int, float | None], ...] = (
    (4, ALL_PROJ, 4, 2e-3, 100, "cosine", 8, None),
    (6, ATTENTION, 8, 2e-3, 150, "cosine", 16, None),
    (4, QV, 16, 1e-3, 60, "constant", 4, None),
    (4, QV, 4, 1e-3, 60, "linear", 4, None),
    (4, ATTENTION, 8, 3e-4, 200, "constant", 4, None),
    (8, QV, 4, 3e-4, 100, "linear", 16, None),
    (4, ATTENTION, 16, 3e-3, 100, "constant", 8, None),
    (4, QV, 8, 3e-3, 200, "constant", 16, 1.0),
    (3, ALL_PROJ, 16, 2e-3, 150, "linear", 16, None),
    (8, ALL_PROJ, 8, 3e-4, 150, "cosine", 8, None),
    (4, ALL_PROJ, 16, 1e-3, 150, "cosine", 16, 1.0),
    (4, ATTENTION, 16, 3e-4, 150, "cosine", 4, 1.0),
    (4, ATTENTION, 8, 1e-3, 200, "linear", 4, 1.0),
    (6, ATTENTION, 8, 3e-3, 150, "cosine", 16, None),
    (5, ALL_PROJ, 4, 3e-3, 200, "cosine", 4, 1.0),
    (8, QV, 4, 1e-3, 200, "constant", 4, None),
    (4, ATTENTION, 4, 2e-3, 100, "linear", 16, 1.0),
    (8, QV, 4, 3e-3, 200, "linear", 4, 1.0),
    (6, ALL_PROJ, 4, 3e-4, 60, "cosine", 4, 1.0),
    (3, QV, 4, 1e-3, 100, "cosine", 16, 1.0),
    (4, ALL_PROJ, 4, 3e-3, 60, "constant", 8, None),
    (3, QV, 16, 3e-3, 60, "constant", 16, None),
    (8, ATTENTION, 4, 3e-3, 60, "linear", 8, 1.0),
    (4, QV, 4, 1e-3, 150, "linear", 8, 1.0),
    (12, QV, 8, 1e-3, 150, "cosine", 8, 1.0),
    (16, QV, 4, 2e-3, 120, "linear", 8, None),
    (12, ALL_PROJ, 4, 5e-4, 100, "cosine", 8, 1.0),
    (24, QV, 4, 1e-3, 100, "linear", 8, 1.0),
)


def healthy_run(row: int) -> RunSpec:
    """The healthy dlm run of row ``row`` of the shapes table."""
    layers, targets, rank, lr, steps, schedule, batch, clip = _SHAPES[row]
    what = (
        f"{layers} layers, rank {rank} on {'/'.join(t.split('_')[0] for t in targets)}, "
        f"lr {lr:g}, batch {batch}, {steps} steps, {schedule}, "
        + ("no clipping" if clip is None else f"clip {clip:g}")
    )
    return RunSpec(
        f"spread-{row:02d}",
        "healthy",
        what,
        layers=layers,
        rank=rank,
        alpha=2 * rank,
        targets=targets,
        lr=lr,
        steps=steps,
        batch=batch,
        schedule=schedule,
        warmup=max(1, steps // 10),
        seed=100 + row,
        max_grad_norm=clip,
    )


def exploding_run(row: int, layers: tuple[int, ...]) -> RunSpec:
    """The healthy run ``row`` with ``layers``' LoRA gradients times FACTOR."""
    base = healthy_run(row)
    named = "-".join(map(str, layers))
    return dataclasses.replace(
        base,
        name=f"{base.name}-x50-layer{'s' if len(layers) > 1 else ''}-{named}",
        label="exploded_second_moments",
        what=f"{base.what}; layer(s) {named}: LoRA gradients x{FACTOR:.3g} every step",
        explode_layers=layers,
        explode_factor=FACTOR,
    )


@dataclass(frozen=True)
class HFRun:
    """One HF Trainer run (:func:`realruns.hf.train_hf_run`) with LoRA on q/v
    (c_attn/c_proj for GPT-2), 60 steps, a checkpoint every 20."""

    name: str
    label: str
    model: str
    layers: int
    seed: int
    lr: float
    grad_scale: tuple[int, ...] = ()  # layers whose gradients are scaled by FACTOR


HEALTHY: tuple[RunSpec, ...] = tuple(healthy_run(row) for row in range(len(_SHAPES)))

HF_HEALTHY: tuple[HFRun, ...] = (
    HFRun("hf-llama-4-0", "healthy", "llama", 4, 0, 2e-3),
    HFRun("hf-llama-4-1", "healthy", "llama", 4, 1, 1e-3),
    HFRun("hf-qwen2-4-0", "healthy", "qwen2", 4, 0, 2e-3),
    HFRun("hf-qwen2-5-2", "healthy", "qwen2", 5, 2, 1e-3),
    HFRun("hf-gpt2-4-0", "healthy", "gpt2", 4, 0, 2e-3),
    HFRun("hf-gpt2-4-3", "healthy", "gpt2", 4, 3, 1e-3),
    HFRun("hf-llama-6-4", "healthy", "llama", 6, 4, 2e-3),
    HFRun("hf-llama-3-5", "healthy", "llama", 3, 5, 3e-3),
)

EXPLODING: tuple[RunSpec, ...] = (
    exploding_run(3, (1,)),
    exploding_run(3, (1, 2)),
    exploding_run(3, (2, 3)),
    exploding_run(1, (3,)),
    exploding_run(1, (2, 4)),
    exploding_run(21, (1,)),
)

HF_EXPLODING: tuple[HFRun, ...] = (
    HFRun("hf-llama-4-0-x50-layer-2", "exploded_second_moments", "llama", 4, 0, 2e-3, (2,)),
    HFRun("hf-llama-4-0-x50-layers-1-2", "exploded_second_moments", "llama", 4, 0, 2e-3, (1, 2)),
    HFRun("hf-qwen2-4-0-x50-layer-1", "exploded_second_moments", "qwen2", 4, 0, 2e-3, (1,)),
)

#: Run name -> (label, what was done).
LABELS: dict[str, tuple[str, str]] = {
    **{s.name: (s.label, s.what) for s in HEALTHY + EXPLODING},
    **{
        r.name: (
            r.label,
            f"HF Trainer, {r.model}, {r.layers} layers, lr {r.lr:g}, seed {r.seed}"
            + (f"; layer(s) {r.grad_scale}: gradients x{FACTOR:.3g}" if r.grad_scale else ""),
        )
        for r in HF_HEALTHY + HF_EXPLODING
    },
}


def write_spread(
    root: str | os.PathLike[str], *, names: Iterable[str] | None = None
) -> dict[str, Path]:
    """Train the runs (default: all; ``names`` picks some) into ``root/<name>/``
    and write ``root/labels.json`` for every run found there afterwards.
    Existing runs are kept, never overwritten; each is built in a staging
    directory and renamed into place."""
    from realruns.hf import train_hf_run

    root = Path(root)
    chosen = list(LABELS) if names is None else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n not in LABELS]
    if unknown:
        raise UsageError(f"unknown spread runs {unknown}; known: {', '.join(LABELS)}")
    root.mkdir(parents=True, exist_ok=True)
    dlm = {s.name: s for s in HEALTHY + EXPLODING}
    hf = {r.name: r for r in HF_HEALTHY + HF_EXPLODING}
    written: dict[str, Path] = {}
    for name in chosen:
        if (root / name).exists():
            continue
        staging = Path(tempfile.mkdtemp(prefix=".spread-", dir=root))
        try:
            out = staging / name
            if name in dlm:
                out.mkdir()
                write_run(out, dlm[name])
            else:
                r = hf[name]
                train_hf_run(
                    out,
                    model=r.model,
                    layers=r.layers,
                    steps=60,
                    save_steps=20,
                    lr=r.lr,
                    seed=r.seed,
                    tensorboard=False,
                    grad_scale={layer: FACTOR for layer in r.grad_scale},
                )
            os.rename(out, root / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        written[name] = root / name
    present = {n: {"label": lab, "what": what} for n, (lab, what) in LABELS.items()}
    present = {n: v for n, v in present.items() if (root / n).is_dir()}
    atomic_write_text(root / "labels.json", json.dumps(present, indent=2, sort_keys=True) + "\n")
    return written
