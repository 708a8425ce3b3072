"""Atomic writes: a reader never sees a half-written file or directory.

Everything adapterprobe writes (extracted adapters, libraries, gradient dumps,
reports) goes through these helpers: content is built under a temporary name
in the destination's own directory, flushed to disk, and renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
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


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file beside it, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
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
    if out.exists():
        if not out.is_dir():
            raise UsageError("output exists and is not a directory", path=out)
        if not overwrite and any(out.iterdir()):
            raise UsageError(
                "output exists and is not empty (overwrite=True / --overwrite replaces it)",
                path=out,
            )


@contextlib.contextmanager
def atomic_dir(out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``out_dir``; on success it is renamed to
    ``out_dir`` (replacing an existing one when ``overwrite``); on error it is removed."""
    out = Path(out_dir).absolute()
    check_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        check_out_dir(out, overwrite)
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
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
