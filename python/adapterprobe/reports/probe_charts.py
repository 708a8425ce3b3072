"""The charts of each probe's evidence: the training_drift loss curve (and the
loss curves of many runs on one chart), the gradient_ghost per-layer bars and
adapter_weights' delta energy and modules.

This is the one place that knows which evidence keys a probe writes and how to
draw them (:data:`DRAWN` lists the keys, so the page does not repeat them as
facts). It reads evidence through the typed accessors of
:mod:`adapterprobe._evidence` (a value of the wrong shape, as a saved scan
may hold, is absent: the chart is left out, never an error) and draws
with :mod:`adapterprobe.reports.svg`; where a chart sits on the page is the
page's business.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from adapterprobe._evidence import (
    as_pairs,
    layer_numbers,
    mapping,
    names,
    natural_key,
    number,
    objects,
    pairs,
    steps,
    text,
)
from adapterprobe.reports.shaping import Record
from adapterprobe.reports.svg import (
    PALETTE,
    Line,
    Scale,
    axes,
    bar_chart,
    clip,
    dotted_name,
    downsample,
    esc,
    fit_box,
    line_path,
    num,
    overlay_chart,
    px,
    svg_open,
)

MAX_POINTS = 300  # points per drawn curve
MAX_MARKS = 120  # spike markers / non-finite bands per chart
LOG_RATIO = 30.0  # a positive curve spanning this factor is drawn on a log axis

# Evidence keys that are drawn rather than listed as facts.
DRAWN = frozenset(
    {
        "curve_sampled",
        "trend_sampled",
        "eval_loss_sampled",
        "grad_norm_sampled",
        "learning_rate_sampled",
        "spike_steps",
        "nonfinite_steps",
        "layer_exp_avg_sq",
        "flagged_layers",
        "worst_layers",
        "layer_delta_energy",
        "dead_modules",
        "top_modules",
        "thresholds",
        "layer_grad_norms",
        "run_facts_text",  # its own line (html.run_line)
    }
)
MAX_LAYER_LINES = 24  # per-layer gradient norm lines drawn (flagged layers first)


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
            parts.append(f"{num(run[0])}–{num(run[-1])}")
        else:
            parts.extend(num(s) for s in run)
    shown = ", ".join(parts[:limit])
    return shown + (f" and {len(parts) - limit} more" if len(parts) > limit else "")


# ---------------------------------------------------------------------------
# Loss curve (training_drift)

CURVE_W, CURVE_H = 520, 230
CURVE_BOX = (58.0, 14.0, 508.0, 190.0)  # left, top, right, bottom (left: at least)
PHONE_FONT = 15.0  # the page's CSS draws the loss charts' text this big on a phone


def loss_points(rec: Record) -> list[tuple[float, float | None]]:
    """training_drift's sampled loss curve as (step, loss) pairs by step, None
    where the loss was not finite."""
    return pairs(rec.evidence, "curve_sampled", allow_null=True)


def loss_figure(rec: Record, uid: str, store_name: str) -> str:
    """The training_drift loss curve with its trend, spikes and non-finite steps."""
    ev = rec.evidence
    curve = loss_points(rec)
    finite = [(x, y) for x, y in curve if y is not None]
    if not finite:
        return ""
    trend = [(x, y) for x, y in pairs(ev, "trend_sampled") if y is not None]
    evals = [(x, y) for x, y in pairs(ev, "eval_loss_sampled") if y is not None]
    spikes = steps(ev, "spike_steps")
    nonfinite = sorted(set(steps(ev, "nonfinite_steps")) | {x for x, y in curve if y is None})

    xs = [x for x, _ in curve] + [x for x, _ in trend] + [x for x, _ in evals]
    ys = [y for _, y in finite] + [y for _, y in trend] + [y for _, y in evals]
    y_lo, y_hi = min(ys), max(ys)
    log = y_lo > 0 and y_hi / y_lo >= LOG_RATIO
    sy = Scale(y_lo, y_hi, CURVE_BOX[3], CURVE_BOX[1], log=log)
    pad = (sy.hi - sy.lo) * 0.05
    sy.lo, sy.hi = sy.lo - pad, sy.hi + pad
    y_ticks = sy.ticks(5)
    box = fit_box(CURVE_BOX, y_ticks, PHONE_FONT)
    left, top, right, bottom = box
    sx = Scale(min(xs), max(xs), left, right)

    in_range = [s for s in spikes if sx.lo <= s <= sx.hi]
    nan_in = [s for s in nonfinite if sx.lo <= s <= sx.hi]
    desc = (
        f"{len(finite)} finite loss values from step {num(finite[0][0])} to "
        f"{num(finite[-1][0])}, loss {num(finite[0][1])} to {num(finite[-1][1])}"
        + (" (log scale)" if log else "")
        + (f"; {len(evals)} eval loss values" if evals else "")
        + (f"; loss spikes at steps {_step_list(spikes)}" if spikes else "")
        + (f"; non-finite loss at steps {_step_list(nonfinite)}" if nonfinite else "")
    )
    out = [svg_open(uid, CURVE_W, CURVE_H, f"Loss curve of {store_name}", desc, "chart curve")]
    out.append(
        axes(
            sx,
            sy,
            box,
            "step",
            "loss (log scale)" if log else "loss",
            sx.ticks(6, integer=True),
            y_ticks,
            PHONE_FONT,
        )
    )
    if nan_in:
        seen: set[str] = set()
        bands = []
        for s in nan_in:
            x = px(sx(s) - 1.5)
            if x not in seen and len(seen) < MAX_MARKS:
                seen.add(x)
                bands.append(f'<rect x="{x}" y="{px(top)}" width="3" height="{px(bottom - top)}"/>')
                bands.append(f'<path class="nan-tick" d="M{px(sx(s))},{px(top + 7)}l-4,-7h8z"/>')
        out.append(f'<g class="nan" data-steps="{" ".join(num(s) for s in nan_in)}">')
        out.append("".join(bands) + "</g>")
    if trend:
        line = line_path(downsample(list(trend), MAX_POINTS), sx, sy)
        out.append(f'<path class="trend" d="{line}"/>')
    out.append(f'<path class="loss" d="{line_path(downsample(curve, MAX_POINTS), sx, sy)}"/>')
    if evals:
        shown = downsample(list(evals), MAX_POINTS)
        out.append(f'<path class="eval" d="{line_path(shown, sx, sy)}"/>')
        out.append(
            '<g class="evalpts">'
            + "".join(
                f'<circle cx="{px(sx(x))}" cy="{px(sy(y))}" r="2.5"/>'
                for x, y in shown
                if y is not None
            )
            + "</g>"
        )
    if in_range:
        finite_x = [x for x, _ in finite]
        marks = []
        for s in in_range[:MAX_MARKS]:
            i = bisect_left(finite_x, s)
            near = [j for j in (i - 1, i) if 0 <= j < len(finite_x)]
            j = min(near, key=lambda k: (abs(finite_x[k] - s), k))
            y = finite[j][1]
            assert y is not None
            marks.append(
                f'<circle class="spike" data-step="{num(s)}" cx="{px(sx(s))}" '
                f'cy="{px(sy(y))}" r="4"><title>loss spike at step {num(s)}</title></circle>'
            )
        out.append(f'<g class="spikes">{"".join(marks)}</g>')
    out.append("</svg>")

    legend = ['<span class="key k-loss">loss</span>']
    if trend:
        legend.append('<span class="key k-trend">trend</span>')
    if evals:
        legend.append('<span class="key k-eval">eval loss</span>')
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


# ---------------------------------------------------------------------------
# The loss curves of many runs on one chart

OVERLAY_RUNS = len(PALETTE)  # curves drawn at most, each its own colour
OVERLAY_W, OVERLAY_H = 640, 260
OVERLAY_BOX = (58.0, 14.0, 628.0, 220.0)  # left, top, right, bottom (left: at least)


def overlay_figure(runs: list[tuple[str, list[tuple[float, float | None]]]], uid: str) -> str:
    """The loss curves of `runs` ((name, :func:`loss_points`) pairs, at most
    OVERLAY_RUNS) by step on one chart, log y where the store's own loss chart
    would use it; run ``i``'s path has the classes ``ov-line`` and
    ``{uid}-{i}`` (for a picker to hide it). Empty when nothing is finite."""
    lines = [
        Line(name, PALETTE[i % len(PALETTE)], pts, f"ov-line {uid}-{i}")
        for i, (name, pts) in enumerate(runs)
    ]
    chart, log = overlay_chart(
        lines,
        uid,
        f"Training loss of {len(lines)} run{'s' if len(lines) != 1 else ''}",
        size=(OVERLAY_W, OVERLAY_H),
        box=OVERLAY_BOX,
        log_ratio=LOG_RATIO,
        max_points=MAX_POINTS,
        pad=0.05,
        cls="chart overlay",
        font=PHONE_FONT,
    )
    if not chart:
        return ""
    return (
        '<figure class="plot wide ov-fig"><p class="ptitle" aria-hidden="true">Training loss '
        f"by step{' (log scale)' if log else ''}</p>{chart}</figure>"
    )


def grad_norm_figure(rec: Record, uid: str, store_name: str) -> str:
    """The gradient norm logged beside the loss (log axis when it spans decades),
    with its non-finite steps marked; empty when the logs had none."""
    points = pairs(rec.evidence, "grad_norm_sampled", allow_null=True)
    finite = [(x, y) for x, y in points if y is not None]
    if len(finite) < 2:
        return ""
    bad = [x for x, y in points if y is None]
    ys = [y for _, y in finite]
    y_lo, y_hi = min(ys), max(ys)
    log = y_lo > 0 and y_hi / y_lo >= LOG_RATIO
    sy = Scale(y_lo, y_hi, CURVE_BOX[3], CURVE_BOX[1], log=log)
    pad = (sy.hi - sy.lo) * 0.05
    sy.lo, sy.hi = sy.lo - pad, sy.hi + pad
    y_ticks = sy.ticks(5)
    box = fit_box(CURVE_BOX, y_ticks)
    left, top, right, bottom = box
    sx = Scale(min(x for x, _ in points), max(x for x, _ in points), left, right)
    desc = (
        f"{len(finite)} finite gradient norms from step {num(finite[0][0])} to "
        f"{num(finite[-1][0])}, {num(y_lo)} to {num(y_hi)}"
        + (f"; non-finite at steps {_step_list(bad)}" if bad else "")
    )
    out = [
        svg_open(uid, CURVE_W, CURVE_H, f"Gradient norm of {store_name}", desc, "chart gradnorm")
    ]
    label = "grad norm (log scale)" if log else "grad norm"
    out.append(axes(sx, sy, box, "step", label, sx.ticks(6, integer=True), y_ticks))
    for x in bad[:MAX_MARKS]:
        out.append(
            f'<g class="nan"><rect x="{px(sx(x) - 1.5)}" y="{px(top)}" width="3" '
            f'height="{px(bottom - top)}"/></g>'
        )
    drawn: list[tuple[float, float | None]] = list(finite)
    out.append(f'<path class="grad" d="{line_path(downsample(drawn, MAX_POINTS), sx, sy)}"/>')
    out.append("</svg>")
    legend = '<span class="key k-grad">gradient norm</span>' + (
        f' <span class="key k-nan">non-finite: steps {_step_list(bad, 6)}</span>' if bad else ""
    )
    return (
        '<figure class="plot wide"><p class="ptitle" aria-hidden="true">Gradient norm'
        f"{' (log scale)' if log else ''}</p>{''.join(out)}<figcaption>{legend}</figcaption>"
        "</figure>"
    )


def layer_grad_figure(rec: Record, uid: str, store_name: str) -> str:
    """gap_monitor's per-layer gradient norms over the sampled steps, on a log
    axis, the layer a rule names drawn in red; empty without two points."""
    ev = rec.evidence
    layers = mapping(ev, "layer_grad_norms")
    hot = {text(ev, "exploding_layer") or ""} | set(names(ev, "vanishing_layers"))
    lines: list[tuple[str, list[tuple[float, float]]]] = []
    for name, series in layers.items():
        pts = [(x, y) for x, y in as_pairs(series) if y is not None and y > 0]
        if len(pts) >= 2:
            lines.append((str(name), pts))
    if not lines:
        return ""
    lines.sort(key=lambda item: (item[0] not in hot, natural_key(item[0])))
    lines = lines[:MAX_LAYER_LINES]
    xs = [x for _, pts in lines for x, _ in pts]
    ys = [y for _, pts in lines for _, y in pts]
    y_lo, y_hi = min(ys), max(ys)
    sy = Scale(y_lo, y_hi if y_hi > y_lo else y_lo * 10, CURVE_BOX[3], CURVE_BOX[1], log=True)
    y_ticks = sy.ticks(5)
    box = fit_box(CURVE_BOX, y_ticks)
    sx = Scale(min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, box[0], box[2])
    flagged = [name for name, _ in lines if name in hot]
    desc = (
        f"gradient norm of {len(lines)} layers from step {num(min(xs))} to {num(max(xs))}, "
        f"{num(y_lo)} to {num(y_hi)}"
        + (f"; flagged: {', '.join(clip(n, 40) for n in flagged)}" if flagged else "")
    )
    out = [
        svg_open(uid, CURVE_W, CURVE_H, f"Per-layer gradient norms of {store_name}", desc, "chart")
    ]
    out.append(axes(sx, sy, box, "step", "layer grad norm (log)", sx.ticks(6, True), y_ticks))
    for name, pts in reversed(lines):  # flagged layers last: drawn on top
        cls = "layer hot" if name in hot else "layer"
        drawn: list[tuple[float, float | None]] = list(pts)
        path = line_path(downsample(drawn, MAX_POINTS), sx, sy)
        out.append(f'<path class="{cls}" d="{path}"><title>{esc(name)}</title></path>')
    out.append("</svg>")
    legend = '<span class="key k-grad">each layer (hover for its name)</span>' + (
        f' <span class="key k-nan">flagged: {esc(", ".join(clip(n, 40) for n in flagged))}</span>'
        if flagged
        else ""
    )
    return (
        '<figure class="plot wide"><p class="ptitle" aria-hidden="true">Gradient norm per layer '
        f"(log scale)</p>{''.join(out)}<figcaption>{legend}</figcaption></figure>"
    )


# ---------------------------------------------------------------------------
# Layer bars (gradient_ghost)


def ghost_chart(rec: Record, uid: str, ratio: float) -> str:
    ev = rec.evidence
    if text(ev, "rules") == "robust":
        return _robust_ghost_chart(ev, uid)
    items = layer_numbers(ev, "layer_exp_avg_sq")
    if items:
        flagged = set(names(ev, "flagged_layers"))
        low = min(v for _, v in items)
        limit = (low * ratio, f"{num(ratio)}× calmest") if low > 0 else None
        return bar_chart(items, flagged, uid, "Mean Adam exp_avg_sq per layer", "exp_avg_sq", limit)
    items = [
        (str(w.get("layer")), r)
        for w in objects(ev, "worst_layers")
        if (r := number(w, "ratio")) is not None
    ]
    items.sort(key=lambda kv: natural_key(kv[0]))
    if items:
        flagged = {k for k, v in items if v > ratio}
        return bar_chart(
            items,
            flagged,
            uid,
            "exp_avg_sq of the worst layers vs the calmest",
            "× calmest",
            (ratio, f"{num(ratio)}× limit"),
        )
    return ""


def _robust_ghost_chart(ev: Mapping[str, Any], uid: str) -> str:
    """rules="robust": each layer against its peers when the layers were
    compared (the outlier limit drawn), else each layer's mean second moment."""
    flagged = set(names(ev, "flagged_layers"))
    scores = layer_numbers(ev, "layer_ratio_to_peers")
    if scores:
        limit = number(mapping(ev, "thresholds"), "layer_outlier_ratio")
        title = "Second moments per layer vs the same tensors in the other layers"
        # A limit far above every bar would flatten them: named, not drawn.
        drawn = limit is not None and max(v for _, v in scores) >= limit / 10
        if limit is not None and not drawn:
            title += f" (WARN above {num(limit)}×)"
        line = (limit, f"{num(limit)}× limit") if drawn and limit is not None else None
        return bar_chart(scores, flagged, uid, title, "× peers", line)
    means = layer_numbers(ev, "layer_exp_avg_sq")
    if means:
        return bar_chart(
            means, flagged, uid, "Mean Adam exp_avg_sq per layer (not compared)", "exp_avg_sq"
        )
    return ""


# ---------------------------------------------------------------------------
# Delta energy and modules (adapter_weights)


def weights_chart(rec: Record, uid: str) -> str:
    ev = rec.evidence
    out = []
    items = layer_numbers(ev, "layer_delta_energy")
    if items:
        out.append(bar_chart(items, set(), uid, "Adapter delta energy per layer", "energy"))
    rows = []
    for item in objects(ev, "top_modules")[:10]:
        share = number(item, "share")
        pct = "—" if share is None else f"{share * 100:.1f}%"
        width = 0.0 if share is None else max(0.0, min(100.0, share * 100))
        module = text(item, "module") or ""
        rows.append(
            f'<tr><td class="mod">{dotted_name(clip(module, 120))}</td>'
            f'<td class="share"><span class="sbar" style="width:{width:.0f}%"></span>'
            f"{pct}</td></tr>"
        )
    if rows:
        out.append(
            '<table class="mods"><caption>Top modules by share of delta energy</caption>'
            '<thead><tr><th scope="col">module</th><th scope="col">share</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
    dead = names(ev, "dead_modules")
    if dead:
        shown = ", ".join(clip(d, 120) for d in dead[:12])
        more = f" and {len(dead) - 12} more" if len(dead) > 12 else ""
        out.append(
            f'<p class="dead"><b>{len(dead)} dead module{"s" if len(dead) != 1 else ""}</b> '
            f"(no change from the base): {esc(shown)}{more}</p>"
        )
    return "".join(out)
