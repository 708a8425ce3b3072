//! `order_jump`: a loss that lost orders of magnitude of its descent.
//!
//! What the failure is: on a log scale the smoothed loss climbed
//! `JUMP_DECADES` or more above the lowest it had reached, and by a
//! `JUMP_FALL_SHARE` of the decades it fell: a regression loss falling
//! from 1e8 to 5 that jumps to 2e6 mid-run climbs less than its start on a
//! linear scale, so neither `unstable` nor `diverged` sees it.
//!
//! False alarms it is built for: near zero a per-batch loss is heavy
//! tailed, and rolling medians of healthy runs of the shared corpora
//! wander two decades, so three are asked for. WARN: the run came back.

use crate::analysis::robust_curve::RobustCurve;
use crate::verdicts::{number_text, Finding, Verdict};

/// Decades of the smoothed loss above its lowest point so far that make a
/// jump. 1000x, not 100x: near zero, a per-batch loss is heavy-tailed (a
/// classifier at 1e-4 logs 1e-2 whenever a batch holds one hard example),
/// and a rolling median of such records wanders two decades on healthy
/// runs of the shared corpora (2.0 and 2.2); a trend 1000x above its low
/// has most of its records there.
pub const JUMP_DECADES: f64 = 3.0;
/// The share of the decades the run had fallen that a jump must climb
/// back: a loss of 1e-6 bouncing to 1e-4 after falling from 1e2 has not
/// lost what it learned.
pub const JUMP_FALL_SHARE: f64 = 0.25;

/// `order_jump`: on a log scale, the smoothed loss climbed `JUMP_DECADES`
/// or more above the lowest it had reached, and by a `JUMP_FALL_SHARE` of
/// the decades it fell. A regression loss falling from 1e8 to 5 that jumps
/// to 2e6 mid-run climbs less than its start on a linear scale, so neither
/// `unstable` nor `diverged` sees it; in decades it lost most of its
/// descent. WARN: the run came back, and a person should look at why.
pub(super) fn order_jump(a: &RobustCurve, steps: &[i64], window: usize) -> Option<Finding> {
    if !a.relative || a.trend.is_empty() {
        return None; // a trend at or below 0 has no log scale
    }
    let n = a.trend.len();
    // Where the trend's window is whole, as for the best level.
    let h = window / 2;
    let inner = if n > 2 * h { h..n - h } else { 0..n };
    let (mut low, mut low_at) = (f64::INFINITY, 0);
    let mut jump: Option<(f64, usize, usize, f64)> = None; // decades, low at, peak at, low
    for i in inner {
        let t = a.trend.get(i).copied().unwrap_or(f64::NAN);
        if !(t.is_finite() && t > 0.0) {
            continue;
        }
        if t < low {
            (low, low_at) = (t, i);
            continue;
        }
        let decades = (t / low).log10();
        if jump.is_none_or(|j| decades > j.0) {
            jump = Some((decades, low_at, i, low));
        }
    }
    let (decades, low_at, peak_at, low) = jump?;
    let fell = (a.head_level / low).log10();
    if !(decades >= JUMP_DECADES && decades >= JUMP_FALL_SHARE * fell) {
        return None;
    }
    let step = |i: usize| steps.get(i).copied().unwrap_or(0);
    let g3 = |x: f64| number_text::significant(x, 3);
    Some(Finding::new(
        Verdict::Warn,
        "order_jump",
        format!(
            "on a log scale the loss trend jumped {} orders of magnitude above its low so far \
             ({} at step {} -> {} at step {}) before ending at {}",
            number_text::fixed(decades, 1),
            g3(low),
            step(low_at),
            g3(a.trend.get(peak_at).copied().unwrap_or(f64::NAN)),
            step(peak_at),
            g3(a.tail_level)
        ),
    ))
}
