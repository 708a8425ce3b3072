"""Tiny transformers models built from configs (nothing downloaded).

One builder serves every test and benchmark; callers pass the shape they need.
"""

from __future__ import annotations

from typing import Any

from adapterprobe.errors import require


def tiny_llama(
    seed: int = 0,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    vocab: int = 64,
    intermediate: int | None = None,
    max_positions: int = 64,
    **config: Any,
) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` (same seed, same weights).

    ``intermediate`` defaults to ``2 * hidden`` and ``kv_heads`` to ``heads``;
    other ``LlamaConfig`` fields (``tie_word_embeddings``,
    ``initializer_range``, ...) pass through ``config``.
    """
    torch = require("torch", "torch")
    transformers = require("transformers", "peft")
    cfg = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden if intermediate is None else intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else kv_heads,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        **config,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)
