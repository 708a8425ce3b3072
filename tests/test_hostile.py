"""Every hostile sample gets a clear AdapterProbeError subclass, fast, and is left unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

import adapterprobe as ap

HOSTILE = Path(__file__).parent / "hostile"
MANIFEST = json.loads((HOSTILE / "manifest.json").read_text())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_hostile_sample_is_refused_cleanly(name):
    path = HOSTILE / name
    expected = getattr(ap, MANIFEST[name]["error"])
    before = digest(path)
    started = time.perf_counter()
    reader = ap.read_safetensors_header if name.endswith(".safetensors") else ap.read_loss_curve
    with pytest.raises(expected) as info:
        reader(path)
    assert time.perf_counter() - started < 5, "refusal must be immediate, not a hang"
    message = str(info.value)
    assert MANIFEST[name]["match"] in message
    assert name in message, "the message names the file"
    assert isinstance(info.value, ap.AdapterProbeError)
    assert digest(path) == before


def test_directory_where_a_file_should_be(tmp_path):
    (tmp_path / "adapter_model.safetensors").mkdir()
    with pytest.raises(ap.HeaderError, match="directory"):
        ap.read_safetensors_header(tmp_path / "adapter_model.safetensors")
    with pytest.raises(ap.HeaderError, match="directory"):
        ap.group_layers(tmp_path)


def test_missing_file():
    with pytest.raises(ap.MissingFileError):
        ap.read_safetensors_header("/nonexistent/adapter_model.safetensors")


def test_overlong_log_line_is_skipped_not_buffered(tmp_path):
    path = tmp_path / "train-1.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"type": "banner"}\n{"loss": 1.0, "note": "')
        fh.write(b"x" * (20 << 20))
        fh.write(b'", "step": 1, "type": "step"}\n{"loss": 2.0, "step": 2, "type": "step"}\n')
    curve = ap.read_loss_curve(path)
    assert curve.steps.tolist() == [2]


def test_deeply_nested_log_line_does_not_crash(tmp_path):
    path = tmp_path / "train-1.jsonl"
    path.write_text(
        '{"type": "banner"}\n' + "[" * 200_000 + "\n" + '{"loss": 1, "step": 5, "type": "step"}\n'
    )
    assert ap.read_loss_curve(path).steps.tolist() == [5]


def test_hostile_store_makes_drift_error_not_raise(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train-1.jsonl").write_bytes(
        (HOSTILE / "binary_first_line.jsonl").read_bytes()
    )
    result = ap.training_drift(tmp_path)
    assert result.verdict == "error"
    assert "first line" in result.message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_are_refused_not_waited_on(tmp_path):
    import shutil

    from adapterprobe.scan import DEMO_STORE

    store = tmp_path / "store"
    shutil.copytree(DEMO_STORE / "healthy", store)
    version = store / "adapter" / "versions" / "v0001"
    (version / "training_state.pt").unlink()
    os.mkfifo(version / "training_state.pt")
    (version / "adapter_model.safetensors").unlink()
    os.mkfifo(version / "adapter_model.safetensors")
    log = sorted((store / "logs").iterdir())[0]
    log.unlink()
    os.mkfifo(log)
    fifo_header = tmp_path / "x.safetensors"
    os.mkfifo(fifo_header)
    started = time.perf_counter()
    with pytest.raises(ap.HeaderError, match="FIFO"):
        ap.read_safetensors_header(fifo_header)
    report = ap.scan(store)
    assert {r.verdict.value for r in report} == {"error"}
    assert all("not a regular file" in r.message for r in report)
    assert time.perf_counter() - started < 10
