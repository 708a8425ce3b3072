"""A scan as one self-contained HTML page.

People take in a picture faster than JSON, so this turns scan records (the
``ScanRecord.to_dict()`` shape) into a single file: inline CSS, inline SVG
plots and a few lines of vanilla JS for filtering and paging. Nothing is
loaded from the network (a Content-Security-Policy forbids it), everything
that came from the scanned files is escaped, and the size stays bounded for
scans of many thousands of stores: only the worst stores get plots, curves
are downsampled, the rest become table rows.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adapterprobe._evidence import number
from adapterprobe._fs import atomic_output, resolve_output
from adapterprobe.reports.probe_charts import (
    DRAWN,
    OVERLAY_RUNS,
    ghost_chart,
    grad_norm_figure,
    layer_grad_figure,
    loss_figure,
    loss_points,
    overlay_figure,
    weights_chart,
)
from adapterprobe.reports.probe_charts import MAX_POINTS as MAX_POINTS  # re-exported
from adapterprobe.reports.shaping import SEVERITY as SEVERITY  # re-exported
from adapterprobe.reports.shaping import (
    VERDICTS,
    Record,
    Store,
    StoreCollector,
    adapter_name,
    as_finite,
    badness,
    clip_middle,
    common_base,
    flatten,
    ghost_ratio,
    group_stores,
    natural_key,
)
from adapterprobe.reports.svg import MAX_BARS as MAX_BARS  # re-exported
from adapterprobe.reports.svg import PALETTE, clip, esc, num

__all__ = [
    "PLOT_LIMIT",
    "VERDICTS",
    "render_html",
    "render_stores",
    "write_html",
    "write_streamed_html",
]

_esc = esc  # the tests read the escaper here by its old private name

PROBLEM = SEVERITY["warn"]  # a store with any record this bad is shown in detail

PLOT_LIMIT = 200  # stores drawn with plots; the rest are table rows
PAGE_ROWS = 100  # rows per page of a compact table (JS paging)
MAX_ROWS = 40  # verdict rows shown per detailed store (--all-versions can make many)
MAX_FIGURES = 12  # charts per detailed store
MESSAGE_CHARS = 4000  # a detailed message is clipped here
ROW_MESSAGE_CHARS = 240  # a compact row's message is clipped here


# ---------------------------------------------------------------------------
# Small HTML pieces. The public ones (badge, facts_line, store_card,
# compact_table, summary_section) are shared with the notebook display.


def badge(verdict: str, label: str | None = None) -> str:
    """A verdict's coloured badge, labelled with ``label`` or the verdict."""
    return f'<b class="v v-{verdict}">{esc(label or verdict)}</b>'


def _count_text(counts: Mapping[str, int]) -> str:
    return " · ".join(f"{n:,} {v}" for v, n in counts.items() if n)


def run_line(evidence: Mapping[str, Any]) -> str:
    """What the run was (``run_facts_text``: how it ended, what it optimised,
    where each was read), so a verdict is read knowing the run."""
    text = evidence.get("run_facts_text")
    if not isinstance(text, str) or not text:
        return ""
    return f'<div class="facts">run: {esc(clip(text, 300))}</div>'


def facts_line(evidence: Mapping[str, Any], limit: int = 8) -> str:
    """The scalar evidence as one short line, so numbers behind a verdict show."""
    parts = []
    for key, value in evidence.items():
        if key in DRAWN or value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            f = as_finite(value)
            text = "non-finite" if f is None else num(f)
        elif isinstance(value, str):
            text = clip(value, 60)
        else:
            continue
        parts.append(f"<span>{esc(key)} <b>{esc(text)}</b></span>")
        if len(parts) == limit:
            break
    return f'<div class="facts">{"".join(parts)}</div>' if parts else ""


# ---------------------------------------------------------------------------
# A store's charts


def _adapter_figures(store: Store, ratio: float, room: int) -> tuple[list[str], int]:
    """Charts of the per-adapter records, worst first, at most `room` of them;
    also how many more there were."""
    figures: list[str] = []
    skipped = 0
    per_adapter = [r for r in store.records if r.adapter is not None]
    per_adapter.sort(key=lambda r: (-r.severity, natural_key(adapter_name(r)), r.probe))
    for j, rec in enumerate(per_adapter):
        uid = f"s{store.index}-a{j}"
        if rec.probe == "gradient_ghost":
            body = ghost_chart(rec, uid, ratio)
        elif rec.probe == "adapter_weights":
            body = weights_chart(rec, uid)
        else:
            body = ""
        if not body:
            continue
        if len(figures) >= room:
            skipped += 1
            continue
        step = number(rec.evidence, "global_step")
        extra = f" · global_step {num(step)}" if step is not None else ""
        figures.append(
            f'<figure class="plot">{body}<figcaption>{badge(rec.verdict, rec.label)} '
            f"<b>{esc(rec.probe)}</b> · {esc(adapter_name(rec))}{extra}</figcaption></figure>"
        )
    return figures, skipped


# ---------------------------------------------------------------------------
# Stores


def _reasons(store: Store) -> str:
    rows = []
    for r in store.records[:MAX_ROWS]:
        score = "—" if r.score is None else f"{r.score:.2f}"
        rows.append(
            f'<tr data-v="{r.verdict}"><td class="c-v">{badge(r.verdict, r.label)}</td>'
            f'<td class="c-p">{esc(r.probe)}</td>'
            f'<td class="c-a{" none" if r.adapter is None else ""}">{esc(adapter_name(r))}</td>'
            f'<td class="c-s">{score}</td><td class="c-m">'
            f"{esc(clip(r.message, MESSAGE_CHARS)) or '<i>no message</i>'}"
            f"{run_line(r.evidence)}{facts_line(r.evidence)}</td></tr>"
        )
    rest = store.records[MAX_ROWS:]
    if rest:
        counts = dict.fromkeys(VERDICTS, 0)
        for r in rest:
            counts[r.verdict] += 1
        present = " ".join(v for v in VERDICTS if counts[v])
        rows.append(
            f'<tr data-v="{present}"><td class="c-more" colspan="5">and {len(rest):,} more '
            f"records, not listed: {esc(_count_text(counts))}</td></tr>"
        )
    return (
        f'<table class="reasons"><caption class="sr">Verdicts for {esc(store.name)}</caption>'
        '<thead><tr><th scope="col">verdict</th><th scope="col">probe</th>'
        '<th scope="col">adapter</th><th scope="col">score</th><th scope="col">message</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _run_text(store: Store) -> str:
    """A W&B or MLflow run's name in its tracker, beside the store's path (its id)."""
    return f' <span class="muted">[{esc(store.run)}]</span>' if store.run else ""


def _store_title(store: Store) -> str:
    worst = VERDICTS[len(VERDICTS) - 1 - store.worst]
    layout = store.layout
    tag = f' <span class="tag">{esc(layout)}</span>' if layout else ""
    return (
        f'{badge(worst)} <span class="name">{esc(store.name)}</span>{_run_text(store)}{tag}'
        f' <span class="muted">{esc(_count_text(store.counts()))}</span>'
    )


def _store_body(store: Store, ratio: float, plots: bool) -> str:
    parts = [f'<p class="path">{esc(store.path)}</p>', _reasons(store)]
    if plots:
        figures = []
        drift = [r for r in store.records if r.probe == "training_drift"]
        for j, rec in enumerate(drift[:MAX_FIGURES]):
            fig = loss_figure(rec, f"s{store.index}-c{j}", store.name)
            if fig:
                figures.append(fig)
            grad = grad_norm_figure(rec, f"s{store.index}-g{j}", store.name)
            if grad:
                figures.append(grad)
        for j, rec in enumerate(r for r in store.records if r.probe == "gap_monitor"):
            fig = layer_grad_figure(rec, f"s{store.index}-l{j}", store.name)
            if fig:
                figures.append(fig)
        more, skipped = _adapter_figures(store, ratio, MAX_FIGURES - len(figures))
        figures += more
        if figures:
            parts.append(f'<div class="plots">{"".join(figures)}</div>')
        if skipped:
            parts.append(f'<p class="note">{skipped:,} more adapter charts are not drawn.</p>')
    return "".join(parts)


def store_card(store: Store, ratio: float) -> str:
    """A problem store in full: title, reasons, verdict rows and its charts."""
    sid = f"s{store.index}"
    return (
        f'<article class="store card" id="{sid}" data-store data-v="{" ".join(store.verdicts)}" '
        f'aria-labelledby="{sid}-h"><h3 id="{sid}-h">{_store_title(store)}</h3>'
        f"{_store_body(store, ratio, plots=True)}</article>"
    )


def _store_fold(store: Store, ratio: float) -> str:
    sid = f"s{store.index}"
    return (
        f'<details class="store fold" id="{sid}" data-store data-v="{" ".join(store.verdicts)}">'
        f"<summary><h3>{_store_title(store)}</h3></summary>"
        f'<div class="fold-body">{_store_body(store, ratio, plots=True)}</div></details>'
    )


def compact_table(stores: list[Store], caption: str) -> str:
    """One row per store, no plots: how big scans stay small and fast."""
    rows = []
    for s in stores:
        worst = s.records[0]
        tag = f' <span class="tag">{esc(s.layout)}</span>' if s.layout else ""
        counts = " ".join(f'<b class="v v-{v}">{n} {v}</b>' for v, n in s.counts().items() if n)
        message = esc(clip(worst.message, ROW_MESSAGE_CHARS))
        rows.append(
            f'<tr id="s{s.index}" data-store data-v="{" ".join(s.verdicts)}">'
            f'<td class="c-n">{esc(s.name)}{_run_text(s)}{tag}</td><td class="c-c">{counts}</td>'
            f'<td class="c-m"><span class="probe">{esc(worst.probe)}</span> {message}</td></tr>'
        )
    return (
        f'<div class="scroll"><table class="compact paged"><caption>{esc(caption)}</caption>'
        '<thead><tr><th scope="col">store</th><th scope="col">records</th>'
        '<th scope="col">worst finding</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


# ---------------------------------------------------------------------------
# Summary


def _settings_html(settings: Mapping[str, Any] | None) -> str:
    rows = "".join(
        f'<tr><th scope="row">{esc(k)}</th><td>{esc(clip(v, 500))}</td></tr>'
        for k, v in (flatten(settings) if settings else ())
    )
    body = (
        f'<table class="kv"><caption class="sr">Settings</caption>{rows}</table>'
        if rows
        else "<p>No settings were recorded with this report.</p>"
    )
    return f'<details class="settings"><summary>Settings used</summary>{body}</details>'


def summary_section(stores: list[Store], settings: Mapping[str, Any] | None, when: str) -> str:
    """The page's head: stores per verdict, the filter and the settings used."""
    # The cards count stores by their roll-up (a store's worst record, skip
    # only when every record skipped); record counts are said as such, so the
    # two are never mixed in one figure.
    counts = dict.fromkeys(VERDICTS, 0)
    store_counts = dict.fromkeys(VERDICTS, 0)
    for s in stores:
        for v, n in s.counts().items():
            counts[v] += n
        store_counts[VERDICTS[len(VERDICTS) - 1 - s.worst]] += 1
    total = sum(counts.values())
    cards = []
    for v in VERDICTS:
        zero = " zero" if not store_counts[v] else ""
        cards.append(
            f'<li class="count v-{v}{zero}"><span class="n">{store_counts[v]:,}</span>'
            f'<span class="lab">{v}</span><span class="sub">'
            f"store{'s' if store_counts[v] != 1 else ''}</span></li>"
        )
    ratio_bar = "".join(
        f'<span class="v-{v}" style="flex:{store_counts[v]}" title="{store_counts[v]:,} '
        f'{v} stores"></span>'
        for v in VERDICTS
        if store_counts[v]
    )
    boxes = "".join(
        f'<label class="f v-{v}"><input type="checkbox" value="{v}" checked> {v}</label>'
        for v in VERDICTS
    )
    return (
        '<section id="summary" aria-labelledby="summary-h"><h2 id="summary-h">Summary</h2>'
        f'<p class="meta">{len(stores):,} stores, {total:,} records '
        f"(records: {esc(_count_text(counts)) or 'none'}) · generated {when}</p>"
        '<ul class="counts" aria-label="stores per verdict, worst first (a store counts '
        'as its worst record; skip only when every record skipped)">'
        f"{''.join(cards)}</ul>"
        f'<div class="ratio" aria-hidden="true">{ratio_bar}</div>'
        '<form id="filter" class="filter" hidden><fieldset><legend>Show stores with</legend>'
        f'{boxes}</fieldset><p id="shown" aria-live="polite"></p></form>'
        f"{_settings_html(settings)}</section>"
    )


# ---------------------------------------------------------------------------
# The runs' loss curves on one chart

OVERLAY_ID = "ov"  # the chart's id; run i's checkbox is "ov-i", its path has class "ov-i"
JUDGED = ("fail", "warn", "pass")  # a training_drift record with a curve to draw


def _is_run(store: Store) -> bool:
    """Whether the store is a training run: its training loss was judged (a
    store without logs has a skipped training_drift record, or none)."""
    return any(r.probe == "training_drift" and r.verdict in JUDGED for r in store.records)


def _drift_curve(store: Store) -> tuple[Record, list[tuple[float, float | None]]] | None:
    """The store's loss curve: its worst judged training_drift record with a
    finite loss value, and that curve; None when it has none."""
    for rec in store.records:
        if rec.probe == "training_drift" and rec.verdict in JUDGED:
            points = loss_points(rec)
            if any(y is not None for _, y in points):
                return rec, points
    return None


#: Curves of the overlay kept for healthy runs (a store with every record
#: passed or skipped), beside the runs needing attention: the worst runs
#: alone leave nothing to compare them with.
OVERLAY_HEALTHY = 3


def _healthy_run(store: Store) -> bool:
    """A store the overlay may draw as a healthy run: no warn or worse, and
    a judged loss curve with a finite value."""
    return store.worst < PROBLEM and _drift_curve(store) is not None


def overlay_section(stores: list[Store], plotted: list[Store], healthy: list[Store]) -> str:
    """The training loss of the runs (stores whose training_drift record
    judged a loss curve) overlaid on one chart, with a picker that needs no
    script (a checkbox per run; CSS hides the line of an unchecked one);
    empty for fewer than two runs.

    At most OVERLAY_RUNS curves are drawn: the runs needing attention among
    `plotted` (the stores the page draws charts for, in the page's order:
    their evidence is kept and read anyway), worst first, and beside them at
    least OVERLAY_HEALTHY healthy runs where there are any, taken from
    `healthy` (the healthy stores in the page's order). Of the healthy stores
    the page draws no charts for, the evidence of at most OVERLAY_HEALTHY runs
    is read (a streamed page keeps theirs: :class:`StoreCollector`'s
    ``healthy``). No curve is drawn when the page draws no charts. A line says
    how many runs were left out and by which rule."""
    runs = sum(1 for s in stores if _is_run(s))
    if runs < 2:
        return ""
    no_curve = 0
    # Healthy runs first: as many as the chart holds from the stores drawn
    # with charts, at most OVERLAY_HEALTHY from the others.
    charted = {id(s) for s in plotted}
    well: list[tuple[Store, Record, list[tuple[float, float | None]]]] = []
    for store in healthy if plotted else []:
        if len(well) == OVERLAY_RUNS or (id(store) not in charted and len(well) >= OVERLAY_HEALTHY):
            break
        found = _drift_curve(store)
        if found is not None:
            well.append((store, *found))
        elif _is_run(store):
            no_curve += 1
    room = OVERLAY_RUNS - min(len(well), OVERLAY_HEALTHY)
    worst: list[tuple[Store, Record, list[tuple[float, float | None]]]] = []
    for store in plotted:
        if len(worst) == room:
            break
        if store.worst < PROBLEM:
            continue
        found = _drift_curve(store)
        if found is not None:
            worst.append((store, *found))
        elif _is_run(store):
            no_curve += 1
    picked = worst + well[: OVERLAY_RUNS - len(worst)]
    figure = overlay_figure([(s.name, points) for s, _, points in picked], OVERLAY_ID)
    out = [
        '<section id="overlay" aria-labelledby="overlay-h">'
        f'<h2 id="overlay-h">Training loss of the runs ({runs:,})</h2>'
    ]
    if figure:
        boxes = "".join(
            f'<input class="sr" type="checkbox" id="{OVERLAY_ID}-{i}" checked>'
            for i in range(len(picked))
        )
        keys = "".join(
            f'<label for="{OVERLAY_ID}-{i}" style="--c:{PALETTE[i % len(PALETTE)]}" '
            f'title="{esc(store.name)}">{esc(clip_middle(store.name, 100))} '
            f"{badge(rec.verdict, rec.label)}</label>"
            for i, (store, rec, _) in enumerate(picked)
        )
        out.append(
            f'<form class="ov" aria-label="training loss of the runs">{boxes}{figure}'
            '<fieldset class="ov-pick"><legend>Runs drawn (uncheck to hide a line)</legend>'
            f'{keys}<button type="reset">Show all</button></fieldset></form>'
        )
    else:
        out.append('<p class="note">No loss curve is drawn.</p>')
    left = runs - len(picked)
    if left:
        scope = (
            f" (runs needing attention among the {len(plotted):,} stores drawn with charts)"
            if len(plotted) < len(stores)
            else ""
        )
        missing = f"; {no_curve:,} of the runs looked at had no finite loss" if no_curve else ""
        out.append(
            f'<p class="note ov-out">{len(picked):,} of {runs:,} runs drawn, {left:,} left out: '
            f"at most {OVERLAY_RUNS} curves are drawn, the runs needing attention in the order "
            f"of the stores below, worst first{scope}, and beside them at least "
            f"{OVERLAY_HEALTHY} healthy runs where there are any{missing}.</p>"
        )
    out.append("</section>")
    return "".join(out)


def _overlay_css() -> str:
    """Per run of the overlay: an unchecked box hides its line and strikes out
    its key; a focused box rings its key (the box itself is visually hidden)."""
    rules = []
    for i in range(OVERLAY_RUNS):
        box, key = f"#{OVERLAY_ID}-{i}", f'.ov-pick label[for="{OVERLAY_ID}-{i}"]'
        rules.append(
            f"{box}:not(:checked)~.ov-fig .{OVERLAY_ID}-{i}{{display:none}}"
            f"{box}:not(:checked)~{key}{{color:var(--muted);text-decoration:line-through}}"
            f"{box}:not(:checked)~{key}:before{{background:none}}"
            f"{box}:focus-visible~{key}{{outline:2px solid var(--loss);outline-offset:1px}}"
        )
    return "\n".join(rules)


# ---------------------------------------------------------------------------
# The page

CSS = """
:root{--error:#7b2cbf;--fail:#c62828;--warn:#b45309;--skip:#64748b;--pass:#2e7d32;
--ink:#1b1f24;--muted:#5b6470;--line:#d9dee4;--bg:#f4f6f8;--card:#fff;--loss:#1f5f99;
color-scheme:light}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
header.top{background:#1f2a37;color:#fff;padding:18px 24px}
header.top h1{margin:0;font-size:1.45rem;overflow-wrap:anywhere}
header.top p{margin:4px 0 0;color:#cdd5df;font-size:.9rem;overflow-wrap:anywhere}
main{max-width:1220px;margin:0 auto;padding:12px 24px 40px}
h2{font-size:1.2rem;margin:22px 0 10px;border-bottom:2px solid var(--line);padding-bottom:4px}
h3{font-size:1.02rem;margin:0 0 4px;overflow-wrap:anywhere}
.meta,.muted,.path,.note{color:var(--muted)}
.muted{font-weight:400;font-size:.85rem}
.path{font:12px/1.3 ui-monospace,"DejaVu Sans Mono",monospace;margin:0 0 8px;overflow-wrap:anywhere}
.v-error{--c:var(--error)}.v-fail{--c:var(--fail)}.v-warn{--c:var(--warn)}
.v-skip{--c:var(--skip)}.v-pass{--c:var(--pass)}
b.v{display:inline-block;background:var(--c);color:#fff;border-radius:9px;padding:0 7px;
font-size:.72rem;font-weight:700;line-height:1.45rem;letter-spacing:.03em;
text-transform:uppercase;white-space:nowrap;vertical-align:1px}
.counts{display:flex;flex-wrap:wrap;gap:10px;list-style:none;padding:0;margin:12px 0}
.count{flex:1 1 120px;background:var(--card);border:1px solid var(--line);
border-top:6px solid var(--c);border-radius:6px;padding:6px 12px;display:grid;
grid-template-columns:auto 1fr;grid-template-areas:"n lab" "sub sub";column-gap:8px;
align-items:baseline}
.count .n{grid-area:n}.count .lab{grid-area:lab}.count .sub{grid-area:sub}
.count .n{font-size:1.9rem;font-weight:700;color:var(--c);line-height:1.1}
.count .lab{font-weight:700;text-transform:uppercase;font-size:.8rem;letter-spacing:.05em}
.count .sub{color:var(--muted);font-size:.8rem}
.count.zero{opacity:.55}.count.zero .n{color:var(--muted)}
.ratio{display:flex;height:12px;border-radius:6px;overflow:hidden;margin:6px 0 10px;
background:var(--line)}
.ratio span{background:var(--c);min-width:3px}
.filter fieldset{border:1px solid var(--line);border-radius:6px;background:var(--card);
display:flex;flex-wrap:wrap;gap:6px 16px;padding:6px 12px}
.filter legend{font-weight:600;font-size:.9rem}
.filter label{white-space:nowrap;cursor:pointer;border-left:5px solid var(--c);padding-left:6px}
.filter p{margin:4px 0;color:var(--muted);font-size:.85rem}
details>summary{cursor:pointer}
.settings{margin:10px 0}
.settings summary{font-weight:600}
table{border-collapse:collapse}
.kv{margin:6px 0;font-size:.85rem;background:var(--card)}
.kv th,.kv td{border:1px solid var(--line);padding:2px 8px;text-align:left;
font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-weight:400}
.card,.fold{background:var(--card);border:1px solid var(--line);border-left:6px solid var(--c);
border-radius:6px;padding:12px 14px;margin:0 0 14px}
.store[data-v^="error"]{--c:var(--error)}.store[data-v^="fail"]{--c:var(--fail)}
.store[data-v^="warn"]{--c:var(--warn)}.store[data-v^="skip"]{--c:var(--skip)}
.store[data-v^="pass"]{--c:var(--pass)}
.fold{padding:6px 12px;margin-bottom:6px}
.fold summary h3{display:inline;font-size:.95rem}
.fold-body{padding-top:8px}
.tag{font-size:.72rem;border:1px solid var(--line);border-radius:4px;padding:0 5px;
color:var(--muted);font-weight:400;white-space:nowrap}
.reasons{width:100%;font-size:.88rem}
.reasons th{text-align:left;font-size:.75rem;color:var(--muted);font-weight:600;
border-bottom:1px solid var(--line);padding:2px 6px}
.reasons td{border-bottom:1px solid var(--line);padding:5px 6px;vertical-align:top}
.reasons tr:last-child td{border-bottom:0}
.c-p,.c-a{white-space:nowrap;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.8rem}
.c-s{text-align:right;font-variant-numeric:tabular-nums}
.c-m{overflow-wrap:anywhere}
.c-more{color:var(--muted);font-style:italic;grid-column:1/-1}
.facts{display:flex;flex-wrap:wrap;gap:2px 12px;font-size:.76rem;color:var(--muted);margin-top:2px}
.facts b{color:var(--ink);font-weight:600}
.plots{display:flex;flex-wrap:wrap;gap:12px;margin-top:10px;align-items:flex-start}
.plot{margin:0;flex:1 1 260px;max-width:420px;border:1px solid var(--line);border-radius:6px;
padding:6px;background:#fcfdfe}
.plot.wide{flex:2 1 420px;max-width:680px}
.plot figcaption{font-size:.8rem;color:var(--muted);overflow-wrap:anywhere}
.plot .ptitle{margin:0 0 2px;font-size:.82rem;font-weight:600;color:var(--ink)}
.chart{display:block;width:100%;height:auto}
.chart text{font:11px system-ui,"DejaVu Sans",sans-serif;fill:#4a5561}
.chart .yt{text-anchor:end}.chart .xt,.chart .xl{text-anchor:middle}
.chart .yl{text-anchor:middle}
.chart .lt{text-anchor:end;fill:var(--fail);paint-order:stroke;stroke:#fff;stroke-width:3px}
.chart .axis{fill:none;stroke:#8a949e}.chart .grid{fill:none;stroke:#e7ebef}
.chart .loss{fill:none;stroke:var(--loss);stroke-width:1.8;stroke-linejoin:round;
stroke-linecap:round}
.chart .trend{fill:none;stroke:#6b7280;stroke-width:1.4;stroke-dasharray:5 4}
.chart .eval{fill:none;stroke:#b45309;stroke-width:1.6}.chart .evalpts{fill:#b45309}
.chart .grad{fill:none;stroke:#4d7c0f;stroke-width:1.5;stroke-linejoin:round}
.chart .layer{fill:none;stroke:#9ca3af;stroke-width:1;stroke-linejoin:round;opacity:.8}
.chart .layer.hot{stroke:#b91c1c;stroke-width:2;opacity:1}
.chart .spike{fill:var(--fail);stroke:#fff;stroke-width:1.5}
.chart .nan rect{fill:var(--error);opacity:.16}.chart .nan-tick{fill:var(--error)}
.bars rect{fill:#7c93ab}.bars rect.flag{fill:var(--fail)}
.chart .limit{stroke:var(--fail);stroke-dasharray:4 3;fill:none}
.key{white-space:nowrap;margin-right:10px}
.key:before{content:"";display:inline-block;width:16px;height:0;vertical-align:middle;
margin-right:4px;border-top:2px solid var(--loss)}
.k-trend:before{border-top:2px dashed #6b7280}
.k-eval:before{border-top:2px solid #b45309}.k-grad:before{border-top:2px solid #4d7c0f}
.k-spike:before{width:9px;height:9px;border:0;border-radius:50%;background:var(--fail)}
.k-nan:before{width:6px;height:12px;border:0;background:var(--error);opacity:.5}
.ov{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start;position:relative}
.ov .ov-fig{flex:3 1 460px;max-width:820px}
.ov-pick{flex:1 1 220px;min-width:0;margin:0;border:1px solid var(--line);border-radius:6px;
background:var(--card);padding:6px 10px}
.ov-pick legend{font-weight:600;font-size:.85rem}
.ov-pick label{display:block;cursor:pointer;font-size:.82rem;padding:2px 0;overflow-wrap:anywhere}
.ov-pick label:before{content:"";display:inline-block;width:11px;height:11px;margin-right:6px;
border:2px solid var(--c);border-radius:3px;background:var(--c);vertical-align:-1px}
.ov-pick button{font:inherit;font-size:.8rem;margin-top:6px;padding:2px 10px;
border:1px solid #9aa5b1;border-radius:5px;background:var(--card);color:var(--ink);cursor:pointer}
.ov-out{font-size:.85rem}
.mods{font-size:.8rem;width:100%;margin-top:4px}
.mods caption{text-align:left;font-weight:600;color:var(--muted)}
.mods th{text-align:left;color:var(--muted);font-weight:600}
.mods td{padding:1px 4px;border-top:1px solid var(--line)}
.mod{font-family:ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:break-word}
.share{white-space:nowrap;position:relative;width:30%}
.sbar{display:inline-block;height:8px;background:#7c93ab;margin-right:4px;vertical-align:middle}
.dead{font-size:.8rem;margin:4px 0;overflow-wrap:anywhere}
.scroll{overflow-x:auto}
.compact{width:100%;font-size:.84rem;background:var(--card);border:1px solid var(--line)}
.compact caption{text-align:left;font-weight:600;padding:4px 0}
.compact th{text-align:left;background:#eef1f4;padding:4px 8px;font-size:.78rem}
.compact td{border-top:1px solid var(--line);padding:4px 8px;vertical-align:top}
.compact .c-n{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.8rem;
overflow-wrap:anywhere;border-left:5px solid var(--c)}
.compact tr[data-v^="error"]{--c:var(--error)}.compact tr[data-v^="fail"]{--c:var(--fail)}
.compact tr[data-v^="warn"]{--c:var(--warn)}.compact tr[data-v^="skip"]{--c:var(--skip)}
.compact tr[data-v^="pass"]{--c:var(--pass)}
.compact .c-c{white-space:nowrap}
.probe{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.76rem;color:var(--muted)}
.more{margin-top:8px}.more>summary{font-weight:600}
.pager{display:flex;gap:10px;align-items:center;margin:6px 0;font-size:.85rem}
.pager button{font:inherit;padding:3px 12px;border:1px solid #9aa5b1;border-radius:5px;
background:var(--card);color:var(--ink);cursor:pointer}
.pager button:disabled{color:#9aa5b1;cursor:default}
.filtered,.off-page{display:none!important}
.sr{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}
footer{color:var(--muted);font-size:.8rem;text-align:center;padding:10px}
OVERLAY_CSS
@media (max-width:640px){
header.top{padding:14px}main{padding:8px 10px 30px}
.counts{display:grid;grid-template-columns:repeat(5,1fr);gap:6px}
.count{padding:4px 6px;display:flex;flex-direction:column;min-width:0}
.count .n{font-size:1.1rem;overflow-wrap:anywhere}.count .lab{font-size:.68rem;letter-spacing:0}
.count .sub{display:none}
.card{padding:10px}
.reasons thead{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}
.reasons tr{display:grid;grid-template-columns:auto 1fr auto;gap:2px 8px;
grid-template-areas:"v p s" "a a a" "m m m";border-bottom:1px solid var(--line);padding:6px 0}
.reasons td{border:0;padding:0}
.reasons .c-v{grid-area:v}.reasons .c-p{grid-area:p}.reasons .c-s{grid-area:s}
.reasons .c-a{grid-area:a}.reasons .c-m{grid-area:m}.reasons .c-a.none{display:none}
.chart.curve text,.chart.overlay text{font-size:15px}
.plot,.plot.wide{flex-basis:100%;max-width:none}
.compact thead{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}
.compact tr{display:grid;grid-template-columns:1fr auto}
.compact td{border:0}.compact tr{border-top:1px solid var(--line);border-left:5px solid var(--c)}
.compact .c-n{border-left:0}
.compact .c-m{grid-column:1/-1;padding-top:0}
}
""".replace("OVERLAY_CSS", _overlay_css())

JS = """
(function () {
  "use strict";
  var form = document.getElementById("filter");
  if (!form) return;
  form.hidden = false;
  var boxes = form.querySelectorAll("input[type=checkbox]");
  var items = document.querySelectorAll("[data-v]");
  var status = document.getElementById("shown");
  var pagers = [];
  function pager(table) {
    var rows = table.tBodies[0].rows, size = PAGE_ROWS, page = 0;
    var nav = document.createElement("nav"), info = document.createElement("span");
    var prev = document.createElement("button"), next = document.createElement("button");
    prev.type = next.type = "button";
    prev.textContent = "\\u2039 previous";
    next.textContent = "next \\u203a";
    nav.className = "pager";
    nav.setAttribute("aria-label", "pages of " + table.caption.textContent);
    nav.appendChild(prev);
    nav.appendChild(info);
    nav.appendChild(next);
    var holder = table.parentNode;
    holder.parentNode.insertBefore(nav, holder.nextSibling);
    function show(p) {
      var vis = [], i;
      for (i = 0; i < rows.length; i++) {
        rows[i].classList.remove("off-page");
        if (!rows[i].classList.contains("filtered")) vis.push(rows[i]);
      }
      var pages = Math.max(1, Math.ceil(vis.length / size));
      page = Math.min(Math.max(p, 0), pages - 1);
      for (i = 0; i < vis.length; i++) {
        if (i < page * size || i >= (page + 1) * size) vis[i].classList.add("off-page");
      }
      info.textContent = vis.length ? "rows " + (page * size + 1) + "\\u2013" +
        Math.min(vis.length, (page + 1) * size) + " of " + vis.length : "no rows";
      prev.disabled = page === 0;
      next.disabled = page >= pages - 1;
      nav.hidden = pages <= 1;
    }
    prev.addEventListener("click", function () { show(page - 1); });
    next.addEventListener("click", function () { show(page + 1); });
    return show;
  }
  function apply() {
    var want = {}, shown = 0, total = 0, i, j;
    for (i = 0; i < boxes.length; i++) if (boxes[i].checked) want[boxes[i].value] = true;
    for (i = 0; i < items.length; i++) {
      var el = items[i], vs = el.getAttribute("data-v").split(" "), ok = false;
      for (j = 0; j < vs.length; j++) if (want[vs[j]]) { ok = true; break; }
      el.classList.toggle("filtered", !ok);
      if (el.hasAttribute("data-store")) { total++; if (ok) shown++; }
    }
    status.textContent = "Showing " + shown.toLocaleString("en") + " of " +
      total.toLocaleString("en") + " stores.";
    for (i = 0; i < pagers.length; i++) pagers[i](0);
  }
  var tables = document.querySelectorAll("table.paged");
  for (var t = 0; t < tables.length; t++) pagers.push(pager(tables[t]));
  form.addEventListener("change", apply);
  apply();
})();
""".replace("PAGE_ROWS", str(PAGE_ROWS))

# The policy allows only this exact script and inline styles, and no fetches:
# if escaping ever failed, an injected script still would not run.
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()
CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; base-uri 'none'; form-action 'none'"
)


def _when(generated_at: datetime | str | None) -> tuple[str, str]:
    """(machine, human) forms of the generation time."""
    if isinstance(generated_at, str):
        return generated_at, generated_at
    moment = generated_at or datetime.now(timezone.utc)
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
        return moment.isoformat(timespec="seconds"), moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    return moment.isoformat(timespec="seconds"), moment.strftime("%Y-%m-%d %H:%M:%S")


def render_html(
    records: Iterable[Mapping[str, Any]],
    *,
    settings: Mapping[str, Any] | None = None,
    title: str = "adapterprobe report",
    generated_at: datetime | str | None = None,
    plot_limit: int = PLOT_LIMIT,
) -> str:
    """One self-contained HTML page for scan records (``ScanRecord.to_dict()`` dicts).

    Problem stores (any warn/fail/error) come first, worst first, in detail;
    healthy ones are folded. Only the first ``plot_limit`` stores in that
    order get plots; the rest are rows of a compact table, so a scan of
    10,000 stores stays a few MB. With ``generated_at`` fixed the output is
    a pure function of the input.
    """
    return render_stores(
        group_stores(records),
        settings=settings,
        title=title,
        generated_at=generated_at,
        plot_limit=plot_limit,
    )


def render_stores(
    stores: list[Store],
    *,
    settings: Mapping[str, Any] | None = None,
    title: str = "adapterprobe report",
    generated_at: datetime | str | None = None,
    plot_limit: int = PLOT_LIMIT,
) -> str:
    """The page for stores already grouped (:func:`group_stores`, or a
    :class:`StoreCollector` for a streamed scan)."""
    ratio = ghost_ratio(settings)
    machine, human = _when(generated_at)
    when = f'<time datetime="{esc(machine)}">{esc(human)}</time>'

    problems = sorted((s for s in stores if s.worst >= PROBLEM), key=badness)
    healthy = sorted((s for s in stores if s.worst < PROBLEM), key=badness)
    limit = max(0, plot_limit)
    detailed, overflow = problems[:limit], problems[limit:]
    left = max(0, limit - len(detailed))
    folded, rest = healthy[:left], healthy[left:]

    body: list[str] = [summary_section(stores, settings, when)]
    overlay = overlay_section(stores, detailed + folded, healthy)
    if overlay:
        body.append(overlay)
    body.append(
        '<section id="problems" aria-labelledby="problems-h">'
        f'<h2 id="problems-h">Stores needing attention ({len(problems):,})</h2>'
    )
    if not problems:
        body.append('<p class="note">None: every record passed or was skipped.</p>')
    body.extend(store_card(s, ratio) for s in detailed)
    if overflow:
        body.append(
            f'<p class="note">Plots are drawn for the worst {len(detailed)} stores only; '
            f"{len(overflow):,} more are listed below, worst first.</p>"
        )
        body.append(compact_table(overflow, f"{len(overflow):,} more stores needing attention"))
    body.append("</section>")

    body.append(
        '<section id="healthy" aria-labelledby="healthy-h">'
        f'<h2 id="healthy-h">Healthy stores ({len(healthy):,})</h2>'
    )
    if healthy:
        body.append('<p class="note">Every record of these stores passed or was skipped.</p>')
    else:
        body.append('<p class="note">None.</p>')
    body.extend(_store_fold(s, ratio) for s in folded)
    if rest:
        caption = f"{len(rest):,} {'more ' if folded else ''}healthy stores"
        body.append(
            f'<details class="more"><summary>{esc(caption)} (table, no plots)</summary>'
            f"{compact_table(rest, caption)}</details>"
        )
    body.append("</section>")

    if not stores:
        body.insert(1, '<p class="note">This scan produced no records.</p>')
    base = common_base([s.path for s in stores])
    root = f" · stores under {esc(base)}" if base else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="generator" content="adapterprobe">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f'<body><header class="top"><h1>{esc(title)}</h1>'
        f"<p>adapterprobe scan · {len(stores):,} stores{root}</p></header>\n"
        f"<main>{''.join(body)}</main>\n"
        f"<footer>Generated {when} by adapterprobe. Works offline; "
        "the filter needs JavaScript.</footer>"
        f"<script>{JS}</script></body></html>\n"
    )


def write_html(
    path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]], **kw: Any
) -> Path:
    """Render and write the page atomically: readers see the old file or the
    whole new one, never a torn one. Keyword arguments go to :func:`render_html`."""
    with atomic_output(path) as out:
        out.write(render_html(records, **kw))
    return resolve_output(path)


def write_streamed_html(
    path: str | os.PathLike[str],
    batches: Iterable[Iterable[Any]],
    *,
    plot_limit: int = PLOT_LIMIT,
    **kw: Any,
) -> tuple[Path, list[Store]]:
    """Write the page for records that arrive in batches (a scan), keeping
    only the evidence of the stores that get plots (:class:`StoreCollector`).
    Returns the path and the stores (their records without evidence)."""
    # The overlay draws a few healthy runs beside the worst (none without charts).
    collector = StoreCollector(
        plot_limit,
        healthy=OVERLAY_HEALTHY if plot_limit > 0 else 0,
        healthy_run=_healthy_run,
    )
    for batch in batches:
        collector.add(batch)
    stores = collector.stores()
    with atomic_output(path) as out:
        out.write(render_stores(stores, plot_limit=plot_limit, **kw))
    return resolve_output(path), stores
