"""Deliberately broken "parsers" that prove the harness reports each kind of bug.

Each takes a case directory like the real calls in ``calls.py``. They are
run by ``test_fuzz_smoke.py`` through the same engine as the real readers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from adapterprobe import LogFormatError

INPUT = "input.bin"


def type_error_on_odd(case: Path) -> None:
    """A TypeError for inputs whose first byte is odd, a proper error otherwise."""
    data = (case / INPUT).read_bytes()
    if data and data[0] % 2:
        raise TypeError("unsupported operand type(s)")
    raise LogFormatError("not a log", path=case / INPUT)


def sleep_forever(case: Path) -> None:
    time.sleep(10**6)


def allocate_forever(case: Path) -> None:
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))


def abort(case: Path) -> None:
    os.abort()


def write_input(case: Path) -> None:
    (case / INPUT).write_bytes(b"rewritten by the reader")


def leave_a_file(case: Path) -> None:
    """What a pickle that ran `touch PWNED` would leave behind (the worker runs in the case dir)."""
    Path("PWNED").touch()


class PanicException(BaseException):
    """Stands in for pyo3's PanicException, which derives from BaseException too."""


PanicException.__module__ = "pyo3_runtime"


def panic(case: Path) -> None:
    raise PanicException("called `Option::unwrap()` on a `None` value")


def fine(case: Path) -> None:
    (case / INPUT).read_bytes()
