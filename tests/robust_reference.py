"""Plain-Python restatement of the robust curve analysis (rust/analysis/robust_curve.rs),
written from its specification, for property tests against the Rust kernel.

Slow on purpose: a sort per window, no sliding structures.
"""

from __future__ import annotations

import math

MAD_TO_SIGMA = 1.4826
Q90_ABS_TO_SIGMA = 1.6448536269514722
#: Our scale estimate of a Student-t(4) variable in its own units: its 95th
#: percentile (the 90th percentile of |T|) over 1.645.
T4_SCALE = 2.131846786326649 / Q90_ABS_TO_SIGMA


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        return math.nan
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def carry_forward(losses: list[float]) -> list[float] | None:
    finite = [v for v in losses if math.isfinite(v)]
    if not finite:
        return None
    last, out = finite[0], []
    for v in losses:
        if math.isfinite(v):
            last = v
        out.append(last)
    return out


def rolling_median(values: list[float], window: int) -> list[float]:
    """Centred windows of half-width window // 2, shrunk symmetrically at the ends."""
    n, h = len(values), window // 2
    out = []
    for i in range(n):
        k = min(h, i, n - 1 - i)
        out.append(median(values[i - k : i + k + 1]))
    return out


def quantile(values: list[float], q: float) -> float:
    """numpy's default (linear) quantile."""
    s = sorted(values)
    at = q * (len(s) - 1)
    lo = math.floor(at)
    frac = at - lo
    return s[lo] + frac * (s[lo + 1] - s[lo]) if frac > 0 else s[lo]


def scale_of(abs_residuals: list[float]) -> float:
    """Larger of 1.4826 x the median and the 90th percentile / 1.645."""
    return max(
        MAD_TO_SIGMA * median(abs_residuals), quantile(abs_residuals, 0.9) / Q90_ABS_TO_SIGMA
    )


def block_scales(residuals: list[float], block: int) -> list[float]:
    n = len(residuals)
    blocks = max(n // max(block, 8), 1)
    return [
        scale_of([abs(r) for r in residuals[b * n // blocks : (b + 1) * n // blocks]])
        for b in range(blocks)
    ]


def t4_upper_tail(t: float) -> float:
    """P(T > t) for Student's t with 4 degrees of freedom (closed form)."""
    u = t / math.sqrt(1 + t * t / 4)
    return 0.5 - 0.375 * u * (1 - u * u / 12)


def spike_threshold(n: int, false_alarm: float, floor: float) -> float:
    """The t4 quantile at per-record probability false_alarm / n, in scale units."""
    p = false_alarm / max(n, 1)
    lo, hi = 0.0, 1.0
    while t4_upper_tail(hi) > p and hi < 1e12:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t4_upper_tail(mid) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return max((lo + hi) / 2 / T4_SCALE, floor)


def scale_allowance(n: int, block: int) -> float:
    """1 + one standard error (1.167 / sqrt(m)) of a scale from m = n // blocks points."""
    blocks = max(n // max(block, 8), 1)
    return 1.0 + 1.167 / math.sqrt(max(n // blocks, 1))


def level_points(n: int) -> int:
    return min(max(n // 20, 3), 10, max(n // 3, 1), n)


def local_scale(residuals: list[float], block: int) -> list[float]:
    n = len(residuals)
    block = max(block, 8)
    blocks = max(n // block, 1)
    centres, scales = [], []
    for b in range(blocks):
        lo, hi = b * n // blocks, (b + 1) * n // blocks
        scales.append(scale_of([abs(r) for r in residuals[lo:hi]]))
        centres.append((lo + hi - 1) / 2)
    out = []
    for i in range(n):
        j = sum(1 for c in centres if c <= i)
        if j == 0:
            out.append(scales[0])
        elif j == blocks:
            out.append(scales[-1])
        else:
            t = (i - centres[j - 1]) / (centres[j] - centres[j - 1])
            out.append(scales[j - 1] + t * (scales[j] - scales[j - 1]))
    return out


def analyse(
    losses,
    trend_window=11,
    spike_z=6.0,
    min_spike_rise=0.1,
    scale_block=64,
    spike_false_alarm=0.01,
    spike_fall_share=0.1,
):
    """(trend, spikes as (start, end, peak), nonfinite, head, tail, best, best_index, noise)."""
    filled = carry_forward(list(losses))
    if filled is None:
        return None
    n = len(filled)
    nonfinite = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    trend = rolling_median(filled, trend_window)
    relative = all(t > 0 for t in trend)
    resid = [(x - t) / t if relative else x - t for x, t in zip(filled, trend, strict=True)]
    scale = local_scale(resid, scale_block)
    k = level_points(n)
    head = median(filled[:k])
    h = trend_window // 2
    inner = range(h, n - h) if n > 2 * h else range(n)
    best_index = min(inner, key=lambda i: (trend[i], i))
    # A climb from the start: looked for past the middle of the head points.
    past_head = max(inner.start, k // 2)
    peak_index = min((i for i in inner if i >= past_head), key=lambda i: (-trend[i], i))
    threshold = spike_threshold(n, spike_false_alarm, spike_z) * scale_allowance(n, scale_block)
    min_rise = spike_fall_share * max(head - trend[best_index], 0.0)
    spikes: list[list[int]] = []
    for i in range(n):
        if not math.isfinite(losses[i]):
            continue
        r = resid[i]
        rise = filled[i] - trend[i]
        if not (r > min_spike_rise and r > threshold * scale[i] and rise >= min_rise):
            continue
        if spikes and spikes[-1][1] + 1 == i:
            spikes[-1][1] = i
            if rise > spikes[-1][3]:
                spikes[-1][2], spikes[-1][3] = i, rise
        else:
            spikes.append([i, i, i, rise])
    return {
        "trend": trend,
        "spikes": [tuple(s[:3]) for s in spikes],
        "nonfinite": nonfinite,
        "head": head,
        "threshold": threshold,
        "tail": median(filled[n - k :]),
        "best": trend[best_index],
        "best_index": best_index,
        "peak": trend[peak_index],
        "peak_index": peak_index,
        "noise": median(block_scales(resid, scale_block)),
        "relative": relative,
    }
