"""``similar`` over adapters it cannot read: each one is named with its
reason, never only the first of a pair (issue 51, item 10b).

Two sparse adapters whose one module claims 2^27 values (16 KiB on disk,
``test_compare_memory.sparse_adapter``) are streamed into sketches, then
refused whole by the exact pass. Read per pair (they do not fit the exact
pass's cache together), the pair stopped at its first adapter's refusal,
and the second, whose only pair that was, went unnamed: the user was told
one adapter was skipped while two were.
"""

from __future__ import annotations

from pathlib import Path

import adapterprobe as ap
from tests.attacks import fs_attacks as fa
from tests.attacks.test_compare_memory import sparse_adapter


def test_similar_names_each_adapter_it_could_not_read(tmp_path):
    store = tmp_path / "store"
    adapters = [sparse_adapter(store / name, one_value=True) for name in ("a", "b")]
    found = ap.similar(store, threshold=0.5)
    assert found["pairs"] == [] and found["pairs_exact"] == 1, found
    assert sorted(Path(s["path"]) for s in found["skipped"]) == adapters, found["skipped"]

    run = fa.cli("similar", store, "--threshold", "0.5", timeout=300)
    assert "Traceback" not in run.stderr, run.stderr[-800:]
    assert run.returncode == 0, (run.returncode, run.stderr[-800:])
    skipped = [line for line in run.stderr.splitlines() if "skipped" in line]
    for adapter in adapters:
        named = [line for line in skipped if f"skipped {adapter}:" in line]
        assert len(named) == 1 and "read at once" in named[0], (adapter, run.stderr)
