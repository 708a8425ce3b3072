"""A scan as a compact Markdown summary, for CI step summaries and PR comments.

GitHub renders it in ``$GITHUB_STEP_SUMMARY`` and in comments: a verdict
count line, a table of the problems (worst first, capped), the healthy
stores as one line, and the settings the verdicts were made with.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

VERDICTS = ("error", "fail", "warn", "skip", "pass")  # worst first
ICONS = {"error": "🟣", "fail": "🔴", "warn": "🟡", "skip": "⚪", "pass": "🟢"}
PROBLEMS = ("error", "fail", "warn")
MAX_ROWS = 50
MESSAGE_CHARS = 200


def _cell(text: str, limit: int = MESSAGE_CHARS) -> str:
    """Table-safe text: pipes escaped, newlines folded, clipped."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def _short(path: str | None, base: str) -> str:
    if not path:
        return "-"
    try:
        rel = os.path.relpath(path, base)
    except ValueError:
        return path
    return os.path.basename(path) if rel in (".", "") or rel.startswith("..") else rel


def render_markdown(
    records: Iterable[Mapping[str, Any]],
    *,
    settings: Mapping[str, Any] | None = None,
    show: Iterable[str] | None = None,
) -> str:
    """The Markdown summary of ``ScanRecord.to_dict()``-shaped records: all
    counted, the verdicts in ``show`` (default: warn, fail, error) tabled."""
    shown = frozenset(show) if show is not None else frozenset(PROBLEMS)
    rows = list(records)
    counts = Counter(r["verdict"] for r in rows)
    stores = sorted({r["store"] for r in rows})
    base = os.path.commonpath(stores) if stores else ""
    if len(stores) > 1 and base in stores:
        base = os.path.dirname(base)
    worst_by_store: dict[str, str] = {}
    for r in rows:
        current = worst_by_store.get(r["store"], "pass")
        if VERDICTS.index(r["verdict"]) < VERDICTS.index(current):
            worst_by_store[r["store"]] = r["verdict"]
        else:
            worst_by_store.setdefault(r["store"], current)
    lines = ["## adapterprobe scan", ""]
    summary = " · ".join(f"{ICONS[v]} {counts[v]} {v}" for v in VERDICTS if counts[v])
    lines.append(f"**{len(rows)} records from {len(stores)} stores**: {summary or 'nothing found'}")
    lines.append("")
    problems = sorted(
        (r for r in rows if r["verdict"] in shown),
        key=lambda r: (VERDICTS.index(r["verdict"]), r["store"], r.get("adapter") or ""),
    )
    if problems:
        lines += ["| verdict | probe | store | adapter | message |", "|---|---|---|---|---|"]
        for r in problems[:MAX_ROWS]:
            lines.append(
                f"| {ICONS[r['verdict']]} {r['verdict'].upper()} | {r['probe']} | "
                f"{_cell(_short(r['store'], base), 80)} | "
                f"{_cell(_short(r.get('adapter'), r['store']), 60)} | {_cell(r['message'])} |"
            )
        if len(problems) > MAX_ROWS:
            more = len(problems) - MAX_ROWS
            lines.append(f"\n… and {more} more records (see the JSON output).")
        lines.append("")
    healthy = [s for s, v in worst_by_store.items() if v not in PROBLEMS]
    if healthy:
        names = ", ".join(_cell(_short(s, base), 60) for s in sorted(healthy)[:20])
        rest = f" and {len(healthy) - 20} more" if len(healthy) > 20 else ""
        lines += [f"**Healthy stores ({len(healthy)})**: {names}{rest}", ""]
    if settings:
        flat = []
        for key, value in settings.items():
            if isinstance(value, Mapping):
                inner = ", ".join(f"{k}={v}" for k, v in value.items())
                flat.append(f"`{key}`: {inner}")
            elif isinstance(value, list):
                flat.append(f"`{key}`: {', '.join(map(str, value))}")
            else:
                flat.append(f"`{key}` = {value}")
        lines += ["<details><summary>Settings</summary>", ""]
        lines += [f"- {_cell(item, 400)}" for item in flat]
        lines += ["", "</details>", ""]
    return "\n".join(lines)
