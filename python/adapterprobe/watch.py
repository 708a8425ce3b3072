"""Re-judge training runs as their logs grow: the engine of ``adapterprobe watch``.

A :class:`Watcher` holds one root. Each :meth:`Watcher.poll` finds the
stores under it with the scan's own discovery (so a run that starts is
picked up), stats the files each store's loss curve was last read from, reads
again only the stores whose files changed, and replays their curve through
the :class:`~adapterprobe.guard.Guard`: the verdict a run gets while it
trains, where FAIL is kept for what no later record can undo. It returns
the stores whose verdict changed. Nothing here sleeps or prints, so the
command line and the tests drive it as they like.

Change detection is a stat per watched path (size, mtime, ctime, inode) of
the log files, the folders holding them, the store and its logs folder (a
new log file or checkpoint folder changes its folder). A file written while
it was being read could leave the same stat behind as the read saw, so, as
git does for its index, a path modified within :data:`RACY_NS` of a read
marks the store to be read once more on the next poll.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapterprobe._core as _core
from adapterprobe import remote
from adapterprobe.errors import AdapterProbeError, UsageError
from adapterprobe.guard import Guard
from adapterprobe.judge import WALK_PROBLEMS
from adapterprobe.probes.drift import DriftOptions
from adapterprobe.probes.options import resolve
from adapterprobe.scan import discover
from adapterprobe.tally import check_fail_on, reaches

__all__ = ["RACY_NS", "Change", "Watcher"]

#: A path modified this close to (or after) the start of a read may have
#: changed during it: its store is read again on the next poll. Two
#: seconds cover coarse kernel clocks and filesystems that keep whole
#: seconds; a network filesystem whose server clock lags further behind
#: can still hide one append until the next.
RACY_NS = 2_000_000_000

# What a watched path looked like: (size, mtime_ns, ctime_ns, inode), or
# None while it does not exist.
_Stat = tuple[int, int, int, int] | None


@dataclass(frozen=True)
class Change:
    """A store whose verdict changed in a poll.

    ``store``: its path below the root, as found on disk (print it through
    :func:`adapterprobe.escape.terminal`, as ``message``); ``old``: the
    verdict before (None the first time the store is seen); ``new``: the
    verdict now, None when the store is gone; ``message``: the finding
    behind the verdict, or why there is none; ``step``: the newest logged
    step; ``at``: when the poll began (``time.time()``); ``was``: the name
    the same run had until this poll, when it moved (an HF run's
    TensorBoard folder is a store of its own until the first checkpoint
    makes the output folder one: the run is then judged as that folder,
    which holds it, and ``old`` is the verdict it had under its old name)."""

    store: str
    path: Path
    old: str | None
    new: str | None
    message: str
    step: int | None
    at: float
    was: str | None = None


@dataclass(frozen=True)
class _State:
    """What the watcher knows of one store: its verdict and the stat of the
    paths its curve was read from (``stamp`` None: read it again)."""

    label: str
    verdict: str
    message: str
    step: int | None
    shape: tuple[str, ...]
    paths: tuple[str, ...]
    stamp: tuple[_Stat, ...] | None


def _stat(path: str) -> _Stat:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _stamp(paths: Iterable[str], since_ns: int) -> tuple[_Stat, ...] | None:
    """The stat of ``paths``; None when one was modified within RACY_NS of
    ``since_ns`` (the read may not have seen its last write)."""
    stats = tuple(_stat(p) for p in paths)
    if any(s is not None and s[1] >= since_ns - RACY_NS for s in stats):
        return None
    return stats


def _shape(target: Any) -> tuple[str, ...]:
    """What discovery says of a store, beyond its files: a new checkpoint or
    layout means a new read even if no watched path changed."""
    log_root = "" if target.log_root is None else str(target.log_root)
    return (target.layout, log_root, *(str(v) for v in target.versions))


def _watched_paths(target: Any, inputs: Any) -> tuple[str, ...]:
    """The paths whose stat says the store's curve may have changed: the log
    files read (or the file a read failed on), their folders, the store and
    its logs folder. Empty when the read named no file (no log yet, or a
    reader that failed before listing its files): such a store is read on
    every poll, as there is nothing to stat."""
    files = [Path(f) for f in inputs.files]
    error = inputs.error
    failed = getattr(error, "path", None) if error is not None else None
    if failed:
        files.append(Path(failed))
    if not files:
        return ()
    paths = {str(f) for f in files} | {str(f.parent) for f in files}
    paths |= {str(inputs.logs_dir), str(target.store)}
    if target.log_root is not None:
        paths.add(str(target.log_root))
    return tuple(sorted(paths))


def _headline(findings: Sequence[dict[str, Any]], verdict: str) -> str | None:
    """The finding behind ``verdict``: the first one at that verdict (else
    the first), as ``rule since step N: message``."""
    if not findings:
        return None
    finding = next((f for f in findings if f["verdict"] == verdict), findings[0])
    return f"{finding['rule']} since step {finding['step']}: {finding['message']}"


def _why(error: BaseException, store: Path) -> str:
    """An error's text with its path shown below the store (the line
    already names the store)."""
    path, reason = getattr(error, "path", None), getattr(error, "reason", None)
    if not path or reason is None:
        return str(error)
    try:
        return f"{Path(path).relative_to(store)}: {reason}"
    except ValueError:
        return str(error)


def _read(path: Path) -> Any:
    """A store's logs (``_core.drift_input``), or the exception reading them
    raised: one store's trouble must not end the poll."""
    try:
        return _core.drift_input(path)
    except (AdapterProbeError, OSError) as exc:
        return exc


def _moved(gone: set[str], new: set[str]) -> dict[str, str]:
    """Stores that moved in a poll: a new store that holds a store gone in
    the same poll is the same run under the folder that now holds it (an HF
    run's TensorBoard folder, then its output folder once a checkpoint is
    saved), each gone store going to the nearest new one that holds it.
    ``{new key: gone key}``, one gone store each."""
    moved: dict[str, str] = {}
    for key in sorted(gone):
        parents = set(Path(key).parents)
        holders = [n for n in new if n not in moved and Path(n) in parents]
        if holders:
            moved[max(holders, key=lambda n: len(Path(n).parts))] = key
    return moved


class Watcher:
    """The stores under ``root``, judged again as their logs grow.

    ``options``: the :class:`DriftOptions` the guard judges with (robust
    rules; their defaults when None). ``exclude``, ``follow_symlinks``: as
    for :func:`adapterprobe.scan`. ``workers``: threads that read logs
    (default: one per core). ``clock``: the wall clock stamped on changes.

    After each :meth:`poll`: ``cycles`` (polls made), ``judged`` (stores
    read and judged by that poll) and ``judged_total``, ``problems`` (paths
    the walk could not search, each reported once), and :attr:`verdicts`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        options: DriftOptions | None = None,
        exclude: Sequence[str] = (),
        follow_symlinks: bool = False,
        workers: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        text = os.fspath(root)
        if remote.scheme_of(text) in remote.URL_SCHEMES:
            raise UsageError(
                "watch reads local files (it stats them between polls); for a bucket run "
                "`adapterprobe scan URL` on a schedule",
                path=text,
            )
        self.root = Path(text).expanduser()
        self.options = resolve(DriftOptions, options, "robust", {})
        Guard(options=self.options)  # refuse options the guard cannot judge with, now
        self.exclude = tuple(exclude)
        self.follow_symlinks = follow_symlinks
        self.workers = workers
        self.clock = clock
        self.cycles = 0
        self.judged = 0
        self.judged_total = 0
        self.problems: list[tuple[str, str]] = []
        self._reported: set[tuple[str, str]] = set()
        self._states: dict[str, _State] = {}

    @property
    def verdicts(self) -> dict[str, str]:
        """Each store's verdict now, by its path below the root."""
        return {s.label: s.verdict for s in self._states.values()}

    def reaching(self, level: str) -> list[str]:
        """The stores whose verdict is ``level`` (``"warn"``, ``"fail"``) or
        worse, error included; none for ``"never"`` (the scan's gate)."""
        check_fail_on(level)
        return sorted(s.label for s in self._states.values() if reaches(s.verdict, level))

    def poll(self) -> list[Change]:
        """Discover, read what changed, judge it; the changes, by store.
        The first poll reports every store (``old`` None)."""
        at = self.clock()
        self.cycles += 1
        self.judged = 0
        self.problems = []
        try:
            targets, problems = discover(
                self.root, exclude=self.exclude, follow_symlinks=self.follow_symlinks
            )
        except UsageError as exc:
            if self.cycles == 1:
                raise  # a root that is missing from the start is a usage error
            self._problem(str(self.root), exc.reason)
            return []  # the root went away: keep what is known until it is back
        for path, why in problems:
            self._problem(path, why)
        current: dict[str, _State] = {}
        stale: list[Any] = []
        for target in targets:
            key = str(target.store)
            if target.layout in WALK_PROBLEMS:
                current[key] = self._walk_problem(target)
            elif target.with_logs:
                known = self._states.get(key)
                if known is not None and self._unchanged(known, target):
                    current[key] = known
                else:
                    stale.append(target)
        current.update(self._judge(stale))
        moved = _moved(set(self._states) - set(current), set(current) - set(self._states))
        changes = []
        for key in sorted(current, key=lambda k: current[k].label):
            now, before = current[key], self._states.get(key)
            was = self._states[moved[key]] if key in moved else None
            if was is not None:
                changes.append(
                    Change(
                        now.label,
                        Path(key),
                        was.verdict,
                        now.verdict,
                        now.message,
                        now.step,
                        at,
                        was=was.label,
                    )
                )
            elif before is None or before.verdict != now.verdict:
                old = None if before is None else before.verdict
                changes.append(
                    Change(now.label, Path(key), old, now.verdict, now.message, now.step, at)
                )
        for key in sorted(set(self._states) - set(current) - set(moved.values())):
            gone = self._states[key]
            message = f"no longer found under {self.root}"
            changes.append(Change(gone.label, Path(key), gone.verdict, None, message, None, at))
        self._states = current
        return changes

    def _problem(self, path: str, why: str) -> None:
        if (path, why) not in self._reported:
            self._reported.add((path, why))
            self.problems.append((path, why))

    def _label(self, store: Path) -> str:
        for base in (self.root, self.root.resolve()):
            try:
                below = store.relative_to(base)
            except ValueError:
                continue
            return str(below) if below.parts else (store.name or str(store))
        return str(store)

    def _unchanged(self, known: _State, target: Any) -> bool:
        if known.stamp is None or not known.paths or known.shape != _shape(target):
            return False
        return tuple(_stat(p) for p in known.paths) == known.stamp

    def _walk_problem(self, target: Any) -> _State:
        """A directory the walk could not enter (error) or a link it did not
        follow (skip), as discovery reported it; nothing to read."""
        verdict = "error" if target.layout == "unreadable" else "skip"
        why = "; ".join(msg for _, msg in target.broken) or target.layout
        return _State(self._label(Path(target.store)), verdict, why, None, (), (), None)

    def _judge(self, targets: Sequence[Any]) -> dict[str, _State]:
        """Read the stores' logs (in threads: the reads leave the GIL) and
        replay each curve through a guard."""
        if not targets:
            return {}
        since = time.time_ns()
        paths = [t.log_root if t.log_root is not None else t.store for t in targets]
        threads = min(len(paths), self.workers or os.cpu_count() or 1)
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="adapterprobe-watch") as pool:
                read = list(pool.map(_read, paths))
        else:
            read = [_read(p) for p in paths]
        out = {}
        for target, inputs in zip(targets, read, strict=True):
            self.judged += 1
            out[str(target.store)] = self._state(target, inputs, since)
        self.judged_total += self.judged
        return out

    def _state(self, target: Any, inputs: Any, since_ns: int) -> _State:
        label = self._label(Path(target.store))
        shape = _shape(target)
        if isinstance(inputs, BaseException):
            message = f"its log cannot be read: {_why(inputs, Path(target.store))}"
            return _State(label, "error", message, None, shape, (), None)
        paths = _watched_paths(target, inputs)
        stamp = _stamp(paths, since_ns)

        def state(verdict: str, message: str, step: int | None = None) -> _State:
            return _State(label, verdict, message, step, shape, paths, stamp)

        if inputs.error is not None:
            why = _why(inputs.error, Path(target.store))
            return state("error", f"its log cannot be read: {why}")
        curve = inputs.curve
        if curve is None:
            return state("skip", inputs.note or "no loss curve yet")
        try:
            guard, _ = Guard.replay_input(inputs, options=self.options)
        except AdapterProbeError as exc:
            return state("error", f"its loss curve cannot be judged: {exc}")
        steps = curve.steps
        last = int(steps[-1]) if len(steps) else None
        verdict, records = guard.verdict, guard.num_records
        if verdict == "pass" and records < self.options.min_steps:
            # training_drift SKIPs a curve this short; no PASS on two records
            return state(
                "skip",
                f"{records} loss record{'s' if records != 1 else ''} so far; judged from "
                f"{self.options.min_steps} (training_drift.min_steps)",
                last,
            )
        headline = _headline(guard.findings, verdict)
        return state(verdict, headline or f"{records} loss records, to step {last}", last)
