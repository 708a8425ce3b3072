//! Loss-curve metrics and MAD spike detection.
//!
//! Sums use numpy's pairwise order so results agree with a numpy reference
//! to the last bit, not just approximately: smoothness is `1 - a/b` of two
//! variances, where a tiny summation difference would otherwise show.

use crate::error::{Area, Error, Result};

/// The domain of the spike kernels' parameters: a window of at least one
/// point and a positive, finite sigma.
pub fn check_spike_params(window: usize, sigma: f64) -> Result<()> {
    if window < 1 {
        return Err(Error::new(Area::Usage, "", "window must be at least 1"));
    }
    if !(sigma > 0.0 && sigma.is_finite()) {
        return Err(Error::new(
            Area::Usage,
            "",
            format!("sigma must be a positive number, got {sigma}"),
        ));
    }
    Ok(())
}

/// numpy's pairwise summation (`add.reduce` on a contiguous float64 array).
pub fn pairwise_sum(a: &[f64]) -> f64 {
    const BLOCK: usize = 128;
    let n = a.len();
    if n < 8 {
        let mut res = -0.0;
        for &x in a {
            res += x;
        }
        res
    } else if n <= BLOCK {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let full = n - n % 8;
        let mut i = 8;
        while i < full {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[full..] {
            res += x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

/// Population variance computed the way `numpy.var` does.
pub fn variance(a: &[f64]) -> f64 {
    let n = a.len() as f64;
    let mean = (0.0 + pairwise_sum(a)) / n;
    let squares: Vec<f64> = a.iter().map(|&x| (x - mean) * (x - mean)).collect();
    (0.0 + pairwise_sum(&squares)) / n
}

/// Median the way `numpy.median` computes it (NaN if any value is NaN).
fn median_of_sorted(sorted: &[f64], has_nan: bool) -> f64 {
    let n = sorted.len();
    if has_nan || n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Windows up to this size locate values by counting, larger ones by binary search.
const SMALL_WINDOW: usize = 64;

/// A multiset of window values kept sorted: binary-search insert/remove,
/// NaNs counted apart (any NaN makes the median NaN, as in numpy). Sliding
/// by one is a single `replace`: O(log w) comparisons and one short memmove.
#[derive(Default)]
pub(crate) struct SortedWindow {
    values: Vec<f64>,
    nans: usize,
}

impl SortedWindow {
    pub(crate) fn insert(&mut self, x: f64) {
        if x.is_nan() {
            self.nans += 1;
        } else {
            let at = self.values.partition_point(|&v| v < x);
            self.values.insert(at, x);
        }
    }

    pub(crate) fn remove(&mut self, x: f64) {
        if x.is_nan() {
            self.nans -= 1;
        } else {
            let at = self.values.partition_point(|&v| v < x);
            self.values.remove(at);
        }
    }

    /// Remove `old` and insert `new`, moving only the values between them.
    pub(crate) fn replace(&mut self, old: f64, new: f64) {
        if old.is_nan() || new.is_nan() {
            self.remove(old);
            self.insert(new);
            return;
        }
        let from = self.rank(old);
        let to = self.rank(new);
        let v = &mut self.values;
        if to > from {
            // `new` lands after `old`: shift (from, to) left by one.
            v.copy_within(from + 1..to, from);
            v[to - 1] = new;
        } else {
            v.copy_within(to..from, to + 1);
            v[to] = new;
        }
    }

    /// The median of the whole window (NaN if it holds a NaN or nothing).
    pub(crate) fn median(&self) -> f64 {
        median_of_sorted(&self.values, self.nans > 0)
    }

    /// The median of the window with one copy of `x` (which it holds) left
    /// out, read from the order statistics without removing anything.
    fn median_without(&self, x: f64) -> f64 {
        if x.is_nan() {
            return median_of_sorted(&self.values, self.nans > 1);
        }
        if self.nans > 0 || self.values.len() < 2 {
            return f64::NAN;
        }
        // values[r] is a copy of x; the remaining k-th value skips index r.
        let r = self.rank(x);
        let pick = |k: usize| self.values[k + usize::from(k >= r)];
        let n = self.values.len() - 1;
        if n % 2 == 1 {
            pick(n / 2)
        } else {
            (pick(n / 2 - 1) + pick(n / 2)) / 2.0
        }
    }

    /// How many values are below `x`. Small windows count without branches
    /// (random losses make a binary search mispredict at every step).
    #[inline]
    fn rank(&self, x: f64) -> usize {
        if self.values.len() <= SMALL_WINDOW {
            self.values.iter().map(|&v| usize::from(v < x)).sum()
        } else {
            self.values.partition_point(|&v| v < x)
        }
    }
}

/// Positions of loss-increase spikes among `deltas` (consecutive loss
/// differences). A positive delta is a spike when it exceeds `sigma` times
/// the median |delta| of its centred window (`window / 2` on each side, the
/// point itself left out). When a window's median is zero, any positive
/// delta in it counts. Curves shorter than `window` use the global median.
pub fn spike_indices(deltas: &[f64], window: usize, sigma: f64) -> Vec<usize> {
    let n = deltas.len();
    if n == 0 {
        return vec![];
    }
    if n < window {
        let mut abs: Vec<f64> = deltas.iter().map(|d| d.abs()).collect();
        let has_nan = abs.iter().any(|v| v.is_nan());
        abs.retain(|v| !v.is_nan());
        abs.sort_by(f64::total_cmp);
        let baseline = median_of_sorted(&abs, has_nan);
        if baseline == 0.0 {
            return vec![];
        }
        let limit = sigma * baseline;
        return (0..n)
            .filter(|&i| deltas[i] > 0.0 && deltas[i] > limit)
            .collect();
    }
    let half = window / 2;
    if half == 0 {
        // The window is the point alone: its own |delta| is the baseline.
        return (0..n)
            .filter(|&i| deltas[i] > 0.0 && deltas[i] > sigma * deltas[i])
            .collect();
    }
    let abs = |i: usize| deltas[i].abs();
    // The window holds abs[lo..hi], the centre included; the centre is left
    // out when the median is read. Sliding is at most one replace per step.
    let mut win = SortedWindow::default();
    let mut hi = (half + 1).min(n);
    for j in 0..hi {
        win.insert(abs(j));
    }
    let mut lo = 0usize;
    let mut spikes = vec![];
    for (i, &d) in deltas.iter().enumerate() {
        let (new_lo, new_hi) = (i.saturating_sub(half), (i + half + 1).min(n));
        match (new_lo > lo, new_hi > hi) {
            (true, true) => win.replace(abs(lo), abs(hi)),
            (true, false) => win.remove(abs(lo)),
            (false, true) => win.insert(abs(hi)),
            (false, false) => {}
        }
        (lo, hi) = (new_lo, new_hi);
        // `d <= 0` never counts; a NaN delta counts only when the baseline is
        // exactly zero (every comparison with NaN is false).
        if d > 0.0 || d.is_nan() {
            let baseline = win.median_without(abs(i));
            if baseline == 0.0 || d > sigma * baseline {
                spikes.push(i);
            }
        }
    }
    spikes
}

/// The number of spikes `spike_indices` finds.
pub fn count_spikes(deltas: &[f64], window: usize, sigma: f64) -> usize {
    spike_indices(deltas, window, sigma).len()
}

#[derive(Debug, Clone, PartialEq)]
pub struct CurveMetrics {
    pub initial_loss: f64,
    pub final_loss: f64,
    pub convergence_ratio: f64,
    pub smoothness: f64,
    /// MAD spikes plus non-finite losses.
    pub instability_events: usize,
    /// Indices into the curve of the points where a MAD spike lands
    /// (the later point of each rising delta).
    pub spike_points: Vec<usize>,
    /// Indices of non-finite losses.
    pub nonfinite_points: Vec<usize>,
}

/// The drift metrics of a loss curve (at least one point expected; an
/// empty curve gives NaN metrics).
pub fn curve_metrics(losses: &[f64], window: usize, sigma: f64) -> CurveMetrics {
    let nonfinite_points: Vec<usize> = (0..losses.len())
        .filter(|&i| !losses[i].is_finite())
        .collect();
    let Some(first_finite) = losses.iter().copied().find(|v| v.is_finite()) else {
        return CurveMetrics {
            initial_loss: f64::NAN,
            final_loss: f64::NAN,
            convergence_ratio: f64::NAN,
            smoothness: 0.0,
            instability_events: losses.len(),
            spike_points: vec![],
            nonfinite_points,
        };
    };
    // Forward-fill non-finite losses; leading ones take the first finite value.
    let mut last = first_finite;
    let filled: Vec<f64> = losses
        .iter()
        .map(|&v| {
            if v.is_finite() {
                last = v;
            }
            last
        })
        .collect();
    let initial_loss = filled[0];
    let final_loss = filled[filled.len() - 1];
    let convergence_ratio = if initial_loss != 0.0 {
        final_loss / initial_loss
    } else {
        f64::INFINITY
    };
    let deltas: Vec<f64> = filled.windows(2).map(|w| w[1] - w[0]).collect();
    let var_loss = variance(&filled);
    let var_delta = if deltas.is_empty() {
        0.0
    } else {
        variance(&deltas)
    };
    let smoothness = if var_loss > 0.0 {
        (1.0 - var_delta / var_loss).max(0.0)
    } else {
        0.0
    };
    let spikes = spike_indices(&deltas, window, sigma);
    CurveMetrics {
        initial_loss,
        final_loss,
        convergence_ratio,
        smoothness,
        instability_events: spikes.len() + nonfinite_points.len(),
        spike_points: spikes.into_iter().map(|i| i + 1).collect(),
        nonfinite_points,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct transcription of the rule: a sort per point.
    fn naive(deltas: &[f64], window: usize, sigma: f64) -> Vec<usize> {
        let n = deltas.len();
        let half = window / 2;
        (0..n)
            .filter(|&i| {
                let d = deltas[i];
                if d <= 0.0 {
                    return false;
                }
                let (lo, hi) = (i.saturating_sub(half), (i + half + 1).min(n));
                let mut w: Vec<f64> = (lo..hi)
                    .filter(|&j| j != i || hi - lo == 1)
                    .map(|j| deltas[j].abs())
                    .collect();
                let nan = w.iter().any(|v| v.is_nan());
                w.sort_by(f64::total_cmp);
                let b = median_of_sorted(&w, nan);
                b == 0.0 || d > sigma * b
            })
            .collect()
    }

    #[test]
    fn sliding_median_matches_sorting_per_point() {
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        };
        for n in [10usize, 11, 50, 300] {
            for window in [1usize, 2, 3, 10, 25] {
                let mut d: Vec<f64> = (0..n).map(|_| next()).collect();
                d[n / 3] = 5.0;
                d[n / 2] = 0.0;
                if n >= window {
                    assert_eq!(
                        spike_indices(&d, window, 3.0),
                        naive(&d, window, 3.0),
                        "n={n} w={window}"
                    );
                }
            }
        }
    }

    #[test]
    fn spike_rules() {
        assert_eq!(count_spikes(&[], 10, 3.0), 0);
        assert_eq!(count_spikes(&[0.0, 0.0, 0.0], 10, 3.0), 0);
        assert_eq!(spike_indices(&[-0.1, 0.1, 5.0], 10, 3.0), vec![2]);
        let mut flat = vec![0.0; 12];
        flat[6] = 1e-9;
        assert_eq!(spike_indices(&flat, 4, 3.0), vec![6]);
    }

    #[test]
    fn metrics_of_a_clean_and_a_broken_curve() {
        let losses: Vec<f64> = (0..20).map(|i| 4.0 * 0.9f64.powi(i)).collect();
        let m = curve_metrics(&losses, 10, 3.0);
        assert_eq!(m.instability_events, 0);
        assert!(m.smoothness > 0.9 && m.convergence_ratio < 0.2);
        let mut broken = losses.clone();
        broken[0] = f64::INFINITY;
        broken[5] = f64::INFINITY;
        let m = curve_metrics(&broken, 10, 3.0);
        assert_eq!(m.nonfinite_points, vec![0, 5]);
        assert_eq!(m.initial_loss, losses[1]);
        let m = curve_metrics(&[f64::INFINITY; 3], 10, 3.0);
        assert!(m.initial_loss.is_nan());
        assert_eq!(m.instability_events, 3);
    }

    #[test]
    fn variance_matches_numpy_order() {
        // numpy.var([1, 2, 3, 4]) == 1.25
        assert_eq!(variance(&[1.0, 2.0, 3.0, 4.0]), 1.25);
        let a: Vec<f64> = (0..1000).map(|i| (i as f64).sin()).collect();
        assert_eq!(pairwise_sum(&a), pairwise_sum(&a));
    }
}
