"""``scan --baseline previous.json``: each record against the same store (and
version) in a saved scan, and what got worse.

Matching: by the store's path relative to its scan root (``--match path``,
the default) or by the store directory's name (``--match name``, for stores
that moved); a version record (adapter_weights, gradient_ghost) matches the
saved record of the same probe for the same relative adapter path, else the
saved one of that probe and store. Saved scans carry ``schema_version`` and
``root`` in every record; a file of another schema version, without them, or
made from another root is refused (``UsageError``) before anything is read.

What counts as a regression (each gives a ``why`` line):

- the verdict dropped (pass → warn → fail → error; skip compares with nothing);
- training_drift: the best or final training loss, or the final eval loss,
  rose by more than ``loss_margin`` (relative) over the saved one;
- adapter_weights: ‖ΔW‖ or the largest rank used fell below ``collapse``
  times the saved value;
- gradient_ghost: the best validation loss rose by more than ``loss_margin``.

What a saved record may hold: the record itself is checked when read, and
one that is not a record of this schema (not an object, a field of the
wrong type, ``evidence`` or ``baseline`` that is not an object, nested
beyond :data:`MAX_EVIDENCE_DEPTH` or holding an integer beyond 64 bits) is
refused with a ``UsageError`` naming the record and what is wrong. Inside
its evidence anything goes: each value is read through the typed accessors
of :mod:`adapterprobe._evidence`, so a value of the wrong shape (a list, a
string or ``true`` where an object or a number was written; a pair that is
not ``[step, number]``) is absent, and a check that needs it says nothing,
as it does for a key the saved record lacks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from adapterprobe._evidence import mapping, number, pairs
from adapterprobe.errors import MissingFileError, UsageError
from adapterprobe.records import SCHEMA_VERSION, ScanRecord

SEVERITY = {"pass": 0, "warn": 1, "fail": 2, "error": 3}


@dataclasses.dataclass(frozen=True)
class Margins:
    loss_margin: float = 0.05
    collapse: float = 0.5


#: Saved scans larger than this are refused (a 100,000-store scan is about
#: 150 MB); ``ADAPTERPROBE_MAX_SAVED_SCAN_MB`` raises it.
MAX_SAVED_SCAN_MB = 512
#: Deepest nesting of a record's evidence (ours is 3 levels deep).
MAX_EVIDENCE_DEPTH = 32
#: Largest integer a saved record may hold (beyond it, float() overflows).
MAX_SAVED_INT = 2**63
_TEXT_FIELDS = ("store", "probe", "verdict", "root")
_OPTIONAL_TEXT = ("adapter", "layout", "message", "checkpoint_kind")


def _size_limit() -> int:
    text = os.environ.get("ADAPTERPROBE_MAX_SAVED_SCAN_MB")
    if text is None:
        return MAX_SAVED_SCAN_MB << 20
    try:
        mb = int(text)
    except ValueError:
        mb = -1
    if mb <= 0:
        raise UsageError(f"ADAPTERPROBE_MAX_SAVED_SCAN_MB must be a positive integer, got {text!r}")
    return mb << 20


def _plain_tree(value: Any, depth: int) -> str | None:
    """Why ``value`` is not the plain JSON a record's evidence holds (too
    deep, or a number no float can hold), None when it is."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if level > MAX_EVIDENCE_DEPTH:
            return f"nests deeper than {MAX_EVIDENCE_DEPTH} levels"
        if isinstance(item, bool) or item is None or isinstance(item, str | float):
            continue
        if isinstance(item, int):
            if abs(item) >= MAX_SAVED_INT:
                return "holds an integer beyond the range of a 64-bit number"
        elif isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
        else:
            return f"holds a {type(item).__name__}"
    return None


def _record_problem(r: Any) -> str | None:
    """Why ``r`` is not a record of this schema, None when it is one."""
    from adapterprobe.probes.result import Verdict

    if not isinstance(r, dict):
        return "is not a JSON object"
    version = r.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version != SCHEMA_VERSION:
        return (
            f"has schema_version {json.dumps(version)[:40]}; this adapterprobe reads the "
            f"integer {SCHEMA_VERSION} (re-run the scan with this version)"
        )
    for key in _TEXT_FIELDS:
        if not isinstance(r.get(key), str):
            return f"needs {key} as a string"
    for key in _OPTIONAL_TEXT:
        if r.get(key) is not None and not isinstance(r.get(key), str):
            return f"has a {key} that is not a string"
    if r["verdict"] not in {v.value for v in Verdict}:
        return f"has an unknown verdict {r['verdict'][:40]!r}"
    score = r.get("score")
    if score is not None and (
        isinstance(score, bool)
        or not isinstance(score, int | float)
        or not math.isfinite(float(score) if abs(score) < MAX_SAVED_INT else math.inf)
    ):
        return "has a score that is not a finite number"
    for key in ("evidence", "baseline"):
        value = r.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            return f"has {key} that is not a JSON object"
        why = _plain_tree(value, 1)
        if why is not None:
            return f"has {key} that {why}"
    return None


def load_saved_scan(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a saved ``scan --format json``, checked against the
    schema record by record; anything else is a UsageError (exit 2) naming
    the first bad record, never a traceback."""
    return list(iter_saved_scan(path))


#: Text decoded per read while streaming a saved scan.
_CHUNK_BYTES = 1 << 20
#: Longest single record read (a record with its evidence is a few KB).
MAX_RECORD_MB = 64


def iter_saved_scan(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """:func:`load_saved_scan` one record at a time: the file is decoded in
    1 MB pieces and each array element parsed and checked alone, so memory
    holds one record's text, not the whole file's (a 300 MB scan is never
    one string and one parse tree at once)."""
    p = Path(path)
    if not p.is_file():
        raise MissingFileError("no such saved scan", path=str(p))
    limit = _size_limit()
    try:
        size = p.stat().st_size
        if size > limit:
            raise UsageError(
                f"saved scan is {size >> 20} MB, above the {limit >> 20} MB read "
                "(ADAPTERPROBE_MAX_SAVED_SCAN_MB raises it)",
                path=str(p),
            )
        with p.open("rb") as f:
            yield from _checked_records(_elements(f, limit, str(p)), str(p))
    except UsageError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(f"cannot read the saved scan: {reason}", path=str(p)) from None
    except RecursionError:
        raise UsageError("not a saved scan (JSON nested too deep)", path=str(p)) from None
    except ValueError as exc:  # invalid JSON or UTF-8, an integer of too many digits
        detail = str(exc)[:200]
        raise UsageError(f"not a saved scan (invalid JSON: {detail})", path=str(p)) from None


def _checked_records(elements: Iterator[Any], path: str) -> Iterator[dict[str, Any]]:
    for i, r in enumerate(elements):
        problem = _record_problem(r)
        if problem is not None:
            raise UsageError(f"not a saved scan of this version: record {i} {problem}", path=path)
        yield r


class _Text:
    """A binary file decoded as UTF-8 in pieces, read through a window."""

    def __init__(self, f: Any, limit: int) -> None:
        import codecs

        self._f = f
        self._left = limit + 1
        self._decode = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.eof = False

    def more(self) -> bool:
        """Append the next piece (dropping what was consumed); False at EOF."""
        if self.eof:
            return False
        chunk = self._f.read(min(_CHUNK_BYTES, self._left))
        self._left -= len(chunk)
        self.buf = self.buf[self.pos :] + self._decode.decode(chunk, final=not chunk)
        self.pos = 0
        self.eof = not chunk
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end), consumed blanks."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""


def _elements(f: Any, limit: int, path: str) -> Iterator[Any]:
    """The elements of the JSON array in `f`, parsed one at a time."""
    decoder = json.JSONDecoder()
    text = _Text(f, limit)
    not_array = UsageError("not a saved scan (expected the JSON array of records)", path=path)
    if text.peek() != "[":
        raise not_array
    text.pos += 1
    if text.peek() == "]":
        text.pos += 1
    else:
        while True:
            text.peek()
            while True:
                try:
                    value, end = decoder.raw_decode(text.buf, text.pos)
                    break
                except json.JSONDecodeError:
                    if len(text.buf) - text.pos > MAX_RECORD_MB << 20:
                        raise UsageError(
                            f"not a saved scan (a record longer than {MAX_RECORD_MB} MB)",
                            path=path,
                        ) from None
                    if not text.more():
                        raise
            text.pos = end
            yield value
            after = text.peek()
            text.pos += 1
            if after == "]":
                break
            if after != ",":
                raise ValueError(f"expected ',' or ']' after record, found {after[:1]!r}")
    if text.peek() != "":
        raise ValueError("extra data after the array of records")


def _norm(root: str) -> str:
    return os.path.normpath(root)


def root_of(store: str, roots: list[str]) -> str:
    """The scan root `store` lies under (the longest that contains it)."""
    best = None
    for root in roots:
        r = _norm(root)
        s = _norm(store)
        if (s == r or s.startswith(r.rstrip(os.sep) + os.sep)) and (
            best is None or len(r) > len(best)
        ):
            best = r
    return best if best is not None else _norm(roots[0]) if roots else ""


def _rel(path: str | None, root: str | None) -> str | None:
    if path is None:
        return None
    if root is None:
        return _norm(path)
    return os.path.relpath(_norm(path), root)


def match_key(record: dict[str, Any], match: str) -> str:
    store = str(record["store"])
    if match == "name":
        return os.path.basename(_norm(store))
    return str(_rel(store, record.get("root")))


class Baseline:
    """A saved scan indexed for matching."""

    def __init__(self, records: list[dict[str, Any]], roots: list[str], match: str) -> None:
        saved_roots = {r.get("root") for r in records}
        if records and None in saved_roots:
            raise UsageError(
                "saved scan records carry no root: save it with `adapterprobe scan ... "
                "--format json` of this version"
            )
        current = {_norm(r) for r in roots}
        other = {str(r) for r in saved_roots} - current
        if match == "path" and other:
            raise UsageError(
                f"saved scan was made from another root ({', '.join(sorted(other))}), "
                f"this scan is of {', '.join(sorted(current))}; scan the same root, or "
                "pass --match name to match stores by name"
            )
        self.match = match
        self.by_store: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in records:
            self.by_store.setdefault((match_key(r, match), r["probe"]), []).append(r)

    def find(self, record: dict[str, Any]) -> dict[str, Any] | None:
        saved = self.by_store.get((match_key(record, self.match), record["probe"]))
        if not saved:
            return None
        if record.get("adapter") is not None:
            rel = _rel(record["adapter"], record.get("root"))
            for s in saved:
                if s.get("adapter") is not None and _rel(s["adapter"], s.get("root")) == rel:
                    return s
        return saved[-1]


def _final_eval(evidence: Any) -> float | None:
    """The eval loss at the last step with a finite one, None without any."""
    points = pairs(evidence, "eval_loss_sampled")
    return points[-1][1] if points else None


def _rank_used(evidence: Any) -> float | None:
    """The largest rank used (``rank_used.max``), None when not a number."""
    return number(mapping(evidence, "rank_used"), "max")


def _rose(what: str, old: float | None, new: float | None, margin: float) -> str | None:
    if old is None or new is None:
        return None
    if new - old > margin * abs(old):
        change = (new - old) / abs(old) * 100 if old else math.inf
        return f"{what} rose {old:.4g} -> {new:.4g} (+{change:.1f}%, margin {margin:.0%})"
    return None


def _fell(what: str, old: float | None, new: float | None, collapse: float) -> str | None:
    if old is None or new is None or old <= 0:
        return None
    if new < collapse * old:
        return f"{what} collapsed {old:.4g} -> {new:.4g} (below {collapse:.0%} of the baseline)"
    return None


def regressions(new: dict[str, Any], old: dict[str, Any], m: Margins) -> list[str]:
    """Why `new` is worse than the saved `old` (empty when it is not)."""
    why = []
    before, after = SEVERITY.get(old["verdict"]), SEVERITY.get(new["verdict"])
    if before is not None and after is not None and after > before:
        why.append(f"verdict dropped {old['verdict']} -> {new['verdict']}")
    e_new, e_old = new.get("evidence"), old.get("evidence")
    if new["probe"] == "training_drift":
        checks = [
            _rose(
                "best loss", number(e_old, "best_loss"), number(e_new, "best_loss"), m.loss_margin
            ),
            _rose(
                "final loss", number(e_old, "tail_loss"), number(e_new, "tail_loss"), m.loss_margin
            ),
            _rose("eval loss", _final_eval(e_old), _final_eval(e_new), m.loss_margin),
        ]
    elif new["probe"] == "adapter_weights":
        checks = [
            _fell(
                "‖ΔW‖",
                number(e_old, "total_delta_fro"),
                number(e_new, "total_delta_fro"),
                m.collapse,
            ),
            _fell("rank used", _rank_used(e_old), _rank_used(e_new), m.collapse),
        ]
    elif new["probe"] == "gradient_ghost":
        checks = [
            _rose(
                "best eval loss",
                number(e_old, "best_val_loss"),
                number(e_new, "best_val_loss"),
                m.loss_margin,
            )
        ]
    else:
        checks = []
    return why + [c for c in checks if c]


def judge(record: ScanRecord, baseline: Baseline, m: Margins) -> dict[str, Any]:
    """The ``"baseline"`` entry of one record."""
    plain = record.to_dict()
    old = baseline.find(plain)
    if old is None:
        return {"verdict": None, "regressed": False, "why": ["not in the baseline"]}
    why = regressions(plain, old, m)
    return {"verdict": old["verdict"], "regressed": bool(why), "why": why}


# ---------------------------------------------------------------------------
# The regression gate a scan's records pass through


class Gate:
    """Tags every record with its root and, with --baseline, its comparison."""

    def __init__(
        self,
        roots: list[str],
        *,
        baseline: str | os.PathLike[str] | None = None,
        fail_on_regression: bool = False,
        match: str = "path",
        loss_margin: float = Margins.loss_margin,
    ) -> None:
        self.roots = [_norm(r) for r in roots]
        # The gate itself is counted by the writers' Tally (regression_gate).
        if fail_on_regression and baseline is None:
            raise UsageError("--fail-on-regression needs --baseline FILE")
        if not (isinstance(loss_margin, float) and 0 <= loss_margin < math.inf):
            raise UsageError(f"--loss-margin must be a share >= 0, got {loss_margin}")
        self.margins = Margins(loss_margin=loss_margin)
        self.baseline = (
            Baseline(load_saved_scan(baseline), self.roots, match) if baseline is not None else None
        )
        self._root_of: dict[str, str] = {}

    def record(self, r: ScanRecord, *, fresh: bool = False) -> ScanRecord:
        """`r` tagged: a copy, or with `fresh` (a record of the scan pass that
        nothing else holds yet) `r` itself, tagged in place."""
        root = self._root_of.get(r.store)
        if root is None:
            if len(self._root_of) > 4096:  # a store's records come together
                self._root_of.clear()
            root = self._root_of[r.store] = root_of(r.store, self.roots)
        if fresh and r.root is None:
            r._tag_root(root)
        else:
            r = r.replace(root=root)
        if self.baseline is None:
            return r
        return r.replace(baseline=judge(r, self.baseline, self.margins))

    def batches(
        self, batches: Iterable[list[ScanRecord]], *, fresh: bool = False
    ) -> Iterator[list[ScanRecord]]:
        """Each batch's records tagged. With `fresh`, the batches are the scan
        pass's own, handed over as they are made and held by nothing else (the
        command line's): their records are tagged in place, not copied (a copy
        a record was a tenth of a small store's cost on the main thread)."""
        for batch in batches:
            yield [self.record(r, fresh=fresh) for r in batch]


# ---------------------------------------------------------------------------
# `report --from scan.json`


def records_from_saved(data: list[dict[str, Any]]) -> list[ScanRecord]:
    """Saved records (from :func:`load_saved_scan`) as ScanRecords again."""
    from adapterprobe.probes.result import Verdict

    out = []
    for d in data:
        try:
            verdict = Verdict(d["verdict"])
        except ValueError:
            raise UsageError(f"saved record has an unknown verdict {d['verdict']!r}") from None
        score = d.get("score")
        evidence = d.get("evidence")
        out.append(
            ScanRecord(
                store=str(d["store"]),
                adapter=None if d.get("adapter") is None else str(d["adapter"]),
                layout=str(d.get("layout") or ""),
                probe=str(d["probe"]),
                verdict=verdict,
                score=float(score) if isinstance(score, (int, float)) else None,
                message=str(d.get("message") or ""),
                evidence=evidence if isinstance(evidence, dict) else {},
                checkpoint_kind=d.get("checkpoint_kind"),
                root=d.get("root"),
                baseline=d.get("baseline") if isinstance(d.get("baseline"), dict) else None,
            )
        )
    return out


def report_from_saved(path: str | os.PathLike[str], output: str) -> tuple[Path, Any]:
    """Re-render a saved scan as the HTML report, without its files."""
    from adapterprobe.records import ScanReport

    report = ScanReport(records_from_saved(load_saved_scan(path)), [], {})
    return report.to_html(output), report
