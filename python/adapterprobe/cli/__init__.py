"""The ``adapterprobe`` command line.

Each subcommand is a module of this package with ``add_parser(subparsers)``,
which declares its arguments and sets ``run(args) -> int`` as the handler.
Subcommand modules must import nothing heavy (no torch) at module level.
Exit codes: 0 healthy, 1 a verdict reached ``--fail-on``, 2 usage errors
(bad arguments, a root that is missing or not a directory, missing optional
extras), 3 nothing found to probe.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from adapterprobe.errors import AdapterProbeError, MissingExtraError, MissingFileError, UsageError
from adapterprobe.escape import terminal

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2
EXIT_NOTHING_FOUND = 3

_EPILOG = """\
examples:
  adapterprobe scan                         scan the bundled demo store
  adapterprobe scan /data/adapters          every store under a directory
  adapterprobe scan out/ --json             an HF Trainer output dir, machine-readable
  adapterprobe scan /data -q --junit junit.xml   problems only, plus a JUnit report
  adapterprobe check out/checkpoint-500     one checkpoint
  adapterprobe watch out/                   re-judge a run as its logs grow
  adapterprobe report /data -o health.html  a report with plots, opens offline
  adapterprobe extract --base base/ --tuned tuned/ --out lora/

exit codes: 0 ok, 1 a verdict reached --fail-on, 2 usage error, 3 nothing found.
Run `adapterprobe scan --help` for what is scanned, verdicts and thresholds.
"""


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse, with its errors fit for a terminal and a CI log: what the
    user typed is shown escaped, so a carriage return or an escape sequence
    in an argument cannot forge a line (``::stop-commands::`` in a GitHub
    log)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {terminal(message)}\n")


def nearest_options(parser: argparse.ArgumentParser, typed: Sequence[str]) -> list[str]:
    """For each unknown ``--option`` typed, the parser's option nearest to it
    (``--fial-on`` -> ``--fail-on``), if one is near."""
    known = [s for action in parser._actions for s in action.option_strings]
    out = []
    for word in typed:
        if not word.startswith("-"):
            continue
        name = word.split("=", 1)[0]
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        if near and near[0] not in out:
            out.append(near[0])
    return out


def _subcommand(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="adapterprobe",
        description=(
            "Fast, model-free health checks for LoRA adapters and fine-tuning runs. "
            "Reads safetensors headers, training logs and optimizer states without "
            "loading a model or importing torch."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from adapterprobe import __version__

    parser.add_argument("--version", action="version", version=f"adapterprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        importlib.import_module(f"adapterprobe.cli.{name}").add_parser(sub)
    return parser


# Subcommand modules, in the order `--help` lists them.
_SUBCOMMANDS = ("scan", "check", "watch", "report", "extract", "compare", "similar")


def main(argv: Sequence[str] | None = None) -> int:
    # Names from scanned trees may hold bytes that are not UTF-8; whatever
    # the terminal's encoding, print them escaped rather than crash.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # The subcommand's usage, not the top level's, and the option meant.
        command = _subcommand(parser, args.command)
        message = f"unrecognized arguments: {' '.join(unknown)}"
        near = nearest_options(command, unknown)
        if near:
            message += f" (did you mean {' or '.join(near)}?)"
        command.error(message)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly. Point stdout at
        # devnull so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (UsageError, MissingFileError, MissingExtraError) as exc:
        # messages quote paths, keys and servers' answers: shown escaped
        print(f"adapterprobe {args.command}: error: {terminal(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except AdapterProbeError as exc:
        print(f"adapterprobe {args.command}: error: {terminal(exc)}", file=sys.stderr)
        return EXIT_UNHEALTHY
    except KeyboardInterrupt:
        from adapterprobe.cli.scan import ProgressBar

        ProgressBar.stop_all()
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
