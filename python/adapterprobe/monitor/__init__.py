"""GAP monitor: gradient, activation and parameter statistics for any PyTorch training loop.

    monitor = GAPMonitor(model, interval=10, sink="run.jsonl")
    for step, batch in enumerate(loader):
        with monitor.step(step):            # forward and backward go inside
            loss = model(**batch).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.log_step(step, loss)

Two levels of detail, because a per-tensor record of every step is large (about 1,000
keys for a 4-layer model, half a megabyte for a 7B one) and costs more to compute:

- ``detail="summary"`` (default): per kind (params, grads, activations, activation
  grads) the global statistics, the same per layer, and the ``top_k`` offenders. Each
  tensor costs one min/max and one norm, nothing more.
- ``detail="tensors"``: also ``mean``, ``var`` (unbiased), ``max_abs``, ``l2_norm`` and
  ``nonfinite`` of every tensor (``gap/{kind}s/{name}/{stat}``). :class:`JsonlSink`
  writes these to a compact safetensors side file, not into the JSON line.

Summary keys, under ``gap/summary/{kind}s/``: ``max_abs``, ``nonfinite`` (NaN/inf
elements), ``nonfinite_tensors``, and ``l2_norm`` for params and grads (the root of all
squares: for grads, the norm gradient clipping sees) or ``rms`` for activations and their
gradients (over every element of every call in the step); per layer, as
``layers/{layer}/{stat}``, the ``l2_norm`` or ``rms`` and ``max_abs``, plus ``nonfinite``
where it is not 0 (a layer is a name's prefix up to its first numeric component,
``model.layers.3``); and the ``top_k`` largest as ``top_l2_norm/{name}`` (params, grads)
or ``top_max_abs/{name}`` (activations).

Per-tensor statistics (``detail="tensors"``): parameters and gradients are reduced over
the whole tensor. Activations and their gradients are reduced per instance (dim 0 is
the instance) and then averaged over all instances seen in the step (every forward call
and micro-batch), except ``max_abs`` (the maximum) and ``nonfinite`` (the total).

Design choices, each answering a cost found by profiling such monitors:

- Hooks exist only inside the block of a sampled step (``step % interval == 0``); on
  other steps ``step()`` returns a shared no-op context and nothing is attached.
- On CPU a result is read back as soon as it exists (a read costs nothing there and
  saves concatenating hundreds of scalars later). On an accelerator statistics stay on
  the device until the block ends and reach the host in one copy per device; a second
  copy happens only when some parameter or gradient holds NaN/inf, to count them.
- Plain reductions only (sum, L2 norm, min/max; ``torch._foreach_norm`` for parameters
  and gradients), which read each tensor once and make no temporary copy; the host
  derives mean, variance and max-abs from them.
- Any module output is accepted: the module's activation is the first floating tensor
  with a batch dimension found inside tensors, tuples, lists, dicts, dataclasses and
  HF ``ModelOutput``; everything else is ignored.
- NaN/inf are counted (``nonfinite``) and left in the other statistics, which then
  read NaN: an honest signal rather than a silently dropped value.

Sums accumulate in float64 where they could cancel, whatever the tensor's dtype (float32
on MPS). Tensors with a single element (per instance, for activations) are skipped, and
so are float8, complex and tensor-subclass values other than DTensor.

Under ``torch.distributed`` (DDP, FSDP2) the statistics are global: DTensor parameters
and gradients are read through their local shards, and every rank's tables are combined
by one all-gather of packed buffers per sampled step (``distributed``); rank 0 alone
writes the sinks, step lines and dumps. FSDP1's flat parameters are refused.

Not covered: under activation checkpointing the recomputed forward is recorded again
(averages stay, ``nonfinite`` counts double); hooks added and removed per sampled
step make ``torch.compile`` recompile.

This package is the door: every public name is importable from here. Inside,
``hooks`` holds :class:`GAPMonitor` (the hooks of a sampled step and the collection
at its end), ``reductions`` the per-tensor work on the device and the copy to the
host, ``stats`` the tables and summaries built on the host, ``distributed`` their
combination over ranks, ``dumps`` :class:`GradientDump`, and ``options`` the choices
and the argument checks.
"""

from __future__ import annotations

from adapterprobe.monitor.dumps import GradientDump
from adapterprobe.monitor.hooks import GAPMonitor
from adapterprobe.monitor.options import DETAILS, KINDS, STATS
from adapterprobe.sinks import JsonlSink, TensorBoardSink

__all__ = [
    "DETAILS",
    "KINDS",
    "STATS",
    "GAPMonitor",
    "GradientDump",
    "JsonlSink",
    "TensorBoardSink",
]
