"""Training-framework callbacks that drive a :class:`adapterprobe.GAPMonitor`.

Import the one you need; this package imports neither framework by itself:

- ``adapterprobe.integrations.transformers.GAPCallback`` for the HF ``Trainer``;
- ``adapterprobe.integrations.lightning.GAPCallback`` for ``lightning.Trainer``;
- ``adapterprobe.integrations.olmo_core.GAPCallback`` for OLMo-core's ``Trainer`` (a
  drop-in for its ``GAPMonitorCallback``).

Under ``torch.distributed`` (``torchrun``, DDP, FSDP2) the monitor writes from rank 0
only, so each callback's records and step lines are written once.
"""
