//! `degenerate_loss`: a loss that is exactly 0, or all but 0, from its
//! first record, with no reward logged beside it.
//!
//! What the failure is: a supervised loss that starts at 0 measures
//! nothing. Every label was masked, the loss was multiplied by a zero
//! weight, or the targets leak into the inputs; either way no gradient
//! carries information and the run trains nothing while looking converged.
//!
//! False alarms it is built for: RL objectives. GRPO's and RLOO's policy
//! loss sits near 0 by construction, so a run that logs a reward (TRL
//! always does) is never judged here, and neither is a series that goes
//! negative (a policy-gradient or log-ratio objective). What is left is a
//! non-negative loss over `DEGENERATE_MIN_RECORDS` records or more that is
//! exactly 0 throughout, or that never rose above `DEGENERATE_LEVEL` and
//! did not fall (its trend moved less than `BARELY_MOVED`). No fine-tune
//! that learns produces either: even memorisation starts from a loss of
//! order 1. The second condition keeps the verdict free of the loss's
//! unit: a healthy descent logged in a tiny unit (1.8e-6 -> 9.7e-7) still
//! falls, and is judged as any other curve.

use super::robust::BARELY_MOVED;
use crate::formats::logs::loss_log::LossCurve;
use crate::verdicts::{number_text, Finding, Verdict};

/// The largest value a degenerate loss reaches: float noise around 0.
pub const DEGENERATE_LEVEL: f64 = 1e-5;
/// Fewest finite records judged.
pub const DEGENERATE_MIN_RECORDS: usize = 5;

/// The FAIL finding of a degenerate loss, if the curve is one; `drop` is
/// how far its trend fell, as a share of its start (NaN: no level).
pub(super) fn degenerate_finding(curve: &LossCurve, drop: f64) -> Option<Finding> {
    if !curve.side.reward.is_empty() {
        return None;
    }
    let finite: Vec<f64> = curve
        .losses
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    let zeros = finite.iter().filter(|&&v| v == 0.0).count();
    let tiny = finite
        .iter()
        .all(|&v| (0.0..=DEGENERATE_LEVEL).contains(&v));
    let fell = drop >= BARELY_MOVED;
    let degenerate =
        finite.len() >= DEGENERATE_MIN_RECORDS && (zeros == finite.len() || (tiny && !fell));
    if !degenerate {
        return None;
    }
    let what = if zeros == finite.len() {
        format!("exactly 0 at all {} records", finite.len())
    } else {
        let largest = finite.iter().copied().fold(0.0, f64::max);
        format!(
            "at most {} over {} records from the first",
            number_text::significant(largest, 2),
            finite.len()
        )
    };
    Some(Finding::new(
        Verdict::Fail,
        "degenerate_loss",
        format!(
            "the loss is {what}, with no reward logged: it measures nothing (every label \
             masked, a zero loss weight, or targets leaked into the inputs), so nothing was \
             trained"
        ),
    ))
}
