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


def tiny_gpt2(
    seed: int = 0,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    vocab: int = 64,
    max_positions: int = 64,
    **config: Any,
) -> Any:
    """A randomly initialised ``GPT2LMHeadModel`` (Conv1D projections with biases,
    LayerNorms, learned positions, ``lm_head`` tied to ``wte``); same seed, same weights."""
    torch = require("torch", "torch")
    transformers = require("transformers", "peft")
    cfg = transformers.GPT2Config(
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        vocab_size=vocab,
        n_positions=max_positions,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
        **config,
    )
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg)


def finetune(
    model: Any,
    *,
    steps: int = 20,
    lr: float = 3e-3,
    batch: int = 4,
    seq: int = 16,
    seed: int = 1,
) -> Any:
    """A fully fine-tuned copy of ``model``: AdamW on every parameter (embeddings,
    norms and biases included) for ``steps`` steps of causal-LM loss on random tokens
    that follow a fixed pattern, so that the model really learns something. The
    original is left untouched; the copy is returned in eval mode."""
    import copy

    torch = require("torch", "torch")
    tuned = copy.deepcopy(model).train()
    vocab = tuned.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(tuned.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=generator)
        ids = (start + 3 * torch.arange(seq)) % vocab  # a learnable arithmetic pattern
        loss = tuned(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return tuned.eval()
