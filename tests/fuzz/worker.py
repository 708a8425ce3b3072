"""The child process that runs fuzz cases, one at a time, under a memory limit.

The parent starts one per parser (`python -m <package>.worker CALL LIMIT`),
where CALL is ``module:function`` taking the case directory. The worker
imports it, lowers its address-space limit (so an unbounded allocation
fails here instead of taking the machine), says ``ready``, then answers
each case directory it reads on stdin with one JSON line on the protocol
descriptor. Whatever the code under test prints goes to stderr, never into
the protocol. A hang is the parent's to notice (it kills us); a crash is
this process dying, which the parent sees as end of file.

Outcomes: ``ok``, ``error`` (an AdapterProbeError subclass), ``panic``
(pyo3's PanicException), ``other-exception`` (anything else raised), and
``memory`` for a MemoryError, which the parent reports as a crash: under
the limit, running out of memory is the allocation bug itself.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def classify(exc: BaseException) -> str:
    """The outcome an exception stands for."""
    from adapterprobe.errors import AdapterProbeError

    if type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime":
        return "panic"
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, AdapterProbeError):
        return "error"
    return "other-exception"


def run_case(call: Callable[[Path], Any], case: Path) -> dict[str, Any]:
    """Run one case and describe what happened (never raises)."""
    try:
        call(case)
    except BaseException as exc:  # classifying every exception is the point
        outcome = classify(exc)
        reply: dict[str, Any] = {
            "outcome": outcome,
            "exception": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc)[:2000],
        }
        if outcome != "error":
            reply["traceback"] = "".join(traceback.format_exception(exc))[-8000:]
        return reply
    return {"outcome": "ok"}


def load_call(spec: str) -> Callable[[Path], Any]:
    module, _, name = spec.partition(":")
    if module.startswith("."):
        module = importlib.import_module(module, __package__).__name__
    return getattr(importlib.import_module(module), name)


def limit_memory(limit_bytes: int) -> None:
    """Cap the address space; no core files from deliberate aborts."""
    if limit_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str]) -> None:
    spec, limit = argv[0], int(argv[1])
    # The protocol gets a private copy of stdout; fd 1 now points at stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import adapterprobe  # noqa: F401 - imported before the limit, like the call

    call = load_call(spec)
    limit_memory(limit)
    proto.write("ready\n")
    for line in sys.stdin:
        case = Path(line.rstrip("\n"))
        reply = run_case(call, case)
        proto.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
