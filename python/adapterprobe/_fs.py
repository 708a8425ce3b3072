"""Atomic writes: a reader never sees a half-written file or directory.

Everything adapterprobe writes (extracted adapters, libraries, gradient dumps,
reports) goes through these helpers: content is built under a temporary name
in the destination's own directory, flushed to disk, and renamed into place.

Symbolic links at the output's own name depend on who named it:

- A path the user names (``-o FILE``, ``report -o``, ``compare -o``,
  ``extract(out_dir)``, a library path) that is a symbolic link is written
  through: the link's target is replaced and the link keeps pointing at it
  (renaming the link itself would leave the old target behind). The link is
  the user's own.
- A file or folder written whole under a *name adapterprobe chooses* inside a
  directory it did not make (the guard's ``adapterprobe-guard.json`` in a
  run's output folder, a GAP side file, a gradient dump's ``step{N}/``) is
  written with ``replace_link=True``: a link standing at that name is never
  followed, it is *replaced* by the new regular file or folder (a rename onto
  the name itself; the link's target is not read, written, moved or deleted).
  Where another library writes the file (Lightning's ``guard-stop-step{N}.ckpt``)
  :func:`remove_link` takes the link away first. The directories above may be
  links; only the last component is never resolved. A run folder resumed from
  a shared or downloaded checkpoint may carry such a link, and the training
  process must not overwrite whatever it points at.
- What is added to instead cannot replace a link without losing what is
  there, so it refuses one: a file opened for appending under a chosen name
  (:func:`open_append`: a store's GAP log) refuses a link, or any other
  non-regular file, at that name with a :class:`UsageError` naming it (the
  sinks also refuse a link at the side-file folder they add files to).

Cleaning up never goes through a link either: a leftover named like our
temporaries (``.NAME.PID-XXXX.tmp``, ``.NAME.old-XXXX``) that is a link is
removed itself (its target untouched) and never renamed back into place.

An output that cannot be created (its parent is a file, a directory cannot be
made, the name is a directory where a file should go) is a :class:`UsageError`
naming the path, never a bare ``OSError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

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


def chosen_output(path: str | os.PathLike[str]) -> Path:
    """The absolute path of a name adapterprobe chose: its directories resolved,
    the last component kept as it is (a link there is not followed)."""
    given = Path(path).absolute()
    try:
        return given.parent.resolve() / given.name
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UsageError(f"cannot resolve the output path: {exc}", path=path) from exc


def _output_path(path: str | os.PathLike[str], replace_link: bool) -> Path:
    return chosen_output(path) if replace_link else resolve_output(path)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _is_link(path: Path) -> bool:
    info = _lstat(path)
    return info is not None and stat.S_ISLNK(info.st_mode)


def _is_real_dir(path: Path) -> bool:
    """A directory itself, not a link to one."""
    info = _lstat(path)
    return info is not None and stat.S_ISDIR(info.st_mode)


def _make_parent(target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the output's parent directory: {exc.strerror or exc}", path=target
        ) from exc


def _require_parent(target: Path) -> None:
    """A file output goes into a directory that exists, or into a new one
    made in one that does (``-o reports/r.html``, as ``mkdir`` would), but a
    typo in ``-o`` must not create a tree of directories anywhere
    (``-o /nonexist/deeper/x.html`` is refused)."""
    parent = target.parent
    if parent.is_dir():
        return
    if not parent.parent.is_dir():
        raise UsageError(
            "the output's directory does not exist, nor the one above it (create them first)",
            path=parent,
        )
    try:
        parent.mkdir()
    except FileExistsError:
        if not parent.is_dir():
            raise UsageError("the output's directory is not a directory", path=parent) from None
    except OSError as exc:
        raise UsageError(
            f"cannot create the output's directory: {exc.strerror or exc}", path=parent
        ) from exc


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
    new ``target`` is in place. A leftover that is a symbolic link is removed
    itself, never followed and never put back in place: our writers never
    leave one that should be restored."""
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
            if not _is_link(path) and not os.path.lexists(target):
                with contextlib.suppress(OSError):
                    os.rename(path, target)
            else:
                _remove(path)


def _remove(path: Path) -> None:
    """Remove ``path`` itself: a directory with what it holds, anything else
    (a link too, whatever it points at) by its name only."""
    if _is_real_dir(path):
        shutil.rmtree(path, ignore_errors=True)  # refuses a link swapped in meanwhile
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


#: Entries of a folder looked at when listing its ``checkpoint-N`` folders.
MAX_LISTED_ENTRIES = 100_000


def checkpoint_folders(folder: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``(N, path)`` of each ``checkpoint-N`` entry of ``folder`` (the HF
    Trainer's layout; N in ASCII digits), in listing order, at most
    :data:`MAX_LISTED_ENTRIES` entries looked at; none where the folder
    cannot be read. Whether each is a folder is the caller's to check."""
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(folder) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_LISTED_ENTRIES:
                    break
                number = entry.name.removeprefix("checkpoint-")
                if number != entry.name and number.isascii() and number.isdigit():
                    found.append((int(number), entry.path))
    except OSError:
        return []
    return found


def remove_link(path: str | os.PathLike[str]) -> bool:
    """Remove a symbolic link standing at ``path`` (the link, never its target)
    before another library writes a file under a name adapterprobe chose there;
    True when there was one."""
    if not _is_link(Path(path)):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise UsageError(
            f"cannot remove the symbolic link at the output: {exc.strerror or exc}", path=path
        ) from exc
    return True


@contextlib.contextmanager
def _replacing(
    path: str | os.PathLike[str], *, create_parent: bool, replace_link: bool = False
) -> Iterator[tuple[int, Path]]:
    """The one write-then-rename of every file output: yields the descriptor
    of a temporary file beside ``path`` (mode ``0666 & ~umask``) and the
    target; when the block ends without an exception the temporary replaces
    the target, otherwise it is removed (an ``OSError`` becomes a
    :class:`UsageError`). The block writes, fsyncs and closes the descriptor.
    ``create_parent``: make missing directories, or refuse them.
    ``replace_link``: a name adapterprobe chose; a link at it is replaced, not
    written through (see the module's docstring)."""
    target = _output_path(path, replace_link)
    if _is_real_dir(target):
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


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, replace_link: bool = False
) -> Path:
    """Write ``data`` to ``path`` atomically (temp file beside it, fsync, rename).

    ``replace_link=True`` for a name adapterprobe chose: a symbolic link at
    ``path`` is replaced by the new file, its target left alone."""
    with (
        _replacing(path, create_parent=True, replace_link=replace_link) as (fd, target),
        os.fdopen(fd, "wb") as f,
    ):
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return target


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, replace_link: bool = False
) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (``replace_link``: as
    :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(
        path, text.encode("utf-8", "backslashreplace"), replace_link=replace_link
    )


def open_append(path: str | os.PathLike[str]) -> IO[str]:
    """Open a file under a name adapterprobe chose for appending UTF-8 lines
    (created ``0666 & ~umask`` when missing). A symbolic link at ``path`` (or a
    FIFO, a device: anything but a regular file) is refused with a
    :class:`UsageError` naming it, never written through: ``O_NOFOLLOW`` makes
    the refusal part of the open itself."""
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block the open
        | getattr(os, "O_CLOEXEC", 0)
    )
    if not hasattr(os, "O_NOFOLLOW") and _is_link(Path(path)):  # Windows: no O_NOFOLLOW
        raise UsageError("refusing to append through a symbolic link", path=path)
    not_regular = "refusing to append to something that is not a regular file"
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        info = _lstat(Path(path))
        if info is not None and stat.S_ISLNK(info.st_mode):  # ELOOP, or EMLINK (FreeBSD)
            raise UsageError(
                "refusing to append through a symbolic link at a name adapterprobe chose "
                "(remove the link)",
                path=path,
            ) from exc
        if info is not None and not stat.S_ISREG(info.st_mode):  # ENXIO: a FIFO, no reader
            raise UsageError(not_regular, path=path) from exc
        raise UsageError(f"cannot open the output: {exc.strerror or exc}", path=path) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(not_regular, path=path)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


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


def _check_dir_output(out: Path, overwrite: bool) -> None:
    """:func:`check_out_dir`, where a link at ``out`` (a chosen name: never
    followed) is an existing entry that only ``overwrite`` replaces."""
    if _is_link(out):
        if not overwrite:
            raise UsageError(
                "output exists and is a symbolic link (overwrite=True replaces the link itself)",
                path=out,
            )
        return
    check_out_dir(out, overwrite)


def replace_dir(staged: Path, out: Path) -> None:
    """Rename the finished directory ``staged`` to ``out``, replacing what is
    there by its name: a directory is swapped out (``.NAME.old-XXXX``) and
    then removed, a symbolic link is renamed and unlinked, never followed. A
    failed rename puts the old entry back and raises the ``OSError``."""
    if os.path.lexists(out):
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        try:
            os.rename(staged, out)
        except OSError:
            os.rename(old, out)
            raise
        _remove(old)
    else:
        os.rename(staged, out)


@contextlib.contextmanager
def atomic_dir(
    out_dir: str | os.PathLike[str], *, overwrite: bool = False, replace_link: bool = False
) -> Iterator[Path]:
    """Yield a temporary directory beside ``out_dir``; on success it is renamed to
    ``out_dir`` (replacing an existing one when ``overwrite``); on error it is removed.

    ``out_dir`` may be a symbolic link: its target is what gets written. With
    ``replace_link`` (a folder name adapterprobe chose) a link at ``out_dir``
    is never followed: with ``overwrite`` the new folder replaces the link
    itself, without it the link is refused."""
    out = _output_path(out_dir, replace_link)
    if out.parent.is_dir():
        clean_leftovers(out)
    _check_dir_output(out, overwrite)
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
        _check_dir_output(out, overwrite)
        try:
            replace_dir(tmp, out)
        except OSError as exc:
            raise UsageError(
                f"cannot move the output into place: {exc.strerror or exc}", path=out
            ) from exc
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
