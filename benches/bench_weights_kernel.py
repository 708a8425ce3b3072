"""What judging costs next to what it must cost anyway: adapter_weights' and
full_weights' Rust kernels against reading the same inputs, in one run.

    python benches/bench_weights_kernel.py [--layers 32] [--repeat 200]

Inputs: rust/testdata's real adapters (each with the one before it as its
previous version), judged against reading them from disk
(``_core.weights_input``: the safetensors header, the factors, their
norms); and reports shaped like a LoRA adapter on every projection of a
``--layers``-layer model (7 modules a layer, norms spread over decades) and
like a full model of as many layers, judged against the least any judge
must do in Python: one pass summing the squared norms and sorting them.
Each timing is the best of 3 rounds of ``--repeat`` calls, through
``judge_weights`` / ``judge_full_weights`` (the kernel and the ProbeResult
it builds). A ratio above 1 means judging costs less than the reference.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _timing import best_of, report

from adapterprobe import _core
from adapterprobe._core import _testing
from adapterprobe.probes.full_weights import FullWeightsOptions, judge_full_weights
from adapterprobe.probes.weights import WeightsOptions, judge_weights

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_report(layers: int, seed: int = 0) -> Any:
    rng = random.Random(seed)
    mods, energy = [], []
    for layer in range(layers):
        for m in MODULES:
            delta = 10.0 ** rng.uniform(-3, 0)
            mods.append(
                _testing.make_lora_module_stats(
                    f"base_model.model.model.layers.{layer}.self_attn.{m}",
                    layer=layer,
                    rank=16,
                    norm_a=rng.uniform(1, 3),
                    norm_b=delta,
                    delta_fro=delta,
                    stable_rank=rng.uniform(1, 8),
                    rank_used=rng.randint(4, 16),
                )
            )
        energy.append(_testing.make_layer_energy(layer, len(MODULES), rng.random()))
    config = _testing.make_config_summary("/a/adapter_config.json", 16, 32.0)
    w = _testing.make_adapter_weights("/a/adapter_model.safetensors", config, mods, [], energy)
    return _testing.make_weights_input("/a", weights=w)


def full_report(layers: int) -> Any:
    tensors = [
        _testing.make_tensor_stats(f"model.layers.{i}.{m}.weight", norm=1.0)
        for i in range(layers)
        for m in MODULES
    ]
    per_layer = [_testing.make_layer_weights(i, norm=1.0 + i) for i in range(layers)]
    w = _testing.make_full_weights(
        "/m/model.safetensors", ["/m/model.safetensors"], tensors, per_layer
    )
    return _testing.make_full_weights_input("/m", model_file="/m/model.safetensors", weights=w)


def timed(
    label: str,
    repeat: int,
    cases: list[tuple[Any, ...]],
    ours: Callable[..., Any],
    ref_name: str,
    ref: Callable[..., Any],
) -> None:
    def run(fn: Callable[..., Any]) -> Callable[[], None]:
        def go() -> None:
            for _ in range(repeat):
                for case in cases:
                    fn(*case)

        return go

    report(f"{label} x{repeat}", best_of(run(ours)), ref_name, best_of(run(ref)))


def sum_and_sort(norms: list[float]) -> Any:
    """The floor of any judge in Python: the energies summed and sorted."""
    energy = [n * n for n in norms]
    return math.fsum(energy), sorted(energy, reverse=True)


def lora_norms_pass(x: Any, *_: Any) -> Any:
    return sum_and_sort([m.delta_fro or 0.0 for m in x.weights.modules])


def layer_norms_pass(x: Any, *_: Any) -> Any:
    return sum_and_sort([layer.norm for layer in x.weights.layers])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    fixtures = sorted(p for p in (ROOT / "rust/testdata/weights").iterdir() if p.is_dir())
    real = [_core.weights_input(p) for p in fixtures]
    options = WeightsOptions(rules="robust")
    # Each case carries its adapter's path, for the reference to read it by.
    real_cases = [(x, options, real[i - 1] if i else None, fixtures[i]) for i, x in enumerate(real)]

    def kernel(x: Any, o: WeightsOptions, previous: Any, *_: Any) -> Any:
        return judge_weights(x, o, previous=previous)

    def read(_x: Any, _o: WeightsOptions, _previous: Any, path: Path) -> Any:
        return _core.weights_input(path)

    timed(
        "adapter_weights, rust/testdata adapters",
        args.repeat,
        real_cases,
        kernel,
        "reading them",
        read,
    )
    lora_cases = [(lora_report(args.layers), options, None)]
    timed(
        f"adapter_weights, {args.layers}-layer LoRA ({args.layers * len(MODULES)} modules)",
        args.repeat,
        lora_cases,
        kernel,
        "a Python sum-and-sort of the norms",
        lora_norms_pass,
    )
    full_cases = [(full_report(args.layers), FullWeightsOptions(rules="robust"))]
    timed(
        f"full_weights, {args.layers}-layer model",
        args.repeat,
        full_cases,
        judge_full_weights,
        "a Python sum-and-sort of the norms",
        layer_norms_pass,
    )


if __name__ == "__main__":
    main()
