"""Scan roots that are not plain directories: object-store URLs and ``file://``.

A URL root (``s3://bucket/prefix``, ``gs://``, ``az://`` and their aliases)
is listed by the Rust core (``object_store``, credentials and endpoint from
the standard environment: ``AWS_*`` with ``AWS_ENDPOINT_URL`` for S3
compatibles, ``GOOGLE_*``, ``AZURE_*``) and laid out as sparse files of
their real sizes in a private temporary directory. A reader's first touch of
a byte range fetches that range (a safetensors header, a zip's central
directory and the entries read; logs and JSON whole, size-capped), so the
scan runs on the tree exactly as on disk; every record, message and problem
then names the object URLs instead of the temporary paths. ``file://``
roots are local paths. Nothing here touches the network before a URL root
is given.

Other roots are shown under another name the same way: a Hugging Face hub
cache's snapshots as ``org/name@rev`` (:mod:`adapterprobe.hf_cache`).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapterprobe.errors import UsageError

#: URL schemes read through object stores.
URL_SCHEMES = ("s3", "s3a", "gs", "az", "azure", "abfs", "abfss")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


@dataclass(frozen=True)
class Alias:
    """Paths under ``real`` are shown under ``shown``; ``in_text``: also
    inside messages and evidence (a temporary staging path is meaningless to
    a reader; a cache snapshot's real path is worth keeping there)."""

    real: str
    shown: str
    in_text: bool
    staged: Path | None = None

    def rename_path(self, path: str) -> str | None:
        if path == self.real:
            return self.shown
        if path.startswith(self.real + os.sep):
            return self.shown + "/" + path[len(self.real) + 1 :].replace(os.sep, "/")
        return None


_LOCK = threading.Lock()
_ALIASES: list[Alias] = []
_ATEXIT = False


def scheme_of(root: str | os.PathLike[str]) -> str | None:
    """The lower-cased scheme when ``root`` is a URL (``scheme://...``)."""
    if not isinstance(root, str):
        return None
    m = _SCHEME.match(root)
    return m.group(1).lower() if m else None


def file_url_path(url: str) -> Path:
    """The local path of a ``file://`` URL (host empty or ``localhost``)."""
    import urllib.parse
    import urllib.request  # here, not at import: it pulls in http, email and ssl

    parts = urllib.parse.urlparse(url)
    if parts.netloc not in ("", "localhost"):
        raise UsageError(f"file:// URLs name local files only, not host {parts.netloc!r}", path=url)
    return Path(urllib.request.url2pathname(parts.path))


#: Staging directories are ``<tmp>/adapterprobe-remote-<pid>-XXXX``: the pid
#: tells a later run which ones a killed scan left behind.
STAGING_PREFIX = "adapterprobe-remote-"
#: Entries of the temporary directory looked through for leftovers.
_MAX_TMP_ENTRIES = 100_000


def clean_staging_leftovers(tmp: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the staging directories of scans that were killed (``kill -9``
    skips every ``finally``): ours by owner, named with a pid that no longer
    runs. Returns what was removed."""
    import tempfile

    from adapterprobe._fs import pid_alive

    folder = Path(tmp if tmp is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = os.scandir(folder)
    except OSError:
        return removed
    with entries:
        for i, entry in enumerate(entries):
            if i >= _MAX_TMP_ENTRIES:
                break
            if not entry.name.startswith(STAGING_PREFIX):
                continue
            pid_text = entry.name[len(STAGING_PREFIX) :].partition("-")[0]
            if not pid_text.isdigit() or pid_alive(int(pid_text)):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            mine = not hasattr(os, "getuid") or info.st_uid == os.getuid()
            if not entry.is_dir(follow_symlinks=False) or not mine:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def stage(url: str) -> tuple[Path, list[tuple[str, str]]]:
    """List ``url`` into a new temporary directory (its files fetched on
    first read), registered until :func:`release`: (directory, problems).
    Staging directories that killed scans left behind are removed first."""
    import tempfile

    import adapterprobe._core as _core

    if not _core.remote_supported():
        raise UsageError(
            "this adapterprobe was built without object stores (the cargo feature "
            "`object-store`, which release wheels have); rebuild it from the checkout with "
            "`maturin develop --release --features python,object-store`, or copy the stores "
            "to a local disk",
            path=url,
        )
    clean_staging_leftovers()
    prefix = f"{STAGING_PREFIX}{os.getpid()}-"
    staged = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    try:
        _objects, _listed, _lists, problems = _core.remote_stage(url, staged)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    register(Alias(str(staged), url.rstrip("/"), in_text=True, staged=staged))
    return staged, list(problems)


def register(alias: Alias) -> None:
    """Show paths under ``alias.real`` as ``alias.shown`` in records."""
    global _ATEXIT
    with _LOCK:
        _ALIASES[:] = [a for a in _ALIASES if a.real != alias.real]
        _ALIASES.append(alias)
        if alias.staged is not None and not _ATEXIT:
            atexit.register(release_all)
            _ATEXIT = True


def release(aliases: Iterable[Alias]) -> None:
    """Forget ``aliases``; remove their staging directories."""
    import adapterprobe._core as _core

    gone = list(aliases)
    with _LOCK:
        _ALIASES[:] = [a for a in _ALIASES if a not in gone]
    for alias in gone:
        if alias.staged is not None:
            _core.remote_release(alias.staged)
            shutil.rmtree(alias.staged, ignore_errors=True)


def release_all() -> None:
    with _LOCK:
        every = list(_ALIASES)
    release(every)


#: Set to 1 to check sha256 sidecars of remote training states (each state
#: is then fetched whole, where the readers fetch only what they parse).
VERIFY_CHECKSUMS_ENV = "ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS"

#: Stores read at once while a remote root is staged: each waits on the
#: network, not on a core, so as many run as requests may be in flight.
DEFAULT_CONCURRENCY = 64


def concurrency() -> int:
    """``ADAPTERPROBE_REMOTE_CONCURRENCY`` (default 64): threads reading a
    scan's stores while a remote root is staged, hence range requests in
    flight. A UsageError unless it is an integer in 1..256."""
    text = os.environ.get("ADAPTERPROBE_REMOTE_CONCURRENCY")
    if text is None:
        return DEFAULT_CONCURRENCY
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 256:
        raise UsageError(
            f"ADAPTERPROBE_REMOTE_CONCURRENCY must be an integer in 1..256, got {text!r}"
        )
    return value


def workers_for(workers: int | None) -> int | None:
    """The threads a scan reads with: ``workers`` when given; while a remote
    root is staged, :func:`concurrency` (a store's reads wait on latency,
    so many stores in flight hide it); else None (one per core)."""
    if workers is not None:
        return workers
    if any(a.staged is not None for a in active()):
        return concurrency()
    return None


def active() -> list[Alias]:
    with _LOCK:
        return list(_ALIASES)


def _rename_text(text: str, aliases: Sequence[Alias]) -> str:
    for a in aliases:
        if a.in_text and a.real in text:
            text = text.replace(a.real + os.sep, a.shown + "/").replace(a.real, a.shown)
    return text


def _rename_value(value: Any, aliases: Sequence[Alias]) -> Any:
    if isinstance(value, str):
        return _rename_text(value, aliases)
    if isinstance(value, dict):
        return {k: _rename_value(v, aliases) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename_value(v, aliases) for v in value]
    if isinstance(value, tuple):
        return tuple(_rename_value(v, aliases) for v in value)
    return value


def rename_path(path: str, aliases: Sequence[Alias] | None = None) -> str:
    """``path`` as shown: under the first alias whose real prefix holds it."""
    for a in active() if aliases is None else aliases:
        shown = a.rename_path(path)
        if shown is not None:
            return shown
    return path


def rename_records(records: list[Any]) -> list[Any]:
    """The records with staged and aliased paths shown by their names
    (unchanged, and no work, when no alias is registered)."""
    aliases = active()
    if not aliases:
        return records
    out = []
    for r in records:
        store = rename_path(r.store, aliases)
        if store == r.store and not any(a.in_text and a.real in r.message for a in aliases):
            out.append(r)
            continue
        out.append(
            r.replace(
                store=store,
                adapter=None if r.adapter is None else rename_path(r.adapter, aliases),
                message=_rename_text(r.message, aliases),
                evidence=_rename_value(r.evidence, aliases),
            )
        )
    return out


def rename_problems(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    aliases = active()
    if not aliases:
        return problems
    return [(rename_path(p, aliases), _rename_text(m, aliases)) for p, m in problems]


def fetched_per_store(stores: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(bytes, requests) fetched for each remote store named in ``stores``
    (URLs as records show them): the files read under it so far."""
    import adapterprobe._core as _core

    files: list[tuple[str, int, int]] = []
    for a in active():
        if a.staged is not None:
            for path, nbytes, requests in _core.remote_fetched(a.staged):
                files.append((rename_path(str(path), [a]), nbytes, requests))
    out: dict[str, tuple[int, int]] = {}
    for store in sorted(set(stores)):
        if scheme_of(store) not in URL_SCHEMES:
            continue
        total = [0, 0]
        for name, nbytes, requests in files:
            if name == store or name.startswith(store + "/"):
                total[0] += nbytes
                total[1] += requests
        out[store] = (total[0], total[1])
    return out


def refuse_staged(targets: Sequence[Any], engine: str) -> None:
    """UsageError when a target lies in a staged remote root: its files are
    fetched by this process only, so another engine cannot read them."""
    staged = [a for a in active() if a.staged is not None]
    for target in targets if staged else ():
        store = str(target.store)
        for a in staged:
            if a.rename_path(store) is not None:
                raise UsageError(
                    f"remote roots are scanned by the local engine, not {engine} (its workers "
                    "cannot fetch the objects)",
                    path=a.shown,
                )


def resolve_roots(
    roots: Sequence[str | os.PathLike[str]],
) -> tuple[list[str | os.PathLike[str]], list[tuple[str, str]], list[Alias]]:
    """(local roots, problems, aliases registered): URL roots staged,
    ``file://`` roots turned into paths, hub caches expanded into their
    snapshots; an unsupported scheme is a UsageError. Plain paths pass
    through untouched (a local scan does no more than this check)."""
    import adapterprobe.hf_cache as hf_cache

    local: list[str | os.PathLike[str]] = []
    problems: list[tuple[str, str]] = []
    made: list[Alias] = []
    try:
        for root in roots:
            scheme = scheme_of(root)
            if scheme is None:
                expanded = hf_cache.expand(root)
                if expanded is None:
                    local.append(root)
                    continue
                snapshots, found, names, others = expanded
                # a snapshot's real path stays in messages (it is worth
                # keeping there); only store/adapter fields show the name
                aliases = [Alias(real, shown, in_text=False) for real, shown in names]
                for alias in aliases:
                    register(alias)
                made += aliases
                local += snapshots
                local += others  # ordinary stores beside the repos: never dropped
                problems += found
            elif scheme == "file":
                local.append(file_url_path(str(root)))
            elif scheme in URL_SCHEMES:
                staged, found = stage(str(root))
                made += [a for a in active() if a.staged == staged]
                local.append(staged)
                problems += found
            else:
                raise UsageError(
                    f"unsupported URL scheme {scheme}://: scan reads s3://, gs://, az:// "
                    "(also s3a, azure, abfs, abfss) and file:// roots, and local paths",
                    path=str(root),
                )
    except BaseException:
        release(made)
        raise
    return local, problems, made


def confinement_of(root: str | os.PathLike[str]) -> Path:
    """The directory a scan of ``root`` stays inside: the root itself, or for
    a Hugging Face hub snapshot (``<cache>/models--org--name/snapshots/<rev>``,
    whose files are links into ``<cache>/.../blobs/``) the whole cache."""
    import adapterprobe.hf_cache as hf_cache

    path = Path(root)
    repo = path.parent.parent
    if path.parent.name == "snapshots" and hf_cache.is_repo_dir(repo):
        return repo.parent
    return path
