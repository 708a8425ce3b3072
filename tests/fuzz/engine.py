"""The fuzz loop: mutate seeds, run each case in a worker process, judge, save bugs.

Each target owns one persistent worker process (started again after a
crash or a timeout), so a case costs a file write and a pipe round trip,
not an interpreter start. The parent enforces the per-case timeout by
killing the worker's process group, checks that the case files are
byte-for-byte unchanged (and that nothing new appeared: the worker runs in
the case directory, so a pickle that managed to run ``touch PWNED`` shows
up here), and saves every bug case with a ``case.json`` for ``--replay``.

There is no coverage instrumentation; as cheap feedback, a mutant that
produced an outcome or error message not seen before for its target joins
that target's pool, so later mutations start from inputs that already get
past some check.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from . import mutators
from .seeds import child_env
from .targets import Target

OUTCOMES = ("ok", "error", "panic", "other-exception", "crash", "timeout", "changed-input")
BUGS = frozenset(("panic", "other-exception", "crash", "timeout", "changed-input"))
DEFAULT_TIMEOUT = 5.0
DEFAULT_MEMORY = 2 << 30
MAX_INPUT = 40 << 20
POOL_CAP = 200
POOL_ENTRY_CAP = 1 << 20
SAVE_PER_SIGNATURE = 5
MAX_SAVED = 200
READY_TIMEOUT = 180.0


@dataclass
class Result:
    """What one case did."""

    outcome: str
    exception: str | None = None
    message: str = ""
    traceback: str = ""
    detail: str = ""
    seconds: float = 0.0


def _package() -> str:
    return __package__ or "tests.fuzz"


def _scratch_root() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def snapshot(case: Path) -> dict[str, str]:
    """sha256 of every file in the case directory (and the names of anything else)."""
    out: dict[str, str] = {}
    for path in sorted(case.rglob("*")):
        rel = str(path.relative_to(case))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


class Worker:
    """One persistent worker process for one call, with its own case directory."""

    def __init__(self, call: str, case_dir: Path, memory: int) -> None:
        self.call = call
        self.case_dir = case_dir
        self.memory = memory
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""
        self.stderr_path = case_dir.parent / (case_dir.name + ".stderr")
        self.starts = 0

    def _start(self) -> None:
        self.case_dir.mkdir(parents=True, exist_ok=True)
        self.buffer = b""
        self.starts += 1
        env = child_env()
        # Address space reserved up front grows with threads (rayon's pool, malloc
        # arenas); bound it so that the limit measures the input, not the core count.
        env.setdefault("RAYON_NUM_THREADS", str(min(4, os.cpu_count() or 1)))
        env.setdefault("MALLOC_ARENA_MAX", "2")
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"{_package()}.worker", self.call, str(self.memory)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=str(self.case_dir),
                env=env,
                start_new_session=True,
            )
        line = self._readline(time.monotonic() + READY_TIMEOUT)
        if line != b"ready":
            tail = self._stderr_tail()
            self.stop()
            raise RuntimeError(f"fuzz worker for {self.call} did not start: {line!r}\n{tail}")

    def _readline(self, deadline: float) -> bytes | None:
        """One protocol line, or None on end of file; raises TimeoutError at the deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def _stderr_tail(self) -> str:
        try:
            data = self.stderr_path.read_bytes()
        except OSError:
            return ""
        return data[-4000:].decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.proc = None

    def write_case(self, files: dict[str, bytes]) -> None:
        for child in list(self.case_dir.iterdir()) if self.case_dir.exists() else []:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        self.case_dir.mkdir(parents=True, exist_ok=True)
        write_files(self.case_dir, files)

    def run(self, files: dict[str, bytes], timeout: float) -> Result:
        """Write the case, run it, and judge the reply and the files."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        self.write_case(files)
        before = snapshot(self.case_dir)
        started = time.monotonic()
        try:
            self.proc.stdin.write(str(self.case_dir).encode() + b"\n")
            self.proc.stdin.flush()
            line = self._readline(started + timeout)
        except TimeoutError:
            self.stop()
            return Result("timeout", detail=f"no answer within {timeout:g} s", seconds=timeout)
        except (BrokenPipeError, OSError):
            line = None
        seconds = time.monotonic() - started
        if line is None:
            code = self.proc.wait(timeout=30) if self.proc else None
            tail = self._stderr_tail()
            self.stop()
            how = f"signal {-code} ({signal.Signals(-code).name})" if code and code < 0 else code
            return Result("crash", detail=f"worker died: {how}\n{tail}", seconds=seconds)
        reply: dict[str, Any] = json.loads(line)
        result = Result(
            reply["outcome"],
            reply.get("exception"),
            reply.get("message", ""),
            reply.get("traceback", ""),
            seconds=seconds,
        )
        if result.outcome == "memory":
            self.stop()  # the worker's heap may be in any state now
            result.outcome = "crash"
            result.detail = "MemoryError under the address-space limit"
        after = snapshot(self.case_dir)
        if after != before and result.outcome not in BUGS:
            changed = sorted(
                k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
            )
            result.detail = f"case files changed: {changed}"
            result.outcome = "changed-input"
        return result


@dataclass
class Stats:
    cases: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    mutator_errors: int = 0
    saved: list[Path] = field(default_factory=list)

    @property
    def bugs(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k in BUGS)

    def line(self, name: str) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        counts = " ".join(f"{k}={self.outcomes[k]}" for k in OUTCOMES if self.outcomes[k])
        if self.mutator_errors:
            counts += f" (mutator errors: {self.mutator_errors})"
        return f"{name:<20} {self.cases:>8} cases {rate:>8.1f}/s  {counts}"


def _signature(result: Result, case_dir: Path) -> str:
    message = result.message.replace(str(case_dir), "")
    message = re.sub(r"\d+", "N", message)[:300]
    return f"{result.outcome}|{result.exception}|{message}"


class _Variant:
    """One mutable file of a target, with its own pool of inputs."""

    def __init__(self, target: Target, seeds: dict[str, list[Path]]) -> None:
        self.target = target
        self.pool: list[bytes] = [p.read_bytes() for p in seeds[target.seed_kind]]
        self.n_seeds = len(self.pool)


class Fuzzer:
    """The mutate-run-judge loop of one target."""

    def __init__(
        self,
        target: Target,
        seeds: dict[str, list[Path]],
        *,
        seed: int,
        workdir: Path,
        out: Path | None,
        timeout: float = DEFAULT_TIMEOUT,
        memory: int = DEFAULT_MEMORY,
    ) -> None:
        self.target = target
        self.rng = random.Random(seed ^ zlib.crc32(target.name.encode()))
        self.variants = [_Variant(t, seeds) for t in target.alternatives or (target,)]
        self.companions = {name: seeds[kind][0].read_bytes() for name, kind in target.companions}
        self.companions.update(dict(target.static))
        self.worker = Worker(target.call, workdir / target.name, memory)
        self.out = out
        self.timeout = timeout
        self.stats = Stats()
        self.seen: set[str] = set()
        self.saved_per_signature: Counter[str] = Counter()

    def mutate(self, variant: _Variant) -> tuple[bytes, list[str]]:
        # Half the time a pristine seed, so the pool's broken inputs do not take over.
        pristine = self.rng.random() < 0.5
        data = self.rng.choice(variant.pool[: variant.n_seeds] if pristine else variant.pool)
        applied: list[str] = []
        for _ in range(1 if self.rng.random() < 0.5 else self.rng.randint(2, 4)):
            name, mutator = variant.target.pick_mutator(self.rng)
            try:
                new = mutator(data, self.rng)
            except Exception:  # a mutator bug must not stop the run
                self.stats.mutator_errors += 1
                new = data
            if new == data:
                name, new = "bit_flip", mutators.bit_flip(data, self.rng)
            if len(new) > MAX_INPUT:
                continue
            data = new
            applied.append(name)
        return data, applied

    def files_for(self, variant: _Variant, data: bytes) -> dict[str, bytes]:
        """The case: companions, the mutated file, and its fix-ups (named beside it)."""
        target = variant.target
        files = dict(self.companions)
        files[target.primary] = data
        if target.fix_up is not None:
            folder = PurePosixPath(target.primary).parent
            for name, body in target.fix_up(data, self.rng).items():
                files[str(folder / name)] = body
        return files

    def one(self) -> Result:
        variant = self.rng.choice(self.variants)
        data, applied = self.mutate(variant)
        files = self.files_for(variant, data)
        result = self.worker.run(files, self.timeout)
        self.stats.cases += 1
        self.stats.outcomes[result.outcome] += 1
        signature = _signature(result, self.worker.case_dir)
        new = signature not in self.seen
        if new:
            self.seen.add(signature)
        keep = new or (result.outcome == "ok" and self.rng.random() < 0.05)
        if keep and result.outcome not in BUGS and len(data) <= POOL_ENTRY_CAP:
            self._keep(variant, data)
        if result.outcome in BUGS and self.out is not None:
            self._save(variant.target.primary, files, result, applied, new)
        return result

    def _keep(self, variant: _Variant, data: bytes) -> None:
        if len(variant.pool) < POOL_CAP:
            variant.pool.append(data)
        else:
            variant.pool[self.rng.randrange(variant.n_seeds, POOL_CAP)] = data

    def _save(
        self, primary: str, files: dict[str, bytes], result: Result, applied: list[str], new: bool
    ) -> None:
        """Every new kind of bug, and a few repeats of each outcome and exception type."""
        assert self.out is not None
        key = f"{result.outcome}|{result.exception}"
        self.saved_per_signature[key] += 1
        if not new and self.saved_per_signature[key] > SAVE_PER_SIGNATURE:
            return
        if len(self.stats.saved) >= MAX_SAVED:
            return
        digest = hashlib.sha256(files[primary]).hexdigest()[:12]
        case = self.out / self.target.name / f"{result.outcome}-{digest}"
        save_case(case, self.target, primary, files, result, applied)
        self.stats.saved.append(case)

    def run(self, seconds: float | None = None, max_cases: int | None = None) -> Stats:
        started = time.monotonic()
        deadline = started + seconds if seconds is not None else None
        try:
            while (deadline is None or time.monotonic() < deadline) and (
                max_cases is None or self.stats.cases < max_cases
            ):
                self.one()
        finally:
            self.worker.stop()
            self.stats.seconds += time.monotonic() - started
        return self.stats


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def save_case(
    case: Path,
    target: Target,
    primary: str,
    files: dict[str, bytes],
    result: Result,
    applied: list[str],
) -> None:
    """Write a bug case: its files and a case.json that --replay reads."""
    case.mkdir(parents=True, exist_ok=True)
    write_files(case, files)
    info = {
        "target": target.name,
        "call": target.call,
        "primary": primary,
        "outcome": result.outcome,
        "exception": result.exception,
        "message": result.message,
        "traceback": result.traceback,
        "detail": result.detail,
        "mutations": applied,
        "files": sorted(files),
        "sha256": hashlib.sha256(files[primary]).hexdigest(),
    }
    (case / "case.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


def case_files(case: Path) -> dict[str, bytes]:
    """The input files of a saved case (everything but its case.json), by relative name."""
    return {
        str(p.relative_to(case)): p.read_bytes()
        for p in sorted(case.rglob("*"))
        if p.is_file() and p != case / "case.json"
    }


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="adapterprobe-fuzz-", dir=_scratch_root()))


def replay(
    cases: list[Path],
    targets: dict[str, Target],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    memory: int = DEFAULT_MEMORY,
) -> list[tuple[Path, dict[str, Any], Result]]:
    """Run saved cases again; each with the call it was found with."""
    work = scratch_dir()
    out: list[tuple[Path, dict[str, Any], Result]] = []
    try:
        for case_json in cases:
            info = json.loads(case_json.read_text(encoding="utf-8"))
            target = targets.get(info["target"])
            call = target.call if target is not None else info["call"]
            files = case_files(case_json.parent)
            worker = Worker(call, work / "replay", memory)
            try:
                out.append((case_json.parent, info, worker.run(files, timeout)))
            finally:
                worker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
