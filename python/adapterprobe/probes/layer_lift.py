"""Exploding layers: each layer's second moments against the same tensors in
the other layers, on a log scale (decades), robust to two exploding layers.

A layer whose gradients blow up lifts the Adam second moment (``exp_avg_sq``)
of every one of its tensors by the square of the gradient factor: gradients
7x too large are a lift of 50x (1.7 decades). Adam divides its update by the
square root of that moment, so the loss can stay finite and even keep
falling while it happens; the optimizer state is where it shows. The rule
is built from what healthy runs look like: 59 saved states of 42 real
healthy runs of 3 to 24 layers, dlm and HF Trainer, measured by
``benches/bench_ghost_layers.py``.

- Log scale, like with like. Second moments span 6 or more decades across
  tensors; a tensor (a module and LoRA factor: an attribution slot) is only
  compared with the same tensor in other layers, as log10 values. One
  tensor alone says little: in healthy runs a tensor's layers sit up to 2.9
  decades (median 0.7) from their median, up to 110 robust z (1.4826 MAD).
- Peers: the ``PEERS`` (4) layers nearest in depth, every other layer in
  models of up to five. Healthy runs have a depth profile, not just noise:
  second moments fall by one to three decades from the first layer to the
  last, and comparing a layer with the whole stack flags the top of a
  deep model's smooth profile.
- Reference: the median of the peers' values of that tensor once their
  ``SET_ASIDE`` (2) highest are set aside (at least the lowest kept). With
  two exploding layers among four, the plain median of the three others is
  the other exploding layer or the naturally busy first layer, and the
  fault hides; setting two aside leaves a calm, healthy value.
- A layer's lift is the value that at least ``share`` (90%) of its tensors
  reach: an exploding layer lifts all of its tensors, while a naturally busy
  layer is busy in some (the first layer's q/k up to about 3 decades, v a
  few tenths). The median over tensors would flag healthy first layers.
- Thresholds, fixed in decades from the healthy spread: other layers
  (mean -0.09, sd 0.24, max 0.64 in healthy runs) WARN above 1.0, 4.6 sd
  out; layer 0, the block that reads the embeddings (mean +0.34, sd 0.32,
  max 0.95), above 1.5, 3.7 sd out. Under a normal model of that spread a
  healthy run warns about once in 5,000 to 8,000 (32 to 4 layers); 0 of
  the 59 measured states warn. A per-run
  robust scale (thresholds times 1.4826 MAD of the other layers' lifts,
  floored at 1) was measured and rejected: with a handful of layers it is
  set by the depth profile and by the very layers under test, so it raised
  the threshold where layers exploded (two 50x layers of four: 43% caught
  instead of 80%) and removed no false alarm.

A 50x layer is caught in 98% of the healthy states it was injected into
(94% of 4-layer ones), two 50x layers in 96% (80% in 4-layer states: the
last two of four escape half the time, being the calmest layers to begin
with, with layer 1 their only calm peer left). With fewer than three
layers nothing is compared: which of two layers is the outlier cannot be
told.

The measure runs in Rust (``rust/verdicts/layer_lift.rs``, inside
gradient_ghost's kernel); this module keeps its constants and the small
helpers under the same names, for the benches and tests that explain the
measure on real states.
"""

from __future__ import annotations

import math
import statistics

#: A layer's peers: this many other layers, the nearest in depth.
PEERS = 4
#: The peers' highest values set aside when forming a tensor's reference:
#: one other exploding layer and one naturally busy layer.
SET_ASIDE = 2
#: The block that reads the embeddings: busier than its peers in healthy
#: runs, so it gets its own threshold.
FIRST_LAYER = 0


def nearest_peers(layer: int, layers: list[int]) -> list[int]:
    """The ``PEERS`` other layers nearest to ``layer`` in depth (the lower one
    first on a tie): every other layer in models of up to ``PEERS + 1``."""
    others = sorted((m for m in layers if m != layer), key=lambda m: (abs(m - layer), m))
    return others[:PEERS]


def peer_reference(others: list[float]) -> float:
    """The median of ``others`` (the same tensor's log10 values in the peer
    layers) without their ``SET_ASIDE`` highest values, at least the lowest kept."""
    ordered = sorted(others)
    return statistics.median(ordered[: max(1, len(ordered) - SET_ASIDE)])


def share_quantile(lifts: list[float], share: float) -> float:
    """The largest value that at least ``share`` of ``lifts`` reach."""
    ordered = sorted(lifts, reverse=True)
    reached_by = max(1, math.ceil(share * len(ordered) - 1e-9))
    return ordered[reached_by - 1]
