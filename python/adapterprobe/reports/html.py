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
import html
import json
import math
import os
import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adapterprobe._fs import atomic_write_text

__all__ = ["PLOT_LIMIT", "VERDICTS", "render_html", "write_html"]

VERDICTS = ("error", "fail", "warn", "skip", "pass")  # worst first
SEVERITY = {v: len(VERDICTS) - 1 - i for i, v in enumerate(VERDICTS)}
PROBLEM = SEVERITY["warn"]  # a store with any record this bad is shown in detail

PLOT_LIMIT = 200  # stores drawn with plots; the rest are table rows
MAX_POINTS = 300  # points per drawn curve
MAX_BARS = 128  # bars per chart (more layers are bucketed)
MAX_MARKS = 120  # spike markers / non-finite bands per chart
PAGE_ROWS = 100  # rows per page of a compact table (JS paging)
MAX_ROWS = 40  # verdict rows shown per detailed store (--all-versions can make many)
MAX_FIGURES = 12  # charts per detailed store
MESSAGE_CHARS = 4000  # a detailed message is clipped here
ROW_MESSAGE_CHARS = 240  # a compact row's message is clipped here
LOG_RATIO = 30.0  # a positive curve spanning this factor is drawn on a log axis
GHOST_RATIO = 2.0  # gradient_ghost's default undertrained_layer_ratio

# Evidence keys that are drawn rather than listed as facts.
DRAWN = frozenset(
    {
        "curve_sampled",
        "trend_sampled",
        "spike_steps",
        "nonfinite_steps",
        "layer_exp_avg_sq",
        "flagged_layers",
        "worst_layers",
        "layer_delta_energy",
        "dead_modules",
        "top_modules",
        "thresholds",
    }
)


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _finite(value: Any) -> float | None:
    """A finite float, or None for anything else (bools, strings, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _num(value: float) -> str:
    """A number for people: 4 significant digits, short exponents."""
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    text = f"{value:.4g}"
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def _c(value: float) -> str:
    """An SVG coordinate: one decimal is plenty and keeps the file small."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key that puts layer "10" after layer "9"."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


# ---------------------------------------------------------------------------
# Records and stores


@dataclass
class _Rec:
    store: str
    adapter: str | None
    probe: str
    verdict: str  # one of VERDICTS (unknown verdicts count as error)
    label: str  # the verdict as written in the record
    score: float | None
    message: str
    evidence: Mapping[str, Any]
    layout: str | None

    @property
    def severity(self) -> int:
        return SEVERITY[self.verdict]


@dataclass
class _Store:
    path: str
    name: str = ""
    index: int = 0
    records: list[_Rec] = field(default_factory=list)

    @property
    def worst(self) -> int:
        return max(r.severity for r in self.records)

    @property
    def verdicts(self) -> list[str]:
        present = {r.verdict for r in self.records}
        return [v for v in VERDICTS if v in present]

    @property
    def layout(self) -> str | None:
        return next((r.layout for r in self.records if r.layout), None)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(VERDICTS, 0)
        for r in self.records:
            out[r.verdict] += 1
        return out


def _record(raw: Any) -> _Rec:
    """Read one record tolerantly: missing or odd fields get safe defaults."""
    if not isinstance(raw, Mapping) and hasattr(raw, "to_dict"):
        raw = raw.to_dict()
    d: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    label = str(d.get("verdict") or "error")
    verdict = label.lower() if label.lower() in SEVERITY else "error"
    evidence = d.get("evidence")
    adapter = d.get("adapter")
    layout = d.get("layout")
    return _Rec(
        store=str(d.get("store") or "(no store)"),
        adapter=None if adapter is None else str(adapter),
        probe=str(d.get("probe") or "(unknown probe)"),
        verdict=verdict,
        label=label,
        score=_finite(d.get("score")),
        message=str(d.get("message") or ""),
        evidence=evidence if isinstance(evidence, Mapping) else {},
        layout=str(layout) if layout else None,
    )


def _group(records: Iterable[Any]) -> list[_Store]:
    stores: dict[str, _Store] = {}
    for raw in records:
        rec = _record(raw)
        stores.setdefault(rec.store, _Store(rec.store)).records.append(rec)
    out = list(stores.values())
    base = _common_base([s.path for s in out])
    for i, s in enumerate(out):
        s.index = i
        s.name = _relative(s.path, base) or s.path
        s.records.sort(key=lambda r: (-r.severity, r.probe, _natural(r.adapter or "")))
    return out


def _common_base(paths: list[str]) -> str:
    """The directory the store names are shown relative to ("" for none)."""
    if len(paths) < 2:
        return os.path.dirname(paths[0].rstrip("/")) if paths else ""
    try:
        base = os.path.commonpath(paths)
    except ValueError:  # mixed absolute and relative paths
        return ""
    return os.path.dirname(base) if base in paths else base


def _relative(path: str, base: str) -> str:
    if base and path.startswith(base.rstrip("/") + "/"):
        return path[len(base.rstrip("/")) + 1 :]
    return path


def _adapter_name(rec: _Rec) -> str:
    if rec.adapter is None:
        return "—"
    return _relative(rec.adapter, rec.store)


# ---------------------------------------------------------------------------
# Small HTML pieces


def _badge(verdict: str, label: str | None = None) -> str:
    return f'<b class="v v-{verdict}">{_esc(label or verdict)}</b>'


def _count_text(counts: Mapping[str, int]) -> str:
    return " · ".join(f"{n:,} {v}" for v, n in counts.items() if n)


def _facts(evidence: Mapping[str, Any], limit: int = 8) -> str:
    """The scalar evidence as one short line, so numbers behind a verdict show."""
    parts = []
    for key, value in evidence.items():
        if key in DRAWN or value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            f = _finite(value)
            text = "non-finite" if f is None else _num(f)
        elif isinstance(value, str):
            text = _clip(value, 60)
        else:
            continue
        parts.append(f"<span>{_esc(key)} <b>{_esc(text)}</b></span>")
        if len(parts) == limit:
            break
    return f'<div class="facts">{"".join(parts)}</div>' if parts else ""


def _step_list(steps: list[float], limit: int = 10) -> str:
    """Sorted steps as short text: runs of 3 or more become ranges ("411–416")."""
    runs: list[list[float]] = []
    for s in steps:
        if runs and s - runs[-1][-1] == 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    parts: list[str] = []
    for run in runs:
        if len(run) >= 3:
            parts.append(f"{_num(run[0])}–{_num(run[-1])}")
        else:
            parts.extend(_num(s) for s in run)
    shown = ", ".join(parts[:limit])
    return shown + (f" and {len(parts) - limit} more" if len(parts) > limit else "")


def _ints(value: Any) -> list[float]:
    """Finite numbers from an evidence list (steps), sorted and deduplicated."""
    if not isinstance(value, (list, tuple)):
        return []
    return sorted({f for v in value if (f := _finite(v)) is not None})


def _pairs(value: Any, allow_null: bool) -> list[tuple[float, float | None]]:
    """``[[x, y], ...]`` evidence as (x, y) tuples; a null y is kept only if allowed."""
    if not isinstance(value, (list, tuple)):
        return []
    out: list[tuple[float, float | None]] = []
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) < 2:
            continue
        x, y = _finite(item[0]), _finite(item[1])
        if x is None or (y is None and not allow_null):
            continue
        out.append((x, y))
    out.sort(key=lambda p: p[0])
    return out


# ---------------------------------------------------------------------------
# Axes


def _nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """About `count` round tick values covering [lo, hi]."""
    span = hi - lo
    if not span > 0:
        return [lo]
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * mag
        if span / step <= count:
            break
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    i = first
    while i * step <= hi + step * 1e-9:
        ticks.append(round(i * step, 12))
        i += 1
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values for a log axis spanning log10 values [lo, hi]."""
    decades = list(range(math.ceil(lo - 1e-9), math.floor(hi + 1e-9) + 1))
    if len(decades) >= 2:
        every = max(1, math.ceil(len(decades) / 6))
        return [10.0**d for d in decades[::every]]
    values = _nice_ticks(10**lo, 10**hi, 4)
    return [v for v in values if v > 0 and lo - 1e-9 <= math.log10(v) <= hi + 1e-9]


class _Scale:
    """Maps data to SVG pixels along one axis (optionally log10)."""

    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool = False):
        self.log = log
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if not hi > lo:
            pad = abs(lo) * 0.1 or 1.0
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, value: float) -> float:
        v = math.log10(value) if self.log else value
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def ticks(self, count: int, integer: bool = False) -> list[float]:
        if self.log:
            return _log_ticks(self.lo, self.hi)
        return _nice_ticks(self.lo, self.hi, count, integer)


def _downsample(
    points: list[tuple[float, float | None]], limit: int
) -> list[tuple[float, float | None]]:
    """At most `limit` points keeping each bucket's lowest and highest loss (so
    spikes survive) and its gaps (non-finite losses break the line)."""
    if len(points) <= limit:
        return points
    buckets = max(1, limit // 3)
    size = len(points) / buckets
    out: list[tuple[float, float | None]] = []
    for b in range(buckets):
        chunk = points[int(b * size) : int((b + 1) * size)]
        finite = [p for p in chunk if p[1] is not None]
        keep: set[tuple[float, float | None]] = set()
        if finite:
            keep.add(min(finite, key=lambda p: (p[1], p[0])))
            keep.add(max(finite, key=lambda p: (p[1], -p[0])))
        gap = next((p for p in chunk if p[1] is None), None)
        if gap is not None:
            keep.add(gap)
        out.extend(sorted(keep, key=lambda p: (p[0], p[1] is None)))
    return out


def _line(points: list[tuple[float, float | None]], sx: _Scale, sy: _Scale) -> str:
    """SVG path data; a None y lifts the pen, a lone point becomes a dot."""
    parts: list[str] = []
    run = 0
    for x, y in points:
        if y is None:
            if run == 1:
                parts.append("h0")
            run = 0
            continue
        parts.append(("L" if run else "M") + f"{_c(sx(x))},{_c(sy(y))}")
        run += 1
    if run == 1:
        parts.append("h0")
    return "".join(parts)


def _axes(
    sx: _Scale,
    sy: _Scale,
    box: tuple[float, float, float, float],
    x_label: str,
    y_label: str,
    x_ticks: list[float],
    y_ticks: list[float],
) -> str:
    left, top, right, bottom = box
    grid = "".join(f"M{_c(left)},{_c(sy(t))}H{_c(right)}" for t in y_ticks)
    out = [f'<path class="grid" d="{grid}"/>'] if grid else []
    out.append(f'<path class="axis" d="M{_c(left)},{_c(top)}V{_c(bottom)}H{_c(right)}"/>')
    for t in y_ticks:
        out.append(f'<text class="yt" x="{_c(left - 5)}" y="{_c(sy(t) + 4)}">{_num(t)}</text>')
    for t in x_ticks:
        out.append(f'<text class="xt" x="{_c(sx(t))}" y="{_c(bottom + 15)}">{_num(t)}</text>')
    mid_y = (top + bottom) / 2
    out.append(f'<text class="xl" x="{_c((left + right) / 2)}" y="{_c(bottom + 30)}">')
    out.append(f"{_esc(x_label)}</text>")
    out.append(f'<text class="yl" transform="translate(13 {_c(mid_y)}) rotate(-90)">')
    out.append(f"{_esc(y_label)}</text>")
    return "".join(out)


def _svg_open(uid: str, width: int, height: int, title: str, desc: str, cls: str) -> str:
    return (
        f'<svg class="{cls}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{uid}-t {uid}-d"><title id="{uid}-t">{_esc(title)}</title>'
        f'<desc id="{uid}-d">{_esc(desc)}</desc>'
    )


# ---------------------------------------------------------------------------
# Plots

CURVE_W, CURVE_H = 520, 230
CURVE_BOX = (58.0, 14.0, 508.0, 190.0)  # left, top, right, bottom


def _loss_figure(rec: _Rec, uid: str, store_name: str) -> str:
    """The training_drift loss curve with its trend, spikes and non-finite steps."""
    ev = rec.evidence
    curve = _pairs(ev.get("curve_sampled"), allow_null=True)
    finite = [(x, y) for x, y in curve if y is not None]
    if not finite:
        return ""
    trend = [(x, y) for x, y in _pairs(ev.get("trend_sampled"), allow_null=False) if y is not None]
    spikes = _ints(ev.get("spike_steps"))
    nonfinite = sorted(set(_ints(ev.get("nonfinite_steps"))) | {x for x, y in curve if y is None})

    left, top, right, bottom = CURVE_BOX
    xs = [x for x, _ in curve] + [x for x, _ in trend]
    ys = [y for _, y in finite] + [y for _, y in trend]
    y_lo, y_hi = min(ys), max(ys)
    log = y_lo > 0 and y_hi / y_lo >= LOG_RATIO
    sx = _Scale(min(xs), max(xs), left, right)
    sy = _Scale(y_lo, y_hi, bottom, top, log=log)
    pad = (sy.hi - sy.lo) * 0.05
    sy.lo, sy.hi = sy.lo - pad, sy.hi + pad

    in_range = [s for s in spikes if sx.lo <= s <= sx.hi]
    nan_in = [s for s in nonfinite if sx.lo <= s <= sx.hi]
    desc = (
        f"{len(finite)} finite loss values from step {_num(finite[0][0])} to "
        f"{_num(finite[-1][0])}, loss {_num(finite[0][1])} to {_num(finite[-1][1])}"
        + (" (log scale)" if log else "")
        + (f"; loss spikes at steps {_step_list(spikes)}" if spikes else "")
        + (f"; non-finite loss at steps {_step_list(nonfinite)}" if nonfinite else "")
    )
    out = [_svg_open(uid, CURVE_W, CURVE_H, f"Loss curve of {store_name}", desc, "chart curve")]
    out.append(
        _axes(
            sx,
            sy,
            CURVE_BOX,
            "step",
            "loss (log scale)" if log else "loss",
            sx.ticks(6, integer=True),
            sy.ticks(5),
        )
    )
    if nan_in:
        seen: set[str] = set()
        bands = []
        for s in nan_in:
            x = _c(sx(s) - 1.5)
            if x not in seen and len(seen) < MAX_MARKS:
                seen.add(x)
                bands.append(f'<rect x="{x}" y="{_c(top)}" width="3" height="{_c(bottom - top)}"/>')
                bands.append(f'<path class="nan-tick" d="M{_c(sx(s))},{_c(top + 7)}l-4,-7h8z"/>')
        out.append(f'<g class="nan" data-steps="{" ".join(_num(s) for s in nan_in)}">')
        out.append("".join(bands) + "</g>")
    if trend:
        line = _line(_downsample(list(trend), MAX_POINTS), sx, sy)
        out.append(f'<path class="trend" d="{line}"/>')
    out.append(f'<path class="loss" d="{_line(_downsample(curve, MAX_POINTS), sx, sy)}"/>')
    if in_range:
        steps = [x for x, _ in finite]
        marks = []
        for s in in_range[:MAX_MARKS]:
            i = bisect_left(steps, s)
            near = [j for j in (i - 1, i) if 0 <= j < len(steps)]
            j = min(near, key=lambda k: (abs(steps[k] - s), k))
            y = finite[j][1]
            assert y is not None
            marks.append(
                f'<circle class="spike" data-step="{_num(s)}" cx="{_c(sx(s))}" '
                f'cy="{_c(sy(y))}" r="4"><title>loss spike at step {_num(s)}</title></circle>'
            )
        out.append(f'<g class="spikes">{"".join(marks)}</g>')
    out.append("</svg>")

    legend = ['<span class="key k-loss">loss</span>']
    if trend:
        legend.append('<span class="key k-trend">trend</span>')
    if spikes:
        legend.append(f'<span class="key k-spike">spikes: steps {_step_list(spikes, 6)}</span>')
    if nonfinite:
        legend.append(
            f'<span class="key k-nan">non-finite: steps {_step_list(nonfinite, 6)}</span>'
        )
    return (
        '<figure class="plot wide"><p class="ptitle" aria-hidden="true">Loss curve'
        f"{' (log scale)' if log else ''}</p>{''.join(out)}"
        f"<figcaption>{' '.join(legend)}</figcaption></figure>"
    )


BARS_W, BARS_H = 320, 160
BARS_BOX = (50.0, 10.0, 312.0, 122.0)


def _bucket(
    items: list[tuple[str, float]], flagged: set[str]
) -> tuple[list[tuple[str, float]], set[str]]:
    """At most MAX_BARS bars: neighbouring layers merged, keeping their maximum."""
    if len(items) <= MAX_BARS:
        return items, flagged
    size = math.ceil(len(items) / MAX_BARS)
    out, flags = [], set()
    for i in range(0, len(items), size):
        chunk = items[i : i + size]
        name = f"{chunk[0][0]}–{chunk[-1][0]}" if len(chunk) > 1 else chunk[0][0]
        out.append((name, max(v for _, v in chunk)))
        if any(k in flagged for k, _ in chunk):
            flags.add(name)
    return out, flags


def _bars_svg(
    items: list[tuple[str, float]],
    flagged: set[str],
    uid: str,
    title: str,
    y_label: str,
    threshold: tuple[float, str] | None = None,
) -> str:
    """A bar per layer; flagged layers stand out, an optional dashed limit line."""
    items, flagged = _bucket(items, flagged)
    left, top, right, bottom = BARS_BOX
    values = [v for _, v in items] + ([threshold[0]] if threshold else [])
    sx_n = len(items)
    sy = _Scale(min(0.0, *values), max(values), bottom, top)
    sy.hi += (sy.hi - sy.lo) * 0.05
    width = (right - left) / sx_n
    gap = width * 0.18 if width > 4 else 0.0
    zero = sy(max(sy.lo, 0.0))
    flagged_names = [k for k, _ in items if k in flagged]
    desc = f"{sx_n} bars, highest {_num(max(v for _, v in items))}" + (
        f"; flagged: layers {', '.join(flagged_names[:12])}" if flagged_names else ""
    )
    out = [
        f'<p class="ptitle" aria-hidden="true">{_esc(title)}</p>',
        _svg_open(uid, BARS_W, BARS_H, title, desc, "chart bars"),
    ]
    every = max(1, math.ceil(sx_n / 12))
    labels = [(i, k) for i, (k, _) in enumerate(items) if i % every == 0]
    grid = "".join(f"M{_c(left)},{_c(sy(t))}H{_c(right)}" for t in sy.ticks(3))
    out.append(f'<path class="grid" d="{grid}"/>')
    for t in sy.ticks(3):
        out.append(f'<text class="yt" x="{_c(left - 4)}" y="{_c(sy(t) + 4)}">{_num(t)}</text>')
    for i, (key, value) in enumerate(items):
        y = sy(value)
        cls = ' class="flag"' if key in flagged else ""
        out.append(
            f'<rect{cls} x="{_c(left + i * width + gap / 2)}" y="{_c(min(y, zero))}" '
            f'width="{_c(max(width - gap, 0.6))}" height="{_c(max(abs(zero - y), 0.6))}">'
            f"<title>layer {_esc(key)}: {_num(value)}</title></rect>"
        )
    for i, key in labels:
        x = left + (i + 0.5) * width
        out.append(
            f'<text class="xt" x="{_c(x)}" y="{_c(bottom + 13)}">{_esc(_clip(key, 8))}</text>'
        )
    if threshold:
        limit_y = _c(sy(threshold[0]))
        out.append(f'<path class="limit" d="M{_c(left)},{limit_y}H{_c(right)}"/>')
        out.append(f'<text class="lt" x="{_c(right)}" y="{_c(sy(threshold[0]) - 3)}">')
        out.append(f"{_esc(threshold[1])}</text>")
    out.append(f'<path class="axis" d="M{_c(left)},{_c(top)}V{_c(bottom)}H{_c(right)}"/>')
    out.append(f'<text class="xl" x="{_c((left + right) / 2)}" y="{_c(bottom + 28)}">layer</text>')
    mid = (top + bottom) / 2
    out.append(f'<text class="yl" transform="translate(11 {_c(mid)}) rotate(-90)">')
    out.append(f"{_esc(y_label)}</text></svg>")
    return "".join(out)


def _layer_items(value: Any) -> list[tuple[str, float]]:
    if not isinstance(value, Mapping):
        return []
    items = [(str(k), f) for k, v in value.items() if (f := _finite(v)) is not None]
    return sorted(items, key=lambda kv: _natural(kv[0]))


def _names(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        return []
    return [str(v) for v in value if isinstance(v, (str, int)) and not isinstance(v, bool)]


def _ghost_ratio(settings: Mapping[str, Any] | None) -> float:
    opts = (settings or {}).get("gradient_ghost")
    ratio = _finite(opts.get("undertrained_layer_ratio")) if isinstance(opts, Mapping) else None
    return ratio if ratio is not None and ratio > 0 else GHOST_RATIO


def _ghost_chart(rec: _Rec, uid: str, ratio: float) -> str:
    ev = rec.evidence
    if ev.get("rules") == "robust":
        return _robust_ghost_chart(ev, uid)
    items = _layer_items(ev.get("layer_exp_avg_sq"))
    if items:
        flagged = set(_names(ev.get("flagged_layers")))
        low = min(v for _, v in items)
        limit = (low * ratio, f"{_num(ratio)}× calmest") if low > 0 else None
        return _bars_svg(items, flagged, uid, "Mean Adam exp_avg_sq per layer", "exp_avg_sq", limit)
    worst = ev.get("worst_layers")
    if isinstance(worst, (list, tuple)):
        items = [
            (str(w.get("layer")), r)
            for w in worst
            if isinstance(w, Mapping) and (r := _finite(w.get("ratio"))) is not None
        ]
        items.sort(key=lambda kv: _natural(kv[0]))
        if items:
            flagged = {k for k, v in items if v > ratio}
            return _bars_svg(
                items,
                flagged,
                uid,
                "exp_avg_sq of the worst layers vs the calmest",
                "× calmest",
                (ratio, f"{_num(ratio)}× limit"),
            )
    return ""


def _robust_ghost_chart(ev: Mapping[str, Any], uid: str) -> str:
    """rules="robust": each layer against its peers when the layers were
    compared (the outlier limit drawn), else each layer's mean second moment."""
    flagged = set(_names(ev.get("flagged_layers")))
    scores = _layer_items(ev.get("layer_ratio_to_peers"))
    if scores:
        thresholds = ev.get("thresholds")
        limit = (
            _finite(thresholds.get("layer_outlier_ratio"))
            if isinstance(thresholds, Mapping)
            else None
        )
        title = "Second moments per layer vs the same tensors in the other layers"
        # A limit far above every bar would flatten them: named, not drawn.
        drawn = limit is not None and max(v for _, v in scores) >= limit / 10
        if limit is not None and not drawn:
            title += f" (WARN above {_num(limit)}×)"
        line = (limit, f"{_num(limit)}× limit") if drawn and limit is not None else None
        return _bars_svg(scores, flagged, uid, title, "× peers", line)
    means = _layer_items(ev.get("layer_exp_avg_sq"))
    if means:
        return _bars_svg(
            means, flagged, uid, "Mean Adam exp_avg_sq per layer (not compared)", "exp_avg_sq"
        )
    return ""


def _weights_chart(rec: _Rec, uid: str) -> str:
    ev = rec.evidence
    out = []
    items = _layer_items(ev.get("layer_delta_energy"))
    if items:
        out.append(_bars_svg(items, set(), uid, "Adapter delta energy per layer", "energy"))
    top = ev.get("top_modules")
    if isinstance(top, (list, tuple)):
        rows = []
        for item in top[:10]:
            if not isinstance(item, Mapping):
                continue
            share = _finite(item.get("share"))
            pct = "—" if share is None else f"{share * 100:.1f}%"
            width = 0.0 if share is None else max(0.0, min(100.0, share * 100))
            rows.append(
                f'<tr><td class="mod">{_esc(_clip(str(item.get("module", "")), 120))}</td>'
                f'<td class="share"><span class="sbar" style="width:{width:.0f}%"></span>'
                f"{pct}</td></tr>"
            )
        if rows:
            out.append(
                '<table class="mods"><caption>Top modules by share of delta energy</caption>'
                '<thead><tr><th scope="col">module</th><th scope="col">share</th></tr></thead>'
                f"<tbody>{''.join(rows)}</tbody></table>"
            )
    dead = _names(ev.get("dead_modules"))
    if dead:
        shown = ", ".join(_clip(d, 120) for d in dead[:12])
        more = f" and {len(dead) - 12} more" if len(dead) > 12 else ""
        out.append(
            f'<p class="dead"><b>{len(dead)} dead module{"s" if len(dead) != 1 else ""}</b> '
            f"(no change from the base): {_esc(shown)}{more}</p>"
        )
    return "".join(out)


def _adapter_figures(store: _Store, ratio: float, room: int) -> tuple[list[str], int]:
    """Charts of the per-adapter records, worst first, at most `room` of them;
    also how many more there were."""
    figures: list[str] = []
    skipped = 0
    per_adapter = [r for r in store.records if r.adapter is not None]
    per_adapter.sort(key=lambda r: (-r.severity, _natural(_adapter_name(r)), r.probe))
    for j, rec in enumerate(per_adapter):
        uid = f"s{store.index}-a{j}"
        if rec.probe == "gradient_ghost":
            body = _ghost_chart(rec, uid, ratio)
        elif rec.probe == "adapter_weights":
            body = _weights_chart(rec, uid)
        else:
            body = ""
        if not body:
            continue
        if len(figures) >= room:
            skipped += 1
            continue
        step = _finite(rec.evidence.get("global_step"))
        extra = f" · global_step {_num(step)}" if step is not None else ""
        figures.append(
            f'<figure class="plot">{body}<figcaption>{_badge(rec.verdict, rec.label)} '
            f"<b>{_esc(rec.probe)}</b> · {_esc(_adapter_name(rec))}{extra}</figcaption></figure>"
        )
    return figures, skipped


# ---------------------------------------------------------------------------
# Stores


def _reasons(store: _Store) -> str:
    rows = []
    for r in store.records[:MAX_ROWS]:
        score = "—" if r.score is None else f"{r.score:.2f}"
        rows.append(
            f'<tr data-v="{r.verdict}"><td class="c-v">{_badge(r.verdict, r.label)}</td>'
            f'<td class="c-p">{_esc(r.probe)}</td>'
            f'<td class="c-a{" none" if r.adapter is None else ""}">{_esc(_adapter_name(r))}</td>'
            f'<td class="c-s">{score}</td><td class="c-m">'
            f"{_esc(_clip(r.message, MESSAGE_CHARS)) or '<i>no message</i>'}"
            f"{_facts(r.evidence)}</td></tr>"
        )
    rest = store.records[MAX_ROWS:]
    if rest:
        counts = dict.fromkeys(VERDICTS, 0)
        for r in rest:
            counts[r.verdict] += 1
        present = " ".join(v for v in VERDICTS if counts[v])
        rows.append(
            f'<tr data-v="{present}"><td class="c-more" colspan="5">and {len(rest):,} more '
            f"records, not listed: {_esc(_count_text(counts))}</td></tr>"
        )
    return (
        f'<table class="reasons"><caption class="sr">Verdicts for {_esc(store.name)}</caption>'
        '<thead><tr><th scope="col">verdict</th><th scope="col">probe</th>'
        '<th scope="col">adapter</th><th scope="col">score</th><th scope="col">message</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _store_title(store: _Store) -> str:
    worst = VERDICTS[len(VERDICTS) - 1 - store.worst]
    layout = store.layout
    tag = f' <span class="tag">{_esc(layout)}</span>' if layout else ""
    return (
        f'{_badge(worst)} <span class="name">{_esc(store.name)}</span>{tag}'
        f' <span class="muted">{_esc(_count_text(store.counts()))}</span>'
    )


def _store_body(store: _Store, ratio: float, plots: bool) -> str:
    parts = [f'<p class="path">{_esc(store.path)}</p>', _reasons(store)]
    if plots:
        figures = []
        drift = [r for r in store.records if r.probe == "training_drift"]
        for j, rec in enumerate(drift[:MAX_FIGURES]):
            fig = _loss_figure(rec, f"s{store.index}-c{j}", store.name)
            if fig:
                figures.append(fig)
        more, skipped = _adapter_figures(store, ratio, MAX_FIGURES - len(figures))
        figures += more
        if figures:
            parts.append(f'<div class="plots">{"".join(figures)}</div>')
        if skipped:
            parts.append(f'<p class="note">{skipped:,} more adapter charts are not drawn.</p>')
    return "".join(parts)


def _store_card(store: _Store, ratio: float) -> str:
    sid = f"s{store.index}"
    return (
        f'<article class="store card" id="{sid}" data-store data-v="{" ".join(store.verdicts)}" '
        f'aria-labelledby="{sid}-h"><h3 id="{sid}-h">{_store_title(store)}</h3>'
        f"{_store_body(store, ratio, plots=True)}</article>"
    )


def _store_fold(store: _Store, ratio: float) -> str:
    sid = f"s{store.index}"
    return (
        f'<details class="store fold" id="{sid}" data-store data-v="{" ".join(store.verdicts)}">'
        f"<summary><h3>{_store_title(store)}</h3></summary>"
        f'<div class="fold-body">{_store_body(store, ratio, plots=True)}</div></details>'
    )


def _compact_table(stores: list[_Store], caption: str) -> str:
    """One row per store, no plots: how big scans stay small and fast."""
    rows = []
    for s in stores:
        worst = s.records[0]
        tag = f' <span class="tag">{_esc(s.layout)}</span>' if s.layout else ""
        counts = " ".join(f'<b class="v v-{v}">{n} {v}</b>' for v, n in s.counts().items() if n)
        message = _esc(_clip(worst.message, ROW_MESSAGE_CHARS))
        rows.append(
            f'<tr id="s{s.index}" data-store data-v="{" ".join(s.verdicts)}">'
            f'<td class="c-n">{_esc(s.name)}{tag}</td><td class="c-c">{counts}</td>'
            f'<td class="c-m"><span class="probe">{_esc(worst.probe)}</span> {message}</td></tr>'
        )
    return (
        f'<div class="scroll"><table class="compact paged"><caption>{_esc(caption)}</caption>'
        '<thead><tr><th scope="col">store</th><th scope="col">records</th>'
        '<th scope="col">worst finding</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


# ---------------------------------------------------------------------------
# Summary


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError):
            text = str(value)
    yield prefix or "(value)", text


def _settings_html(settings: Mapping[str, Any] | None) -> str:
    rows = "".join(
        f'<tr><th scope="row">{_esc(k)}</th><td>{_esc(_clip(v, 500))}</td></tr>'
        for k, v in (_flatten(settings) if settings else ())
    )
    body = (
        f'<table class="kv"><caption class="sr">Settings</caption>{rows}</table>'
        if rows
        else "<p>No settings were recorded with this report.</p>"
    )
    return f'<details class="settings"><summary>Settings used</summary>{body}</details>'


def _summary(stores: list[_Store], settings: Mapping[str, Any] | None, when: str) -> str:
    counts = dict.fromkeys(VERDICTS, 0)
    store_counts = dict.fromkeys(VERDICTS, 0)
    for s in stores:
        for v, n in s.counts().items():
            counts[v] += n
            store_counts[v] += 1 if n else 0
    total = sum(counts.values())
    cards = []
    for v in VERDICTS:
        zero = " zero" if not counts[v] else ""
        in_stores = store_counts[v]
        cards.append(
            f'<li class="count v-{v}{zero}"><span class="n">{counts[v]:,}</span>'
            f'<span class="lab">{v}</span><span class="sub">in {in_stores:,} '
            f"store{'s' if in_stores != 1 else ''}</span></li>"
        )
    ratio_bar = "".join(
        f'<span class="v-{v}" style="flex:{counts[v]}" title="{counts[v]:,} {v}"></span>'
        for v in VERDICTS
        if counts[v]
    )
    worst_counts = dict.fromkeys(VERDICTS, 0)
    for s in stores:
        worst_counts[VERDICTS[len(VERDICTS) - 1 - s.worst]] += 1
    boxes = "".join(
        f'<label class="f v-{v}"><input type="checkbox" value="{v}" checked> {v}</label>'
        for v in VERDICTS
    )
    return (
        '<section id="summary" aria-labelledby="summary-h"><h2 id="summary-h">Summary</h2>'
        f'<p class="meta">{total:,} records from {len(stores):,} stores'
        f" (by worst verdict: {_esc(_count_text(worst_counts)) or 'none'}) · generated {when}</p>"
        f'<ul class="counts" aria-label="records per verdict, worst first">{"".join(cards)}</ul>'
        f'<div class="ratio" aria-hidden="true">{ratio_bar}</div>'
        '<form id="filter" class="filter" hidden><fieldset><legend>Show stores with</legend>'
        f'{boxes}</fieldset><p id="shown" aria-live="polite"></p></form>'
        f"{_settings_html(settings)}</section>"
    )


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
.chart .spike{fill:var(--fail);stroke:#fff;stroke-width:1.5}
.chart .nan rect{fill:var(--error);opacity:.16}.chart .nan-tick{fill:var(--error)}
.bars rect{fill:#7c93ab}.bars rect.flag{fill:var(--fail)}
.chart .limit{stroke:var(--fail);stroke-dasharray:4 3;fill:none}
.key{white-space:nowrap;margin-right:10px}
.key:before{content:"";display:inline-block;width:16px;height:0;vertical-align:middle;
margin-right:4px;border-top:2px solid var(--loss)}
.k-trend:before{border-top:2px dashed #6b7280}
.k-spike:before{width:9px;height:9px;border:0;border-radius:50%;background:var(--fail)}
.k-nan:before{width:6px;height:12px;border:0;background:var(--error);opacity:.5}
.mods{font-size:.8rem;width:100%;margin-top:4px}
.mods caption{text-align:left;font-weight:600;color:var(--muted)}
.mods th{text-align:left;color:var(--muted);font-weight:600}
.mods td{padding:1px 4px;border-top:1px solid var(--line)}
.mod{font-family:ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:anywhere}
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
.chart.curve text{font-size:15px}
.plot,.plot.wide{flex-basis:100%;max-width:none}
.compact thead{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}
.compact tr{display:grid;grid-template-columns:1fr auto}
.compact td{border:0}.compact tr{border-top:1px solid var(--line);border-left:5px solid var(--c)}
.compact .c-n{border-left:0}
.compact .c-m{grid-column:1/-1;padding-top:0}
}
"""

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
    stores = _group(records)
    ratio = _ghost_ratio(settings)
    machine, human = _when(generated_at)
    when = f'<time datetime="{_esc(machine)}">{_esc(human)}</time>'

    def by_badness(s: _Store) -> tuple[Any, ...]:
        return (-s.worst, -s.counts()[VERDICTS[len(VERDICTS) - 1 - s.worst]], s.name, s.path)

    problems = sorted((s for s in stores if s.worst >= PROBLEM), key=by_badness)
    healthy = sorted((s for s in stores if s.worst < PROBLEM), key=by_badness)
    limit = max(0, plot_limit)
    detailed, overflow = problems[:limit], problems[limit:]
    left = max(0, limit - len(detailed))
    folded, rest = healthy[:left], healthy[left:]

    body: list[str] = [_summary(stores, settings, when)]
    body.append(
        '<section id="problems" aria-labelledby="problems-h">'
        f'<h2 id="problems-h">Stores needing attention ({len(problems):,})</h2>'
    )
    if not problems:
        body.append('<p class="note">None: every record passed or was skipped.</p>')
    body.extend(_store_card(s, ratio) for s in detailed)
    if overflow:
        body.append(
            f'<p class="note">Plots are drawn for the worst {len(detailed)} stores only; '
            f"{len(overflow):,} more are listed below, worst first.</p>"
        )
        body.append(_compact_table(overflow, f"{len(overflow):,} more stores needing attention"))
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
            f'<details class="more"><summary>{_esc(caption)} (table, no plots)</summary>'
            f"{_compact_table(rest, caption)}</details>"
        )
    body.append("</section>")

    if not stores:
        body.insert(1, '<p class="note">This scan produced no records.</p>')
    base = _common_base([s.path for s in stores])
    root = f" · stores under {_esc(base)}" if base else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="generator" content="adapterprobe">'
        f"<title>{_esc(title)}</title><style>{CSS}</style></head>\n"
        f'<body><header class="top"><h1>{_esc(title)}</h1>'
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
    return atomic_write_text(path, render_html(records, **kw))
