"""FIFOs and devices where a reader expects a file: refused before reading,
so the scan neither hangs nor reads forever."""

from __future__ import annotations

import json

from tests.attacks import fs_attacks as fa


def test_fifos_and_devices_are_refused_not_waited_on(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    made = fa.fifos(root)
    fa.device_link(root)
    # A hang would run into the timeout (the FIFOs have no writer).
    run = fa.cli("scan", root, "--format", "json", timeout=120)
    assert "Traceback" not in run.stderr, run.stderr
    records = json.loads(run.stdout)
    text = json.dumps(records)
    assert "not a regular file" in text
    by_store: dict[str, list[dict]] = {}
    for r in records:
        by_store.setdefault(r["store"], []).append(r)
    for fifo in made:
        store = str(root / fifo.relative_to(root).parts[0])
        verdicts = {r["verdict"] for r in by_store.get(store, [])}
        assert "error" in verdicts, (fifo, by_store.get(store))
    dev = by_store[str(root / "dev-zero")]
    assert any("not a regular file" in r["message"] for r in dev), dev
    assert run.returncode == 1
