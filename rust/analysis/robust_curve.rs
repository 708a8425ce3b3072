//! Robust loss-curve analysis: a trend, the curve's own noise around it,
//! spike events that stand out from that noise, and how far the run got.
//!
//! Mini-batch noise is not an instability. The trend is a centred rolling
//! median (symmetric windows that shrink at the ends, so a steep early
//! descent is not mistaken for a rise). Residuals are taken relative to the
//! trend when the trend is positive (cross-entropy noise scales with the
//! loss), and their scale is estimated per block of points and
//! interpolated, so a curve whose noise shrinks as it trains is judged
//! against its local noise.
//!
//! The spike rule is built for a stated false-alarm rate. Small batches make
//! heavy-tailed, skewed noise (a few hard batches per hundred), so:
//!
//! - the scale of a block is the larger of 1.4826 x its median absolute
//!   residual and its 90th percentile absolute residual / 1.645 (both equal
//!   σ for Gaussian noise; the second one sees a tail the median misses);
//! - the null model is Student's t with [`TAIL_DOF`] degrees of freedom in
//!   those units (much heavier tails than Gaussian or log-normal batch
//!   means), and the threshold is the t quantile at which `n` records give a
//!   spike with probability `spike_false_alarm` in all (a Bonferroni bound
//!   over the records judged): a 3,000-record run is not 100× likelier to
//!   warn than a 30-record one, it needs a larger excursion;
//! - a spike must also matter to the run: its rise is at least
//!   `min_spike_rise` of the trend *and* `spike_fall_share` of how far the
//!   run has fallen (start level minus best level), so bumps on a near-zero
//!   tail after a long fall are not instabilities.
//!
//! `spike_z` is a floor under the threshold. Adjacent spike points form one
//! event. Everything is O(n log w) for a trend window of w points.

use crate::analysis::metrics::SortedWindow;

/// Tuning of the robust analysis (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RobustParams {
    /// Points in the rolling-median trend window (odd, at least 3).
    pub trend_window: usize,
    /// A spike rises at least this many robust noise scales above the trend.
    pub spike_z: f64,
    /// ... and at least this fraction of the trend (or, for curves whose
    /// trend is not positive, this much in absolute terms).
    pub min_spike_rise: f64,
    /// Points per block when estimating the local noise scale.
    pub scale_block: usize,
    /// Probability that a run whose noise follows the null model shows a
    /// spike anywhere (the threshold grows with the number of records).
    pub spike_false_alarm: f64,
    /// A spike also rises this share of the run's fall (start level minus
    /// best level), when the run fell.
    pub spike_fall_share: f64,
}

impl Default for RobustParams {
    fn default() -> Self {
        RobustParams {
            trend_window: 11,
            spike_z: 6.0,
            min_spike_rise: 0.1,
            scale_block: 64,
            spike_false_alarm: 0.01,
            spike_fall_share: 0.1,
        }
    }
}

/// Degrees of freedom of the Student-t null model of the residuals.
pub const TAIL_DOF: u32 = 4;

/// Upper tail `P(T > t)` of Student's t with 4 degrees of freedom, exact:
/// with `u = t / sqrt(1 + t²/4)`, `F(t) = 1/2 + (3/8)·u·(1 − u²/12)`.
pub fn t4_upper_tail(t: f64) -> f64 {
    let u = t / (1.0 + t * t / 4.0).sqrt();
    0.5 - 0.375 * u * (1.0 - u * u / 12.0)
}

/// The `t` with `P(T > t) = p` for Student's t with 4 degrees of freedom
/// (`0 < p < 1/2`), by bisection on the exact tail.
pub fn t4_upper_quantile(p: f64) -> f64 {
    if p.is_nan() || p <= 0.0 {
        return f64::INFINITY;
    }
    if p >= 0.5 {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while t4_upper_tail(hi) > p && hi < 1e12 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t4_upper_tail(mid) > p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-12 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// Our scale estimate of a t4 variable, in its own units: the larger of
/// 1.4826 x its median |T| (t4's 75th percentile, 0.7407) and its 90th
/// percentile |T| / 1.645 (t4's 95th percentile, 2.1318); the second wins.
const T4_SCALE_IN_OUR_UNITS: f64 = 2.131_846_786_326_649 / 1.644_853_626_951_472_2;

/// Relative standard error of a median-of-|residual| scale from m points
/// (Gaussian, asymptotic: sqrt(1 / (4 m f(q)^2)) / q at q = 0.6745).
const SCALE_REL_SE: f64 = 1.167;
/// Standard errors of the scale estimate allowed for in the spike threshold.
pub const SCALE_SE_ALLOWANCE: f64 = 1.0;

/// The factor on the spike threshold for a noise scale that is estimated,
/// not known: each block's scale comes from its m = n / blocks residuals,
/// and a scale estimated low by chance (one standard error is 22% at 29
/// records, 15% at 64) makes ordinary batch noise read as a spike. One
/// standard error of allowance: a 29-record curve's threshold goes from 7.3
/// to 8.9 noise scales, a long curve's (blocks of 64 to 127 points) rises
/// 10 to 15%. Two would cost real faults: a learning rate too high whose
/// one sign is a jump 12.4 noise scales high on 120 records (our labelled
/// corpus's `lr-too-high-diverge`) would pass.
pub fn scale_allowance(n: usize, block: usize) -> f64 {
    let blocks = (n / block.max(8)).max(1);
    let points = (n / blocks).max(1);
    1.0 + SCALE_SE_ALLOWANCE * SCALE_REL_SE / (points as f64).sqrt()
}

/// The spike threshold, in noise scales, for a curve of `n` records: the t4
/// quantile at which one of `n` records exceeds it with probability
/// `false_alarm`, in our scale units, and never below `floor`.
pub fn spike_threshold(n: usize, false_alarm: f64, floor: f64) -> f64 {
    let per_record = false_alarm / n.max(1) as f64;
    (t4_upper_quantile(per_record) / T4_SCALE_IN_OUR_UNITS).max(floor)
}

/// One spike: a run of adjacent points above the spike threshold.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct SpikeEvent {
    /// First and last curve index of the event (inclusive) and its highest point.
    pub start: usize,
    pub end: usize,
    pub peak: usize,
    /// Loss minus trend at the peak.
    pub rise: f64,
    /// `rise` relative to the trend at the peak (NaN when the trend is not positive).
    pub relative_rise: f64,
    /// `rise` in robust noise scales.
    pub z: f64,
}

/// The result of the robust analysis of one curve.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct RobustCurve {
    /// The rolling-median trend of the curve (non-finite losses carried forward).
    pub trend: Vec<f64>,
    pub spikes: Vec<SpikeEvent>,
    /// Indices of non-finite losses.
    pub nonfinite: Vec<usize>,
    /// Median of the first and of the last few points (a twentieth of the
    /// curve, 3 to 10 points): where the run started and where it ended.
    pub head_level: f64,
    pub tail_level: f64,
    /// The lowest trend value where the trend window is whole (the whole
    /// curve when it is shorter than two windows) and its index.
    pub best_level: f64,
    pub best_index: usize,
    /// The highest trend value over the same points, and its index.
    pub peak_level: f64,
    pub peak_index: usize,
    /// Typical noise: the median of the block scales (see `block_scale`),
    /// relative to the trend when `relative` (else absolute).
    pub noise: f64,
    /// Whether residuals were taken relative to the trend.
    pub relative: bool,
    /// Points in each of `head_level` and `tail_level`.
    pub level_points: usize,
    /// The spike threshold used, in noise scales (see [`spike_threshold`]).
    pub spike_threshold: f64,
}

impl RobustCurve {
    /// `(head - tail) / |head|`: the share of the starting loss the run shed.
    pub fn relative_drop(&self) -> f64 {
        (self.head_level - self.tail_level) / self.head_level.abs()
    }

    /// `(tail - best) / |head|`: how far the end sits above the best level.
    pub fn relative_regression(&self) -> f64 {
        (self.tail_level - self.best_level) / self.head_level.abs()
    }
}

/// Non-finite losses replaced by the previous finite one (leading ones by
/// the first finite value); None when no loss is finite.
pub fn carry_forward(losses: &[f64]) -> Option<Vec<f64>> {
    let mut last = losses.iter().copied().find(|v| v.is_finite())?;
    Some(
        losses
            .iter()
            .map(|&v| {
                if v.is_finite() {
                    last = v;
                }
                last
            })
            .collect(),
    )
}

/// Centred rolling median with symmetric windows that shrink at both ends:
/// point i uses `values[i - k ..= i + k]` with `k = min(h, i, n - 1 - i)`.
pub fn rolling_median(values: &[f64], window: usize) -> Vec<f64> {
    let n = values.len();
    let h = window.max(1) / 2;
    let mut out = Vec::with_capacity(n);
    let mut win = SortedWindow::default();
    // The window is values[lo..hi]. Near the ends it grows or shrinks by two
    // points a step; in between it slides by one, a single replace.
    let (mut lo, mut hi) = (0usize, 0usize);
    for i in 0..n {
        let k = h.min(i).min(n - 1 - i);
        let (new_lo, new_hi) = (i - k, i + k + 1);
        if new_lo == lo + 1 && new_hi == hi + 1 {
            win.replace(values[lo], values[hi]);
            (lo, hi) = (new_lo, new_hi);
        } else {
            while hi < new_hi {
                win.insert(values[hi]);
                hi += 1;
            }
            while lo < new_lo {
                win.remove(values[lo]);
                lo += 1;
            }
        }
        out.push(win.median());
    }
    out
}

/// Median of `values` (which it reorders); NaN for an empty slice.
fn median_in_place(values: &mut [f64]) -> f64 {
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    let mid = n / 2;
    let (_, &mut upper, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    if n % 2 == 1 {
        upper
    } else {
        let lower = values[..mid]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        (lower + upper) / 2.0
    }
}

const MAD_TO_SIGMA: f64 = 1.4826;
/// The 95th percentile of the standard normal: its 90th percentile |x|.
const Q90_ABS_TO_SIGMA: f64 = 1.644_853_626_951_472_2;

/// The scale of one block of absolute residuals (which it reorders): the
/// larger of 1.4826 x their median and their 90th percentile / 1.645.
fn block_scale(abs_residuals: &mut [f64]) -> f64 {
    let n = abs_residuals.len();
    if n == 0 {
        return f64::NAN;
    }
    let mad = MAD_TO_SIGMA * median_in_place(abs_residuals);
    // The order statistic at 0.9·(n − 1), interpolated linearly (numpy's default).
    let at = 0.9 * (n - 1) as f64;
    let lo = at.floor() as usize;
    let frac = at - lo as f64;
    let (_, &mut below, above) = abs_residuals.select_nth_unstable_by(lo, f64::total_cmp);
    let next = above.iter().copied().fold(f64::INFINITY, f64::min);
    let q90 = if frac > 0.0 && next.is_finite() {
        below + frac * (next - below)
    } else {
        below
    };
    mad.max(q90 / Q90_ABS_TO_SIGMA)
}

/// Noise scale along the curve: [`block_scale`] per block of points,
/// interpolated linearly between block centres (the nearest block's value
/// before the first centre and after the last).
struct LocalScale {
    centres: Vec<f64>,
    scales: Vec<f64>,
}

impl LocalScale {
    /// Scales of the blocks of `block` points of the residuals `residual(i)`.
    fn new(n: usize, block: usize, residual: impl Fn(usize) -> f64) -> LocalScale {
        let blocks = (n / block.max(8)).max(1);
        let mut scratch = Vec::with_capacity(n.div_ceil(blocks) + 1);
        let mut centres = Vec::with_capacity(blocks);
        let mut scales = Vec::with_capacity(blocks);
        for b in 0..blocks {
            let (from, to) = (b * n / blocks, (b + 1) * n / blocks);
            scratch.clear();
            scratch.extend((from..to).map(|i| residual(i).abs()));
            scales.push(block_scale(&mut scratch));
            centres.push((from + to - 1) as f64 / 2.0);
        }
        LocalScale { centres, scales }
    }

    /// The curve's typical noise: the median of the block scales.
    fn typical(&self) -> f64 {
        median_in_place(&mut self.scales.clone())
    }

    /// The scale at each point, in order (walks the block centres once).
    fn along(&self, n: usize) -> impl Iterator<Item = f64> + '_ {
        let blocks = self.centres.len();
        let mut j = 0usize; // centres[..j] are <= the current point
        (0..n).map(move |i| {
            let x = i as f64;
            while j < blocks && self.centres[j] <= x {
                j += 1;
            }
            if j == 0 {
                self.scales[0]
            } else if j == blocks {
                self.scales[blocks - 1]
            } else {
                let (c0, c1) = (self.centres[j - 1], self.centres[j]);
                let (s0, s1) = (self.scales[j - 1], self.scales[j]);
                s0 + (x - c0) / (c1 - c0) * (s1 - s0)
            }
        })
    }
}

/// The domain of the parameters: a window of at least 3 points, positive
/// finite thresholds, blocks of at least 8 points.
pub fn check_params(p: &RobustParams) -> crate::Result<()> {
    let bad = |what: String| Err(crate::Error::new(crate::Area::Usage, "", what));
    if p.trend_window < 3 {
        return bad(format!(
            "trend_window must be at least 3, got {}",
            p.trend_window
        ));
    }
    if !(p.spike_z > 0.0 && p.spike_z.is_finite()) {
        return bad(format!(
            "spike_z must be a positive number, got {}",
            p.spike_z
        ));
    }
    if !(p.min_spike_rise >= 0.0 && p.min_spike_rise.is_finite()) {
        return bad(format!(
            "min_spike_rise must be a number >= 0, got {}",
            p.min_spike_rise
        ));
    }
    if p.scale_block < 8 {
        return bad(format!(
            "scale_block must be at least 8, got {}",
            p.scale_block
        ));
    }
    if !(p.spike_false_alarm > 0.0 && p.spike_false_alarm < 1.0) {
        return bad(format!(
            "spike_false_alarm must be a probability in (0, 1), got {}",
            p.spike_false_alarm
        ));
    }
    if !(p.spike_fall_share >= 0.0 && p.spike_fall_share.is_finite()) {
        return bad(format!(
            "spike_fall_share must be a number >= 0, got {}",
            p.spike_fall_share
        ));
    }
    Ok(())
}

/// Analyse a loss curve (non-finite losses allowed, at least one finite).
/// Returns None when no loss is finite.
pub fn analyse(losses: &[f64], params: &RobustParams) -> Option<RobustCurve> {
    // Carry non-finite losses forward only when there are any.
    let nonfinite: Vec<usize> = (0..losses.len())
        .filter(|&i| !losses[i].is_finite())
        .collect();
    let carried;
    let filled: &[f64] = if nonfinite.is_empty() {
        losses
    } else {
        carried = carry_forward(losses)?;
        &carried
    };
    let n = filled.len();
    if n == 0 {
        return None;
    }
    let trend = rolling_median(filled, params.trend_window);
    let relative = trend.iter().all(|&t| t > 0.0);
    let residual = |i: usize| {
        let (x, t) = (filled[i], trend[i]);
        if relative {
            (x - t) / t
        } else {
            x - t
        }
    };
    let scale = LocalScale::new(n, params.scale_block, residual);
    let k = level_points(n);
    let head_level = median_in_place(&mut filled[..k].to_vec());
    let tail_level = median_in_place(&mut filled[n - k..].to_vec());
    // The best level is the trend's lowest point where its window is whole:
    // at the very ends the window shrinks to a single noisy record.
    let h = params.trend_window / 2;
    let inner = if n > 2 * h { h..n - h } else { 0..n };
    // The peak is a climb from the start, so it is looked for past the
    // middle of the head points: on a short or coarsely logged curve the
    // first records are the start itself (a steep first descent logged every
    // 10 steps puts its first record far above the head's median).
    let past_head = inner.start.max(k / 2);
    let (mut best_index, mut best_level) = (0, f64::INFINITY);
    let (mut peak_index, mut peak_level) = (past_head.min(n - 1), f64::NEG_INFINITY);
    for i in inner {
        if trend[i] < best_level {
            (best_index, best_level) = (i, trend[i]);
        }
        if i >= past_head && trend[i] > peak_level {
            (peak_index, peak_level) = (i, trend[i]);
        }
    }
    let threshold = spike_threshold(n, params.spike_false_alarm, params.spike_z)
        * scale_allowance(n, params.scale_block);
    // How far the run fell: a spike smaller than a share of it does not matter.
    let min_rise = params.spike_fall_share * (head_level - best_level).max(0.0);
    let mut spikes: Vec<SpikeEvent> = Vec::new();
    for (i, s) in scale.along(n).enumerate() {
        let r = residual(i);
        let rise = filled[i] - trend[i];
        // A non-finite loss is its own kind of event, never a spike.
        let stands_out = r > params.min_spike_rise && r > threshold * s && rise >= min_rise;
        if !(stands_out && losses[i].is_finite()) {
            continue;
        }
        let z = if s > 0.0 { r / s } else { f64::INFINITY };
        let relative_rise = if relative { r } else { f64::NAN };
        match spikes.last_mut() {
            Some(last) if last.end + 1 == i => {
                last.end = i;
                if rise > last.rise {
                    (last.peak, last.rise, last.relative_rise, last.z) =
                        (i, rise, relative_rise, z);
                }
            }
            _ => spikes.push(SpikeEvent {
                start: i,
                end: i,
                peak: i,
                rise,
                relative_rise,
                z,
            }),
        }
    }
    Some(RobustCurve {
        noise: scale.typical(),
        trend,
        spikes,
        nonfinite,
        head_level,
        tail_level,
        best_level,
        best_index,
        peak_level,
        peak_index,
        relative,
        level_points: k,
        spike_threshold: threshold,
    })
}

/// Points in each of the start and end levels: a twentieth of the curve,
/// 3 to 10 points, but at most a third of it (at least one), so the two
/// levels of a short curve never share a point.
pub fn level_points(n: usize) -> usize {
    (n / 20).clamp(3, 10).min((n / 3).max(1)).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_rolling_median(values: &[f64], window: usize) -> Vec<f64> {
        let n = values.len();
        let h = window / 2;
        (0..n)
            .map(|i| {
                let k = h.min(i).min(n - 1 - i);
                let mut w = values[i - k..=i + k].to_vec();
                w.sort_by(f64::total_cmp);
                w[w.len() / 2]
            })
            .collect()
    }

    fn lcg(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64) / ((1u64 << 53) as f64)
        }
    }

    #[test]
    fn rolling_median_matches_sorting_each_window() {
        let mut next = lcg(7);
        for n in [1usize, 2, 3, 10, 57, 300] {
            let v: Vec<f64> = (0..n).map(|_| next()).collect();
            for w in [1usize, 3, 5, 11, 31] {
                assert_eq!(
                    rolling_median(&v, w),
                    naive_rolling_median(&v, w),
                    "n={n} w={w}"
                );
            }
        }
    }

    #[test]
    fn median_of_even_and_odd_slices() {
        assert_eq!(median_in_place(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_in_place(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median_in_place(&mut []).is_nan());
    }

    /// A decaying curve with 2% multiplicative noise.
    fn noisy_decay(n: usize, seed: u64) -> Vec<f64> {
        let mut next = lcg(seed);
        (0..n)
            .map(|i| {
                let level = 0.5 + 4.0 * (-(i as f64) / 60.0).exp();
                let u = next() + next() + next() + next() - 2.0; // ~N(0, 1/3)
                level * (1.0 + 0.035 * u)
            })
            .collect()
    }

    #[test]
    fn noise_is_not_a_spike_but_a_jump_is() {
        let clean = noisy_decay(2000, 3);
        let a = analyse(&clean, &RobustParams::default()).unwrap();
        assert!(a.spikes.is_empty(), "{:?}", a.spikes);
        assert!(a.relative_drop() > 0.8, "{}", a.relative_drop());
        let mut spiky = clean.clone();
        // Jumps that undo at least a tenth of the run's fall (4.0).
        spiky[700] *= 3.0;
        spiky[701] *= 2.0;
        spiky[1500] *= 4.0;
        let a = analyse(&spiky, &RobustParams::default()).unwrap();
        let at: Vec<(usize, usize, usize)> =
            a.spikes.iter().map(|s| (s.start, s.end, s.peak)).collect();
        assert_eq!(at, vec![(700, 701, 700), (1500, 1500, 1500)]);
        assert!(a.spikes[1].relative_rise > 1.0 && a.spikes[1].z > a.spike_threshold);
        // The same +80% jump is a spike on a flat curve, where nothing says
        // it is small next to the run's own progress.
        let mut next = lcg(11);
        let mut flat: Vec<f64> = (0..2000)
            .map(|_| 1.0 + 0.02 * (next() + next() + next() + next() - 2.0))
            .collect();
        flat[900] *= 1.8;
        let a = analyse(&flat, &RobustParams::default()).unwrap();
        assert_eq!(a.spikes.iter().map(|s| s.peak).collect::<Vec<_>>(), [900]);
    }

    #[test]
    fn the_threshold_grows_with_the_records_judged() {
        let p = RobustParams::default();
        let t30 = spike_threshold(30, p.spike_false_alarm, 0.0);
        let t3000 = spike_threshold(3000, p.spike_false_alarm, 0.0);
        assert!(t30 > 6.0 && t30 < 9.0, "{t30}");
        assert!(t3000 > 2.0 * t30, "{t30} {t3000}");
        // Under the null model itself the per-run false-alarm rate is the one asked for.
        for n in [30usize, 300, 3000] {
            let z = spike_threshold(n, 0.01, 0.0) * T4_SCALE_IN_OUR_UNITS;
            let per_run = 1.0 - (1.0 - t4_upper_tail(z)).powi(n as i32);
            assert!((per_run - 0.01).abs() < 1e-4, "n={n}: {per_run}");
        }
        assert_eq!(spike_threshold(30, 0.01, 50.0), 50.0);
    }

    #[test]
    fn t4_tail_and_quantile_agree_with_known_values() {
        // Tables: t_{0.95}(4) = 2.131847, t_{0.995}(4) = 4.604095.
        assert!((t4_upper_quantile(0.05) - 2.131_847).abs() < 1e-5);
        assert!((t4_upper_quantile(0.005) - 4.604_095).abs() < 1e-5);
        assert!((t4_upper_tail(0.0) - 0.5).abs() < 1e-15);
        assert_eq!(t4_upper_quantile(0.0), f64::INFINITY);
    }

    #[test]
    fn heavy_tailed_scale_sees_the_tail_the_median_misses() {
        // Two batch kinds: most near the trend, one in five 30% above it.
        let mut abs: Vec<f64> = (0..100)
            .map(|i| if i % 5 == 0 { 0.3 } else { 0.005 })
            .collect();
        let s = block_scale(&mut abs);
        assert!(s > 0.15, "{s}");
    }

    #[test]
    fn steep_early_descent_is_not_a_spike() {
        let curve: Vec<f64> = (0..200).map(|i| 5.0 * 0.9f64.powi(i) + 0.1).collect();
        let a = analyse(&curve, &RobustParams::default()).unwrap();
        assert!(a.spikes.is_empty(), "{:?}", a.spikes);
        assert_eq!(a.noise, 0.0);
    }

    #[test]
    fn nonfinite_points_are_reported_not_spiked() {
        let mut curve = noisy_decay(100, 5);
        curve[40] = f64::INFINITY;
        curve[0] = f64::NAN;
        let a = analyse(&curve, &RobustParams::default()).unwrap();
        assert_eq!(a.nonfinite, vec![0, 40]);
        assert!(a.spikes.is_empty());
        assert!(analyse(&[f64::NAN, f64::INFINITY], &RobustParams::default()).is_none());
    }

    #[test]
    fn divergence_shows_in_the_levels() {
        let curve: Vec<f64> = (0..100)
            .map(|i| {
                if i < 40 {
                    4.0 - 0.05 * i as f64
                } else {
                    2.0 + 0.1 * (i - 40) as f64
                }
            })
            .collect();
        let a = analyse(&curve, &RobustParams::default()).unwrap();
        assert!(a.relative_regression() > 0.5);
        assert!(a.tail_level > a.head_level);
        assert!((a.best_index as i64 - 40).abs() <= 5, "{}", a.best_index);
    }

    #[test]
    fn a_steep_start_logged_coarsely_is_no_climb() {
        // Ten records of a falling curve, logged every 10 steps: the first
        // sits far above the head's median, yet nothing ever climbed.
        let curve = [3.16, 2.33, 1.89, 1.69, 1.63, 1.52, 1.52, 1.52, 1.51, 1.52];
        let a = analyse(&curve, &RobustParams::default()).unwrap();
        assert!(
            a.peak_level <= a.head_level,
            "{} > {}",
            a.peak_level,
            a.head_level
        );
        // A real climb after the start is still found.
        let bump = [3.16, 2.33, 1.89, 2.9, 3.8, 3.9, 3.7, 2.0, 1.6, 1.5];
        let a = analyse(&bump, &RobustParams::default()).unwrap();
        assert!(a.peak_level > 1.3 * a.head_level, "{}", a.peak_level);
    }

    #[test]
    fn negative_losses_use_absolute_residuals() {
        let curve: Vec<f64> = (0..100).map(|i| -(i as f64) * 0.01).collect();
        let a = analyse(&curve, &RobustParams::default()).unwrap();
        assert!(!a.relative);
        assert!(a.spikes.is_empty());
    }
}
