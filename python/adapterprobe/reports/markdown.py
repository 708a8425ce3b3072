"""A scan as a compact Markdown summary, for CI step summaries and PR comments.

GitHub renders it in ``$GITHUB_STEP_SUMMARY`` and in comments: a count
line (records per verdict, stores per rolled-up verdict), a table of the
problems (worst first, capped), the healthy stores as one line, and the
settings the verdicts were made with. :class:`MarkdownSummary` takes records
as they stream past and keeps only what the page shows (the first
``MAX_ROWS`` problems per verdict, a few integers per store), so its memory
does not grow with the records' evidence.

Every string from a scanned tree goes through :func:`adapterprobe.escape.markdown`:
no raw HTML, no control character, no table-breaking pipe reaches the page.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from adapterprobe.escape import markdown as md
from adapterprobe.probes.result import Verdict
from adapterprobe.reports.shaping import (
    clip_middle,
    relative_to,
    store_name,
    tracker_run,
    working_dir,
)
from adapterprobe.tally import Tally

VERDICTS = ("error", "fail", "warn", "skip", "pass")  # worst first
ICONS = {"error": "🟣", "fail": "🔴", "warn": "🟡", "skip": "⚪", "pass": "🟢"}
PROBLEMS = ("error", "fail", "warn")
MAX_ROWS = 50
HEALTHY_NAMES = 20
MESSAGE_CHARS = 200


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _name(store: str, here: str, limit: int) -> str:
    """A store's name (:func:`store_name`) on one line, cut in the middle."""
    return clip_middle(" ".join(store_name(store, here).split()), limit)


def _adapter(adapter: str | None, store: str) -> str:
    """An adapter relative to its store ("-" for a store-wide record)."""
    return relative_to(adapter, store) if adapter else "-"


class _Row(NamedTuple):
    """A record as the summary reads it (a ``ScanRecord`` or a JSON dict)."""

    store: str
    adapter: str | None
    layout: str
    probe: str
    verdict: Verdict
    message: str
    evidence: Any


def _as_record(raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        return raw  # a ScanRecord
    return _Row(
        store=str(raw.get("store") or "(no store)"),
        adapter=raw.get("adapter"),
        layout=str(raw.get("layout") or ""),
        probe=str(raw.get("probe") or ""),
        verdict=Verdict(raw.get("verdict") or "error"),
        message=str(raw.get("message") or ""),
        evidence=raw.get("evidence"),
    )


class MarkdownSummary:
    """Accumulates records (``add``) and renders the summary (``render``)."""

    def __init__(
        self,
        *,
        show: Iterable[str] | None = None,
        fail_on: str = "fail",
        regression_gate: bool = False,
    ) -> None:
        self.fail_on = fail_on
        self.shown = frozenset(show) if show is not None else frozenset(PROBLEMS)
        self.tally = Tally(regression_gate=regression_gate)
        self._rows: list[tuple[int, int, tuple[str, str, str | None, str]]] = []
        self._seen = 0

    def add(self, records: Iterable[Any]) -> None:
        for raw in records:
            r = _as_record(raw)
            self.tally.add(r)
            if r.verdict.value not in self.shown:
                continue
            self._seen += 1
            # Keep the MAX_ROWS worst, first come first: a bounded max-heap on
            # (severity, arrival) with the least wanted row on top.
            key = (r.verdict.severity, -self._seen)
            run = (tracker_run(r) or "").replace("\0", "")  # a tracker's name for it
            row = (r.verdict.value, r.probe, r.adapter, f"{r.store}\0{run}\0{r.message}")
            if len(self._rows) < MAX_ROWS:
                heapq.heappush(self._rows, (*key, row))
            elif key > self._rows[0][:2]:
                heapq.heapreplace(self._rows, (*key, row))

    def render(self, settings: Mapping[str, Any] | None = None) -> str:
        tally = self.tally
        stores = list(tally.per_store)
        here = working_dir()
        lines = ["## adapterprobe scan", ""]
        records = " · ".join(f"{ICONS[v]} {n:,} {v}" for v in VERDICTS if (n := tally.counts[v]))
        by_store = tally.stores_by_verdict()
        store_text = ", ".join(f"{by_store[v]:,} {v}" for v in VERDICTS if by_store[v])
        lines.append(
            f"**{tally.records:,} records from {len(stores):,} stores**: "
            f"{records or 'nothing found'}  \n"
            f"Stores by their worst record (skip only when all skipped): {store_text or 'none'}"
        )
        lines.append("")
        rows = sorted(self._rows, key=lambda item: (-item[0], -item[1]))
        if rows:
            lines += ["| verdict | probe | store | adapter | message |", "|---|---|---|---|---|"]
            for _, _, (verdict, probe, adapter, packed) in rows:
                store, run, message = packed.split("\0", 2)
                name = _name(store, here, 80) + (f" [{run}]" if run else "")
                lines.append(
                    f"| {ICONS[verdict]} {verdict.upper()} | {md(probe)} | "
                    f"{md(name)} | "
                    f"{md(_clip(_adapter(adapter, store), 60))} | "
                    f"{md(_clip(message, MESSAGE_CHARS))} |"
                )
            if self._seen > len(rows):
                more = self._seen - len(rows)
                lines.append(f"\n… and {more:,} more records (see the JSON output).")
            lines.append("")
        if tally.regressed:
            lines += [
                f"**Regressed against the baseline ({tally.regressed:,})**",
                "",
                "| probe | store | adapter | why |",
                "|---|---|---|---|",
            ]
            for reg in tally.regressions:
                lines.append(
                    f"| {md(reg.probe)} | {md(_name(reg.store, here, 80))} | "
                    f"{md(_clip(_adapter(reg.adapter, reg.store), 60))} | "
                    f"{md(_clip('; '.join(reg.why), MESSAGE_CHARS))} |"
                )
            if tally.regressed > len(tally.regressions):
                more = tally.regressed - len(tally.regressions)
                lines.append(f"\n… and {more:,} more (see the JSON output).")
            lines.append("")
        lines += [f"Exit {tally.exit_code(self.fail_on)}: {tally.exit_reason(self.fail_on)}.", ""]
        healthy = sorted(
            s
            for s in stores
            if (v := tally.store_verdict(s)) is not None and v.value not in PROBLEMS
        )
        if healthy:
            names = ", ".join(md(_name(s, here, 60)) for s in healthy[:HEALTHY_NAMES])
            rest = (
                f" and {len(healthy) - HEALTHY_NAMES:,} more"
                if len(healthy) > HEALTHY_NAMES
                else ""
            )
            lines += [f"**Healthy stores ({len(healthy):,})**: {names}{rest}", ""]
        if settings:
            lines += _settings_lines(settings)
        return "\n".join(lines)


def _healthy(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.value not in PROBLEMS


def _settings_lines(settings: Mapping[str, Any]) -> list[str]:
    flat = []
    for key, value in settings.items():
        if isinstance(value, Mapping):
            inner = ", ".join(f"{k}={v}" for k, v in value.items())
            flat.append(f"{key}: {inner}")
        elif isinstance(value, list):
            flat.append(f"{key}: {', '.join(map(str, value))}")
        else:
            flat.append(f"{key} = {value}")
    lines = ["<details><summary>Settings</summary>", ""]
    lines += [f"- {md(_clip(item, 400))}" for item in flat]
    return [*lines, "", "</details>", ""]


def render_markdown(
    records: Iterable[Any],
    *,
    settings: Mapping[str, Any] | None = None,
    show: Iterable[str] | None = None,
) -> str:
    """The Markdown summary of records (``ScanRecord`` objects or their
    ``to_dict()`` dicts): all counted, the verdicts in ``show`` (default:
    warn, fail, error) tabled."""
    summary = MarkdownSummary(show=show)
    summary.add(records)
    return summary.render(settings)
