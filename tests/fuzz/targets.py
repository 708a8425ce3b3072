"""The fuzz targets: which seed file is mutated, how, and which reader runs on it.

A case is a directory: the mutated file under the name the reader expects,
plus unchanged companion files (the config beside the weights, a fixed-up
``.sha256`` sidecar). ``call`` names the function of ``calls.py`` (or of
any module, ``module:function``) that the worker runs on the directory.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from . import mutators as m
from .calls import EVENTS_NAME
from .seeds import MLFLOW_RUN, SHARDS

FixUp = Callable[[bytes, random.Random], dict[str, bytes]]


@dataclass(frozen=True)
class Target:
    """One parser under fuzz."""

    name: str
    call: str
    primary: str
    seed_kind: str
    families: tuple[str, ...]
    companions: tuple[tuple[str, str], ...] = ()
    fix_up: FixUp | None = None
    # Fixed files of the case, by name (e.g. a store's current.txt).
    static: tuple[tuple[str, bytes], ...] = ()
    # Targets whose `primary` files take turns being mutated (a whole store);
    # their `call` is unused, this target's runs on the case.
    alternatives: tuple[Target, ...] = ()

    def pick_mutator(self, rng: random.Random) -> tuple[str, m.Mutator]:
        """A structure-aware mutator 70% of the time, a generic byte edit otherwise."""
        special = [f for f in self.families if f != "generic"]
        family = "generic" if not special or rng.random() < 0.3 else rng.choice(special)
        name = rng.choice(sorted(m.FAMILIES[family]))
        return name, m.FAMILIES[family][name]


def sha256_sidecar(data: bytes, rng: random.Random) -> dict[str, bytes]:
    """Usually a sidecar that matches (so the reader goes on), sometimes a stale or bad one."""
    digest = hashlib.sha256(data).hexdigest()
    roll = rng.random()
    if roll < 0.85:
        return {"training_state.pt.sha256": (digest + "\n").encode()}
    if roll < 0.9:
        return {}
    return {
        "training_state.pt.sha256": rng.choice(
            (b"", b"0" * 64, digest.upper().encode(), b"\xff" * 64, b"x" * 70_000, b"\n" * 3)
        )
    }


CALLS = ".calls"
VERSION = "adapter/versions/v0001/"
LOG = "logs/train-000001-20250301T090000.jsonl"
#: A W&B offline run directory as the SDK names it, holding its run log.
WANDB_RUN = "wandb/offline-run-20250301_090000-seed/run-seed.wandb"
#: The files of the MLflow file store's run (seeds.MLFLOW_RUN), by seed kind.
MLFLOW_FILES = (
    (f"{MLFLOW_RUN}/metrics/train/loss", "mlflow_loss"),
    (f"{MLFLOW_RUN}/metrics/eval_loss", "mlflow_eval"),
    (f"{MLFLOW_RUN}/metrics/learning_rate", "mlflow_lr"),
    (f"{MLFLOW_RUN}/meta.yaml", "mlflow_meta"),
    (f"{MLFLOW_RUN}/tags/mlflow.runName", "mlflow_run_name"),
)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "safetensors_header",
            f"{CALLS}:safetensors_header",
            "adapter_model.safetensors",
            "safetensors",
            ("generic", "safetensors"),
        ),
        Target(
            "adapter_weights",
            f"{CALLS}:adapter_weights",
            "adapter_model.safetensors",
            "safetensors",
            ("generic", "safetensors"),
            companions=(("adapter_config.json", "adapter_config"),),
        ),
        Target(
            "adapter_bin",
            f"{CALLS}:adapter_weights",
            "adapter_model.bin",
            "adapter_bin",
            ("generic", "zip"),
            companions=(("adapter_config.json", "adapter_config"),),
        ),
        Target(
            "adapter_config",
            f"{CALLS}:adapter_weights",
            "adapter_config.json",
            "adapter_config",
            ("generic", "json", "peft"),
            companions=(("adapter_model.safetensors", "safetensors"),),
        ),
        Target(
            "full_weights",
            f"{CALLS}:full_weights",
            "model.safetensors",
            "safetensors",
            ("generic", "safetensors"),
        ),
        Target(
            "model_index",
            f"{CALLS}:full_weights",
            "model.safetensors.index.json",
            "model_index",
            ("generic", "json"),
            companions=tuple((name, f"model_shard_{i}") for i, name in enumerate(SHARDS, 1)),
        ),
        Target(
            "dlm_log",
            f"{CALLS}:dlm_log",
            "train-000001-20250301T090000.jsonl",
            "dlm_log",
            ("generic", "jsonl"),
        ),
        Target(
            "trainer_state",
            f"{CALLS}:trainer_state",
            "trainer_state.json",
            "trainer_state",
            ("generic", "json"),
        ),
        Target(
            "trainer_log",
            f"{CALLS}:trainer_log",
            "trainer_log.jsonl",
            "trainer_log",
            ("generic", "jsonl"),
        ),
        Target("tfevents", f"{CALLS}:tfevents", EVENTS_NAME, "tfevents", ("generic", "tfevents")),
        Target(
            "wandb_log", f"{CALLS}:wandb_log", "run-seed.wandb", "wandb_log", ("generic", "wandb")
        ),
        Target("mlflow_db", f"{CALLS}:mlflow_db", "mlflow.db", "mlflow_db", ("generic",)),
        Target("csv", f"{CALLS}:csv", "metrics.csv", "csv", ("generic", "csv")),
        Target(
            "optimizer_pt",
            f"{CALLS}:optimizer_pt",
            "optimizer.pt",
            "optimizer_pt",
            ("generic", "zip"),
        ),
        Target(
            "training_state",
            f"{CALLS}:training_state",
            "training_state.pt",
            "training_state",
            ("generic", "zip"),
            fix_up=sha256_sidecar,
        ),
        Target("ckpt", f"{CALLS}:ckpt", "last.ckpt", "ckpt", ("generic", "zip")),
        Target(
            "compare_updates",
            f"{CALLS}:compare_updates",
            "adapter_model.safetensors",
            "safetensors",
            ("generic", "safetensors"),
            companions=(("adapter_config.json", "adapter_config"),),
        ),
        Target(
            "compare_config",
            f"{CALLS}:compare_updates",
            "adapter_config.json",
            "adapter_config",
            ("generic", "json", "peft"),
            companions=(("adapter_model.safetensors", "safetensors"),),
        ),
        Target(
            "saved_scan",
            f"{CALLS}:saved_scan",
            "scan.json",
            "saved_scan",
            ("generic", "json", "saved_scan"),
        ),
        Target(
            "wandb_run",
            f"{CALLS}:tracker_run",
            WANDB_RUN,
            "wandb_log",
            ("generic", "wandb"),
        ),
        Target(
            "mlflow_run",
            f"{CALLS}:tracker_run",
            MLFLOW_FILES[0][0],
            "mlflow_loss",
            ("generic", "mlflow"),
            companions=MLFLOW_FILES,
            alternatives=tuple(
                Target("", "", path, kind, ("generic", "mlflow")) for path, kind in MLFLOW_FILES
            ),
        ),
        Target(
            "store_scan",
            f"{CALLS}:store_scan",
            VERSION + "adapter_model.safetensors",
            "safetensors",
            ("generic", "safetensors"),
            companions=(
                (VERSION + "adapter_model.safetensors", "safetensors"),
                (VERSION + "adapter_config.json", "adapter_config"),
                (VERSION + "training_state.pt", "training_state"),
                (LOG, "dlm_log"),
            ),
            static=(("adapter/current.txt", b"versions/v0001"),),
            alternatives=(
                Target(
                    "",
                    "",
                    VERSION + "adapter_model.safetensors",
                    "safetensors",
                    ("generic", "safetensors"),
                ),
                Target(
                    "",
                    "",
                    VERSION + "adapter_config.json",
                    "adapter_config",
                    ("generic", "json", "peft"),
                ),
                Target(
                    "",
                    "",
                    VERSION + "training_state.pt",
                    "training_state",
                    ("generic", "zip"),
                    fix_up=sha256_sidecar,
                ),
                Target("", "", LOG, "dlm_log", ("generic", "jsonl")),
            ),
        ),
    )
}
