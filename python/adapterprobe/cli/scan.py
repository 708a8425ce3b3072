"""``adapterprobe scan``: the health of every adapter and run under some roots."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

from adapterprobe.cli import positive_int
from adapterprobe.cli.render import Output, add_output_options, choose_format, print_problems

EPILOG = """\
examples:
  adapterprobe scan                          the bundled demo store
  adapterprobe scan /data/adapters           every store below /data/adapters
  adapterprobe scan out/ --format json       an HF Trainer output dir, as JSON records
  adapterprobe scan wandb/ mlflow.db         every W&B run and every MLflow run
  adapterprobe scan /data --fail-on warn     exit 1 on any warning (for CI)
  adapterprobe scan /data -q                 only the problems and the summary
  adapterprobe scan /data --json -o scan.json   JSON records, written atomically
  adapterprobe scan /data --save-json scan.json the table, and every record saved as JSON
  adapterprobe scan /data --junit junit.xml  also a JUnit report for the CI's test view
  adapterprobe scan /data --format github    annotations + step summary (automatic
                                             when GITHUB_ACTIONS=true)
  adapterprobe scan /data --all-versions     every version, not just the newest
  adapterprobe scan --stores-of -- FILE...   only the stores holding these files (a
                                             pre-commit hook's staged files)
  adapterprobe scan s3://bucket/runs -v      a bucket prefix, read by range (also gs://, az://)
  adapterprobe scan --hf-cache               the Hugging Face hub cache, stores as org/name@rev
  adapterprobe scan /data --set training_drift.spike_z=8 --set adapter_weights.max_top_share=0.95

what is scanned:
  Every store below the roots, found by what it has: dlm stores (adapter/ and
  logs/), HF Trainer / TRL / axolotl output dirs (checkpoint-N/, last-checkpoint/,
  trainer_state.json, runs/; LLaMA-Factory's trainer_log.jsonl), Lightning runs
  (*.ckpt, metrics.csv), bare PEFT adapter dirs (adapter_config.json +
  adapter_model.safetensors or .bin), folders of TensorBoard events, and tracker
  runs: each W&B run (wandb/run-*/, offline-run-*/) and each MLflow run (mlruns/,
  or a run of mlflow.db; give the file itself as a root too) is a store, read
  without importing the tracker. Each store gets a training_drift record (its
  loss curve), and a gap_monitor record where its logs/ hold the GAP monitor's
  records; each version (the newest, or all with --all-versions) an
  adapter_weights record (its LoRA weights) and a gradient_ghost record (its
  optimizer state). Records say what a version holds in checkpoint_kind:
  adapter, full (a full fine-tune: adapter_weights SKIPs it; --probes
  ...,full_weights checks its weights) or logs.

verdicts and score:
  pass/warn/fail/skip/error per record; --rules robust (default) raises no alarm
  on healthy runs, --rules sway reproduces dlm-sway's heuristics. The score is in
  [0, 1], higher is healthier, for ranking only; the verdict is what gates.

thresholds:
  --set PROBE.OPTION=VALUE, or in pyproject.toml:
    [tool.adapterprobe]
    rules = "robust"
    fail_on = "warn"
    [tool.adapterprobe.training_drift]
    spike_z = 8
  Options per probe: python -c "import adapterprobe as ap; print(ap.DriftOptions().describe())"

output:
  The table is the default on a terminal and in CI logs; programs ask for
  --format json (or --json), jsonl or csv. Names and messages from scanned
  files are escaped for each format (control characters shown as \\x1b, no raw
  HTML in markdown, CSV cells guarded against spreadsheet formulas). A store's
  verdict is its worst record's; skip only when every record skipped.

exit codes:
  0  no verdict reached --fail-on      2  usage error (bad option, root missing or not a dir)
  1  some verdict reached --fail-on    3  nothing found to probe under the roots
  (error records count as failures, except with --fail-on never, which turns the gate off)
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan",
        help="probe every store under one or more roots",
        description="Probe every adapter store under the given roots, in parallel, "
        "without loading any model or importing torch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "roots",
        nargs="*",
        metavar="ROOT",
        help="store, adapter version or checkpoint dir, or any directory holding stores "
        "(default: the bundled demo store)",
    )
    p.add_argument(
        "--stores-of",
        action="store_true",
        help="the ROOTs are files (e.g. those a commit touches, from a pre-commit hook): scan "
        "the store holding each, once, as a scan of the working directory finds it; a file in "
        "no store is passed over, and none in a store is exit 0",
    )
    add_output_options(p)
    add_save_option(p)
    add_scan_options(p)
    add_baseline_options(p)
    p.set_defaults(run=run)


def add_save_option(p: argparse.ArgumentParser) -> None:
    """``--save-json``, in the output group: one scan, shown in one format and
    kept as JSON (the GitHub Action annotates from it and renders its report
    with ``report --from``)."""
    groups = [g for g in p._action_groups if g.title == "output"]
    (groups[0] if groups else p).add_argument(
        "--save-json",
        default=None,
        metavar="FILE",
        help="also write every record to FILE as --format json does (all of them, whatever "
        "--only shows), atomically: for `report --from` and --baseline",
    )


def add_baseline_options(p: argparse.ArgumentParser) -> None:
    """``--baseline`` and its gate options (comparison.baseline.Gate does the work)."""
    from adapterprobe.comparison.baseline import Margins

    g = p.add_argument_group("regression gate")
    g.add_argument(
        "--baseline",
        metavar="FILE",
        default=None,
        help='a saved `scan --format json`: every record gains a "baseline" entry',
    )
    g.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when any record regressed against --baseline",
    )
    g.add_argument(
        "--match",
        choices=("path", "name"),
        default="path",
        help="match stores by path relative to the root (default) or by directory name",
    )
    g.add_argument(
        "--loss-margin",
        type=float,
        default=Margins.loss_margin,
        metavar="SHARE",
        help="relative rise of a loss that counts as a regression (default 0.05)",
    )


def probe_list(text: str) -> tuple[str, ...]:
    """`--probes a,b`: a comma-separated subset of the probes."""
    from adapterprobe.probes import PROBES

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PROBES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(PROBES)}, got {text!r}"
        )
    return names


def add_probe_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--probes",
        type=probe_list,
        default=None,
        metavar="P[,P...]",
        help="probes to run (default: adapter_weights, gradient_ghost, training_drift, "
        "gap_monitor); "
        "full_weights (every value of a full fine-tune's model.safetensors) only when named",
    )


def add_scan_options(p: argparse.ArgumentParser) -> None:
    add_probe_option(p)
    p.add_argument(
        "--all-versions",
        action="store_true",
        help="probe every adapter version (dlm versions/vNNNN, every checkpoint-N, every "
        ".ckpt), not only the current or newest one",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="threads to read with (default: one per core; at most 256)",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local threads (default) or a Ray cluster (needs ray: pip install ray)",
    )
    p.add_argument(
        "--address", default=None, metavar="ADDR", help="Ray cluster to join (needs --engine ray)"
    )
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="follow symlinks that lead out of the roots (default: such links are not followed "
        "and their records say so; only for trees you trust)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="do not enter folders matching GLOB, by name or by path below the root "
        "(repeatable): --exclude wandb --exclude 'outputs/old' --exclude 'runs/ablation-*'",
    )
    p.add_argument(
        "--hf-cache",
        action="store_true",
        help="also scan the Hugging Face hub cache (HF_HUB_CACHE, else $HF_HOME/hub, else "
        "~/.cache/huggingface/hub): each snapshot is a store named org/name@rev",
    )


def scan_settings(args: argparse.Namespace) -> Any:
    """The settings of this run: config file, --set, --rules; --fail-on too."""
    from adapterprobe.errors import UsageError
    from adapterprobe.settings import load_settings

    if args.address is not None and args.engine != "ray":
        raise UsageError("--address only applies with --engine ray")
    settings = load_settings(config=args.config, sets=args.sets, rules=args.rules)
    args.fail_on = args.fail_on or settings.fail_on or "fail"
    return settings


def scan_records(
    roots: list[str], args: argparse.Namespace, settings: Any
) -> tuple[Iterator[list[Any]], list[tuple[str, str]], int, Callable[[], None]]:
    """(batches, problems, number of targets, stop_progress) for the roots."""
    from adapterprobe.probes import DEFAULT_PROBES
    from adapterprobe.scan import discover, scan_batches

    probes = args.probes or DEFAULT_PROBES
    settings.resolved(probes)  # bad thresholds fail before the walk
    verbose = bool(getattr(args, "verbose", False))
    found = discover(
        *roots,
        all_versions=args.all_versions,
        workers=args.workers,
        follow_symlinks=getattr(args, "follow_symlinks", False),
        explain=verbose,
        exclude=getattr(args, "exclude", None) or (),
    )
    targets, problems = found
    if args.all_versions:
        print(all_versions_cost(targets), file=sys.stderr)
    if verbose:
        from adapterprobe.escape import terminal

        for path, why in found.skipped or ():
            print(f"adapterprobe: passed over {terminal(path)}: {terminal(why)}", file=sys.stderr)
    bar = ProgressBar()
    batches = scan_batches(
        targets,
        workers=args.workers,
        probes=probes,
        engine=args.engine,
        address=args.address,
        rules=settings.rules,
        options=settings.options,
        progress=bar.update,
        json=choose_format(getattr(args, "format", None)) in ("json", "jsonl")
        or getattr(args, "save_json", None) is not None,
    )
    if getattr(args, "verbose", False):
        batches = report_fetched(batches)
    return batches, problems, len(targets), bar.stop


#: What a probe reads of a version: weights, adapters, optimizer states.
BIG_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")
#: Entries of one version folder looked at for the cost line.
MAX_ENTRIES_COSTED = 10_000


def all_versions_cost(targets: list[Any]) -> str:
    """The line ``--all-versions`` prints before it reads anything: how many
    versions (checkpoints) of how many stores, and the bytes of the weight,
    adapter and optimizer files in them (a stat of each version folder's
    files, no read), so a scan about to read 100 GB says so first."""
    import itertools

    versions = 0
    total = 0
    for target in targets:
        for version in target.versions:
            versions += 1
            try:
                with os.scandir(version) as entries:
                    for entry in itertools.islice(entries, MAX_ENTRIES_COSTED):
                        if entry.name.endswith(BIG_FILE_SUFFIXES) and entry.is_file():
                            total += entry.stat().st_size
            except OSError:
                continue  # not a local folder (a remote store, a file): not costed
    stores = len(targets)
    return (
        f"adapterprobe: --all-versions: {versions} version{'s' if versions != 1 else ''} of "
        f"{stores} store{'s' if stores != 1 else ''}, {total / 1e9:.2f} GB of weight, adapter "
        f"and optimizer files ({total:,} bytes) at most to read"
    )


def report_fetched(batches: Iterator[list[Any]]) -> Iterator[list[Any]]:
    """The batches unchanged; once they are read, the bytes fetched for each
    remote store go to stderr."""
    from adapterprobe.remote import fetched_per_store

    stores: set[str] = set()
    for batch in batches:
        stores.update(r.store for r in batch)
        yield batch
    from adapterprobe.escape import terminal

    for store, (nbytes, requests) in fetched_per_store(stores).items():
        print(
            f"adapterprobe: fetched {nbytes} bytes in {requests} range requests from "
            f"{terminal(store)}",
            file=sys.stderr,
        )


#: Files named under "nothing to probe", per root: enough to say what is
#: there without listing a whole disk.
SEEN_FILES_SHOWN = 12
#: Entries looked at per root (a bound on the walk, hidden folders skipped).
SEEN_ENTRIES_LOOKED_AT = 2_000
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def seen_files(root: str) -> list[str]:
    """What a local root holds that no layout reads, one line a file (at
    most ``SEEN_FILES_SHOWN``): its path under the root and, for a Git LFS
    pointer, that it is one (the file itself was never pulled)."""
    from adapterprobe.escape import terminal

    base = Path(root)
    if not base.is_dir():
        return []
    lines: list[str] = []
    looked = 0
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            looked += 1
            if looked > SEEN_ENTRIES_LOOKED_AT or len(lines) >= SEEN_FILES_SHOWN:
                return lines
            path = Path(folder, name)
            shown = terminal(str(path.relative_to(base)))
            try:
                with open(path, "rb") as f:
                    head = f.read(len(_LFS_POINTER))
                size = path.stat().st_size
            except OSError:
                lines.append(f"{shown}: unreadable")
                continue
            if head == _LFS_POINTER:
                lines.append(
                    f"{shown}: a Git LFS pointer ({size} bytes), not the file: run `git lfs pull`"
                )
            else:
                lines.append(f"{shown} ({size} bytes): {why_not_read(name)}")
    return lines


#: Files adapterprobe reads only inside a run, and what such a run is.
_READ_IN_A_RUN = (
    (
        re.compile(r"(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)$"),
        "a model's weights with no run around them: they are judged as a checkpoint of a "
        "fine-tune (beside trainer_state.json, or in a checkpoint-N/ folder)",
    ),
    (
        re.compile(r"(model|pytorch_model)\.(safetensors|bin)\.index\.json$"),
        "the shard index of a model's weights with no run around them",
    ),
    (
        re.compile(r"config\.json$"),
        "a model config: read beside a run's weights or logs (K for the loss rules)",
    ),
    (
        re.compile(r"(optimizer|scheduler)\.(pt|bin)$"),
        "a trainer's state, read inside a checkpoint folder beside trainer_state.json",
    ),
)


def why_not_read(name: str) -> str:
    """Why a file the walk saw made no store: a file read only inside a
    run says so, anything else is a format not read."""
    for pattern, why in _READ_IN_A_RUN:
        if pattern.fullmatch(name):
            return why
    return "not a format adapterprobe reads"


def nothing_found(roots: list[str], problems: list[tuple[str, str]], args: Any) -> int:
    from adapterprobe.escape import terminal
    from adapterprobe.records import EXIT_NOTHING_FOUND, EXIT_OK
    from adapterprobe.scan import LAYOUT_LINES

    print_problems(problems)
    allowed = bool(getattr(args, "allow_empty", False))
    if allowed:
        looked = " (--allow-empty: exit 0)"
    else:
        looked = ". It looks for:" + "".join(f"\n  - {line}" for line in LAYOUT_LINES)
    print(
        f"adapterprobe: nothing to probe under {', '.join(map(terminal, roots))}{looked}",
        file=sys.stderr,
    )
    seen = [line for root in roots for line in seen_files(root)]
    if seen:
        print(
            "adapterprobe: it saw these files, and reads none of them:"
            + "".join(f"\n  - {line}" for line in seen),
            file=sys.stderr,
        )
    from adapterprobe._fs import atomic_output

    if getattr(args, "format", None) == "json":
        output = getattr(args, "output", None)
        if output:
            with atomic_output(output) as out:
                out.write("[]\n")
        else:
            print("[]")
    saved = getattr(args, "save_json", None)
    if saved is not None:
        with atomic_output(saved) as out:
            out.write("[]\n")
    return EXIT_OK if allowed else EXIT_NOTHING_FOUND


def output_of(args: argparse.Namespace, settings: dict[str, Any] | None) -> Output:
    """The Output the command-line options ask for."""
    return Output(
        args.format,
        args.fail_on,
        path=args.output,
        quiet=args.quiet,
        verbose=args.verbose,
        only=args.only,
        junit=args.junit,
        settings=settings,
        regression_gate=getattr(args, "fail_on_regression", False),
    )


def run_scan(roots: list[str], args: argparse.Namespace) -> int:
    from adapterprobe.comparison.baseline import Gate, Margins
    from adapterprobe.probes import DEFAULT_PROBES

    settings = scan_settings(args)
    roots = default_roots(roots, args)
    gate = Gate(  # --baseline: checked before the walk (`check` has no such options)
        roots,
        baseline=getattr(args, "baseline", None),
        fail_on_regression=getattr(args, "fail_on_regression", False),
        match=getattr(args, "match", "path"),
        loss_margin=getattr(args, "loss_margin", Margins.loss_margin),
    )
    batches, problems, found, stop = scan_records(roots, args, settings)
    if not found:
        stop()
        return nothing_found(roots, problems, args)
    note_remote_checksums(roots)
    output = output_of(args, settings.to_dict(args.probes or DEFAULT_PROBES))
    saved = getattr(args, "save_json", None)
    if saved is None:
        code = output.write(gate.batches(batches, fresh=True), before_output=stop)
    else:
        from adapterprobe._fs import atomic_output

        with atomic_output(saved) as out:
            code = output.write(
                saving_json(gate.batches(batches, fresh=True), out), before_output=stop
            )
    print_problems(problems)
    return code  # the writers' Tally counts --fail-on-regression in it


def saving_json(batches: Iterable[list[Any]], out: IO[str]) -> Iterator[list[Any]]:
    """The batches unchanged, each also written to `out` as ``--format json``
    writes it (``--save-json``: every record, whatever ``--only`` shows)."""
    from adapterprobe.cli.render import write_in_parts
    from adapterprobe.records import json_chunks

    first = True
    for batch in batches:
        write_in_parts(out, json_chunks(batch, first=first, last=False))
        first = False
        yield batch
    out.write("[\n]\n" if first else "\n]\n")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "stores_of", False):
        return run_stores_of(args.roots, args)
    return run_scan(args.roots, args)


def run_stores_of(files: list[str], args: argparse.Namespace) -> int:
    """``scan --stores-of FILE...``: the stores holding the files, found
    from the working directory (:func:`adapterprobe.scan.stores_of`), each
    scanned once; exit 0 when no file is in a store."""
    from adapterprobe.errors import UsageError
    from adapterprobe.escape import terminal
    from adapterprobe.records import EXIT_OK
    from adapterprobe.remote import URL_SCHEMES, scheme_of
    from adapterprobe.scan import stores_of

    if getattr(args, "exclude", None):
        raise UsageError(
            "--exclude does not apply with --stores-of, which scans only the stores holding "
            "the files given: leave the files out instead (pre-commit: the hook's exclude:)"
        )
    if getattr(args, "hf_cache", False):
        raise UsageError("--hf-cache does not apply with --stores-of")
    urls = [f for f in files if scheme_of(f) in URL_SCHEMES]
    if urls:
        raise UsageError(f"--stores-of takes local files, not {terminal(urls[0])}")
    found = stores_of(files)
    if found.outside:
        shown = ", ".join(terminal(f) for f in found.outside[:3])
        more = f" and {len(found.outside) - 3} more" if len(found.outside) > 3 else ""
        print(
            f"adapterprobe: not under the working directory, passed over: {shown}{more}",
            file=sys.stderr,
        )
    if not found.roots:
        given = (
            "no file given"
            if not files
            else f"none of the {len(files)} file{'' if len(files) == 1 else 's'} given is in a "
            "store"
        )
        print(f"adapterprobe: {given}: nothing to scan (exit 0)", file=sys.stderr)
        return EXIT_OK
    if getattr(args, "verbose", False):
        for root in found.roots:
            print(f"adapterprobe: scanning the store {terminal(root)}", file=sys.stderr)
    return run_scan(found.roots, args)


def note_remote_checksums(roots: list[str]) -> None:
    """Say, once, that a remote root's sha256 sidecars are not checked."""
    from adapterprobe import _core, remote

    if _core.remote_checksums_verified():
        return
    if any(remote.scheme_of(r) in remote.URL_SCHEMES for r in roots):
        print(
            "adapterprobe: note: on remote roots the sha256 sidecars of training states are "
            "not checked (each state would be fetched whole for it); "
            f"{remote.VERIFY_CHECKSUMS_ENV}=1 checks them",
            file=sys.stderr,
        )


def default_roots(roots: list[str], args: argparse.Namespace | None = None) -> list[str]:
    if args is not None and getattr(args, "hf_cache", False):
        from adapterprobe.hf_cache import cache_root

        roots = [*roots, str(cache_root())]
    if roots:
        return roots
    from adapterprobe.scan import DEMO_STORE

    print(
        f"adapterprobe: no ROOT given, scanning the bundled demo store {DEMO_STORE} "
        "(give a directory to scan your own stores)",
        file=sys.stderr,
    )
    return [str(DEMO_STORE)]


class ProgressBar:
    """A rich progress bar on stderr, shown only on a terminal and for big
    scans, and removed (with its line) before any output is printed."""

    MIN_STORES = 200
    #: Bars on screen: an interrupted command takes them down before it
    #: says so, or the prompt would follow the bar on its line.
    _shown: ClassVar[set[ProgressBar]] = set()

    def __init__(self) -> None:
        self._bar: Any = None

    @classmethod
    def stop_all(cls) -> None:
        """Take down every bar still on screen (Ctrl-C mid-scan)."""
        for bar in list(cls._shown):
            bar.stop()

    def update(self, done: int, total: int) -> None:
        if self._bar is None:
            if total < self.MIN_STORES or not sys.stderr.isatty():
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            ProgressBar._shown.add(self)
            self._task = self._bar.add_task("scanning stores", total=total)
        self._bar.update(self._task, completed=done, total=total)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            ProgressBar._shown.discard(self)
