"""The Hugging Face hub cache: each snapshot scanned as a store named ``org/name@rev``.

The hub keeps each downloaded repository as ``models--org--name/`` with
``blobs/`` (the files, named by hash), ``refs/`` (branch and tag names, each
a file holding a commit hash) and ``snapshots/<commit>/`` (the repository's
tree, its files symbolic links into ``blobs/``). A scan of the cache (or of
one ``models--*`` directory) scans every snapshot like any other store,
following its links into ``blobs/`` only while they stay inside the cache:
a snapshot with a link leading out of it is reported and not scanned. No
request is made to the Hub.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from adapterprobe.errors import UsageError

_REPO = re.compile(r"^(models|datasets|spaces)--(.+)$")
#: Entries looked at below one snapshot while checking its links.
MAX_SNAPSHOT_ENTRIES = 100_000
_MAX_REF_BYTES = 256
#: Ref files read per repo (a repo has a branch or two and some tags).
_MAX_REFS = 10_000


def default_cache() -> Path:
    """Where the hub cache is: ``HF_HUB_CACHE`` (or the older
    ``HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache`` by default)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cache_root() -> Path:
    """The hub cache for ``--hf-cache``; UsageError when there is none."""
    path = default_cache()
    if not path.is_dir():
        raise UsageError(
            "no Hugging Face hub cache here (set HF_HUB_CACHE or HF_HOME to point at it)",
            path=path,
        )
    return path


def is_repo_dir(path: Path) -> bool:
    return _REPO.match(path.name) is not None and (path / "snapshots").is_dir()


def is_hub_cache(path: Path) -> bool:
    try:
        with os.scandir(path) as listing:
            return any(_REPO.match(e.name) and is_repo_dir(Path(e.path)) for e in listing)
    except OSError:
        return False


def repo_id(dirname: str) -> str:
    """``models--org--name`` → ``org/name`` (datasets and spaces keep their kind)."""
    m = _REPO.match(dirname)
    if m is None:
        return dirname
    kind, rest = m.groups()
    name = rest.replace("--", "/")
    return name if kind == "models" else f"{kind}/{name}"


def _read_ref(path: Path) -> str | None:
    """A ref file's text, or None unless it is a small regular file. Opened
    without following a link and without blocking (a FIFO planted there
    opens at once and is refused by its type), so nothing here can hang."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_REF_BYTES:
            return None
        data = os.read(fd, _MAX_REF_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[:_MAX_REF_BYTES].decode("utf-8", errors="replace").strip()


def _refs(repo: Path) -> dict[str, list[str]]:
    """Commit hash → the ref names pointing at it (``main`` first); at most
    ``_MAX_REFS`` ref files are read."""
    out: dict[str, list[str]] = {}
    refs = repo / "refs"
    if not refs.is_dir():
        return out
    seen = 0
    for dirpath, _dirs, files in os.walk(refs):
        for name in files:
            seen += 1
            if seen > _MAX_REFS:
                break
            path = Path(dirpath) / name
            commit = _read_ref(path)
            if commit is not None:
                out.setdefault(commit, []).append(path.relative_to(refs).as_posix())
        if seen > _MAX_REFS:
            break
    for names in out.values():
        names.sort(key=lambda n: (n != "main", n))
    return out


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def escaping_link(snapshot: Path, cache: Path) -> tuple[Path, str] | None:
    """The first link under ``snapshot`` that leads outside ``cache`` (or
    nowhere inside it), with why; None when every link stays inside."""
    folder = os.path.realpath(cache)
    seen = 0
    for dirpath, dirs, files in os.walk(snapshot):
        for name in dirs + files:
            seen += 1
            if seen > MAX_SNAPSHOT_ENTRIES:
                return snapshot, f"holds more than {MAX_SNAPSHOT_ENTRIES} entries; not scanned"
            path = Path(dirpath) / name
            if not path.is_symlink():
                continue
            target = os.path.realpath(path)
            if not _inside(target, folder):
                return path, (
                    "is a link leading outside the Hugging Face cache; the snapshot is not scanned"
                )
    return None


#: Snapshots looked at per repo.
MAX_SNAPSHOTS = 10_000
_OUTSIDE = "is a link leading outside the Hugging Face cache; not scanned"
_LINK_OUT = "is a link leading out of the root; not followed"


def _leads_outside(path: Path, folder: str) -> bool:
    return path.is_symlink() and not _inside(os.path.realpath(path), folder)


def expand(
    root: str | os.PathLike[str],
) -> tuple[list[Path], list[tuple[str, str]], list[tuple[str, str]], list[Path]] | None:
    """(snapshot roots, problems, names: (snapshot path, ``org/name@rev``),
    other entries) when ``root`` is a hub cache or one ``models--*``
    directory in it; None for any other root.

    The other entries are what a cache root holds besides its repos and
    its hidden bookkeeping (``.locks``): they are scanned as ordinary roots,
    so a repo folder dropped beside ordinary stores never hides them. A
    repo, ``snapshots`` folder or snapshot that is a link out of the cache
    is a problem, not scanned."""
    path = Path(root).expanduser()
    others: list[Path] = []
    problems_early: list[tuple[str, str]] = []
    if is_repo_dir(path):
        cache, repos = path.parent, [path]
    elif path.is_dir() and is_hub_cache(path):
        cache = path
        repos = []
        folder = os.path.realpath(cache)
        for entry in sorted(path.iterdir()):
            if is_repo_dir(entry):
                repos.append(entry)
            elif entry.name.startswith("."):
                continue
            elif entry.is_symlink():
                # as a root it would be followed: the walk's rule instead
                if _leads_outside(entry, folder):
                    problems_early.append((str(entry), _LINK_OUT))
            else:
                others.append(entry)
    else:
        return None
    folder = os.path.realpath(cache)
    roots: list[Path] = []
    problems: list[tuple[str, str]] = problems_early
    shown: list[tuple[str, str]] = []
    for repo in repos:
        snapshots_dir = repo / "snapshots"
        if _leads_outside(repo, folder) or _leads_outside(snapshots_dir, folder):
            where = repo if repo.is_symlink() else snapshots_dir
            problems.append((str(where), _OUTSIDE))
            continue
        refs = _refs(repo)
        for i, snapshot in enumerate(sorted(snapshots_dir.iterdir())):
            if i >= MAX_SNAPSHOTS:
                problems.append((str(snapshots_dir), f"holds more than {MAX_SNAPSHOTS} snapshots"))
                break
            if snapshot.is_symlink():
                why = _OUTSIDE if _leads_outside(snapshot, folder) else "is a link; not scanned"
                problems.append((str(snapshot), why))
                continue
            if not snapshot.is_dir():
                continue
            bad = escaping_link(snapshot, cache)
            if bad is not None:
                problems.append((str(bad[0]), bad[1]))
                continue
            names = refs.get(snapshot.name)
            rev = names[0] if names else snapshot.name
            roots.append(snapshot)
            shown.append((str(snapshot), f"{repo_id(repo.name)}@{rev}"))
    return roots, problems, shown, others
