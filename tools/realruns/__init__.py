"""Real training runs for tests, benchmarks and the bundled demo.

Nothing here is shipped in the wheel. Every artifact is made by the real
libraries (torch, transformers, PEFT) training tiny models built from
configs on the CPU, never downloaded and never shaped by hand:

- :mod:`realruns.tiny`: tiny transformers models from configs.
- :mod:`realruns.dlm`: dlm-layout stores (PEFT adapter, optimizer state, JSONL logs).
- :mod:`realruns.corpus`: a labelled corpus of healthy and faulty real runs.
- :mod:`realruns.field`: a labelled corpus of real ``transformers.Trainer`` output
  directories, as the field writes them.
"""
