"""GAP monitor step-time overhead, against no monitor and two per-tensor references.

    python benches/bench_monitor.py [--device cpu|cuda] [--preset small|125m]
                                    [--steps 20] [--rounds 5] [--batch 4] [--seq 64]

One training loop (LlamaForCausalLM built from a config, AdamW), timed under:

- no monitor (the reference for the overhead ratios);
- GAPMonitor, interval=10 and interval=1 (params, grads, activations, activation grads);
- naive, interval=1: the seed's method, hooks on every module kept for the whole run
  (forward hook + full backward pre-hook), the same five statistics per tensor, each
  read with ``.item()``;
- wandb.watch-style, ``log="all", log_freq=1``: a histogram per parameter and per
  gradient, built as wandb builds it (clone, finite checks, min/max, ``histc``, copy
  to the host), which syncs several times per tensor.

Configurations are interleaved round by round and each round times a whole number of
10-step blocks, so sampled steps count in the interval=10 mean. The figure per
configuration is its best round (mean step time), the one least disturbed by other
work on the machine; the median round is printed beside it. Torch runs on one thread
by default so that a busy shared machine disturbs the ratios less (--threads).

The default "small" preset is a 4.2M-parameter Llama (hidden 256, 4 layers, vocab 4096,
4x128 tokens). "tiny" (hidden 128) is the worst case for any activation monitor: its
activations are large next to its matmuls. "125m" is meant for --device cuda.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from adapterprobe import GAPMonitor

PRESETS = {
    # hidden, intermediate, layers, heads, vocab
    "tiny": (128, 256, 4, 4, 1024),  # 0.8M params: activations dwarf the matmuls
    "small": (256, 688, 4, 4, 4096),  # 4.2M params
    "125m": (768, 2048, 12, 12, 50304),  # 124M params (GPT-2 small sized), for --device cuda
}


def build_model(preset: str, device: str) -> nn.Module:
    hidden, intermediate, layers, heads, vocab = PRESETS[preset]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device)


# -- the two per-tensor references -----------------------------------------------------


def naive_stats(tensor: torch.Tensor, per_instance: bool) -> list[float]:
    """The seed's per-tensor reduction, each statistic brought to the host on its own."""
    t = tensor.detach().float()
    if per_instance:
        t = t.reshape(t.shape[0], -1)
        var, mean = torch.var_mean(t, dim=-1)
        l2 = t.norm(dim=-1).mean()
        var, mean = var.mean(), mean.mean()
    else:
        var, mean = torch.var_mean(t)
        l2 = t.norm()
    return [
        mean.item(),
        var.item(),
        t.abs().max().item(),
        l2.item(),
        (~torch.isfinite(t)).sum().item(),
    ]


class NaiveMonitor:
    """Hooks attached once for the whole run; every tensor synced on its own."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.latest: dict[str, list[float]] = {}
        self.handles = []
        for name, module in model.named_modules():
            if not name:
                continue
            forward = functools.partial(self._forward, name)
            backward = functools.partial(self._backward, name)
            self.handles.append(module.register_forward_hook(forward))
            self.handles.append(module.register_full_backward_pre_hook(backward))

    def _record(self, key: str, value) -> None:
        if isinstance(value, tuple):
            value = value[0]
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.ndim >= 2:
            self.latest[key] = naive_stats(value, per_instance=True)

    def _forward(self, name, module, args, output) -> None:
        self._record(f"activations/{name}", output)

    def _backward(self, name, module, grad_output) -> None:
        self._record(f"activation_grads/{name}", grad_output)

    def after_backward(self) -> None:
        for name, p in self.model.named_parameters():
            self.latest[f"params/{name}"] = naive_stats(p, per_instance=False)
            if p.grad is not None:
                self.latest[f"grads/{name}"] = naive_stats(p.grad, per_instance=False)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def wandb_histogram(tensor: torch.Tensor, bins: int = 64) -> tuple[list[float], list[float]]:
    """A histogram the way wandb.watch builds one (its torch integration, per tensor)."""
    flat = tensor.detach().clone().reshape(-1)
    if flat.numel() == 0 or (~torch.isfinite(flat)).all().item():
        return [], []
    if not torch.isfinite(flat).all():
        flat = flat[torch.isfinite(flat)]
    low, high = flat.min().item(), flat.max().item()
    counts = flat.float().histc(bins=bins, min=low, max=high).cpu().tolist()
    edges = torch.linspace(low, high, steps=bins + 1).tolist()
    return counts, edges


class WandbStyleWatch:
    """wandb.watch(model, log="all", log_freq=1): parameter and gradient histograms."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.latest: dict[str, tuple] = {}
        self.handles = [model.register_forward_hook(self._log_parameters)]
        for name, p in model.named_parameters():
            if p.requires_grad:
                hook = functools.partial(self._log_gradient, name)
                self.handles.append(p.register_hook(hook))

    def _log_parameters(self, module, args, output) -> None:
        for name, p in self.model.named_parameters():
            self.latest[f"parameters/{name}"] = wandb_histogram(p)

    def _log_gradient(self, name: str, grad: torch.Tensor) -> None:
        self.latest[f"gradients/{name}"] = wandb_histogram(grad)

    def after_backward(self) -> None:
        pass

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


# -- the loop ----------------------------------------------------------------------------


def make_runner(model, optimizer, batch, sync) -> Callable:
    def run(steps: int, start: int, monitor=None, reference=None) -> float:
        begin = time.perf_counter()
        for step in range(start, start + steps):
            if monitor is not None:
                with monitor.step(step):
                    loss = model(input_ids=batch, labels=batch).loss
                    loss.backward()
            else:
                loss = model(input_ids=batch, labels=batch).loss
                loss.backward()
                if reference is not None:
                    reference.after_backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync()
        return (time.perf_counter() - begin) / steps

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=10, help="steps per round (multiple of 10)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch default)")
    args = parser.parse_args()
    if args.steps % 10:
        parser.error("--steps must be a multiple of 10 (whole interval=10 blocks)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    if args.threads:
        torch.set_num_threads(args.threads)
    # The seed's full backward hooks cannot see modules that return a ModelOutput
    # (torch warns once per module); the naive reference simply records less there.
    warnings.filterwarnings("ignore", message="For backward hooks to be called")

    model = build_model(args.preset, args.device)
    params = sum(p.numel() for p in model.parameters())
    vocab = PRESETS[args.preset][4]
    batch = torch.randint(0, vocab, (args.batch, args.seq), device=args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    run = make_runner(model, optimizer, batch, sync)
    modules = sum(1 for name, _ in model.named_modules() if name)
    print(
        f"device={args.device} preset={args.preset} params={params / 1e6:.1f}M "
        f"modules={modules} batch={args.batch}x{args.seq} steps/round={args.steps} "
        f"rounds={args.rounds} threads={torch.get_num_threads()}",
        flush=True,
    )

    ours_10 = GAPMonitor(model, interval=10)
    ours_1 = GAPMonitor(model, interval=1)

    def with_reference(factory):
        def go(steps: int, start: int) -> float:
            reference = factory(model)
            try:
                return run(steps, start, reference=reference)
            finally:
                reference.close()

        return go

    configs: dict[str, Callable[[int, int], float]] = {
        "no monitor": lambda steps, start: run(steps, start),
        "ours interval=10": lambda steps, start: run(steps, start, monitor=ours_10),
        "ours interval=1": lambda steps, start: run(steps, start, monitor=ours_1),
        "naive interval=1 (seed)": with_reference(NaiveMonitor),
        "wandb.watch-style log_freq=1": with_reference(WandbStyleWatch),
    }
    for go in configs.values():  # warm-up: allocator, kernels, hook paths
        go(10, 0)
    times: dict[str, list[float]] = {name: [] for name in configs}
    for round_index in range(args.rounds):
        for name, go in configs.items():
            times[name].append(go(args.steps, round_index * args.steps))
    step = {name: min(values) for name, values in times.items()}

    print("\nstep time (s), best round and median round:")
    for name, value in step.items():
        print(f"  {name:32s} {value:.4f}   {statistics.median(times[name]):.4f}")
    base = step["no monitor"]
    print("\nratios (same run):")
    print(f"  ours interval=10 / no monitor:             {step['ours interval=10'] / base:.3f}x")
    print(f"  ours interval=1  / no monitor:             {step['ours interval=1'] / base:.3f}x")
    naive = step["naive interval=1 (seed)"]
    watch = step["wandb.watch-style log_freq=1"]
    print(f"  naive interval=1 (seed) / no monitor:      {naive / base:.3f}x")
    print(f"  wandb.watch-style / no monitor:            {watch / base:.3f}x")
    ours = step["ours interval=1"] - base
    print(f"  overhead naive / ours (interval=1):        {(naive - base) / ours:.2f}x")
    print(f"  overhead wandb-style / ours (interval=1):  {(watch - base) / ours:.2f}x")
    print(f"  keys per sampled step (ours):              {len(ours_1.latest)}")


if __name__ == "__main__":
    main()
