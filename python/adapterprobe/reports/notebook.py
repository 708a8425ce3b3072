"""Notebook display: ``_repr_html_`` for a scan and for one probe result.

Jupyter, VS Code and JupyterLab insert the HTML into the notebook page
itself, so a fragment here must not restyle the notebook: the report page's
stylesheet is nested under one wrapper class (CSS nesting, so page-level
selectors such as ``body`` match nothing inside the fragment and the
variables hang off the wrapper). The charts are the report's own inline SVG;
nothing needs JavaScript or the network.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from adapterprobe.reports import html as page
from adapterprobe.reports.probe_charts import ghost_chart, grad_norm_figure, loss_figure
from adapterprobe.reports.probe_charts import weights_chart as weights_figure
from adapterprobe.reports.shaping import (
    VERDICTS,
    Record,
    badness,
    ghost_ratio,
    group_stores,
)
from adapterprobe.reports.svg import clip, esc

WRAPPER = "adapterprobe-nb"
#: Stores drawn with charts in a notebook (the rest are table rows).
NOTEBOOK_STORES = 12
NOTEBOOK_ROWS = 200

_CSS = f".{WRAPPER}{{" + page.CSS.replace(":root{", "&{") + "}"


def _wrap(body: str) -> str:
    return f'<div class="{WRAPPER}"><style>{_CSS}</style>{body}</div>'


def scan_html(
    records: Iterable[Any],
    settings: Mapping[str, Any] | None = None,
    *,
    stores_with_charts: int = NOTEBOOK_STORES,
) -> str:
    """The fragment for a scan: the summary, the worst stores with their
    charts, and a table of the rest."""
    stores = sorted(group_stores(records), key=badness)
    ratio = ghost_ratio(settings)
    drawn, rest = stores[:stores_with_charts], stores[stores_with_charts:]
    parts = [page.summary_section(stores, settings, "now")]
    parts.extend(page.store_card(s, ratio) for s in drawn)
    if rest:
        shown = rest[:NOTEBOOK_ROWS]
        caption = f"{len(rest):,} more stores" + (
            f" (the first {len(shown):,} listed)" if len(shown) < len(rest) else ""
        )
        parts.append(page.compact_table(shown, caption))
    if not stores:
        parts.append("<p>This scan produced no records.</p>")
    return _wrap("".join(parts))


def result_html(
    kind: str,
    verdict: str,
    score: float | None,
    message: str,
    evidence: Mapping[str, Any],
    name: str = "",
) -> str:
    """The fragment for one probe result: its verdict, message and charts."""
    v = verdict if verdict in VERDICTS else "error"
    rec = Record(
        store=name or kind,
        adapter=None,
        probe=kind,
        verdict=v,
        label=verdict,
        score=score,
        message=message,
        evidence=evidence,
        layout=None,
    )
    figures = []
    if kind == "training_drift":
        figures += [loss_figure(rec, "nb-loss", name), grad_norm_figure(rec, "nb-grad", name)]
    elif kind == "gradient_ghost":
        figures.append(ghost_chart(rec, "nb-ghost", ghost_ratio(None)))
    elif kind == "adapter_weights":
        figures.append(weights_figure(rec, "nb-weights"))
    score_text = "" if score is None else f" · score {score:.2f}"
    head = (
        f"<h3>{page.badge(v, verdict)} {esc(kind)}{esc(score_text)}"
        f"{' · ' + esc(name) if name else ''}</h3>"
        f'<p class="c-m">{esc(clip(message, page.MESSAGE_CHARS))}</p>'
        f"{page.facts_line(evidence)}"
    )
    drawn = "".join(f for f in figures if f)
    charts = f'<div class="plots">{drawn}</div>' if drawn else ""
    return _wrap(f'<article class="store card">{head}{charts}</article>')


__all__ = ["result_html", "scan_html"]
