"""Parasitic extraction under FSDP2 on two real ranks (gloo, CPU) against one process.

Both ranks train the same tiny model on their halves of the global batch; rank 0's
adapter must equal the one a single process extracts after training on the whole
batch (relative 1e-4 on every ``B @ A``), whether ``W0`` was snapshotted from the
sharded model (each rank keeping its shard) or before wrapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors.torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this build", allow_module_level=True)

from dist_workers import batch, fsdp2, local_batch, loss_of, make_model, run_world  # noqa: E402

from adapterprobe import ParasiticConfig, ParasiticExtractor  # noqa: E402

STEPS = 3
CONFIG = ParasiticConfig(min_rank=1, max_rank=4, interval_steps=0, detect_triggers=False)


def _train(model: Any, x: Any, y: Any) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(STEPS):
        loss_of(model, x, y).backward()
        optimizer.step()
        optimizer.zero_grad()


def _products(adapter: Any) -> dict[str, list[Any]]:
    return {
        name: (f.lora_B.double() @ f.lora_A.double()).tolist() for name, f in adapter.layers.items()
    }


def sharded_runs(rank: int, world: int, workdir: Path) -> dict[str, Any]:
    x, y = local_batch(rank, world)
    out: dict[str, Any] = {}

    model = fsdp2(make_model())
    px = ParasiticExtractor(CONFIG)
    px.snapshot_base(model)
    out["shard_rows"] = {name: w0.shape[0] for name, w0 in px.base_weights.items()}
    _train(model, x, y)
    out["sharded"] = _products(px.extract(model, STEPS))
    px.save_library(workdir / "library")

    early = ParasiticExtractor(CONFIG)
    plain = make_model()
    early.snapshot_base(plain)  # before wrapping: a full W0 on each rank
    model = fsdp2(plain)
    _train(model, x, y)
    out["early"] = _products(early.extract(model, STEPS))
    return out


def reference() -> tuple[dict[str, list[Any]], dict[str, int]]:
    model = make_model()
    px = ParasiticExtractor(CONFIG)
    px.snapshot_base(model)
    rows = {name: w0.shape[0] for name, w0 in px.base_weights.items()}
    x, y = batch()
    _train(model, x, y)
    return _products(px.extract(model, STEPS)), rows


@pytest.fixture(scope="module")
def world_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    workdir = tmp_path_factory.mktemp("parasitic2")
    return run_world(sharded_runs, workdir), workdir


def _assert_products(got: dict[str, list[Any]], want: dict[str, list[Any]]) -> None:
    assert sorted(got) == sorted(want)
    for name, product in want.items():
        torch.testing.assert_close(
            torch.tensor(got[name]), torch.tensor(product), rtol=1e-4, atol=1e-6
        )


def test_sharded_snapshot_keeps_one_shard_per_rank(world_run):
    results, _ = world_run
    _, full_rows = reference()
    for name, rows in full_rows.items():
        # rows split as torch.chunk does: ceil on rank 0, the rest on rank 1
        assert [r["shard_rows"][name] for r in results] == [(rows + 1) // 2, rows // 2]


def test_rank0_adapter_equals_single_process_extraction(world_run):
    results, _ = world_run
    want, _ = reference()
    assert len(want) == 8
    _assert_products(results[0]["sharded"], want)
    assert results[1]["sharded"] == {}  # only rank 0 factors


def test_snapshot_taken_before_wrapping_gives_the_same_adapter(world_run):
    results, _ = world_run
    want, _ = reference()
    _assert_products(results[0]["early"], want)


def test_library_written_once_by_rank0(world_run):
    _, workdir = world_run
    library = ParasiticExtractor.load_library(workdir / "library")
    (adapter,) = list(library)
    want, _ = reference()
    _assert_products(_products(adapter), want)
