//! `diverged`, `unstable`, `regressed` and `no_progress`: where a positive
//! loss's trend went, against where it started and the best it reached.
//!
//! What the failure is: a run that ends above where it started
//! (`diverged`, FAIL), also one that blew up inside its first records and
//! never came back down to the first one; a trend that climbed far above
//! its start mid-run (`unstable`); one that climbed back from its best
//! (`regressed`); one that did not fall (`no_progress`). Levels are the
//! robust analysis's medians, never single records.
//!
//! False alarms it is built for: every limit is the larger of a fixed
//! share and what the curve's own noise moves a level by (3 standard
//! errors), so a noisy small-batch run is not called unstable for its
//! noise; a warm-up bump is followed by a fall past it.

use super::upper_median;
use crate::analysis::robust_curve::RobustCurve;
use crate::formats::logs::curve::LossCurve;
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{number_text, Finding, Verdict};

/// The smoothed loss climbing this share above its start (or three noise
/// scales, if more) mid-run is an instability, wherever the run ends.
pub const UNSTABLE_RISE: f64 = 0.25;

/// What the trend rules read of a positive loss's robust analysis, computed
/// once: the levels, their steps, and how far apart noise alone sets two
/// levels.
pub(super) struct Trend {
    pub head: f64,
    pub tail: f64,
    pub best: f64,
    pub best_step: i64,
    pub peak: f64,
    pub peak_step: i64,
    /// The fall from the start level to the end level, as a share of the start.
    pub drop: f64,
    /// The climb from the best level back to the end, as a share of the start.
    pub regression: f64,
    /// How far apart two level estimates may be by noise alone (3 standard
    /// errors), as a share of the start.
    pub level_noise: f64,
}

impl Trend {
    pub fn of(a: &RobustCurve, steps: &[i64]) -> Trend {
        let step = |i: usize| steps.get(i).copied().unwrap_or(0);
        let head = a.head_level;
        Trend {
            head,
            tail: a.tail_level,
            best: a.best_level,
            best_step: step(a.best_index),
            peak: a.peak_level,
            peak_step: step(a.peak_index),
            drop: a.relative_drop(),
            regression: a.relative_regression(),
            level_noise: 3.0 * a.noise * (if a.relative { 1.0 } else { 1.0 / head })
                / (a.level_points as f64).sqrt(),
        }
    }

    /// `head_loss`, `tail_loss`, `best_loss`, `best_step`, `relative_drop`
    /// and `relative_regression`.
    pub fn put_evidence(&self, e: &mut Evidence) {
        e.put("head_loss", self.head);
        e.put("tail_loss", self.tail);
        e.put("best_loss", self.best);
        e.put("best_step", self.best_step);
        e.put("relative_drop", self.drop);
        e.put("relative_regression", self.regression);
    }
}

/// The limits the trend rules are set to (the robust options).
pub(super) struct TrendLimits {
    pub min_relative_drop: f64,
    pub max_regression: f64,
    pub trend_window: usize,
}

/// The one trend finding of a positive loss, the first that holds of
/// `diverged`, `unstable`, `regressed`, `no_progress`.
pub(super) fn trend_finding(
    curve: &LossCurve,
    a: &RobustCurve,
    t: &Trend,
    limits: &TrendLimits,
    span: &str,
) -> Option<Finding> {
    let g4 = |x: f64| number_text::significant(x, 4);
    let (head, tail, best, best_step) = (t.head, t.tail, t.best, t.best_step);
    let rise = -t.drop;
    // The trend's highest point past the start: a healthy run's smoothed
    // loss does not climb far above where it began, even when it ends lower.
    let peak_rise = (t.peak - head) / head;
    // NaN policy of these limits: f64::max ignores a NaN operand, so a NaN
    // noise estimate leaves the fixed floor as the limit.
    let unstable_limit = UNSTABLE_RISE.max(if a.relative {
        3.0 * a.noise
    } else {
        3.0 * a.noise / head
    });
    let regression_limit = limits.max_regression.max(regression_noise(
        a,
        curve.steps.len(),
        head,
        limits.trend_window,
    ));
    if rise > t.level_noise.max(0.05) {
        return Some(Finding::new(
            Verdict::Fail,
            "diverged",
            format!(
                "loss ended {} above where it started ({} -> {} {span}; best {} at step {best_step})",
                number_text::percent(rise, 0),
                g4(head),
                g4(tail),
                g4(best)
            ),
        ));
    }
    if let Some((first_step, first, above)) = never_back_to_first(curve, a) {
        return Some(Finding::new(
            Verdict::Fail,
            "diverged",
            format!(
                "loss ended {} above its first record ({} at step {first_step} -> {} {span}) \
                 and its trend never got back down to it (best {} at step {best_step}): it \
                 blew up within the first records",
                number_text::percent(above, 0),
                g4(first),
                g4(tail),
                g4(best)
            ),
        ));
    }
    if peak_rise > unstable_limit {
        return Some(Finding::new(
            Verdict::Warn,
            "unstable",
            format!(
                "the loss trend climbed {} above where it started ({} -> {} at step {}) before \
                 ending at {}",
                number_text::percent(peak_rise, 0),
                g4(head),
                g4(t.peak),
                t.peak_step,
                g4(tail)
            ),
        ));
    }
    if t.regression > regression_limit {
        return Some(Finding::new(
            Verdict::Warn,
            "regressed",
            format!(
                "loss climbed back from its best by {} of its starting level ({} at step \
                 {best_step} -> {} at the end), more than {}",
                number_text::percent(t.regression, 0),
                g4(best),
                g4(tail),
                number_text::percent(limits.max_regression, 0)
            ),
        ));
    }
    // Even allowing for noise, it fell less than required.
    let required = limits.min_relative_drop;
    let short = t.drop < required && thirds_drop_bound(&curve.losses, a.noise) < required;
    let unproven = a.relative && fall_within_noise(&curve.losses, a.noise, t.drop, required);
    (short || unproven).then(|| {
        Finding::new(
            Verdict::Warn,
            "no_progress",
            if short {
                no_progress_text(t.drop, required, span, g4(head), g4(tail))
            } else {
                format!(
                    "loss fell {} {span} ({} -> {}), within its noise ({} a record): the \
                     medians of its first and last thirds differ by less than three standard \
                     errors, no sign it learned",
                    number_text::percent(t.drop, 1),
                    g4(head),
                    g4(tail),
                    number_text::percent(a.noise, 1)
                )
            },
        )
    })
}

/// The `no_progress` message: how far the loss fell, against the fall
/// required, said once.
fn no_progress_text(drop: f64, required: f64, span: &str, head: String, tail: String) -> String {
    let required = number_text::percent(required, 0);
    if drop > 0.0 {
        let fell = number_text::percent(drop, 1);
        format!("loss fell only {fell} (< {required} required) {span} ({head} -> {tail})")
    } else {
        format!("loss did not fall (a {required} fall required) {span} ({head} -> {tail})")
    }
}

/// A run that blew up within its first records, inside the start level's
/// window, so the start level already sits high: its trend never got back
/// down to the first record, and it ended more than `UNSTABLE_RISE` (or 3
/// noise scales) above it. A healthy run falls below its first record, even
/// one that came out low by chance; a warm-up bump (the second record above
/// the first) is followed by a fall past both. `(step, first, rise)`.
fn never_back_to_first(curve: &LossCurve, a: &RobustCurve) -> Option<(i64, f64, f64)> {
    let (i, &first) = curve
        .losses
        .iter()
        .enumerate()
        .find(|(_, v)| v.is_finite())?;
    if first <= 0.0 {
        return None;
    }
    let noise = if a.relative {
        a.noise
    } else {
        a.noise / a.head_level
    };
    let above = (a.tail_level - first) / first;
    let limit = UNSTABLE_RISE.max(3.0 * noise);
    (a.best_level > first && above > limit)
        .then(|| (curve.steps.get(i).copied().unwrap_or(0), first, above))
}

/// How far above its best a healthy run's end level can sit by noise
/// alone, as a share of the start: three standard errors of the end level
/// (a median of `level_points` records) plus the expected depth of the
/// lowest of the trend's independent windows below the true level (the
/// best level is a minimum, so it is biased low by about sqrt(2 ln m) of
/// them).
fn regression_noise(a: &RobustCurve, n: usize, head: f64, window: usize) -> f64 {
    let per_point = 1.2533 * a.noise; // standard error factor of a median
    let tail_scale = if a.relative { a.tail_level.abs() } else { 1.0 };
    let best_scale = if a.relative { a.best_level.abs() } else { 1.0 };
    let w = window.max(1);
    let windows = (n / w).max(2);
    let end = 3.0 * per_point * tail_scale / (a.level_points as f64).sqrt();
    let low = per_point * best_scale / (w as f64).sqrt() * (2.0 * (windows as f64).ln()).sqrt();
    (end + low) / head
}

/// An upper bound on how far the loss fell, from the medians of the first
/// and last thirds of the records (more points than the start and end
/// levels, so a flat curve is told from a noisy one): the relative drop
/// plus three standard errors of a median of that many points.
fn thirds_drop_bound(losses: &[f64], noise: f64) -> f64 {
    thirds_fall(losses, noise).map_or(f64::INFINITY, |(fall, se)| fall + 3.0 * se)
}

/// The relative fall from the median of the first third of the records to
/// the median of the last, and the standard error of one such median (a
/// median of `third` points of relative noise `noise`). None where there
/// is nothing to measure a fall against.
fn thirds_fall(losses: &[f64], noise: f64) -> Option<(f64, f64)> {
    let finite: Vec<f64> = losses.iter().copied().filter(|v| v.is_finite()).collect();
    let third = (finite.len() / 3).max(1);
    let first = finite.get(..third).and_then(upper_median)?;
    let last = finite
        .get(finite.len().saturating_sub(third)..)
        .and_then(upper_median)?;
    if first.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    Some((
        (first - last) / first,
        1.2533 * noise / (third as f64).sqrt(),
    ))
}

/// Fewest records on which a fall is tested against the noise.
pub const NOISE_TEST_RECORDS: usize = 30;

/// Whether a small fall is within noise: fewer than twice the required
/// fall, and the first third's median above the last third's by less
/// than three standard errors of their difference. A curve that wanders
/// flat (2.25 at the start, 2.28 at the end, 5% noise a record) can show
/// a 2.4% fall between two levels by chance; the thirds, with more points
/// each, say whether anything fell at all.
fn fall_within_noise(losses: &[f64], noise: f64, drop: f64, required: f64) -> bool {
    let records = losses.iter().filter(|v| v.is_finite()).count();
    if records < NOISE_TEST_RECORDS || drop >= 2.0 * required || !noise.is_finite() {
        return false;
    }
    thirds_fall(losses, noise).is_some_and(|(fall, se)| fall < 3.0 * 2f64.sqrt() * se)
}
