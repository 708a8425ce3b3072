"""A small SVG chart toolkit: scales, round ticks, downsampling, axes, line
paths, bar charts and overlaid curves, as strings of inline SVG.

It knows nothing of probes, records or the report page: callers hand it numbers
and labels and get markup back, so the scan page, a comparison page or a
notebook's ``_repr_html_`` can draw with the same pieces. Output is small on
purpose (one decimal per coordinate, downsampled curves, bucketed bars) and every
label is escaped here.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

from adapterprobe.escape import xml_text

MAX_BARS = 128  # bars per chart (more layers are bucketed)

# Text layout. SVG text cannot be measured here, so its width is estimated
# from its length; these sizes are in the chart's own units (the page's CSS
# sets the font size in them).
FONT = 11.0  # px of chart text on the report page
CHAR_EM = 0.6  # a character's width in em (generous for digits)
ASCENT, DESCENT = 0.95, 0.25  # the text's box above and below its baseline, in em
TICK_GAP = 5.0  # from the y axis to the right end of its tick labels
TITLE_GAP = 4.0  # from the widest y tick label to the y axis title
EDGE = 1.0  # kept clear at the picture's left edge


# ---------------------------------------------------------------------------
# Text in markup


def esc(value: Any) -> str:
    """Any value as text safe inside an element or a quoted attribute, its
    control characters (a terminal's escape sequences, should the page be
    printed) and undecodable bytes shown as ``\\xNN``
    (:func:`adapterprobe.escape.xml_text`)."""
    text = str(value)
    return html.escape(text, quote=True) if text.isprintable() else xml_text(text)


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


def text_width(text: str, font: float = FONT) -> float:
    """A generous estimate of how wide one line of `text` is at `font` px
    (0.6 em a character: digits, dots and signs are narrower)."""
    return len(text) * CHAR_EM * font


def y_gutter(labels: list[str], font: float = FONT) -> float:
    """The room the y axis needs left of the plot: the gap, the widest tick
    label, another gap and the rotated title, clear of the picture's edge."""
    widest = max((text_width(t, font) for t in labels), default=0.0)
    return TICK_GAP + widest + TITLE_GAP + (ASCENT + DESCENT) * font + EDGE


def fit_box(
    box: tuple[float, float, float, float], y_ticks: list[float], font: float = FONT
) -> tuple[float, float, float, float]:
    """`box` (left, top, right, bottom) with its left edge moved right where
    the y tick labels and the title need more room than it leaves."""
    left, top, right, bottom = box
    return (max(left, y_gutter([num(t) for t in y_ticks], font)), top, right, bottom)


def y_title(
    label: str, left: float, top: float, bottom: float, ticks: list[str], font: float
) -> str:
    """The y axis's title, rotated, centred on the plot's height and set left
    of the widest tick label (whose right ends sit TICK_GAP left of `left`):
    rotated by -90°, the text's em box spans from ASCENT em left of its
    baseline to DESCENT em right of it."""
    widest = max((text_width(t, font) for t in ticks), default=0.0)
    x = left - TICK_GAP - widest - TITLE_GAP - DESCENT * font
    x = max(x, ASCENT * font + EDGE)  # on the picture, should a caller not fit_box
    return (
        f'<text class="yl" transform="translate({px(x)} {px((top + bottom) / 2)}) rotate(-90)">'
        f"{esc(label)}</text>"
    )


def axes(
    sx: Scale,
    sy: Scale,
    box: tuple[float, float, float, float],
    x_label: str,
    y_label: str,
    x_ticks: list[float],
    y_ticks: list[float],
    font: float = FONT,
) -> str:
    """Grid lines, the two axis lines, tick labels and axis titles for a plot area
    `box` (left, top, right, bottom; see :func:`fit_box` for room for the y
    labels); `font` is the largest size the page draws the text at."""
    left, top, right, bottom = box
    grid = "".join(f"M{px(left)},{px(sy(t))}H{px(right)}" for t in y_ticks)
    out = [f'<path class="grid" d="{grid}"/>'] if grid else []
    out.append(f'<path class="axis" d="M{px(left)},{px(top)}V{px(bottom)}H{px(right)}"/>')
    labels = [num(t) for t in y_ticks]
    for t, text in zip(y_ticks, labels, strict=True):
        out.append(f'<text class="yt" x="{px(left - TICK_GAP)}" y="{px(sy(t) + 4)}">{text}</text>')
    for t in x_ticks:
        out.append(f'<text class="xt" x="{px(sx(t))}" y="{px(bottom + 15)}">{num(t)}</text>')
    out.append(f'<text class="xl" x="{px((left + right) / 2)}" y="{px(bottom + 30)}">')
    out.append(f"{esc(x_label)}</text>")
    out.append(y_title(y_label, left, top, bottom, labels, font))
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
    font: float = FONT,
) -> str:
    """A bar per layer; flagged layers stand out, an optional dashed limit line."""
    items, flagged = bucket_bars(items, flagged)
    _, top, right, bottom = BARS_BOX
    values = [v for _, v in items] + ([threshold[0]] if threshold else [])
    sx_n = len(items)
    sy = Scale(min(0.0, *values), max(values), bottom, top)
    sy.hi += (sy.hi - sy.lo) * 0.05
    y_ticks = sy.ticks(3)
    tick_labels = [num(t) for t in y_ticks]
    left = fit_box(BARS_BOX, y_ticks, font)[0]
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
    grid = "".join(f"M{px(left)},{px(sy(t))}H{px(right)}" for t in y_ticks)
    out.append(f'<path class="grid" d="{grid}"/>')
    for t, text in zip(y_ticks, tick_labels, strict=True):
        out.append(f'<text class="yt" x="{px(left - TICK_GAP)}" y="{px(sy(t) + 4)}">{text}</text>')
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
    out.append(y_title(y_label, left, top, bottom, tick_labels, font))
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------------------
# Curves overlaid

# Line colours of overlaid curves, in order (distinct for the first 12).
PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#393b79",
    "#7f7f7f",
    "#8c6d31",
)


@dataclass
class Line:
    """One curve of an overlay: its name (escaped here), colour, class
    (``""`` for none) and (x, y) points, a None y a gap."""

    label: str
    colour: str
    points: list[tuple[float, float | None]]
    cls: str = ""


def overlay_chart(
    lines: list[Line],
    uid: str,
    title: str,
    *,
    size: tuple[int, int],
    box: tuple[float, float, float, float],
    log_ratio: float,
    max_points: int,
    pad: float = 0.0,
    x_label: str = "step",
    y_label: str = "loss",
    cls: str = "chart curves",
    font: float = FONT,
) -> tuple[str, bool]:
    """Curves on one chart by x, each a path of its own colour titled with
    its label: the SVG, and whether y is on a log axis (when the positive
    finite ys span a factor of `log_ratio`: a blown-up run beside healthy
    ones; a y of 0 or below, such as a trainer's masked NaN loss, is then a
    gap in its curve rather than a reason to flatten the others on a linear
    axis). Each curve is downsampled to `max_points`; `pad` widens y by that
    share of its span. ``("", False)`` when no curve has a finite point."""
    drawn: list[tuple[Line, list[tuple[float, float | None]]]] = []
    for line in lines:
        pts = [
            (x, y if y is not None and math.isfinite(y) else None)
            for x, y in line.points
            if math.isfinite(x)
        ]
        if any(y is not None for _, y in pts):
            drawn.append((line, downsample(pts, max_points)))
    if not drawn:
        return "", False
    xs = [x for _, pts in drawn for x, _ in pts]
    ys = [y for _, pts in drawn for _, y in pts if y is not None]
    positive = [y for y in ys if y > 0]
    log = bool(positive) and max(positive) / min(positive) >= log_ratio
    if log:
        drawn = [
            (line, [(x, y if y is None or y > 0 else None) for x, y in pts]) for line, pts in drawn
        ]
        ys = positive
    y_lo, y_hi = min(ys), max(ys)
    sy = Scale(y_lo, y_hi, box[3], box[1], log=log)
    span = (sy.hi - sy.lo) * pad
    sy.lo, sy.hi = sy.lo - span, sy.hi + span
    y_ticks = sy.ticks(5)
    box = fit_box(box, y_ticks, font)
    sx = Scale(min(xs), max(xs), box[0], box[2])
    names = ", ".join(clip(line.label, 60) for line, _ in drawn[:12])
    desc = (
        f"{len(drawn)} curve{'s' if len(drawn) != 1 else ''} by {x_label}"
        + (" (log scale)" if log else "")
        + f": {names}"
        + (f" and {len(drawn) - 12} more" if len(drawn) > 12 else "")
    )
    out = [svg_open(uid, size[0], size[1], title, desc, cls)]
    label = f"{y_label} (log scale)" if log else y_label
    out.append(axes(sx, sy, box, x_label, label, sx.ticks(6, integer=True), y_ticks, font))
    for line, pts in drawn:
        attr = f' class="{esc(line.cls)}"' if line.cls else ""
        out.append(
            f'<path{attr} d="{line_path(pts, sx, sy)}" fill="none" stroke="{esc(line.colour)}" '
            f'stroke-width="1.4"><title>{esc(line.label)}</title></path>'
        )
    out.append("</svg>")
    return "".join(out), log
