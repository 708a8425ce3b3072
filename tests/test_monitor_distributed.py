"""GAPMonitor and GradientDump on two real ranks (gloo, CPU): DDP and FSDP2 against one process.

One spawned world runs every scenario in turn (starting processes is the slow part);
each rank returns what it saw, and the tests compare rank 0's records with a
single-process run on the same global batch (relative 1e-4).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this build", allow_module_level=True)

from dist_workers import batch, fsdp2, local_batch, loss_of, make_model, run_world  # noqa: E402

from adapterprobe import GAPMonitor, GradientDump, MonitorConfigError  # noqa: E402
from adapterprobe.sinks import read_tensor_stats  # noqa: E402

FIRST_N = 4


def _one_step(model: Any, monitor: GAPMonitor, x: Any, y: Any, step: int = 0) -> float:
    with monitor.step(step):
        loss = loss_of(model, x, y)
        loss.backward()
    return float(loss.detach())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- what each rank runs (module level: spawn imports them) ------------------------------


def scenarios(rank: int, world: int, workdir: Path) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    out: dict[str, Any] = {}
    x, y = local_batch(rank, world)

    # DDP, summary detail, a JSONL sink and log_step on every rank; the monitor gets the
    # DDP wrapper itself
    ddp = DistributedDataParallel(make_model())
    monitor = GAPMonitor(ddp, sink=workdir / "ddp.jsonl", timeout=30)
    loss = _one_step(ddp, monitor, x, y)
    monitor.log_step(0, loss)
    out["ddp"] = monitor.latest
    out["ddp_sinks"] = len(monitor.sinks)
    monitor.close()

    # FSDP2, per-tensor detail with the side file, and a first_n dump
    model = fsdp2(make_model())
    dump = GradientDump(workdir / "first_n", first_n=FIRST_N)
    monitor = GAPMonitor(
        model, detail="tensors", sink=workdir / "fsdp.jsonl", dump=dump, timeout=30
    )
    _one_step(model, monitor, x, y)
    out["fsdp"] = monitor.latest
    out["fsdp_dtensors"] = sum(type(p).__name__ == "DTensor" for p in model.parameters())
    monitor.close()

    # the same gradients again, dumped whole as a distributed checkpoint
    model.zero_grad()
    monitor = GAPMonitor(model, kinds=(), dump=GradientDump(workdir / "dcp"), timeout=30)
    _one_step(model, monitor, x, y)
    monitor.close()

    # a dump that cannot be written (its directory is a file on rank 0's disk, made
    # after the check at construction): the error is raised on every rank, after the
    # record reached the sink
    blocked = GradientDump(workdir / "blocked", first_n=2)
    torch.distributed.barrier()  # both dumps built before the file appears
    if rank == 0:
        (workdir / "blocked").write_text("in the way", encoding="utf-8")
    model.zero_grad()
    monitor = GAPMonitor(model, sink=workdir / "blocked.jsonl", dump=blocked, timeout=30)
    try:
        _one_step(model, monitor, x, y)
        out["blocked"] = "no error"
    except MonitorConfigError as exc:
        out["blocked"] = str(exc)
    monitor.close()

    # a NaN in one rank's half of the batch: global NaN/inf counts, NaN extremes
    ddp = DistributedDataParallel(make_model())
    monitor = GAPMonitor(ddp, detail="tensors", timeout=30)
    _one_step(ddp, monitor, *_with_nan(x, y, rank, world))
    out["nan"] = monitor.latest

    # ranks at different sampled steps: both fail, naming the steps
    monitor = GAPMonitor(make_model(), kinds=("param",), timeout=30)
    try:
        with monitor.step(2 if rank == 0 else 4):
            pass
        out["steps"] = "no error"
    except MonitorConfigError as exc:
        out["steps"] = str(exc)

    # a step entered on rank 1 only: a bounded wait and a message naming the step
    # (last: the group is unusable afterwards)
    if rank == 0:
        time.sleep(4)  # alive, and never entering the step, while rank 1 waits
    else:
        monitor = GAPMonitor(make_model(), kinds=("param",), timeout=1)
        try:
            with monitor.step(7):
                pass
            out["alone"] = "no error"
        except MonitorConfigError as exc:
            out["alone"] = str(exc)
    return out


# -- the single-process reference ------------------------------------------------------------


def _with_nan(x: Any, y: Any, rank: int, world: int) -> tuple[Any, Any]:
    """The batch with one NaN input, in the last rank's half (index 6 of 8)."""
    x = x.clone()
    if rank == world - 1:
        x[-2, 3] = float("nan")
    return x, y


def reference(detail: str, nan: bool = False) -> dict[str, float]:
    model = make_model()
    monitor = GAPMonitor(model, detail=detail)
    x, y = batch()
    if nan:
        x, y = _with_nan(x, y, 0, 1)
    _one_step(model, monitor, x, y)
    return monitor.latest


def reference_grads() -> dict[str, Any]:
    model = make_model()
    x, y = batch()
    loss_of(model, x, y).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def world_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    workdir = tmp_path_factory.mktemp("world2")
    return run_world(scenarios, workdir), workdir


def _scaled(key: str, value: float, world: int) -> float:
    """Activation gradients under a per-rank mean loss are ``world`` times larger."""
    if "/activation_grads/" not in key or key.endswith(("/nonfinite", "/nonfinite_tensors")):
        return value
    return value * world * world if key.endswith("/var") else value * world


def _assert_same(got: dict[str, float], want: dict[str, float], world: int = 2) -> None:
    missing = sorted(set(want) - set(got))
    assert not missing, f"missing keys: {missing[:5]}"
    extra = sorted(set(got) - set(want))
    assert not extra, f"extra keys: {extra[:5]}"
    for key, value in want.items():
        expected = _scaled(key, value, world)
        if math.isnan(expected):
            assert math.isnan(got[key]), key
        else:
            assert got[key] == pytest.approx(expected, rel=1e-4, abs=1e-9), key


# -- the tests ------------------------------------------------------------------------------


def test_ddp_statistics_are_global_and_equal_single_process(world_run):
    results, _ = world_run
    want = reference("summary")
    for rank in (0, 1):  # every rank holds the global numbers
        _assert_same(results[rank]["ddp"], want)
    assert "gap/summary/activations/rms" in want and "gap/summary/grads/l2_norm" in want


def test_ddp_rank0_alone_writes_one_record_and_one_step_line(world_run):
    results, workdir = world_run
    lines = _lines(workdir / "ddp.jsonl")
    assert [line["type"] for line in lines] == ["gap", "step"]
    assert lines[0]["stats"]["gap/summary/grads/l2_norm"] == pytest.approx(
        reference("summary")["gap/summary/grads/l2_norm"], rel=1e-6
    )
    assert [r["ddp_sinks"] for r in results] == [1, 0]  # rank 1 opened no file


def test_fsdp2_covers_every_parameter_and_equals_single_process(world_run):
    results, workdir = world_run
    want = reference("tensors")
    assert results[0]["fsdp_dtensors"] == 16
    assert sum(key.startswith("gap/grads/") and key.endswith("/l2_norm") for key in want) == 16
    for rank in (0, 1):
        _assert_same(results[rank]["fsdp"], want)
    # one record, and its side file holds the same per-tensor numbers
    (record,) = _lines(workdir / "fsdp.jsonl")
    side = read_tensor_stats(workdir / record["tensors_file"])
    for key, value in side.items():
        assert value == pytest.approx(_scaled(key, want[key], 2), rel=1e-4, abs=1e-9), key


def test_first_n_dump_gathers_the_global_gradient_on_rank0(world_run):
    from safetensors import safe_open

    _, workdir = world_run
    grads = reference_grads()
    files = sorted((workdir / "first_n" / "step0").iterdir())
    assert len(files) == len(grads)
    for name, grad in grads.items():
        with safe_open(str(workdir / "first_n" / "step0" / f"{name}.safetensors"), "pt") as f:
            assert f.metadata()["full_shape"] == str(list(grad.shape))
            got = f.get_tensor("gradient")
        want = grad[tuple(slice(0, FIRST_N) for _ in grad.shape)]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


def test_full_dump_is_a_distributed_checkpoint_of_the_global_gradients(world_run, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    _, workdir = world_run
    dcp_to_torch_save(workdir / "dcp" / "step0", tmp_path / "grads.pt")
    loaded = torch.load(tmp_path / "grads.pt", weights_only=True)
    grads = reference_grads()
    assert sorted(loaded) == sorted(grads)
    for name, grad in grads.items():
        torch.testing.assert_close(loaded[name], grad, rtol=1e-4, atol=1e-7)
    assert not list((workdir / "dcp").glob(".*"))  # no staging left behind


def test_a_failed_dump_raises_on_every_rank_and_keeps_the_record(world_run):
    results, workdir = world_run
    for rank in (0, 1):
        assert "cannot write gradient dump" in results[rank]["blocked"]
    (record,) = _lines(workdir / "blocked.jsonl")
    assert record["type"] == "gap" and record["step"] == 0


def test_ranks_at_different_steps_fail_with_both_steps_named(world_run):
    results, _ = world_run
    for rank in (0, 1):
        assert "different steps (2 to 4)" in results[rank]["steps"]


def test_a_step_entered_on_one_rank_times_out_naming_the_step(world_run):
    results, _ = world_run
    assert "alone" not in results[0]
    message = results[1]["alone"]
    assert "GAP monitor step 7" in message and "enter every sampled step" in message
    assert "timed out" in message.lower()


def test_fsdp1_flat_parameters_are_refused():
    model = make_model()
    # FSDP1 names (use_orig_params): a wrapper component in every parameter name
    wrapper = torch.nn.Module()
    wrapper._fsdp_wrapped_module = model
    with pytest.raises(MonitorConfigError, match="FSDP1"):
        GAPMonitor(wrapper)


def test_nan_on_one_rank_is_counted_globally(world_run):
    results, _ = world_run
    want = reference("tensors", nan=True)
    assert want["gap/summary/activations/nonfinite"] > 0
    assert math.isnan(want["gap/activations/0/max_abs"])
    for rank in (0, 1):
        _assert_same(results[rank]["nan"], want)
