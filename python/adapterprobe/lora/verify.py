"""Measure how much of a fine-tune a PEFT adapter reproduces (``extract_lora(verify=...)``).

Delta energy (``||dW||_F^2``) says how much of each weight change an adapter keeps, not
what the model then computes. This runs three models on the same random token batches:
the base model, the tuned model, and the base model with the adapter loaded by PEFT
(``PeftModel.from_pretrained``, exactly as a user would load it), and compares logits
over all batches together:

    logit change recovered = 1 - ||L_adapter - L_tuned||_F / ||L_tuned - L_base||_F

1 when the adapter reproduces the fine-tune exactly, 0 when it does no better than the
base model, negative when it does worse. Also reported: the relative logit error
``||L_adapter - L_tuned|| / ||L_tuned||``, the top-1 agreement (argmax) of adapter and
tuned model, and the largest absolute logit difference.

Models given as ``nn.Module`` are used as they are (the base is copied before PEFT wraps
it); checkpoint directories with a ``config.json`` are loaded with transformers'
``AutoModelForCausalLM`` in float32, so that the figure measures the adapter and not
bfloat16 rounding.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapterprobe.errors import ExtractionError, UsageError, require

torch = require("torch", "torch")

__all__ = ["DEFAULT_BATCHES", "check_verifiable", "verify_adapter"]

#: Batches run when ``verify=True``.
DEFAULT_BATCHES = 4
BATCH_SIZE = 2
SEQ_LEN = 32
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")


def _checkpoint_dir(obj: Any) -> Path | None:
    """The HF checkpoint directory a path names (itself, or the folder of its weights)."""
    path = Path(obj)
    folder = path if path.is_dir() else path.parent
    if not (folder / "config.json").is_file():
        return None
    if path.is_file() and path.name not in ("model.safetensors", "model.safetensors.index.json"):
        return None  # a loose weights file: config.json would load other weights
    return folder


def check_verifiable(obj: Any, label: str) -> None:
    """UsageError, before anything is extracted, when ``obj`` cannot be run as a model."""
    if isinstance(obj, torch.nn.Module):
        return
    if isinstance(obj, (str, os.PathLike)) and _checkpoint_dir(obj) is not None:
        return
    raise UsageError(
        f"verify needs {label} as an nn.Module or a transformers checkpoint directory "
        "(config.json + model.safetensors); a state dict or a loose .safetensors file "
        "has no architecture to run"
    )


def _load(obj: Any, label: str, device: Any) -> Any:
    if isinstance(obj, torch.nn.Module):
        return obj
    transformers = require("transformers", "peft")
    folder = _checkpoint_dir(obj)
    errors = []
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        try:
            model = auto.from_pretrained(str(folder), dtype=torch.float32)
        except Exception as exc:  # transformers raises many types for unloadable configs
            errors.append(f"{auto.__name__}: {exc}")
            continue
        return model.to(device)
    raise ExtractionError(
        f"verify: cannot load {label} with transformers ({'; '.join(errors)})", path=folder
    )


def _first_tensor(output: Any) -> Any:
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                return item
    raise ExtractionError(f"verify: the model returned no logits ({type(output).__name__})")


def _run(model: Any, ids: Any) -> Any:
    try:
        output = model(input_ids=ids)
    except TypeError:  # not a transformers model: positional input
        output = model(ids)
    return _first_tensor(output).double()


def _vocab_and_length(model: Any) -> tuple[int, int]:
    embeddings = None
    getter = getattr(model, "get_input_embeddings", None)
    if callable(getter):
        embeddings = getter()
    if embeddings is None:
        embeddings = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    if embeddings is None or not hasattr(embeddings, "num_embeddings"):
        raise ExtractionError("verify: the model has no token embedding to draw input ids for")
    config = getattr(model, "config", None)
    limits = [getattr(config, key, None) for key in _POSITION_KEYS]
    length = min([SEQ_LEN, *(n for n in limits if isinstance(n, int) and n > 0)])
    return int(embeddings.num_embeddings), length


def _device_of(model: Any) -> Any:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def verify_adapter(
    base: Any,
    tuned: Any,
    adapter_dir: str | os.PathLike[str],
    *,
    batches: int = DEFAULT_BATCHES,
    seed: int = 0,
    device: Any = None,
) -> dict[str, Any]:
    """Logit agreement of the PEFT-loaded adapter with the tuned model (see module doc)."""
    peft = require("peft", "peft")
    device = torch.device("cpu") if device is None else device
    base_model = _load(base, "base", device)
    tuned_model = _load(tuned, "tuned", device)
    adapted_base = copy.deepcopy(base_model) if base_model is base else _load(base, "base", device)
    modes = [(m, m.training) for m in (base_model, tuned_model)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's advice on tied weights and merging
            try:
                adapted = peft.PeftModel.from_pretrained(adapted_base, str(adapter_dir))
            except Exception as exc:  # a bug of ours if it happens: say so clearly
                raise ExtractionError(
                    f"verify: PEFT cannot load the extracted adapter: {exc}", path=adapter_dir
                ) from exc
        for model in (base_model, tuned_model, adapted):
            model.eval()
        vocab, length = _vocab_and_length(base_model)
        generator = torch.Generator().manual_seed(seed)
        error = change = scale = 0.0
        agree = total = 0
        worst = 0.0
        with torch.no_grad():
            for _ in range(batches):
                ids = torch.randint(0, vocab, (BATCH_SIZE, length), generator=generator)
                l_base = _run(base_model, ids.to(_device_of(base_model)))
                l_tuned = _run(tuned_model, ids.to(_device_of(tuned_model)))
                l_adapter = _run(adapted, ids.to(_device_of(adapted)))
                l_base, l_adapter = l_base.to(l_tuned.device), l_adapter.to(l_tuned.device)
                diff = l_adapter - l_tuned
                error += float(diff.pow(2).sum())
                change += float((l_tuned - l_base).pow(2).sum())
                scale += float(l_tuned.pow(2).sum())
                worst = max(worst, float(diff.abs().max()))
                agree += int((l_adapter.argmax(-1) == l_tuned.argmax(-1)).sum())
                total += l_tuned.shape[0] * l_tuned.shape[1] if l_tuned.ndim > 2 else ids.numel()
    finally:
        for model, training in modes:
            model.train(training)
    recovered = 1.0 - math.sqrt(error / change) if change > 0 else None
    return {
        "batches": batches,
        "batch_size": BATCH_SIZE,
        "seq_len": length,
        "seed": seed,
        "logit_change_recovered": recovered,
        "relative_error": math.sqrt(error / scale) if scale > 0 else None,
        "top1_agreement": agree / total if total else None,
        "max_abs_diff": worst,
        "tuned_vs_base_change": math.sqrt(change / scale) if scale > 0 else None,
        "definition": "1 - ||L_adapter - L_tuned||_F / ||L_tuned - L_base||_F",
    }
