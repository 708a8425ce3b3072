"""What judging costs next to the least any per-layer judge must do:
gradient_ghost's Rust kernel against one Python pass that groups the second
moments by layer and takes each layer's median, on the same inputs in one run.

    python benches/bench_ghost_kernel.py [--layers 32] [--repeat 200]

Inputs: the demo store's current versions (real dlm states), and a state
shaped like a LoRA adapter on every projection of a ``--layers``-layer model
(7 modules x 2 factors a layer, second moments spread over decades, one
layer exploding). Both rule sets; each timing is the best of 3 rounds of
``--repeat`` judgements, through ``judge_ghost`` (the kernel and the
ProbeResult it builds) and through that pass. A ratio above 1 means the
whole verdict costs less than the pass.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _timing import best_of, report

from adapterprobe import _core
from adapterprobe.probes.ghost import GhostOptions, judge_ghost
from adapterprobe.scan import DEMO_STORE

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_state(layers: int, seed: int = 0) -> Any:
    """A LoRA state of ``layers`` layers (ids layer-major), layer 5 at 50x."""
    rng = random.Random(seed)
    slots = [f"self_attn.{m}.lora_{f}" for m in MODULES for f in "AB"]
    scale = [10.0 ** rng.uniform(-12, -4) for _ in slots]
    per_param, params = [], []
    for layer in range(layers):
        for slot, base in enumerate(scale):
            pid = layer * len(slots) + slot
            lift = 50.0 if layer == 5 else 1.0
            value = base * lift * 10.0 ** rng.gauss(0.0, 0.2)
            per_param.append(SimpleNamespace(param_id=pid, exp_avg_sq_mean=value, nonfinite=0))
            params.append(SimpleNamespace(param_id=pid, layer=layer, slot=slot))
    n = len(per_param)
    return _core.ghost_input_of(
        SimpleNamespace(
            state=SimpleNamespace(global_step=500, epoch=1.0, per_param=per_param),
            attribution=SimpleNamespace(
                layer_indices=list(range(layers)), params=params, slot_names=slots
            ),
            grouping=SimpleNamespace(
                layer_indices=list(range(layers)),
                params_per_layer=len(slots),
                layer_of={i: i // len(slots) for i in range(n)},
            ),
            optimizer="adam",
        )
    )


def layer_medians(x: Any) -> dict[int, float]:
    """The floor of a per-layer judge in Python: each layer's median second moment."""
    value = {p.param_id: p.exp_avg_sq_mean for p in x.state.per_param}
    by_layer: dict[int, list[float]] = {}
    for p in x.attribution.params:
        if p.param_id in value:
            by_layer.setdefault(p.layer, []).append(value[p.param_id])
    return {layer: statistics.median(vs) for layer, vs in by_layer.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    demo = [
        _core.ghost_input(store / "adapter" / (store / "adapter/current.txt").read_text().strip())
        for store in sorted(DEMO_STORE.iterdir())
        if (store / "adapter/current.txt").is_file()
    ]
    cases = [
        ("demo store versions", demo),
        (f"{args.layers}-layer LoRA", [lora_state(args.layers)]),
    ]
    for rules in ("robust", "sway"):
        options = GhostOptions(rules=rules)
        for label, inputs in cases:

            def kernel(inputs: list[Any] = inputs, options: GhostOptions = options) -> None:
                for _ in range(args.repeat):
                    for x in inputs:
                        judge_ghost(x, options)

            def reference(inputs: list[Any] = inputs, options: GhostOptions = options) -> None:
                for _ in range(args.repeat):
                    for x in inputs:
                        layer_medians(x)

            report(
                f"rules={rules}, {label} x{args.repeat}",
                best_of(kernel),
                "a Python pass of per-layer medians",
                best_of(reference),
            )


if __name__ == "__main__":
    main()
