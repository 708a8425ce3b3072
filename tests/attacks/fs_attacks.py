"""Hostile stores built from the filesystem side: links out of the root,
special files, unreadable directories, tampered optimizer states.

Every store starts as a copy of real files (the bundled demo store written
by dlm's writers, the HF Trainer / Lightning / PEFT fixtures in
``rust/testdata`` written by those libraries) and is then attacked the way
someone who controls a pull request or a shared bucket could. ``scan_cli``
runs the command line in a subprocess as CI would, with a fake secret in
its environment, optionally as an unprivileged user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import adapterprobe

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
DEMO = PYTHON_DIR / "adapterprobe" / "demo_store" / "healthy"
HF_RUN = REPO / "rust" / "testdata" / "logs" / "hf_run"
LIGHTNING_RUN = REPO / "rust" / "testdata" / "logs" / "lightning" / "version_0"
HF_CHECKPOINT = REPO / "rust" / "testdata" / "optim" / "hf_lora" / "checkpoint-3"

#: What the scanning process must never reveal: in its environment (so
#: ``/proc/self/environ`` holds it) and in a file outside the scanned root.
SECRET = "ghp_adapterprobeFAKEtoken0123456789abcdef"
SECRET_ENV = {"CI_SECRET_TOKEN": SECRET}
#: The user an unprivileged scan runs as (nobody).
NOBODY = 65534


def outside_secret(base: Path) -> Path:
    """A file outside any scanned root holding the secret, shaped like
    ``/etc/shadow`` (a line a CSV reader would take as its header)."""
    out = base / "outside"
    out.mkdir(parents=True, exist_ok=True)
    secret = out / "shadow"
    secret.write_text(f"root:{SECRET}:19000:0:99999:7:::\n")
    return secret


def dlm_store(root: Path, name: str = "dlm") -> Path:
    store = root / name
    shutil.copytree(DEMO, store)
    return store


def hf_run(root: Path, name: str = "hf") -> Path:
    store = root / name
    shutil.copytree(HF_RUN, store)
    return store


def lightning_run(root: Path, name: str = "lightning") -> Path:
    store = root / name
    shutil.copytree(LIGHTNING_RUN, store)
    return store


def hf_checkpoint_run(root: Path, name: str = "hf-opt") -> Path:
    """An HF output dir whose one checkpoint holds a real AdamW state and adapter."""
    store = root / name
    shutil.copytree(HF_CHECKPOINT, store / "checkpoint-3")
    return store


def replace_with_link(path: Path, target: str | Path) -> Path:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)
    return path


# ---- links ----


def current_txt_to_environ(root: Path) -> Path:
    """A dlm store whose ``current.txt`` is the scanner's own environment."""
    store = dlm_store(root, "environ")
    return replace_with_link(store / "adapter" / "current.txt", "/proc/self/environ")


def current_txt_to_outside(root: Path, secret: Path) -> Path:
    store = dlm_store(root, "pointer-out")
    return replace_with_link(store / "adapter" / "current.txt", secret)


def metrics_csv_to_outside(root: Path, secret: Path) -> Path:
    """A Lightning run whose ``metrics.csv`` is a file outside the root."""
    store = lightning_run(root, "csv-out")
    return replace_with_link(store / "metrics.csv", secret)


def trainer_state_to_outside(root: Path, secret: Path) -> Path:
    store = hf_run(root, "trainer-state-out")
    return replace_with_link(store / "trainer_state.json", secret)


def event_file_to_environ(root: Path) -> Path:
    """A TensorBoard-only run whose event file is ``/proc/self/environ``."""
    store = root / "tb-environ"
    store.mkdir()
    events = store / "events.out.tfevents.1700000000.host.1.0"
    return replace_with_link(events, "/proc/self/environ")


def dlm_log_to_outside(root: Path, secret: Path) -> Path:
    store = dlm_store(root, "log-out")
    log = next((store / "logs").glob("train-*.jsonl"))
    return replace_with_link(log, secret)


def adapter_files_to_outside(root: Path, secret: Path) -> list[Path]:
    """A bare PEFT adapter whose config and weights are links out of the root."""
    store = root / "peft-out"
    shutil.copytree(HF_CHECKPOINT, store, ignore=shutil.ignore_patterns("optimizer.pt"))
    return [
        replace_with_link(store / "adapter_config.json", secret),
        replace_with_link(store / "adapter_model.safetensors", secret),
    ]


def optimizer_to_outside(root: Path, outside: Path) -> Path:
    """An HF checkpoint whose ``optimizer.pt`` is a real state kept outside."""
    real = outside / "optimizer.pt"
    shutil.copy(HF_CHECKPOINT / "optimizer.pt", real)
    store = hf_checkpoint_run(root, "optimizer-out")
    return replace_with_link(store / "checkpoint-3" / "optimizer.pt", real)


def link_to_slash(root: Path) -> Path:
    """A link to ``/``: followed, it would make the scan walk the machine."""
    return replace_with_link(root / "everything", "/")


def link_to_outside_store(root: Path, outside: Path) -> Path:
    """A link to a healthy store that lives outside the root."""
    store = dlm_store(outside, "their-store")
    return replace_with_link(root / "borrowed", store)


def all_links(root: Path, base: Path) -> dict[str, Path]:
    """Every link attack under `root` (secrets under `base`, outside it)."""
    secret = outside_secret(base)
    return {
        "environ": current_txt_to_environ(root),
        "pointer": current_txt_to_outside(root, secret),
        "csv": metrics_csv_to_outside(root, secret),
        "trainer_state": trainer_state_to_outside(root, secret),
        "events": event_file_to_environ(root),
        "dlm_log": dlm_log_to_outside(root, secret),
        "peft": adapter_files_to_outside(root, secret)[0],
        "optimizer": optimizer_to_outside(root, secret.parent),
        "slash": link_to_slash(root),
        "store": link_to_outside_store(root, secret.parent),
    }


# ---- special files ----


def fifos(root: Path) -> list[Path]:
    """FIFOs where a reader expects a file: a CSV log, a trainer state, an
    event file, an optimizer state, a dlm pointer. Opening any of them for
    reading would wait forever for a writer."""
    made = []
    lightning = lightning_run(root, "fifo-csv")
    hf = hf_run(root, "fifo-trainer-state")
    tb = root / "fifo-events"
    tb.mkdir()
    opt = hf_checkpoint_run(root, "fifo-optimizer")
    dlm = dlm_store(root, "fifo-pointer")
    for path in (
        lightning / "metrics.csv",
        hf / "trainer_state.json",
        tb / "events.out.tfevents.1700000000.host.1.0",
        opt / "checkpoint-3" / "optimizer.pt",
        dlm / "adapter" / "current.txt",
    ):
        if path.exists():
            path.unlink()
        os.mkfifo(path)
        made.append(path)
    return made


def device_link(root: Path) -> Path:
    """A Lightning run whose ``metrics.csv`` is ``/dev/zero`` (endless)."""
    store = lightning_run(root, "dev-zero")
    return replace_with_link(store / "metrics.csv", "/dev/zero")


# ---- unreadable ----


def world_readable(tree: Path) -> None:
    """Let an unprivileged user read `tree` (its copies keep the owner's modes)."""
    for dirpath, _, filenames in os.walk(tree):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                os.chmod(p, 0o644)


def unreadable_adapter_dir(root: Path) -> Path:
    """A dlm store whose ``adapter/`` cannot be listed (mode 000)."""
    store = dlm_store(root, "locked-adapter")
    return store / "adapter"


def unreadable_checkpoint(root: Path) -> Path:
    """An HF run whose newest checkpoint cannot be listed."""
    store = hf_checkpoint_run(root, "locked-checkpoint")
    return store / "checkpoint-3"


def unreadable_plain_dir(root: Path) -> Path:
    """A directory below the root, not (visibly) a store, that cannot be listed."""
    locked = root / "team-b"
    dlm_store(locked, "hidden-store")
    return locked


def lock(paths: Sequence[Path]) -> None:
    for p in paths:
        os.chmod(p, 0)


# ---- tampered optimizer states ----

#: How a real AdamW state is tampered with, by name.
TAMPERINGS = ("negative_exp_avg_sq", "huge_exp_avg", "negative_step", "absurd_step")


def tamper_optimizer(path: Path, how: str) -> None:
    """Load the real ``torch.save``d optimizer state at `path`, make it say
    something no optimizer writes, and save it back with torch."""
    import torch

    sd = torch.load(path, weights_only=True)
    first = min(sd["state"])
    slot = sd["state"][first]
    if how == "negative_exp_avg_sq":
        slot["exp_avg_sq"].view(-1)[0] = -abs(float(slot["exp_avg_sq"].view(-1)[0])) - 1e-6
    elif how == "huge_exp_avg":
        v = slot["exp_avg_sq"].view(-1)
        slot["exp_avg"].view(-1)[0] = 1000.0 * float(v[0].sqrt()) + 1.0
    elif how == "negative_step":
        slot["step"] = torch.tensor(-5.0)
    elif how == "absurd_step":
        slot["step"] = torch.tensor(1e300, dtype=torch.float64)
    else:
        raise ValueError(how)
    torch.save(sd, path)


def tampered_run(root: Path, how: str) -> Path:
    store = hf_checkpoint_run(root, f"tampered-{how}")
    tamper_optimizer(store / "checkpoint-3" / "optimizer.pt", how)
    return store


# ---- running the command line as CI would ----

#: Runs the command line; with ``--as-nobody`` first, everything it needs is
#: imported (the interpreter may live where nobody can read) and then the
#: process drops to uid/gid 65534 before any store is touched.
_PRELUDE = """
import os, sys
sys.path.insert(0, {python_dir!r})
import adapterprobe, adapterprobe.cli, adapterprobe.scan, adapterprobe.judge
import adapterprobe.cli.scan, adapterprobe.cli.report, adapterprobe.cli.render
import adapterprobe.reports.html, adapterprobe.reports.markdown, adapterprobe.reports.shaping
import adapterprobe.probes, adapterprobe.probes.drift, adapterprobe.probes.ghost
import adapterprobe.probes.weights, adapterprobe.records, adapterprobe.settings
import adapterprobe._fs, json, csv, io, textwrap, shutil, tempfile, encodings.idna
import locale, gettext, argparse, concurrent.futures, gc, statistics, html, numpy
adapterprobe.cli.build_parser()
args = sys.argv[1:]
if args and args[0] == "--as-nobody":
    args = args[1:]
    os.setgroups([])
    os.setgid({nobody})
    os.setuid({nobody})
from adapterprobe.cli import main
sys.exit(main(args))
"""


@dataclass
class Run:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def cli(
    *args: str | Path,
    as_nobody: bool = False,
    cwd: Path | None = None,
    timeout: float = 120,
) -> Run:
    """``adapterprobe ARGS`` in a subprocess with the secret in its
    environment (and nothing else of ours), optionally as nobody."""
    # The package the tests import: the installed wheel in CI (python/ has no
    # built _core there), the development tree elsewhere.
    package_dir = Path(adapterprobe.__file__).resolve().parent.parent
    prelude = _PRELUDE.format(python_dir=str(package_dir), nobody=NOBODY)
    argv = [str(a) for a in args]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "NO_COLOR": "1",
        **SECRET_ENV,
    }
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", prelude, *(["--as-nobody"] if as_nobody else []), *argv],
        capture_output=True,
        text=True,
        errors="replace",
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    return Run(argv, done.returncode, done.stdout, done.stderr, time.monotonic() - start)
