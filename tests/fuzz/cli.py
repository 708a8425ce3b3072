"""Command line: `python -m tests.fuzz --seconds 60 [--cases N] [--parser NAME ...] [--replay DIR]`.

Prints, per parser, the cases run, cases per second and the count of each
outcome; exits 1 when any case was a bug (panic, other-exception, crash,
timeout, changed-input), 0 otherwise. ``--replay DIR`` runs the saved
cases under DIR again and exits 1 when any of them is still a bug.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .engine import BUGS, DEFAULT_MEMORY, DEFAULT_TIMEOUT, Fuzzer, Stats, replay, scratch_dir
from .seeds import ensure_seeds
from .targets import TARGETS, Target


def fuzz(
    targets: list[Target],
    seeds: dict[str, list[Path]],
    *,
    seconds: float,
    seed: int,
    out: Path | None,
    workers: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    memory: int = DEFAULT_MEMORY,
    max_cases: int | None = None,
) -> dict[str, Stats]:
    """Fuzz each target for an equal share of `seconds` of wall time, `workers` at once."""
    targets = [t for t in targets if seeds.get(t.seed_kind)]
    share = seconds * max(1, workers) / max(1, len(targets))
    work = scratch_dir()
    try:
        fuzzers = [
            Fuzzer(t, seeds, seed=seed, workdir=work, out=out, timeout=timeout, memory=memory)
            for t in targets
        ]
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            runs = [pool.submit(f.run, share, max_cases) for f in fuzzers]
            for r in runs:
                r.result()
        return {f.target.name: f.stats for f in fuzzers}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(stats: dict[str, Stats]) -> int:
    """Print the per-parser table; the number of bug cases."""
    total = Stats()
    for name, s in stats.items():
        print(s.line(name))
        total.cases += s.cases
        total.seconds += s.seconds
        total.outcomes.update(s.outcomes)
    print(total.line("total"))
    for s in stats.values():
        for case in s.saved:
            print(f"saved: {case}")
    return total.bugs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="total wall time")
    parser.add_argument(
        "--parser",
        action="extend",
        nargs="+",
        choices=sorted(TARGETS),
        metavar="NAME",
        help=f"fuzz only these parsers (default: all): {', '.join(sorted(TARGETS))}",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cases", type=int, default=None, help="stop each parser after this many cases"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / time.strftime("adapterprobe-fuzz-%Y%m%d-%H%M%S"),
        help="bug cases are saved here (default: a new folder in the temp dir)",
    )
    parser.add_argument("--workers", type=int, default=1, help="parsers fuzzed at once")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="per case")
    parser.add_argument("--memory", type=int, default=DEFAULT_MEMORY >> 20, help="MiB per worker")
    parser.add_argument("--replay", type=Path, help="run the saved cases under this folder")
    args = parser.parse_args(argv)

    if args.replay is not None:
        return _replay(args.replay, args.timeout, args.memory << 20)

    started = time.monotonic()
    seeds = ensure_seeds()
    print(f"seeds ready in {time.monotonic() - started:.1f} s", flush=True)
    names = args.parser or sorted(TARGETS)
    stats = fuzz(
        [TARGETS[n] for n in names],
        seeds,
        seconds=args.seconds,
        seed=args.seed,
        out=args.out,
        workers=args.workers,
        timeout=args.timeout,
        memory=args.memory << 20,
        max_cases=args.cases,
    )
    bugs = report(stats)
    if bugs:
        print(f"{bugs} bug cases; replay with: python -m tests.fuzz --replay {args.out}")
    return 1 if bugs else 0


def _replay(folder: Path, timeout: float, memory: int) -> int:
    cases = sorted(folder.rglob("case.json"))
    if not cases:
        print(f"no case.json under {folder}", file=sys.stderr)
        return 2
    still = 0
    for case, info, result in replay(cases, TARGETS, timeout=timeout, memory=memory):
        still += result.outcome in BUGS
        print(f"{case}: was {info['outcome']}, now {result.outcome}")
        if result.outcome in BUGS:
            print(f"  {result.exception}: {result.message}\n{result.traceback}{result.detail}")
    print(f"{len(cases)} cases replayed, {still} still bugs")
    return 1 if still else 0
