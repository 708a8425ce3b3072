"""A small SVG chart toolkit: scales, round ticks, downsampling, axes, line
paths and bar charts, as strings of inline SVG.

It knows nothing of probes, records or the report page: callers hand it numbers
and labels and get markup back, so the scan page, a comparison page or a
notebook's ``_repr_html_`` can draw with the same pieces. Output is small on
purpose (one decimal per coordinate, downsampled curves, bucketed bars) and every
label is escaped here.
"""

from __future__ import annotations

import html
import math
from typing import Any

from adapterprobe.escape import surrogates_visible

MAX_BARS = 128  # bars per chart (more layers are bucketed)


# ---------------------------------------------------------------------------
# Text in markup


def esc(value: Any) -> str:
    """Any value as text safe inside an element or a quoted attribute."""
    return html.escape(surrogates_visible(str(value)), quote=True)


def dotted_name(value: Any) -> str:
    """A dotted module name as HTML that wraps at its dots
    (``layers.0.<wbr>self_attn.<wbr>q_proj``), not in the middle of a word."""
    return esc(value).replace(".", ".<wbr>")


def clip(text: str, limit: int) -> str:
    """At most `limit` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def num(value: float) -> str:
    """A number for people: 4 significant digits, short exponents."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    text = f"{value:.4g}"
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def px(value: float) -> str:
    """An SVG coordinate: one decimal is plenty and keeps the file small."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


# ---------------------------------------------------------------------------
# Axes


def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """About `count` round tick values covering [lo, hi]."""
    span = hi - lo
    if not span > 0:
        return [lo]
    if span == math.inf:  # both ends finite, their distance is not
        return [lo, hi]
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * mag
        if span / step <= count:
            break
    if integer:
        step = max(1.0, float(round(step)))
    first = math.ceil(lo / step - 1e-9)
    ticks: list[float] = []
    # Bounded: about `count` ticks fit; where the values are so large that
    # float steps stop moving (1e20 + 1), a few more tries change nothing.
    for i in range(first, first + 2 * count + 3):
        value = round(float(i) * step, 12)
        if not value <= hi + step * 1e-9:  # past the end, or overflowed
            break
        if not ticks or value > ticks[-1]:
            ticks.append(value)
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values for a log axis spanning log10 values [lo, hi]."""
    # Decades a float can show (10.0**-324 is 0, 10.0**309 overflows).
    lo, hi = max(lo, -307.0), min(hi, 307.0)
    decades = list(range(math.ceil(lo - 1e-9), math.floor(hi + 1e-9) + 1))
    if len(decades) >= 2:
        every = max(1, math.ceil(len(decades) / 6))
        return [10.0**d for d in decades[::every]]
    values = nice_ticks(10**lo, 10**hi, 4)
    return [v for v in values if v > 0 and lo - 1e-9 <= math.log10(v) <= hi + 1e-9]


class Scale:
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
        if self.log:  # what a log axis cannot place goes to its edge
            v = math.log10(value) if 0 < value < math.inf else self.lo if value <= 0 else self.hi
        else:
            v = value
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def ticks(self, count: int, integer: bool = False) -> list[float]:
        if self.log:
            return log_ticks(self.lo, self.hi)
        return nice_ticks(self.lo, self.hi, count, integer)


def downsample(
    points: list[tuple[float, float | None]], limit: int
) -> list[tuple[float, float | None]]:
    """At most `limit` points keeping each bucket's lowest and highest y (so
    spikes survive) and its gaps (a None y, such as a non-finite loss, breaks
    the line)."""
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


def line_path(points: list[tuple[float, float | None]], sx: Scale, sy: Scale) -> str:
    """SVG path data; a None y lifts the pen, a lone point becomes a dot."""
    parts: list[str] = []
    run = 0
    for x, y in points:
        if y is None:
            if run == 1:
                parts.append("h0")
            run = 0
            continue
        parts.append(("L" if run else "M") + f"{px(sx(x))},{px(sy(y))}")
        run += 1
    if run == 1:
        parts.append("h0")
    return "".join(parts)


def axes(
    sx: Scale,
    sy: Scale,
    box: tuple[float, float, float, float],
    x_label: str,
    y_label: str,
    x_ticks: list[float],
    y_ticks: list[float],
) -> str:
    """Grid lines, the two axis lines, tick labels and axis titles for a plot area
    `box` (left, top, right, bottom)."""
    left, top, right, bottom = box
    grid = "".join(f"M{px(left)},{px(sy(t))}H{px(right)}" for t in y_ticks)
    out = [f'<path class="grid" d="{grid}"/>'] if grid else []
    out.append(f'<path class="axis" d="M{px(left)},{px(top)}V{px(bottom)}H{px(right)}"/>')
    for t in y_ticks:
        out.append(f'<text class="yt" x="{px(left - 5)}" y="{px(sy(t) + 4)}">{num(t)}</text>')
    for t in x_ticks:
        out.append(f'<text class="xt" x="{px(sx(t))}" y="{px(bottom + 15)}">{num(t)}</text>')
    mid_y = (top + bottom) / 2
    out.append(f'<text class="xl" x="{px((left + right) / 2)}" y="{px(bottom + 30)}">')
    out.append(f"{esc(x_label)}</text>")
    out.append(f'<text class="yl" transform="translate(13 {px(mid_y)}) rotate(-90)">')
    out.append(f"{esc(y_label)}</text>")
    return "".join(out)


def svg_open(uid: str, width: int, height: int, title: str, desc: str, cls: str) -> str:
    """An opening ``<svg>`` tag with an accessible title and description; `uid`
    must be unique in the page."""
    return (
        f'<svg class="{cls}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{uid}-t {uid}-d"><title id="{uid}-t">{esc(title)}</title>'
        f'<desc id="{uid}-d">{esc(desc)}</desc>'
    )


# ---------------------------------------------------------------------------
# Bar charts

BARS_W, BARS_H = 320, 160
BARS_BOX = (50.0, 10.0, 312.0, 122.0)


def bucket_bars(
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


def bar_chart(
    items: list[tuple[str, float]],
    flagged: set[str],
    uid: str,
    title: str,
    y_label: str,
    threshold: tuple[float, str] | None = None,
) -> str:
    """A bar per layer; flagged layers stand out, an optional dashed limit line."""
    items, flagged = bucket_bars(items, flagged)
    left, top, right, bottom = BARS_BOX
    values = [v for _, v in items] + ([threshold[0]] if threshold else [])
    sx_n = len(items)
    sy = Scale(min(0.0, *values), max(values), bottom, top)
    sy.hi += (sy.hi - sy.lo) * 0.05
    width = (right - left) / sx_n
    gap = width * 0.18 if width > 4 else 0.0
    zero = sy(max(sy.lo, 0.0))
    flagged_names = [k for k, _ in items if k in flagged]
    desc = f"{sx_n} bars, highest {num(max(v for _, v in items))}" + (
        f"; flagged: layers {', '.join(flagged_names[:12])}" if flagged_names else ""
    )
    out = [
        f'<p class="ptitle" aria-hidden="true">{esc(title)}</p>',
        svg_open(uid, BARS_W, BARS_H, title, desc, "chart bars"),
    ]
    every = max(1, math.ceil(sx_n / 12))
    labels = [(i, k) for i, (k, _) in enumerate(items) if i % every == 0]
    grid = "".join(f"M{px(left)},{px(sy(t))}H{px(right)}" for t in sy.ticks(3))
    out.append(f'<path class="grid" d="{grid}"/>')
    for t in sy.ticks(3):
        out.append(f'<text class="yt" x="{px(left - 4)}" y="{px(sy(t) + 4)}">{num(t)}</text>')
    for i, (key, value) in enumerate(items):
        y = sy(value)
        cls = ' class="flag"' if key in flagged else ""
        out.append(
            f'<rect{cls} x="{px(left + i * width + gap / 2)}" y="{px(min(y, zero))}" '
            f'width="{px(max(width - gap, 0.6))}" height="{px(max(abs(zero - y), 0.6))}">'
            f"<title>layer {esc(key)}: {num(value)}</title></rect>"
        )
    for i, key in labels:
        x = left + (i + 0.5) * width
        out.append(f'<text class="xt" x="{px(x)}" y="{px(bottom + 13)}">{esc(clip(key, 8))}</text>')
    if threshold:
        limit_y = px(sy(threshold[0]))
        out.append(f'<path class="limit" d="M{px(left)},{limit_y}H{px(right)}"/>')
        out.append(f'<text class="lt" x="{px(right)}" y="{px(sy(threshold[0]) - 3)}">')
        out.append(f"{esc(threshold[1])}</text>")
    out.append(f'<path class="axis" d="M{px(left)},{px(top)}V{px(bottom)}H{px(right)}"/>')
    out.append(f'<text class="xl" x="{px((left + right) / 2)}" y="{px(bottom + 28)}">layer</text>')
    mid = (top + bottom) / 2
    out.append(f'<text class="yl" transform="translate(11 {px(mid)}) rotate(-90)">')
    out.append(f"{esc(y_label)}</text></svg>")
    return "".join(out)
