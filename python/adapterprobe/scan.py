"""Scan adapter stores: every store under the given roots, every probe, one report.

Discovery and all file reading run in Rust, in parallel, with the GIL
released; the verdicts come from the same judge functions the single probes
use (``judge_drift``, ``judge_ghost``), so a scan never disagrees with
``training_drift``/``gradient_ghost`` called directly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
import adapterprobe.remote as remote
from adapterprobe.errors import UsageError
from adapterprobe.judge import judge_batch
from adapterprobe.probes import DEFAULT_PROBES, resolve_options
from adapterprobe.probes.options import ProbeOptions
from adapterprobe.records import ScanRecord, ScanReport

DEMO_STORE = Path(__file__).parent / "demo_store"
#: What discovery recognises as a store, in words, one layout a line (for
#: "nothing to probe"; docs/formats.md has each with an example tree).
LAYOUT_LINES = (
    "dlm stores: adapter/ and logs/train-*.jsonl",
    "HF Trainer output directories (also TRL, LLaMA-Factory, axolotl): checkpoint-N/, "
    "trainer_state.json, trainer_log.jsonl, training_args.bin",
    "Lightning runs: *.ckpt or metrics.csv",
    "W&B run directories (run-<id>.wandb) and MLflow runs (mlruns/<experiment>/<run>/, "
    "mlflow.db or another SQLite *.db with MLflow's tables)",
    "folders of TensorBoard event files (events.out.tfevents.*)",
    "training-log CSVs: Keras's CSVLogger (epoch,loss,val_loss,...), Ultralytics' results.csv",
    "PEFT adapter directories: adapter_config.json and adapter_model.safetensors",
)
LAYOUTS = "; ".join(LAYOUT_LINES)
# Stores gathered per Rust call: big enough to keep every core busy, small
# enough for a progress bar to move.
BATCH = 256
# Batches handed to the Rust pass ahead of the one being written out: with
# two, the pool starts the next batch the moment it finishes one, instead
# of waiting for Python to take the finished records (3-7% of a 20,000-store
# scan's wall time on 2 cores).
AHEAD = 2
#: Most reader threads a scan starts (the Rust core refuses more).
MAX_WORKERS = 256

Progress = Callable[[int, int], None]
OptionsArg = Mapping[str, "ProbeOptions | Mapping[str, Any]"]


def check_workers(workers: int | None) -> None:
    """UsageError unless ``workers`` is None or an integer in 1..MAX_WORKERS."""
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise UsageError(
            f"workers must be an integer between 1 and {MAX_WORKERS}, got {workers!r}",
            option="workers",
        )


def flat_roots(roots: Sequence[Any]) -> list[str | Path]:
    """Roots given as paths or as lists of paths (``ap.scan([a, b])`` and
    ``ap.scan(a, b)`` mean the same); UsageError for anything else."""
    out: list[str | Path] = []
    for root in roots:
        if isinstance(root, (list, tuple)):
            out.extend(flat_roots(root))
        elif isinstance(root, (str, os.PathLike)):
            out.append(root if isinstance(root, str) else Path(os.fspath(root)))
        else:
            raise UsageError(
                f"a root must be a path (str or os.PathLike) or a list of them, "
                f"got {type(root).__name__}"
            )
    return out


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def check_roots(roots: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The roots with ``~`` expanded; UsageError for one that does not exist,
    is not a directory (or an SQLite file: MLflow's store), or cannot be listed."""
    roots = flat_roots(roots)
    if not roots:
        raise UsageError("scan needs at least one root directory")
    checked = []
    for root in roots:
        path = Path(root).expanduser()
        if not path.exists():
            raise UsageError("no such file or directory", path=path)
        if path.is_file() and _is_sqlite(path):
            checked.append(path)  # an MLflow store (mlflow.db): each run is a store
            continue
        if path.is_file() and path.suffix == ".safetensors" and _core.is_lora_file(str(path)):
            checked.append(path)  # a kohya, LyCORIS or diffusers LoRA file: a store
            continue
        if not path.is_dir():
            raise UsageError(
                "is not a directory; give a store, an adapter or checkpoint directory, a "
                "directory holding them, an MLflow mlflow.db, or a LoRA .safetensors file",
                path=path,
            )
        try:
            with os.scandir(path) as listing:
                next(listing, None)
        except OSError as exc:
            raise UsageError(f"cannot be listed: {exc.strerror}", path=path) from exc
        checked.append(path)
    return checked


class Discovered(tuple[list[_core.Target], list[tuple[str, str]]]):
    """What :func:`discover` found: unpacks as ``(targets, problems)``, and
    has ``skipped``: with ``explain=True``, the directories the walk passed
    over on purpose, as ``(path, why)`` (hidden ones, folders with nothing a
    layout recognises, subfolders of a store that are no part of its
    layout), for ``-v``; None when not asked."""

    skipped: list[tuple[str, str]] | None

    def __new__(
        cls,
        targets: list[_core.Target],
        problems: list[tuple[str, str]],
        skipped: list[tuple[str, str]] | None,
    ) -> Discovered:
        self = super().__new__(cls, (targets, problems))
        self.skipped = skipped
        return self

    @property
    def targets(self) -> list[_core.Target]:
        return self[0]

    @property
    def problems(self) -> list[tuple[str, str]]:
        return self[1]


def discover(
    *roots: str | Path,
    all_versions: bool = False,
    workers: int | None = None,
    explain: bool = False,
    follow_symlinks: bool = False,
    exclude: Sequence[str] = (),
) -> Discovered:
    """``(targets, problems)`` for the roots; with ``explain``, also
    ``.skipped`` (see :class:`Discovered`: one more directory listing per
    store, so only when asked). A bad root is a UsageError (see
    :func:`check_roots`). A root may be a URL (``s3://``, ``gs://``,
    ``az://``, ``file://``; see :mod:`adapterprobe.remote`) or a Hugging
    Face hub cache (its snapshots are the stores). Symlinks are followed
    only while they stay inside their root (a hub snapshot's: inside its
    cache) unless ``follow_symlinks``; a directory that cannot be listed
    and a link not followed are targets of their own (layout
    ``"unreadable"``, ``"outside-root"``) whose records say so."""
    found, _ = _discover(roots, all_versions, workers, explain, follow_symlinks, exclude)
    return found


def _discover(
    roots: Sequence[str | os.PathLike[str]],
    all_versions: bool,
    workers: int | None,
    explain: bool = False,
    follow_symlinks: bool = False,
    exclude: Sequence[str] = (),
) -> tuple[Discovered, list[remote.Alias]]:
    local, early, made = remote.resolve_roots(flat_roots(roots))
    try:
        paths = [str(p) for p in check_roots(local)] if local or not roots else []
        bounds = [str(remote.confinement_of(p)) for p in paths]
        found = _core.discover(
            paths,
            all_versions=all_versions,
            workers=remote.workers_for(workers),
            follow_symlinks=follow_symlinks,
            explain=explain,
            bounds=bounds,
            exclude=list(exclude),
        )
    except BaseException:
        remote.release(made)
        raise
    problems = early + [(str(p.path), p.message) for p in found.problems]
    skipped = [(str(p.path), p.message) for p in found.skipped] if explain else None
    discovered = Discovered(found.targets, remote.rename_problems(problems), skipped)
    return discovered, made


def scan_batches(
    targets: Sequence[Any],
    *,
    probes: Sequence[str] = DEFAULT_PROBES,
    workers: int | None = None,
    engine: str = "local",
    address: str | None = None,
    rules: str | None = None,
    options: OptionsArg | None = None,
    progress: Progress | None = None,
    json: bool = False,
) -> Iterator[list[ScanRecord]]:
    """Records of discovered `targets`, a batch at a time and in order, so a
    caller can write them out without holding a whole large scan in memory.
    ``json``: the pass also writes each record's JSON text (for JSON output)."""
    probes = tuple(probes)
    resolved = resolve_options(probes, options, rules)
    check_workers(workers)
    if engine == "ray":
        remote.refuse_staged(targets, "ray")
        from adapterprobe.ray_engine import run_on_ray

        yield remote.rename_records(
            run_on_ray(targets, probes, resolved, address=address, progress=progress)
        )
        return
    if engine != "local":
        raise UsageError(f"engine must be 'local' or 'ray', got {engine!r}")
    total = len(targets)
    if progress:
        progress(0, total)
    batches = [targets[start : start + BATCH] for start in range(0, total, BATCH)]
    done = 0
    # Rust gathers and judges the next AHEAD batches (GIL released) while
    # Python hands out batch i; at most AHEAD + 1 are held at a time.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapterprobe-scan") as pool:
        threads = remote.workers_for(workers)

        def submit(batch: Sequence[Any]) -> Any:
            return pool.submit(judge_batch, batch, probes, resolved, threads, json=json)

        pending = [submit(b) for b in batches[:AHEAD]]
        for i, batch in enumerate(batches):
            records = pending.pop(0).result()
            if i + AHEAD < len(batches):
                pending.append(submit(batches[i + AHEAD]))
            yield remote.rename_records(records)
            done += len(batch)
            if progress:
                progress(done, total)


def scan(
    *roots: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    probes: Sequence[str] = DEFAULT_PROBES,
    all_versions: bool = False,
    workers: int | None = None,
    engine: str = "local",
    address: str | None = None,
    rules: str | None = None,
    options: OptionsArg | None = None,
    progress: Progress | None = None,
    follow_symlinks: bool = False,
    exclude: Sequence[str] = (),
) -> ScanReport:
    """Probe every store under ``roots`` and return the records.

    ``probes``: which probes to run (default: ``adapter_weights``,
    ``gradient_ghost``, ``training_drift``; ``full_weights`` is opt-in).
    ``all_versions``: every
    ``versions/vNNNN`` instead of each adapter's ``current.txt``.
    ``workers``: threads (default: one per core). ``engine``: ``"local"``
    or ``"ray"`` (``address``: a Ray cluster to join). ``rules``: the verdict
    rule set, ``"robust"`` (default: built to gate CI on) or ``"sway"``
    (dlm-sway's exact semantics). ``options``: probe
    thresholds keyed by probe name, each an options object or a mapping, e.g.
    ``{"training_drift": {"min_steps": 20}}`` or ``{"gradient_ghost":
    GhostOptions(min_steps_threshold=100)}``. ``progress(done, total)`` is
    called as stores finish. ``follow_symlinks``: follow links that lead
    out of a root (default False: the scan stays inside each root, resolved,
    and a record says what it did not follow; files under ``/proc`` and
    ``/sys`` are never read). ``exclude``: glob patterns of folders the walk
    does not enter, matched against a folder's name or its path below the
    root (``"wandb"``, ``"outputs/old"``, ``"runs/ablation-*"``; ``*``
    stays within one name, ``**`` crosses them). With no root, the demo store bundled with the
    package is scanned (as ``adapterprobe scan`` does).
    """
    resolved = resolve_options(tuple(probes), options, rules)  # fail fast, before the walk
    check_workers(workers)
    if engine != "ray" and address is not None:
        raise UsageError("address is only used with engine='ray'", option="address")
    (targets, problems), made = _discover(
        flat_roots(roots) or (DEMO_STORE,),
        all_versions,
        workers,
        follow_symlinks=follow_symlinks,
        exclude=exclude,
    )
    batches = scan_batches(
        targets,
        probes=probes,
        workers=workers,
        engine=engine,
        address=address,
        rules=rules,
        options=options,
        progress=progress,
    )
    return ScanReport(released(batches, made), problems, settings_of(resolved, probes))


def released(batches: Iterator[list[ScanRecord]], made: list[remote.Alias]) -> Iterator[ScanRecord]:
    """The records of ``batches``; the remote roots staged for them are
    released once they are all read (or the reading stops)."""
    try:
        for batch in batches:
            yield from batch
    finally:
        remote.release(made)


def settings_of(resolved: Mapping[str, ProbeOptions], probes: Sequence[str]) -> dict[str, Any]:
    """The settings a report shows: the rule set and each probe's options."""
    rules = next(iter(resolved.values())).rules
    out: dict[str, Any] = {"rules": rules}
    for name in probes:
        values = resolved[name].to_dict()
        values.pop("rules", None)
        out[name] = values
    return out


#: Folder levels below the top a path of :func:`stores_of` is looked up
#: through at most (the walk searches no deeper either).
MAX_DEPTH = 64


class StoresOf(tuple[list[str], list[str], list[str]]):
    """:func:`stores_of`'s answer: ``(roots, in_none, outside)``: the roots
    to scan, each once (a store folder, or an MLflow database file, whose
    runs are its stores), in the order first met; the paths in no store; the
    paths not under the top."""

    __slots__ = ()

    @property
    def roots(self) -> list[str]:
        return self[0]

    @property
    def in_none(self) -> list[str]:
        return self[1]

    @property
    def outside(self) -> list[str]:
        return self[2]


def stores_of(
    paths: Sequence[str | os.PathLike[str]], *, top: str | os.PathLike[str] = "."
) -> StoresOf:
    """The stores that hold `paths` (such as the files a commit touches), as
    a scan of `top` finds them, so that only those are scanned.

    The walk of a scan stops at the first folder of a known layout, so the
    store holding a path is the topmost folder on the way down from `top`
    to it that is a store (each folder on the way judged alone, from its own
    listing: ``discover`` told to enter none of its subfolders); an MLflow
    database (``mlflow.db``) holds its runs. A path below a hidden folder,
    or deeper than ``MAX_DEPTH`` levels, is in no store, as the walk does
    not go there; so is one whose folders are all plain ones. A path that no
    longer exists (a deleted file) is looked up through the folders of it
    that do. Paths are taken as given (``os.path.abspath``, no links
    resolved); links inside the store are confined to `top`, as in a scan
    of it."""
    base = os.path.abspath(top)
    answers: dict[str, list[Any]] = {}

    def targets_of(folder: str) -> list[Any]:
        if folder not in answers:
            found = _core.discover([folder], exclude=["*"], bounds=[base])
            answers[folder] = list(found.targets)
        return answers[folder]

    roots: list[str] = []
    in_none: list[str] = []
    outside: list[str] = []
    for given in paths:
        path = os.path.abspath(given)
        if path != base and not path.startswith(base.rstrip(os.sep) + os.sep):
            outside.append(os.fsdecode(given))
            continue
        parts = Path(path).relative_to(base).parts
        folders = [base] + [os.path.join(base, *parts[:i]) for i in range(1, len(parts))]
        if parts and os.path.isdir(path):
            folders.append(path)
        root = None
        for depth, folder in enumerate(folders):
            if depth > MAX_DEPTH or not os.path.isdir(folder):
                break
            if depth and os.path.basename(folder).startswith("."):
                break  # the walk enters no hidden folder
            held = [Path(t.store) for t in targets_of(folder)]
            here = Path(folder)
            # A folder that is a store (at the top: also one version of a
            # store above it, as a scan of the top takes it), or the MLflow
            # database that is the path itself.
            if any(s == here or (depth == 0 and here.is_relative_to(s)) for s in held):
                root = folder
            elif any(s.is_relative_to(path) and s != Path(path) for s in held):
                root = path
            if root is not None:
                break
        if root is None:
            in_none.append(os.fsdecode(given))
            continue
        named = os.path.normpath(os.path.join(top, os.path.relpath(root, base)))
        if named not in roots:
            roots.append(named)
    return StoresOf((roots, in_none, outside))
