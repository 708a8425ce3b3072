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


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file beside it, fsync, rename)."""
    target = resolve_output(path)
    if target.is_dir():
        raise UsageError("output is a directory, not a file", path=target)
    _make_parent(target)
    try:
        fd, staged = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise UsageError(
            f"cannot write beside the output: {exc.strerror or exc}", path=target
        ) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
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
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


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
    check_out_dir(out, overwrite)
    _make_parent(out)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
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
