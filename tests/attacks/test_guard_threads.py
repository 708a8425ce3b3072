"""The guard shared between threads (issue 51, item 7).

A training loop calls ``Guard.observe`` once per record while a metrics
thread reads ``verdict``, ``findings`` and ``result()``. Before, ``result()``
released the GIL while it held PyO3's borrow of the guard, and ``observe``
raised ``RuntimeError('Already borrowed')`` on nearly every call meanwhile:
the training loop died. And ``copy.copy(guard)`` shared the Rust state, so
records fed to the copy changed the original.
"""

from __future__ import annotations

import copy
import math
import threading

import adapterprobe as ap


def loss_at(step: int) -> float:
    return 4.0 * 0.999**step + 0.5 + 0.01 * math.sin(step)


def test_observe_while_another_thread_reads_never_raises():
    guard = ap.Guard()
    for step in range(1, 20_001):  # a long history: result() takes a while
        guard.observe(step, loss=loss_at(step), grad_norm=1.0)
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                guard.result()
                _ = guard.verdict, guard.findings, guard.num_records
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for step in range(20_001, 30_001):
            guard.observe(step, loss=loss_at(step), grad_norm=1.0)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[:3]
    assert guard.num_records == 30_000
    assert guard.verdict == "pass", guard.findings
    assert guard.result().verdict.value == "pass"


def test_a_copy_is_an_independent_guard():
    guard = ap.Guard(output_classes=128)
    for step in range(1, 51):
        guard.observe(step, loss=loss_at(step))
    for twin in (copy.copy(guard), copy.deepcopy(guard)):
        assert twin.num_records == 50 and twin.verdict == guard.verdict
        for step in range(51, 56):
            assert twin.observe(step, loss=math.nan, grad_norm=math.nan) in {"warn", "fail"}
        assert twin.num_records == 55 and twin.verdict == "fail"
        assert guard.num_records == 50 and guard.verdict == "pass", guard.findings
        assert twin.options == guard.options
    # and the original goes on by itself
    assert guard.observe(51, loss=loss_at(51)) == "pass"
    assert guard.num_records == 51
