"""Run a function on two real ranks (gloo, CPU, spawned processes) and collect what each returns.

Used by the distributed tests: :func:`run_world` starts ``world`` processes with
``torch.multiprocessing``'s spawn context, each initializes a gloo process group on
127.0.0.1 and a free port, runs ``scenario(rank, world, workdir)`` (a module-level
function, so that spawn can import it) and writes its JSON result; a process that
raises writes the error instead. A process still alive after ``deadline`` seconds is
killed and the run fails: a test never hangs.
"""

from __future__ import annotations

import json
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

GLOBAL_BATCH = 8


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(
    rank: int,
    world: int,
    port: int,
    scenario: Callable[[int, int, Path], Any],
    workdir: str,
    pg_timeout: float,
) -> None:
    import datetime

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    out = Path(workdir) / f"result-rank{rank}.json"
    try:
        torch.distributed.init_process_group(
            "gloo",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=pg_timeout),
        )
        result = {"ok": scenario(rank, world, Path(workdir))}  # NaN: json's NaN token
    except BaseException as exc:  # reported to the test, which fails on it
        result = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    out.write_text(json.dumps(result), encoding="utf-8")
    # No teardown: after a timed-out collective the group's shutdown can wait a long time.
    os._exit(0)


def run_world(
    scenario: Callable[[int, int, Path], Any],
    workdir: Path,
    *,
    world: int = 2,
    deadline: float = 240.0,
    pg_timeout: float = 60.0,
) -> list[Any]:
    """Each rank's return value (rank order); raises AssertionError on any rank's error."""
    ctx = torch.multiprocessing.get_context("spawn")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    procs = [
        ctx.Process(target=_entry, args=(r, world, port, scenario, str(workdir), pg_timeout))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(deadline)
    alive = [i for i, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert not alive, f"ranks {alive} still running after {deadline}s"
    results = []
    for rank in range(world):
        path = workdir / f"result-rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result"
        result = json.loads(path.read_text(encoding="utf-8"))
        assert "error" not in result, f"rank {rank}: {result['error']}\n{result['trace']}"
        results.append(result["ok"])
    return results


# ---------------------------------------------------------------------------
# The tiny model and data every scenario and its single-process reference use


def make_model() -> torch.nn.Module:
    """16 parameter tensors, uneven under a 2-way shard (7 and 5 rows)."""
    torch.manual_seed(0)
    dims = [6, 7, 5, 9, 7, 8, 5, 7, 3]
    layers: list[torch.nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: 8 instances."""
    gen = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH, 6, generator=gen), torch.randn(GLOBAL_BATCH, 3, generator=gen)


def local_batch(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch()
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean()


def fsdp2(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for module in model:
        if isinstance(module, torch.nn.Linear):
            fully_shard(module)
    fully_shard(model)
    return model
