//! `degenerate_loss`: a loss that is exactly 0, or all but 0, from its
//! first record, or exactly 0 at most of its records, with no reward
//! logged beside it; `constant_loss`: the same value at every record;
//! `preference_collapse`: a preference loss driven to exactly 0;
//! `margins_runaway`: its logged margin far past what a preference
//! explains (see [`MARGIN_RUNAWAY`]).
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

//!
//! Exactly 0 at most records (more than half, or the only record): a
//! cross-entropy is exactly 0 only where every prediction is certain, and
//! trainers log it rounded (HF to 4 decimals), so a run that sits at 0.0
//! for most of its records had no gradient for most of its training. A
//! memorising run that reaches 0 late (under half its records) is left to
//! the trend rules.
//!
//! `constant_loss`: five or more records, every one the same non-zero
//! value to the last bit. Noise of batches moves any real loss, even a
//! stuck one; an unchanging value is a constant logged in place of the
//! loss, or a model whose output does not depend on its weights.
//!
//! `preference_collapse`: DPO, IPO and their kin start at ln 2 (the policy
//! equals the reference) and fall as the margin between chosen and
//! rejected grows. Exactly 0 means the margin ran away (a loss under
//! 1e-4 logged at 4 decimals: margins past ~9/beta): the policy learned to
//! tell the pair apart by something other than preference (length, a
//! formatting tell) or drifted far from the reference. A healthy
//! preference run ends well above 0. Built for: no false alarm on a DPO
//! run that ends low but positive.

use super::stuck::BARELY_MOVED;
use crate::formats::logs::curve::LossCurve;
use crate::formats::model_config::OutputClasses;
use crate::verdicts::{number_text, Finding, Verdict};

/// The largest value a degenerate loss reaches: float noise around 0.
pub const DEGENERATE_LEVEL: f64 = 1e-5;
/// Fewest finite records judged.
pub const DEGENERATE_MIN_RECORDS: usize = 5;

/// The FAIL finding of a degenerate loss, if the curve is one; `drop` is
/// how far its trend fell, as a share of its start (NaN: no level). The
/// curve's masked zeros are read as NaN already (`side::unmask`): they are
/// `nan_masked`'s, not a loss that measured nothing.
pub(super) fn degenerate_finding(
    curve: &LossCurve,
    drop: f64,
    classes: Option<&OutputClasses>,
) -> Option<Finding> {
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
    let n = finite.len();
    // A classifier the config names is judged as one, not as DPO.
    let known_classifier = classes.is_some_and(|c| c.kind == "labels");
    if let Some(collapse) = preference_collapse(&finite).filter(|_| !known_classifier) {
        return Some(collapse);
    }
    let mostly_zero = n >= 1 && zeros * 2 > n;
    let degenerate = mostly_zero || (n >= DEGENERATE_MIN_RECORDS && tiny && !fell);
    if !degenerate {
        return constant_loss(&finite);
    }
    let what = if zeros == n && n == 1 {
        "exactly 0 at its only record".to_string()
    } else if zeros == n {
        format!("exactly 0 at all {n} records")
    } else if mostly_zero {
        format!("exactly 0 at {zeros} of its {n} records")
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

/// A loss within this share of ln 2 at its first record starts where a
/// sigmoid preference loss (DPO, IPO, ...) does.
const PREFERENCE_START: f64 = 0.01;

/// Whether a first loss sits where a sigmoid preference loss starts.
pub(super) fn starts_at_ln2(first: f64) -> bool {
    let ln2 = std::f64::consts::LN_2;
    ((first - ln2) / ln2).abs() <= PREFERENCE_START
}

/// `preference_collapse` (FAIL): a loss that starts at ln 2 and whose last
/// record is exactly 0 (see the module doc).
fn preference_collapse(finite: &[f64]) -> Option<Finding> {
    let (&first, &last) = (finite.first()?, finite.last()?);
    (finite.len() >= 2 && starts_at_ln2(first) && last == 0.0).then(|| {
        Finding::new(
            Verdict::Fail,
            "preference_collapse",
            format!(
                "the loss started at {} (ln 2: a preference loss, policy equal to its \
                 reference, or a two-class classifier) and ended at exactly 0: the \
                 chosen/rejected margin ran away, so the policy separates the pairs by a \
                 shortcut or has drifted far from its reference (beta too small, learning rate \
                 too high, pairs that differ by a tell); a classifier driven to certainty has \
                 memorised its data",
                number_text::significant(first, 4)
            ),
        )
    })
}

/// A preference run's mean reward margin above this, at its end, ran
/// away. TRL's margin is beta times the gap between the policy's
/// log-ratios (against the reference) of the chosen and the rejected
/// answer; at beta 0.1 a margin of 30 is a gap of 300 nats. The healthy
/// DPO runs of the shared corpora end at 1.6 and 4.4; a run whose loss
/// reached exactly 0 ended at 141.
pub const MARGIN_RUNAWAY: f64 = 30.0;

/// `margins_runaway` (WARN): the median of a preference run's last three
/// logged margins above [`MARGIN_RUNAWAY`]. What the failure is: the
/// policy separates chosen from rejected by a margin no preference
/// explains (a shortcut such as length, or a drift far from the
/// reference), while its sigmoid loss, already near 0, hides how far.
/// Built for: no alarm on a run whose margins grow into the single digits.
pub(super) fn margins_runaway(margins: &[(i64, f64)]) -> Option<Finding> {
    let finite: Vec<(i64, f64)> = margins
        .iter()
        .copied()
        .filter(|p| p.1.is_finite())
        .collect();
    let tail = finite.get(finite.len().saturating_sub(3)..)?;
    let mut values: Vec<f64> = tail.iter().map(|p| p.1).collect();
    values.sort_by(f64::total_cmp);
    let end = *values.get(values.len() / 2)?;
    let (&(first_step, first), &(last_step, _)) = (finite.first()?, finite.last()?);
    (end > MARGIN_RUNAWAY).then(|| {
        Finding::new(
            Verdict::Warn,
            "margins_runaway",
            format!(
                "the chosen/rejected reward margin ran away: {} at step {first_step} -> {} by                  step {last_step} (over {}): the policy separates the pairs by far more than a                  preference explains, by a shortcut or a drift from its reference (beta too                  small, a learning rate too high?)",
                number_text::significant(first, 3),
                number_text::significant(end, 3),
                number_text::significant(MARGIN_RUNAWAY, 2)
            ),
        )
    })
}

/// `constant_loss` (FAIL): the same non-zero value at every one of five or
/// more records (see the module doc).
fn constant_loss(finite: &[f64]) -> Option<Finding> {
    let &first = finite.first()?;
    let constant = finite.len() >= DEGENERATE_MIN_RECORDS
        && first != 0.0
        && finite.iter().all(|&v| v.to_bits() == first.to_bits());
    constant.then(|| {
        Finding::new(
            Verdict::Fail,
            "constant_loss",
            format!(
                "the loss is {} at every one of its {} records: no batch moved it, so it \
                 carries no learning signal (a constant logged in place of the loss, or \
                 outputs that do not depend on the weights)",
                number_text::significant(first, 6),
                finite.len()
            ),
        )
    })
}
