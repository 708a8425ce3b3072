"""A comparison as HTML: the loss curves overlaid on one chart, and per-layer
bars side by side (‖ΔW‖ of each adapter, the A–B cosine per layer), drawn
with the report's SVG toolkit. Self-contained (no scripts, no network);
every name from a scanned file goes through ``esc``."""

from __future__ import annotations

import math
from typing import Any

from adapterprobe.comparison.render import item_notes, level_line, pair_errors
from adapterprobe.reports.svg import PALETTE, Line, bar_chart, esc, num, overlay_chart

W, H = 640, 300
BOX = (60.0, 12.0, 620.0, 250.0)
COLOURS = PALETTE[:7]  # a run's colour: its place among the items
FONT = 10.0  # px of the fragment's chart text (its stylesheet)
LOG_RATIO = 20.0  # positive losses spanning this factor are drawn on a log axis

# Every rule is scoped to the fragment's class, so a notebook's own styles
# are left alone.
_RULES = (
    "{font:14px system-ui,sans-serif;color:#222}",
    " table{border-collapse:collapse;margin:8px 0}",
    " td, .ap-cmp th{border:1px solid #ccc;padding:3px 8px;text-align:left}",
    " .chart{max-width:100%;height:auto}",
    " .curves{width:640px}",
    " .bars{width:320px}",
    " .grid{stroke:#eee;fill:none}",
    " .axis{stroke:#888;fill:none}",
    " text{font-size:10px;fill:#555}",
    " .yt{text-anchor:end}",
    " .xt, .ap-cmp .xl, .ap-cmp .yl{text-anchor:middle}",
    " .bars rect{fill:#4a78b0}",
    " .bars rect.flag{fill:#c44}",
    " .limit{stroke:#c44;stroke-dasharray:4 3}",
    " .row{display:flex;flex-wrap:wrap;gap:16px}",
    " .ptitle{margin:4px 0;font-weight:600}",
    " .legend span{margin-right:14px}",
    " .note{color:#a60}",
)
STYLE = "\n".join(".ap-cmp" + rule for rule in _RULES)


def _curves_chart(items: list[dict[str, Any]]) -> str:
    lines = []
    for i, it in enumerate(items):
        c = it.get("curve")
        if not c or not c.get("sample"):
            continue
        pts = [(float(s), None if v is None else float(v)) for s, v in c["sample"]]
        lines.append(Line(str(it["label"]), COLOURS[i % len(COLOURS)], pts))
    if not lines:
        return "<p>No loss curves to overlay.</p>"
    chart, _ = overlay_chart(
        lines,
        "cmp-curves",
        "Loss curves",
        size=(W, H),
        box=BOX,
        log_ratio=LOG_RATIO,
        max_points=600,
        font=FONT,
    )
    if not chart:
        return "<p>No finite loss to draw.</p>"
    legend = "".join(f'<span style="color:{ln.colour}">━ {esc(ln.label)}</span>' for ln in lines)
    return chart + f'<p class="legend">{legend}</p>'


def _layer_bars(data: dict[str, Any]) -> str:
    out = []
    for it in data["items"]:
        a = it.get("adapter")
        if not a or not a.get("layers"):
            continue
        bars = [(str(e["layer"]), e["delta_fro"] or 0.0) for e in a["layers"]]
        label = str(it["label"])
        chart = bar_chart(bars, set(), f"cmp-w-{label}", f"{label}: ‖ΔW‖ per layer", "‖ΔW‖")
        out.append(f"<div>{chart}</div>")
    by_layer: dict[int, list[float]] = {}
    for m in data["modules"]:
        if m.get("layer") is None or m.get("inner") is None or m.get("norm_a") is None:
            continue
        acc = by_layer.setdefault(int(m["layer"]), [0.0, 0.0, 0.0])
        acc[0] += m["inner"]
        acc[1] += m["norm_a"] * m["norm_a"]  # (x ** 2 raises past the float range)
        acc[2] += m["norm_b"] * m["norm_b"]
    cos = [
        (str(k), v[0] / math.sqrt(v[1] * v[2]))
        for k, v in sorted(by_layer.items())
        if 0 < v[1] < math.inf and 0 < v[2] < math.inf and math.isfinite(v[0])
    ]
    if cos:
        out.append(
            f"<div>{bar_chart(cos, set(), 'cmp-cos', 'A vs B: cosine per layer', 'cosine')}</div>"
        )
    return f'<div class="row">{"".join(out)}</div>' if out else ""


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return esc(num(v))
    return esc("-" if v is None else v)


def _items_table(data: dict[str, Any]) -> str:
    head = [
        "",
        "kind",
        "best loss",
        "at step",
        "final loss",
        "at step",
        "best eval",
        "rank",
        "rank used",
        "‖ΔW‖",
        "path",
    ]
    rows = []
    for it in data["items"]:
        c = it.get("curve") or {}
        a = it.get("adapter") or {}
        vals = [
            it["label"],
            it["kind"],
            c.get("best_loss"),
            c.get("best_step"),
            c.get("final_loss"),
            c.get("final_step"),
            c.get("best_eval_loss"),
            a.get("rank"),
            a.get("rank_used_max"),
            a.get("delta_fro"),
            it["path"],
        ]
        rows.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in vals) + "</tr>")
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f"<table><tr>{th}</tr>{''.join(rows)}</table>"


def _pairs_list(data: dict[str, Any]) -> str:
    level = level_line(data)
    out = [f"<li>{esc(level)}</li>"] if level else []
    out += [f"<li>{esc(line)}</li>" for line in pair_errors(data["pairs"])]
    for p in data["pairs"]:
        if not p.get("error"):
            left = len(p["left_out"])
            out.append(
                f"<li>{esc(p['a'])} vs {esc(p['b'])}: similarity <b>{_cell(p['similarity'])}</b> "
                f"over {len(p['modules'])} shared modules"
                + (f", {left} left out" if left else "")
                + "</li>"
            )
    out += [f'<li class="note">{esc(line)}</li>' for line in item_notes(data["items"])]
    for x in data["left_out"]:
        out.append(f'<li class="note">left out {esc(x["module"])}: {esc(x["reason"])}</li>')
    return f"<ul>{''.join(out)}</ul>"


def _modules_table(data: dict[str, Any]) -> str:
    if not data["modules"]:
        return ""
    head = ["module", "cosine", "‖ΔW‖ A", "‖ΔW‖ B", "rank A", "rank B", "min angle°"]
    rows = []
    for m in data["modules"]:
        angles = m.get("principal_angles_deg") or []
        vals = [
            m["module"],
            m["cosine"],
            m["norm_a"],
            m["norm_b"],
            m["rank_a"],
            m["rank_b"],
            angles[0] if angles else None,
        ]
        rows.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in vals) + "</tr>")
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    return (
        "<details><summary>A vs B per module</summary>"
        f"<table><tr>{th}</tr>{''.join(rows)}</table></details>"
    )


def render_fragment(data: dict[str, Any]) -> str:
    """The comparison as an HTML fragment (for notebooks)."""
    return (
        f'<div class="adapterprobe-compare ap-cmp"><style>{STYLE}</style>'
        f"{_items_table(data)}{_pairs_list(data)}"
        f'<p class="ptitle">Loss by step</p>{_curves_chart(data["items"])}{_layer_bars(data)}'
        f"{_modules_table(data)}</div>"
    )


def render_page(data: dict[str, Any]) -> str:
    """The comparison as a standalone HTML page."""
    labels = " vs ".join(esc(i["label"]) for i in data["items"])
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>adapterprobe compare: {labels}</title>"
        "<style>body{margin:24px}</style></head><body>"
        f"<h1>Comparison: {labels}</h1>{render_fragment(data)}</body></html>\n"
    )
