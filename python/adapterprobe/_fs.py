"""Atomic writes: a reader never sees a half-written file or directory.

Everything adapterprobe writes (extracted adapters, libraries, gradient dumps,
reports) goes through these helpers: content is built under a temporary name
in the destination's own directory, flushed to disk, and renamed into place.

An output path that is a symbolic link is written through: the link's target is
replaced and the link keeps pointing at it (renaming the link itself would leave the
old target behind). An output that cannot be created (its parent is a file, a
directory cannot be made, the name is a directory where a file should go) is a
:class:`UsageError` naming the path, never a bare ``OSError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from adapterprobe._json import json_safe
from adapterprobe.errors import UsageError


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (best effort: not every OS allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def resolve_output(path: str | os.PathLike[str]) -> Path:
    """The absolute path to write, with symbolic links followed (also dangling ones)."""
    try:
        return Path(path).absolute().resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UsageError(f"cannot resolve the output path: {exc}", path=path) from exc


def _make_parent(target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the output's parent directory: {exc.strerror or exc}", path=target
        ) from exc


def _require_parent(target: Path) -> None:
    """A file output goes into a directory that exists: a typo in ``-o`` must
    not create directories anywhere (``-o /nonexist/x.html``)."""
    if not target.parent.is_dir():
        raise UsageError(
            "the output's directory does not exist (create it first)", path=target.parent
        )


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _staging_prefix(name: str) -> str:
    """Temporary names carry the writer's pid, so a later run can tell a
    leftover of a killed writer (pid gone) from a live one."""
    return f".{name}.{os.getpid()}-"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        return True
    return True


def clean_leftovers(target: Path) -> None:
    """Remove temporaries that a killed writer left beside ``target``
    (``.NAME.PID-XXXX.tmp`` whose PID is gone), and settle a swap that a
    kill interrupted: a ``.NAME.old-XXXX`` copy is put back when ``target``
    is missing (the kill came between the two renames) and removed when the
    new ``target`` is in place."""
    parent = target.parent
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    prefix = f".{target.name}."
    for entry in entries:
        name = entry.name
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        path = Path(entry.path)
        if rest.endswith(".tmp"):
            pid_text = rest.partition("-")[0]
            if pid_text.isdigit() and not pid_alive(int(pid_text)):
                _remove(path)
        elif rest.startswith("old-"):
            if not target.exists():
                with contextlib.suppress(OSError):
                    os.rename(path, target)
            else:
                _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def _replacing(path: str | os.PathLike[str], *, create_parent: bool) -> Iterator[tuple[int, Path]]:
    """The one write-then-rename of every file output: yields the descriptor
    of a temporary file beside ``path`` (mode ``0666 & ~umask``) and the
    target; when the block ends without an exception the temporary replaces
    the target, otherwise it is removed (an ``OSError`` becomes a
    :class:`UsageError`). The block writes, fsyncs and closes the descriptor.
    ``create_parent``: make missing directories, or refuse them."""
    target = resolve_output(path)
    if target.is_dir():
        raise UsageError("output is a directory, not a file", path=target)
    if create_parent:
        _make_parent(target)
    else:
        _require_parent(target)
    clean_leftovers(target)
    try:
        fd, staged = tempfile.mkstemp(
            prefix=_staging_prefix(target.name), suffix=".tmp", dir=target.parent
        )
    except OSError as exc:
        raise UsageError(
            f"cannot write beside the output: {exc.strerror or exc}", path=target
        ) from exc
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        yield fd, target
        os.replace(staged, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        if isinstance(exc, OSError):
            raise UsageError(
                f"cannot write the output: {exc.strerror or exc}", path=target
            ) from exc
        raise
    fsync_dir(target.parent)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Any]:
    """A text stream whose content replaces ``path`` only when the block ends
    without an exception (temp file beside it, fsync, rename); a killed or
    failed writer leaves the old file (or none), never a truncated one. The
    file gets the usual ``0666 & ~umask`` mode. Undecodable bytes of names
    (lone surrogates) are written as backslash escapes, never an error."""
    with (
        _replacing(path, create_parent=False) as (fd, _),
        os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as f,
    ):
        yield f
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file beside it, fsync, rename)."""
    with _replacing(path, create_parent=True) as (fd, target), os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON (NaN/inf as null) and fsync it. For files
    inside a directory that :func:`atomic_dir` renames into place."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(json_safe(data), f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def check_out_dir(out: Path, overwrite: bool) -> None:
    """UsageError unless `out` is absent, empty, or replaceable (`overwrite`)."""
    try:
        if out.exists():
            if not out.is_dir():
                raise UsageError("output exists and is not a directory", path=out)
            if not overwrite and any(out.iterdir()):
                raise UsageError(
                    "output exists and is not empty (overwrite=True / --overwrite replaces it)",
                    path=out,
                )
    except OSError as exc:  # unreadable, or a parent that is not a directory
        raise UsageError(f"cannot use the output: {exc.strerror or exc}", path=out) from exc


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_disjoint(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]]) -> None:
    """UsageError when the output is an input, contains one, or sits inside one.

    Replacing the output must never touch what is being read: ``out=tuned`` with
    ``overwrite`` would delete the checkpoint being extracted from.
    """
    target = resolve_output(out)
    for given in inputs:
        source = resolve_output(given)
        if _inside(source, target):
            what = "is" if source == target else "contains"
            raise UsageError(f"the output {what} the input {given}", path=target)
        if _inside(target, source):
            raise UsageError(f"the output sits inside the input {given}", path=target)


@contextlib.contextmanager
def atomic_dir(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``out_dir``; on success it is renamed to
    ``out_dir`` (replacing an existing one when ``overwrite``); on error it is removed.

    ``out_dir`` may be a symbolic link: its target is what gets written."""
    out = resolve_output(out_dir)
    if out.parent.is_dir():
        clean_leftovers(out)
    check_out_dir(out, overwrite)
    _make_parent(out)
    try:
        tmp = Path(
            tempfile.mkdtemp(prefix=_staging_prefix(out.name), suffix=".tmp", dir=out.parent)
        )
    except OSError as exc:
        raise UsageError(
            f"cannot write beside the output: {exc.strerror or exc}", path=out
        ) from exc
    try:
        yield tmp
        check_out_dir(out, overwrite)
        try:
            if out.exists():
                old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
                os.rename(out, old)
                try:
                    os.rename(tmp, out)
                except OSError:
                    os.rename(old, out)
                    raise
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, out)
        except OSError as exc:
            raise UsageError(
                f"cannot move the output into place: {exc.strerror or exc}", path=out
            ) from exc
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
