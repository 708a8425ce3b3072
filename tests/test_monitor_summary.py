"""GAPMonitor's default summary records and the JSONL side file for per-tensor statistics."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from test_monitor import manual_pass, mlp, read_jsonl, tiny_llama  # noqa: E402
from torch import nn  # noqa: E402

from adapterprobe import GAPMonitor, LogFormatError, MonitorConfigError  # noqa: E402
from adapterprobe.sinks import JsonlSink, read_tensor_stats  # noqa: E402


def rms(tensors):
    flat = torch.cat([t.detach().double().reshape(-1) for t in tensors])
    return math.sqrt(flat.pow(2).sum().item() / flat.numel())


def l2(tensors):
    return math.sqrt(sum(t.detach().double().pow(2).sum().item() for t in tensors))


def max_abs(tensors):
    return max(t.detach().double().abs().max().item() for t in tensors)


def test_summary_is_the_default_and_matches_direct_computation():
    model = mlp()
    x = torch.randn(3, 5, 8)
    _, acts, act_grads = manual_pass(model, x)
    model.zero_grad()
    monitor = GAPMonitor(model)
    with monitor.step(0):
        model(x).pow(2).mean().backward()
    latest = monitor.latest
    assert all(key.startswith("gap/summary/") for key in latest)
    params = dict(model.named_parameters())
    grads = {name: p.grad for name, p in params.items()}
    for kind, tensors in (("params", params), ("grads", grads)):
        assert latest[f"gap/summary/{kind}/l2_norm"] == pytest.approx(l2(tensors.values()))
        assert latest[f"gap/summary/{kind}/max_abs"] == pytest.approx(max_abs(tensors.values()))
        assert latest[f"gap/summary/{kind}/nonfinite"] == 0
        layer = [tensors["2.weight"], tensors["2.bias"]]  # a layer: a name's numeric prefix
        assert latest[f"gap/summary/{kind}/layers/2/l2_norm"] == pytest.approx(l2(layer))
        # per layer, NaN/inf counts appear only where there are some
        assert f"gap/summary/{kind}/layers/2/nonfinite" not in latest
        assert not any(k.endswith("nonfinite_tensors") and "/layers/" in k for k in latest)
        for name, tensor in tensors.items():  # 4 tensors, top_k = 5: all ranked
            top = latest[f"gap/summary/{kind}/top_l2_norm/{name}"]
            assert top == pytest.approx(tensor.detach().double().norm().item())
    for kind, tensors in (("activations", acts), ("activation_grads", act_grads)):
        assert latest[f"gap/summary/{kind}/rms"] == pytest.approx(rms(tensors), rel=1e-6)
        assert latest[f"gap/summary/{kind}/max_abs"] == pytest.approx(max_abs(tensors))
        assert latest[f"gap/summary/{kind}/layers/1/rms"] == pytest.approx(rms(tensors[1:2]))
        assert latest[f"gap/summary/{kind}/nonfinite_tensors"] == 0
        biggest = max(range(3), key=lambda i: tensors[i].abs().max().item())
        assert f"gap/summary/{kind}/top_max_abs/{biggest}" in latest


def test_accelerator_code_path_gives_the_same_summary(monkeypatch):
    """Where host reads stall the device every statistic stays a tensor until the end."""
    import adapterprobe.monitor.reductions as reductions

    model = mlp()
    with torch.no_grad():
        model[0].weight[3, 1] = float("nan")
    x = torch.randn(3, 5, 8)
    results = []
    for cheap in (True, False):
        monkeypatch.setattr(reductions, "_cheap_host_reads", lambda device, c=cheap: c)
        model.zero_grad()
        monitor = GAPMonitor(model)
        with monitor.step(0):
            model(x).pow(2).mean().backward()
        results.append(monitor.latest)
    assert results[0].keys() == results[1].keys()
    for key, value in results[0].items():
        if math.isnan(value):
            assert math.isnan(results[1][key]), key
        else:
            assert results[1][key] == pytest.approx(value, rel=1e-6), key
    assert results[1]["gap/summary/activations/layers/0/nonfinite"] == 15
    assert results[1]["gap/summary/params/nonfinite"] == 1


def test_summary_is_the_same_whatever_the_detail():
    model = tiny_llama()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    records = {}
    for detail in ("summary", "tensors"):
        model.zero_grad()
        monitor = GAPMonitor(model, detail=detail)
        with monitor.step(0):
            model(input_ids=ids, labels=ids).loss.backward()
        records[detail] = monitor.latest
    summary, full = records["summary"], records["tensors"]
    assert summary.keys() == {k for k in full if k.startswith("gap/summary/")}
    for key, value in summary.items():
        assert full[key] == pytest.approx(value, rel=1e-5), key
    assert len(full) > 5 * len(summary)  # the point of summaries
    layers = {k.split("/")[4] for k in summary if "/layers/" in k}
    assert layers == {"model.layers.0", "model.layers.1"}
    for kind in ("params", "grads", "activations", "activation_grads"):
        assert sum(f"gap/summary/{kind}/top_" in k for k in summary) == 5


def test_summary_counts_nan_and_inf():
    model = mlp()
    with torch.no_grad():
        model[0].weight[3, 1] = float("nan")
        model[2].bias[0] = float("inf")
    monitor = GAPMonitor(model)
    with monitor.step(0):
        model(torch.randn(3, 5, 8)).pow(2).mean().backward()
    latest = monitor.latest
    assert latest["gap/summary/params/nonfinite"] == 2
    assert latest["gap/summary/params/nonfinite_tensors"] == 2
    assert latest["gap/summary/params/layers/2/nonfinite"] == 1
    assert math.isnan(latest["gap/summary/params/l2_norm"])
    assert math.isnan(latest["gap/summary/params/top_l2_norm/0.weight"])  # NaN ranks first
    assert latest["gap/summary/activations/layers/0/nonfinite"] == 15
    assert latest["gap/summary/grads/nonfinite"] > 0


def test_top_k_and_detail_options():
    model = mlp()
    for top_k, expected in ((0, 0), (2, 2)):
        monitor = GAPMonitor(model, top_k=top_k, kinds="param")
        with monitor.step(0):
            pass
        assert sum("/top_" in key for key in monitor.latest) == expected
    with pytest.raises(MonitorConfigError, match="detail must be one of"):
        GAPMonitor(model, detail="everything")
    with pytest.raises(MonitorConfigError, match="top_k must be >= 0"):
        GAPMonitor(model, top_k=-1)


# -- the side file ---------------------------------------------------------------------


def monitored_llama_run(log_sink, detail="tensors", steps=2):
    model = tiny_llama()
    monitor = GAPMonitor(model, detail=detail, sink=log_sink)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    latest = []
    for step in range(steps):
        with monitor.step(step):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.log_step(step, loss)
        latest.append(dict(monitor.latest))
    monitor.close()
    return latest


def test_per_tensor_statistics_go_to_a_side_file(tmp_path):
    log = tmp_path / "run.jsonl"
    latest = monitored_llama_run(JsonlSink(log))
    gaps = [r for r in read_jsonl(log) if r["type"] == "gap"]
    assert [g["step"] for g in gaps] == [0, 1]
    for gap, full in zip(gaps, latest, strict=True):
        assert gap["tensors_file"] == f"run.tensors/step{gap['step']:08d}.safetensors"
        assert all(k.startswith("gap/summary/") for k in gap["stats"])
        side = read_tensor_stats(tmp_path / gap["tensors_file"])
        assert side.keys() == {k for k in full if not k.startswith("gap/summary/")}
        assert "gap/activations/model.layers.1.mlp/var" in side
        for key, value in side.items():  # stored as float32
            assert value == pytest.approx(full[key], rel=1e-6, abs=1e-38), key
    assert sorted(p.name for p in (tmp_path / "run.tensors").iterdir()) == [
        "step00000000.safetensors",
        "step00000001.safetensors",
    ]


def test_inline_keeps_every_statistic_in_the_line(tmp_path):
    inline, summary = tmp_path / "inline.jsonl", tmp_path / "summary.jsonl"
    full = monitored_llama_run(JsonlSink(inline, tensors="inline", digits=None), steps=1)[0]
    monitored_llama_run(JsonlSink(summary), detail="summary", steps=1)
    (gap,) = [r for r in read_jsonl(inline) if r["type"] == "gap"]
    assert gap["stats"] == full and "tensors_file" not in gap
    assert not (tmp_path / "inline.tensors").exists()
    summary_line = next(line for line in summary.read_text().splitlines() if '"gap"' in line)
    inline_line = next(line for line in inline.read_text().splitlines() if '"gap"' in line)
    assert 5 * len(summary_line) < len(inline_line)


def test_training_drift_reads_a_store_with_side_files(tmp_path):
    from adapterprobe import training_drift

    monitored_llama_run(JsonlSink.for_store(tmp_path, 3), steps=12)
    (logs,) = [p for p in (tmp_path / "logs").iterdir() if p.suffix == ".jsonl"]
    assert (tmp_path / "logs" / f"{logs.stem}.tensors").is_dir()
    result = training_drift(tmp_path, rules="sway")
    assert result.evidence["num_steps"] == 12


def test_a_file_that_is_not_a_side_file_is_a_log_format_error(tmp_path):
    from safetensors.numpy import save_file

    log = tmp_path / "run.jsonl"
    monitored_llama_run(JsonlSink(log), steps=1)
    side = tmp_path / "run.tensors" / "step00000000.safetensors"
    data = side.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    save_file({"params": json_array()}, tmp_path / "foreign.safetensors")
    for bad in ("cut.safetensors", "foreign.safetensors", "absent.safetensors"):
        with pytest.raises(LogFormatError, match="cannot read GAP side file") as err:
            read_tensor_stats(tmp_path / bad)
        assert err.value.path == str(tmp_path / bad)


def json_array():
    import numpy as np

    return np.zeros((2, 5), dtype=np.float32)


def test_bad_sink_options(tmp_path):
    with pytest.raises(MonitorConfigError, match="tensors must be"):
        JsonlSink(tmp_path / "a.jsonl", tensors="parquet")
    for digits in (0, 18, 2.5, True):
        with pytest.raises(MonitorConfigError, match="digits"):
            JsonlSink(tmp_path / "a.jsonl", digits=digits)


def test_side_file_that_cannot_be_written_is_a_clear_error(tmp_path):
    log = tmp_path / "run.jsonl"
    (tmp_path / "run.tensors").write_text("a file where the directory should be")
    model = nn.Linear(4, 4)
    monitor = GAPMonitor(model, detail="tensors", sink=JsonlSink(log))
    with pytest.raises(MonitorConfigError, match="side file"), monitor.step(0):
        model(torch.randn(2, 4)).sum().backward()
    monitor.close()
    assert json.loads(json.dumps(monitor.latest))  # the step itself was recorded
