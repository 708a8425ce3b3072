"""``adapterprobe watch``: re-judge the runs under a root as their logs grow.

The work is :class:`adapterprobe.watch.Watcher`'s; this module reads the
options, sleeps between polls and prints what changed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from adapterprobe.cli import EXIT_NOTHING_FOUND, EXIT_OK, EXIT_UNHEALTHY, positive_int

EPILOG = """\
examples:
  adapterprobe watch out/                     an HF Trainer output dir, every 30 s
  adapterprobe watch /data/runs --interval 10 every run below, new ones too
  adapterprobe watch /data/runs --once        judge once and exit (scripts, cron)
  adapterprobe watch out/ --stop-on fail || kill "$TRAIN_PID"
                                              end a run the guard would have stopped

what it prints:
  One line per store whose verdict changed: the time, the store (its path below
  ROOT), old verdict -> new verdict, and the finding behind the new one:
    14:02:31  run-7  PASS -> FAIL  nonfinite_loss since step 812: 3 NaN/inf ...
  The first poll prints every store's verdict once; a store that goes away gets
  a last line. At the end (--once, --max-cycles, --stop-on or Ctrl-C) a summary.

how it works:
  Each poll finds the stores under ROOT as `adapterprobe scan` does (a run that
  starts is picked up), stats the files each store's loss curve was read from
  (and their folders), reads again only the stores whose files changed, and
  replays each curve through the guard (`adapterprobe.Guard`, docs/guard.md).
  A store whose log cannot be read gets a line saying why; the watch goes on.

verdicts:
  The guard's, as while the run trains: FAIL only for what no later record can
  undo (NaN weights, the loss non-finite at its last three records, a loss far
  worse than a uniform guess); a climb, a spike or a stall is WARN until the run
  ends. skip: no loss curve yet, or fewer than training_drift.min_steps records;
  error: the log cannot be read. The rules are robust's (sway judges finished
  curves only); thresholds come from --set, --config or pyproject.toml as for
  scan. A finished run's verdict is `adapterprobe scan`'s.

exit codes (the scan's gate, on each store's verdict at the end):
  0    no verdict reached --fail-on     2  usage error (bad option, ROOT missing)
  1    some verdict reached --fail-on,  3  nothing to watch under ROOT (--once,
       or --stop-on ended the watch        --max-cycles)
  130  Ctrl-C, after the summary
  (error counts as failure, except with --fail-on never)
"""


def seconds(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    from adapterprobe.records import FAIL_ON

    p = sub.add_parser(
        "watch",
        help="re-judge the runs under a root as their logs grow",
        description="Watch the training runs under ROOT: every --interval seconds, read "
        "again the stores whose logs changed, judge them as the guard does while a run "
        "trains, and print each change of verdict.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "root",
        metavar="ROOT",
        help="a run (an HF Trainer output dir, a dlm store, ...) or a directory holding runs",
    )
    p.add_argument(
        "--interval",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds from the start of one poll to the next (default 30)",
    )
    cycles = p.add_mutually_exclusive_group()
    cycles.add_argument(
        "--once", action="store_true", help="judge once, print every store's verdict and exit"
    )
    cycles.add_argument(
        "--max-cycles",
        type=positive_int,
        default=None,
        metavar="N",
        help="exit after N polls (default: watch until Ctrl-C or --stop-on)",
    )
    p.add_argument(
        "--stop-on",
        choices=("warn", "fail"),
        default=None,
        help="end the watch (exit 1) as soon as a store's verdict is this bad or worse",
    )
    p.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=None,
        help="exit 1 when a store's verdict at the end is this bad or worse, error "
        "included (default: fail); never turns the gate off",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="training_drift.OPTION=VALUE",
        help="override a threshold of the drift rules, e.g. --set training_drift.min_steps=20 "
        "(repeatable)",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML file with the settings, as for scan (default: [tool.adapterprobe] of "
        "./pyproject.toml when present)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="do not enter folders matching GLOB, by name or by path below ROOT (repeatable)",
    )
    p.set_defaults(run=run)


def line(change: Any) -> str:
    """One change as the watch prints it; names and messages escaped."""
    from adapterprobe.escape import terminal

    when = time.strftime("%H:%M:%S", time.localtime(change.at))
    new = "gone" if change.new is None else change.new.upper()
    verdicts = new if change.old is None else f"{change.old.upper()} -> {new}"
    name = terminal(change.store)
    if getattr(change, "was", None):
        name += f" (was {terminal(change.was)})"
    return f"{when}  {name}  {verdicts}  {terminal(change.message)}"


def summary(watcher: Any, fail_on: str, code: int, ending: str, stop_on: str | None = None) -> str:
    """The last line: how many stores at which verdict, and why the exit code
    (``stop_on``: the level whose --stop-on ended the watch, which says so
    whatever --fail-on is)."""
    verdicts = list(watcher.verdicts.values())
    order = ("fail", "error", "warn", "skip", "pass")
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in order if v in verdicts)
    stores = f"{len(verdicts)} store{'s' if len(verdicts) != 1 else ''}"
    polls = f"{watcher.cycles} poll{'s' if watcher.cycles != 1 else ''}"
    text = f"{ending} after {polls}: {stores}" + (f" ({counts})" if counts else "")
    reads = watcher.judged_total
    text += f"; {reads} store read{'s' if reads != 1 else ''}."
    if code == EXIT_UNHEALTHY:
        from adapterprobe.escape import terminal

        level = stop_on or fail_on
        reached = watcher.reaching(level)
        names = ", ".join(terminal(n) for n in reached[:3]) + (", ..." if len(reached) > 3 else "")
        named = f" ({names})" if names else ""
        if stop_on:
            text += f" Exit 1: --stop-on {stop_on} ended the watch{named}."
        else:
            text += f" Exit 1: a verdict reached --fail-on {fail_on}{named}."
    return text


def run(args: argparse.Namespace) -> int:
    from adapterprobe.cli.render import print_problems
    from adapterprobe.escape import terminal
    from adapterprobe.guard import reached
    from adapterprobe.probes.drift import DriftOptions
    from adapterprobe.probes.options import resolve
    from adapterprobe.settings import load_settings
    from adapterprobe.watch import Watcher

    settings = load_settings(config=args.config, sets=args.sets, rules="robust")
    fail_on = args.fail_on or settings.fail_on or "fail"
    drift = resolve(DriftOptions, None, "robust", settings.options.get("training_drift", {}))
    watcher = Watcher(args.root, options=drift, exclude=args.exclude)
    last = 1 if args.once else args.max_cycles  # None: until Ctrl-C or --stop-on
    root = terminal(args.root)
    if last != 1:
        every = f"{args.interval:g} s"
        print(f"adapterprobe watch: watching {root} every {every} (Ctrl-C ends)", file=sys.stderr)
    seen = False
    stopped = False
    try:
        while True:
            began = time.monotonic()
            changes = watcher.poll()
            print_problems(watcher.problems)
            for change in changes:
                print(line(change), flush=True)
            seen = seen or bool(watcher.verdicts)
            if watcher.cycles == 1 and not seen and last != 1:
                print(f"adapterprobe watch: no run under {root} yet; waiting", file=sys.stderr)
            if args.stop_on and any(reached(v, args.stop_on) for v in watcher.verdicts.values()):
                stopped = True
                break
            if last is not None and watcher.cycles >= last:
                break
            time.sleep(max(0.0, args.interval - (time.monotonic() - began)))
    except KeyboardInterrupt:
        print(summary(watcher, fail_on, 130, "interrupted"), flush=True)
        return 130
    if not seen:
        print(
            f"adapterprobe: nothing to watch under {root}: no run with a training log (a dlm "
            "store's logs/, an HF trainer_state.json, TensorBoard events, a Lightning "
            "metrics.csv, a W&B or MLflow run); `adapterprobe scan` checks bare adapters",
            file=sys.stderr,
        )
        return EXIT_NOTHING_FOUND
    code = EXIT_UNHEALTHY if stopped or watcher.reaching(fail_on) else EXIT_OK
    ending = f"stopped on {args.stop_on}" if stopped else "done"
    print(summary(watcher, fail_on, code, ending, args.stop_on if stopped else None), flush=True)
    return code
