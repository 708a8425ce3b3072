"""LoRA extraction from full fine-tunes (needs torch).

- :mod:`~adapterprobe.lora.factorize`: a weight delta to LoRA factors (rank rule).
- :mod:`~adapterprobe.lora.sources`: modules, state dicts and checkpoints as tensor sources.
- :mod:`~adapterprobe.lora.peft_writer`: streamed safetensors and ``adapter_config.json``.
- :mod:`~adapterprobe.lora.extract`: :func:`extract_lora`, base vs tuned to a PEFT adapter.
- :mod:`~adapterprobe.lora.report`: what an extraction carried, per module and category.
- :mod:`~adapterprobe.lora.verify`: the PEFT-loaded adapter's logits against the tuned model.
- :mod:`~adapterprobe.lora.parasitic`: adapters snapshotted during a training run.

Importing this package does not import torch; its modules do.
"""
