"""GAPMonitor, GradientDump and the sinks, checked against direct torch computations."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from torch import nn  # noqa: E402

from adapterprobe import GAPMonitor, GradientDump, MonitorConfigError  # noqa: E402
from adapterprobe.sinks import JsonlSink, step_record  # noqa: E402
from realruns.tiny import tiny_llama as build_llama  # noqa: E402

STATS = ("mean", "var", "max_abs", "l2_norm", "nonfinite")


# -- references: plain torch, one tensor at a time ---------------------------------


def whole(tensor):
    """Statistics of a whole tensor, computed directly in float64."""
    t = tensor.detach().double()
    var, mean = torch.var_mean(t)
    return {
        "mean": mean.item(),
        "var": var.item(),
        "max_abs": t.abs().max().item(),
        "l2_norm": t.norm().item(),
        "nonfinite": (~torch.isfinite(t)).sum().item(),
    }


def per_instance(tensors):
    """Per-instance statistics averaged over all instances of all given tensors."""
    rows = torch.cat([t.detach().double().reshape(t.shape[0], -1) for t in tensors])
    var, mean = torch.var_mean(rows, dim=1)
    return {
        "mean": mean.mean().item(),
        "var": var.mean().item(),
        "max_abs": rows.abs().max().item(),
        "l2_norm": rows.norm(dim=1).mean().item(),
        "nonfinite": (~torch.isfinite(rows)).sum().item(),
    }


def assert_stats(latest, prefix, expected, rel=1e-5):
    """Each statistic within ``rel``; a mean also within float32 rounding of the data's
    scale, since a sum that cancels to ~0 keeps only that absolute precision."""
    for stat in STATS:
        got = latest[f"{prefix}/{stat}"]
        want = expected[stat]
        if math.isnan(want):
            assert math.isnan(got), f"{prefix}/{stat}: {got} is not NaN"
            continue
        scale = 1e-7 * expected["max_abs"] if stat == "mean" else 0.0
        assert got == pytest.approx(want, rel=rel, abs=1e-12 + scale), f"{prefix}/{stat}"


def hook_count(model):
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(dtype)


def manual_pass(model, x):
    """Forward/backward spelled out, so activations and their grads are direct values."""
    acts = []
    h = x
    for layer in model:
        h = layer(h)
        acts.append(h)
    loss = acts[-1].float().pow(2).mean()
    return loss, acts, torch.autograd.grad(loss, acts, retain_graph=True)


def tiny_llama():
    pytest.importorskip("transformers")
    return build_llama(0, max_positions=32)


# -- exactness -----------------------------------------------------------------------


def test_param_and_grad_stats_match_direct_computation():
    model = mlp()
    monitor = GAPMonitor(model, detail="tensors")
    x = torch.randn(3, 5, 8)
    with monitor.step(0):
        model(x).pow(2).mean().backward()
    assert monitor.latest_step == 0
    for name, p in model.named_parameters():
        assert_stats(monitor.latest, f"gap/params/{name}", whole(p))
        assert_stats(monitor.latest, f"gap/grads/{name}", whole(p.grad))
    total = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters()))
    assert monitor.latest["gap/summary/grads/l2_norm"] == pytest.approx(total.item(), rel=1e-6)
    biggest = max(model.named_parameters(), key=lambda item: item[1].grad.norm().item())[0]
    assert f"gap/summary/grads/top_l2_norm/{biggest}" in monitor.latest


def test_accelerator_code_path_matches_direct_computation(monkeypatch):
    """The path taken where host reads stall the device (float64 sums, counts always),
    exercised on CPU; the CUDA test below runs it for real where a GPU is present."""
    import adapterprobe.monitor.reductions as reductions

    monkeypatch.setattr(reductions, "_cheap_host_reads", lambda device: False)
    model = mlp()
    with torch.no_grad():
        model[0].weight[3, 1] = float("nan")
        model[2].weight.fill_(0.5)  # constant: variance 0
    monitor = GAPMonitor(model, detail="tensors")
    x = torch.randn(3, 5, 8)
    with monitor.step(0):
        model(x).pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert_stats(monitor.latest, f"gap/params/{name}", whole(p))
        assert_stats(monitor.latest, f"gap/grads/{name}", whole(p.grad))
    assert monitor.latest["gap/params/2.weight/var"] == 0.0
    assert monitor.latest["gap/activations/0/nonfinite"] == 15
    assert monitor.latest["gap/activations/2/nonfinite"] == 3 * 5 * 4
    assert_stats(monitor.latest, "gap/activations/1", per_instance([torch.tanh(model[0](x))]))


def test_activation_stats_reduce_per_instance_and_match_direct_computation():
    model = mlp()
    monitor = GAPMonitor(model, detail="tensors", kinds=("activation", "activation_grad"))
    x = torch.randn(3, 5, 8)
    _, acts, act_grads = manual_pass(model, x)
    model.zero_grad()
    with monitor.step(0):
        model(x).pow(2).mean().backward()
    for index, (act, grad) in enumerate(zip(acts, act_grads, strict=True)):
        assert_stats(monitor.latest, f"gap/activations/{index}", per_instance([act]))
        assert_stats(monitor.latest, f"gap/activation_grads/{index}", per_instance([grad]))
    assert not any(key.startswith(("gap/params/", "gap/grads/")) for key in monitor.latest)


def test_in_place_modules_and_shared_outputs_get_their_own_values():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Identity(), nn.Linear(16, 4))
    monitor = GAPMonitor(model, detail="tensors", kinds=("activation", "activation_grad"))
    x = torch.randn(5, 8)
    pre = model[0](x)
    post = torch.relu(pre)
    loss = model[3](post).pow(2).mean()
    pre_grad, post_grad = torch.autograd.grad(loss, [pre, post])
    with monitor.step(0):
        model(x).pow(2).mean().backward()
    assert_stats(monitor.latest, "gap/activations/0", per_instance([pre]))
    assert_stats(monitor.latest, "gap/activations/1", per_instance([post]))
    assert_stats(monitor.latest, "gap/activations/2", per_instance([post]))  # same tensor
    assert_stats(monitor.latest, "gap/activation_grads/0", per_instance([pre_grad]))
    assert_stats(monitor.latest, "gap/activation_grads/2", per_instance([post_grad]))


def test_gradient_accumulation_reports_the_accumulated_gradient_and_all_instances():
    model = mlp()
    monitor = GAPMonitor(model, detail="tensors")
    batches = [torch.randn(2, 8), torch.randn(4, 8)]
    with monitor.step(4):
        for batch in batches:
            model(batch).pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert_stats(monitor.latest, f"gap/grads/{name}", whole(p.grad))
    first_layer = [model[0](batch) for batch in batches]
    assert_stats(monitor.latest, "gap/activations/0", per_instance(first_layer))


def test_bf16_model_stats_are_computed_in_float32():
    model = mlp(torch.bfloat16)
    monitor = GAPMonitor(model, detail="tensors")
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with monitor.step(0):
        model(x).float().pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert_stats(monitor.latest, f"gap/params/{name}", whole(p), rel=1e-5)
        assert_stats(monitor.latest, f"gap/grads/{name}", whole(p.grad), rel=1e-5)
    assert_stats(monitor.latest, "gap/activations/0", per_instance([model[0](x)]), rel=1e-5)
    # A bf16 result would carry 8 bits of mantissa; float32 keeps the exact value.
    mean = monitor.latest["gap/params/0.weight/mean"]
    assert mean != torch.tensor(mean, dtype=torch.bfloat16).item()


def test_variance_keeps_its_precision_under_a_large_mean():
    model = nn.Linear(64, 64)
    with torch.no_grad():
        model.weight.copy_(1000 + torch.randn(64, 64) * 0.1)  # |mean| / std = 1e4
    monitor = GAPMonitor(model, detail="tensors", kinds="param")
    with monitor.step(0):
        pass
    assert_stats(monitor.latest, "gap/params/weight", whole(model.weight), rel=1e-6)


def test_no_grad_evaluation_records_activations_only():
    model = mlp()
    monitor = GAPMonitor(model, detail="tensors")
    x = torch.randn(3, 8)
    with monitor.step(0), torch.no_grad():
        model(x)
    assert_stats(monitor.latest, "gap/activations/2", per_instance([model(x)]))
    assert not any(key.startswith("gap/activation_grads/") for key in monitor.latest)
    assert not any(key.startswith("gap/grads/") for key in monitor.latest)
    assert "gap/params/0.weight/mean" in monitor.latest


# -- hooks: when they exist -----------------------------------------------------------


def test_non_sampled_steps_attach_nothing_and_sampled_steps_clean_up():
    model = mlp()
    monitor = GAPMonitor(model, interval=3)
    x = torch.randn(2, 8)
    for step in range(7):
        with monitor.step(step):
            assert hook_count(model) == (len(model) if step % 3 == 0 else 0)
            model(x).sum().backward()
        assert hook_count(model) == 0
    assert monitor.latest_step == 6
    # tensor hooks die with the block too: a later backward records nothing
    out = model(x)
    before = dict(monitor.latest)
    out.sum().backward()
    assert monitor.latest == before


def test_hooks_are_removed_when_the_block_raises():
    model = mlp()
    monitor = GAPMonitor(model, detail="tensors")
    with monitor.step(0):
        model(torch.randn(2, 8)).sum().backward()
    before = dict(monitor.latest)
    with pytest.raises(RuntimeError, match="boom"), monitor.step(1):
        out = model(torch.randn(2, 8))
        raise RuntimeError("boom")
    assert hook_count(model) == 0
    assert monitor.latest == before and monitor.latest_step == 0
    out.sum().backward()  # the graph built inside the failed step has no live hooks
    assert monitor.latest == before
    x = torch.randn(5, 8)
    model.zero_grad()
    with monitor.step(2):
        model(x).sum().backward()
    assert_stats(monitor.latest, "gap/activations/0", per_instance([model[0](x)]))


def test_steps_do_not_nest_and_need_an_int():
    monitor = GAPMonitor(mlp())
    with monitor.step(0), pytest.raises(MonitorConfigError, match="inside step"):
        monitor.step(1)
    for bad in (1.0, True, "3"):
        with pytest.raises(MonitorConfigError, match="step must be an int"):
            monitor.step(bad)


def test_close_removes_hooks_and_refuses_further_steps(tmp_path):
    model = mlp()
    monitor = GAPMonitor(model, sink=tmp_path / "gap.jsonl")
    window = monitor.step(0)
    window.__enter__()
    assert hook_count(model) > 0
    monitor.close()
    assert hook_count(model) == 0
    with pytest.raises(MonitorConfigError, match="closed"):
        monitor.step(1)
    with pytest.raises(MonitorConfigError, match="closed"):
        monitor.sinks[0].write_step(step_record(0, 1.0))


# -- NaN / inf -------------------------------------------------------------------------


def test_nan_in_one_weight_is_counted_in_params_activations_and_grads():
    model = mlp()
    with torch.no_grad():
        model[0].weight[3, 1] = float("nan")
        model[2].bias[0] = float("inf")
    monitor = GAPMonitor(model, detail="tensors")
    x = torch.randn(3, 5, 8)
    with monitor.step(0):
        model(x).pow(2).mean().backward()
    latest = monitor.latest
    assert latest["gap/params/0.weight/nonfinite"] == 1
    assert math.isnan(latest["gap/params/0.weight/mean"])  # honest: NaN stays NaN
    assert latest["gap/params/2.bias/nonfinite"] == 1
    assert latest["gap/params/2.bias/max_abs"] == math.inf
    assert latest["gap/params/0.bias/nonfinite"] == 0
    assert latest["gap/activations/0/nonfinite"] == 3 * 5  # output unit 3 of every token
    assert latest["gap/activations/2/nonfinite"] > 0
    assert latest["gap/grads/0.weight/nonfinite"] > 0
    assert latest["gap/grads/0.weight/nonfinite"] == whole(model[0].weight.grad)["nonfinite"]
    assert latest["gap/summary/params/nonfinite"] == 2
    assert latest["gap/summary/params/nonfinite_tensors"] == 2
    assert latest["gap/summary/grads/nonfinite"] > 0
    assert math.isnan(latest["gap/summary/activations/max_abs"])
    assert latest["gap/summary/activations/layers/0/nonfinite"] == 15


# -- outputs of any shape ----------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    label: str
    hidden: torch.Tensor


class Shapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.as_tuple = Wrap(lambda h: (h.sum(), h * 2, "note"))
        self.as_dict = Wrap(lambda h: {"n": 3, "h": h + 1})
        self.as_dataclass = Wrap(lambda h: Pair("x", h - 1))
        self.as_none = Wrap(lambda h: None)
        self.as_int = Wrap(lambda h: 7)
        self.as_ids = Wrap(lambda h: h.argmax(-1))
        self.proj = nn.Linear(4, 6)

    def forward(self, x):
        h = self.proj(x)
        outs = [self.as_tuple(h)[1], self.as_dict(h)["h"], self.as_dataclass(h).hidden]
        for silent in (self.as_none, self.as_int, self.as_ids):
            silent(h)
        return sum(o.sum() for o in outs)


class Wrap(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, h):
        return self.fn(h)


def test_non_tensor_outputs_use_the_tensors_inside_and_ignore_the_rest():
    model = Shapes()
    monitor = GAPMonitor(model, detail="tensors")
    x = torch.randn(3, 4)
    with monitor.step(0):
        model(x).backward()
    h = model.proj(x)
    assert_stats(monitor.latest, "gap/activations/as_tuple", per_instance([h * 2]))
    assert_stats(monitor.latest, "gap/activations/as_dict", per_instance([h + 1]))
    assert_stats(monitor.latest, "gap/activations/as_dataclass", per_instance([h - 1]))
    ones = per_instance([torch.ones_like(h)])
    assert_stats(monitor.latest, "gap/activation_grads/as_dict", ones)
    for silent in ("as_none", "as_int", "as_ids"):
        assert not any(f"/{silent}/" in key for key in monitor.latest)


def test_hf_model_outputs_are_monitored():
    model = tiny_llama()
    monitor = GAPMonitor(model, detail="tensors", include=("model", "model.layers.*", "lm_head*"))
    ids = torch.randint(0, 64, (2, 6))
    with monitor.step(0):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    hidden = model.model(input_ids=ids).last_hidden_state  # BaseModelOutputWithPast
    assert_stats(monitor.latest, "gap/activations/model", per_instance([hidden]), rel=1e-4)
    assert_stats(monitor.latest, "gap/activations/lm_head", per_instance([out.logits]), rel=1e-4)
    assert "gap/activations/model.layers.0.self_attn/mean" in monitor.latest  # a tuple output
    assert "gap/activation_grads/model.layers.1.mlp/mean" in monitor.latest
    assert "gap/activations/model.embed_tokens/mean" not in monitor.latest  # not included
    assert_stats(monitor.latest, "gap/grads/lm_head.weight", whole(model.lm_head.weight.grad))
    layer = [k for k in monitor.latest if k.startswith("gap/summary/grads/layers/")]
    assert {k.split("/")[4] for k in layer} == {"model.layers.0", "model.layers.1"}
    assert hook_count(model) == 0


def test_include_and_exclude_select_names():
    model = mlp()
    monitor = GAPMonitor(model, detail="tensors", include="2*", exclude="*.bias")
    with monitor.step(0):
        model(torch.randn(2, 8)).sum().backward()
    names = {key.split("/")[2] for key in monitor.latest if not key.startswith("gap/summary")}
    assert names == {"2.weight", "2"}


# -- options -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": 0}, "interval must be >= 1"),
        ({"interval": True}, "interval must be an int"),
        ({"interval": 2.0}, "interval must be an int"),
        ({"kinds": ("grad", "weights")}, "unknown kinds"),
        ({"kinds": ()}, "nothing to monitor"),
        ({"include": 3}, "include must be a glob"),
        ({"exclude": [""]}, "exclude patterns must be non-empty"),
        ({"dump": "dumps/"}, "dump must be a GradientDump"),
        ({"sink": 42}, "sink must be a path"),
    ],
)
def test_invalid_monitor_options(kwargs, message):
    with pytest.raises(MonitorConfigError, match=message):
        GAPMonitor(mlp(), **kwargs)


def test_model_must_be_a_module():
    with pytest.raises(MonitorConfigError, match=r"torch\.nn\.Module"):
        GAPMonitor({"weight": torch.zeros(2)})
    assert issubclass(MonitorConfigError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": -1}, "start must be >= 0"),
        ({"every": 0}, "every must be >= 1"),
        ({"first_n": 0}, "first_n must be >= 1"),
        ({"first_n": 2.5}, "first_n must be an int"),
        ({"start": 5, "end": 4}, "end .* must be >= 5"),
    ],
)
def test_invalid_dump_options(tmp_path, kwargs, message):
    with pytest.raises(MonitorConfigError, match=message):
        GradientDump(tmp_path, **kwargs)


def test_dump_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(MonitorConfigError, match="is a file"):
        GradientDump(tmp_path / "f")


# -- gradient dumps ------------------------------------------------------------------------


def test_gradient_dump_round_trips_in_range_steps(tmp_path):
    model = mlp()
    dump = GradientDump(tmp_path / "grads", start=2, end=8, every=3)
    monitor = GAPMonitor(model, interval=1, kinds=(), dump=dump)
    saved = {}
    for step in range(10):
        model.zero_grad()
        with monitor.step(step):
            model(torch.randn(2, 8)).sum().backward()
        saved[step] = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert sorted(p.name for p in (tmp_path / "grads").iterdir()) == ["step2", "step5", "step8"]
    for step in (2, 5, 8):
        for name, grad in saved[step].items():
            path = tmp_path / "grads" / f"step{step}" / f"{name}.safetensors"
            loaded = safetensors_torch.load_file(path)["gradient"]
            assert torch.equal(loaded, grad)


def test_gradient_dump_first_n_keeps_the_leading_slice_and_replaces_reruns(tmp_path):
    model = mlp()
    monitor = GAPMonitor(model, dump=GradientDump(tmp_path, first_n=3))
    for _ in range(2):  # the same step twice: the second dump replaces the first
        model.zero_grad()
        with monitor.step(0):
            model(torch.randn(2, 8)).sum().backward()
    step_dir = tmp_path / "step0"
    with safetensors_torch.safe_open(step_dir / "0.weight.safetensors", "pt") as f:
        loaded = f.get_tensor("gradient")
        assert json.loads(f.metadata()["full_shape"]) == [16, 8]
    assert torch.equal(loaded, model[0].weight.grad[:3, :3])
    bias = safetensors_torch.load_file(step_dir / "2.bias.safetensors")["gradient"]
    assert torch.equal(bias, model[2].bias.grad[:3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step0"]  # no staging leftovers


# -- sinks -----------------------------------------------------------------------------------


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_sink_writes_gap_records_and_dlm_step_lines(tmp_path):
    model = mlp()
    log = tmp_path / "run.jsonl"
    monitor = GAPMonitor(model, interval=2, sink=log)
    for step in range(4):
        with monitor.step(step):
            loss = model(torch.randn(2, 8)).pow(2).mean()
            loss.backward()
        monitor.log_step(step, loss, lr=1e-3, grad_norm=None)
    monitor.log_step(4, float("nan"), lr=1e-3)
    monitor.close()
    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["type"], r["step"]) for r in records] == [
        ("gap", 0),
        ("step", 0),
        ("step", 1),
        ("gap", 2),
        ("step", 2),
        ("step", 3),
        ("step", 4),
    ]
    gap = records[3]
    assert gap["stats"].keys() == monitor.latest.keys()  # the summary, nothing per tensor
    assert "tensors_file" not in gap
    for key, value in monitor.latest.items():  # rounded to 7 significant digits
        assert gap["stats"][key] == float(format(value, ".7g")), key
    step_line = records[2]
    fields = {"type", "step", "loss", "lr", "grad_norm", "tokens_per_sec", "val_loss", "timestamp"}
    assert set(step_line) == fields
    assert step_line["grad_norm"] is None and step_line["lr"] == 1e-3
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", step_line["timestamp"])
    assert lines[2] == json.dumps(step_line, sort_keys=True)
    assert '"loss": NaN' in lines[-1]


def test_training_drift_reads_a_monitored_run(tmp_path):
    from adapterprobe import training_drift

    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 8), torch.randn(64, 4)
    monitor = GAPMonitor(model, interval=3, sink=JsonlSink.for_store(tmp_path, 1))
    for step in range(12):
        with monitor.step(step):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.log_step(step, float("nan") if step == 7 else loss, lr=0.05)
    monitor.close()
    result = training_drift(tmp_path, rules="sway")
    assert result.evidence["num_steps"] == 12  # gap records are not steps
    assert result.evidence["nonfinite_steps"] == [7]


def test_log_step_needs_a_sink_and_valid_fields(tmp_path):
    with pytest.raises(MonitorConfigError, match="needs a sink"):
        GAPMonitor(mlp()).log_step(0, 1.0)
    monitor = GAPMonitor(mlp(), sink=tmp_path / "x.jsonl")
    with pytest.raises(MonitorConfigError, match="'lr' must be a number"):
        monitor.log_step(0, 1.0, lr="fast")
    with pytest.raises(MonitorConfigError, match="reserved"):
        monitor.log_step(0, 1.0, type="gap")
    with pytest.raises(MonitorConfigError, match="step must be an int"):
        monitor.log_step(0.5, 1.0)
    monitor.close()
    assert (tmp_path / "x.jsonl").read_text() == ""


def test_store_log_name_and_banner(tmp_path):
    with JsonlSink.for_store(tmp_path, 7, banner={"seed": 1}) as sink:
        sink.write_step(step_record(1, 2.5))
    (path,) = (tmp_path / "logs").iterdir()
    assert re.fullmatch(r"train-000007-\d{8}T\d{6}\.jsonl", path.name)
    banner, step = read_jsonl(path)
    assert banner == {"type": "banner", "run_id": 7, "seed": 1}
    assert step["loss"] == 2.5 and step["type"] == "step"
    with pytest.raises(MonitorConfigError, match="run_id"):
        JsonlSink.for_store(tmp_path, -1)


def test_unwritable_log_path_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(MonitorConfigError, match="cannot open GAP log"):
        JsonlSink(tmp_path / "file" / "gap.jsonl")


def test_tensorboard_sink_writes_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from adapterprobe.sinks import TensorBoardSink

    model = mlp()
    monitor = GAPMonitor(model, kinds="grad", detail="tensors", sink=TensorBoardSink(tmp_path))
    with monitor.step(0):
        model(torch.randn(2, 8)).sum().backward()
    monitor.log_step(0, 0.5, lr=0.1)
    monitor.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "gap/grads/0.weight/l2_norm" in tags and "train/loss" in tags
    (scalar,) = events.Scalars("gap/summary/grads/l2_norm")
    assert scalar.value == pytest.approx(monitor.latest["gap/summary/grads/l2_norm"], rel=1e-6)


def test_sinks_module_does_not_import_torch():
    code = "import sys, adapterprobe.sinks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- CUDA ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    cpu_model = mlp()
    gpu_model = mlp().cuda()
    x = torch.randn(3, 5, 8)
    results = []
    for model, batch in ((cpu_model, x), (gpu_model, x.cuda())):
        monitor = GAPMonitor(model, detail="tensors")
        with monitor.step(0):
            model(batch).pow(2).mean().backward()
        results.append(monitor.latest)
    assert results[0].keys() == results[1].keys()
    for key, value in results[0].items():
        assert results[1][key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
