"""Training-framework callbacks that drive a :class:`adapterprobe.GAPMonitor`.

Import the one you need; this package imports neither framework by itself:

- ``adapterprobe.integrations.transformers.GAPCallback`` for the HF ``Trainer``;
- ``adapterprobe.integrations.lightning.GAPCallback`` for ``lightning.Trainer``.
"""
