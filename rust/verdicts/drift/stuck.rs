//! `at_chance` and `not_learning`: a run that never learned.
//!
//! What the failure is: the loss trend barely moved (`BARELY_MOVED`), and
//! either it sits at the chance level ln(k) of a k-class task without ever
//! getting below it (a classifier that predicts the prior, a model that
//! collapsed to it), or the held-out loss stayed flat while the training
//! loss wandered (nothing generalises).
//!
//! False alarms it is built for: a run that is flat on purpose (a probe, a
//! continued run already converged) is a WARN, never a FAIL; a flat loss
//! near some ln(k) is no evidence when k is not what the loss is over, so
//! where the model's config says K only ln K is tried, else ln 2 .. ln 10,
//! which lie far enough apart for a 1% tolerance to name one k. Neither
//! rule judges fewer than `STUCK_MIN_RECORDS` records.

use super::change_text;
use crate::analysis::robust_curve::RobustCurve;
use crate::formats::logs::curve::LossCurve;
use crate::verdicts::{number_text, Finding, Verdict};

/// A loss trend that fell less than this share of where it started barely
/// moved: the first condition of `at_chance` and `not_learning`. Healthy
/// fine-tunes in the shared corpora fall more (the least: 3.7% on a
/// 12-record run with no eval, 4.7% with an eval that fell 10%), so the
/// second condition of each rule is what tells a stuck run.
pub const BARELY_MOVED: f64 = 0.10;
/// A loss level this close to ln(k) (relative) sits at chance for k classes.
pub const CHANCE_TOLERANCE: f64 = 0.01;
/// The class counts whose chance level is judged: ln 2 .. ln 10 lie at least
/// 5% apart, so a level within 1% names one k; above 10 the levels crowd
/// and any flat loss would sit near some ln(k).
pub const CHANCE_CLASSES: std::ops::RangeInclusive<u32> = 2..=10;
/// An eval loss whose best stays within this share of its first value did
/// not fall: flat.
pub const FLAT_EVAL: f64 = 0.02;
/// Fewest records and eval points `at_chance` and `not_learning` judge.
pub const STUCK_MIN_RECORDS: usize = 10;
pub const STUCK_MIN_EVALS: usize = 3;

/// A run that never learned: its loss trend barely moved (`BARELY_MOVED`)
/// and either sits at the chance level ln(k) of a k-class task without
/// ever getting below it (`at_chance`: a classifier that predicts the
/// prior, or a model that collapsed to it), or its held-out loss stayed
/// flat (`not_learning`: the training loss wanders while nothing
/// generalises). Both WARN: a stuck run is not broken data, and a person
/// should look (a flat loss can be intended, e.g. a probe run); neither is
/// judged on fewer than `STUCK_MIN_RECORDS` records.
pub(super) fn stuck_finding(
    curve: &LossCurve,
    a: &RobustCurve,
    num_steps: usize,
    model_classes: Option<u64>,
) -> Option<Finding> {
    let (head, tail, best) = (a.head_level, a.tail_level, a.best_level);
    let drop = a.relative_drop();
    // A NaN drop (no level to measure from) is no evidence of a stuck run.
    let barely_moved = drop < BARELY_MOVED;
    if num_steps < STUCK_MIN_RECORDS || !barely_moved {
        return None;
    }
    let g4 = |x: f64| number_text::significant(x, 4);
    if let Some(k) = chance_classes(tail, best, model_classes) {
        return Some(Finding::new(
            Verdict::Warn,
            "at_chance",
            format!(
                "the loss sits at ln({k}) = {}, the chance level of {k} classes ({} -> {}, \
                 never below {}): the model predicts no better than the class prior",
                g4((k as f64).ln()),
                g4(head),
                g4(tail),
                g4(best)
            ),
        ));
    }
    let evals: Vec<f64> = curve
        .side
        .eval_loss
        .iter()
        .map(|&(_, v)| v)
        .filter(|v| v.is_finite())
        .collect();
    let first = *evals.first()?;
    let lowest = evals.iter().copied().fold(f64::INFINITY, f64::min);
    let eval_fall = (first - lowest) / first;
    if evals.len() >= STUCK_MIN_EVALS && first > 0.0 && eval_fall < FLAT_EVAL {
        return Some(Finding::new(
            Verdict::Warn,
            "not_learning",
            format!(
                "the training loss barely moved ({} -> {}, {}) and the eval loss stayed flat \
                 ({} at first, best {}: {} lower over {} evaluations)",
                g4(head),
                g4(tail),
                change_text(head, tail),
                g4(first),
                g4(lowest),
                number_text::percent(eval_fall, 1),
                evals.len()
            ),
        ));
    }
    None
}

/// The k whose chance level ln(k) the loss sits at: its end level within
/// `CHANCE_TOLERANCE` of ln(k), and its best level never clearly below it
/// (3 tolerances). Where the run's model config says K (its labels or
/// vocabulary), only ln K is a chance level: a LoRA on a trained base with
/// a vocabulary of 128 that settles at 2.07 sits near ln 8, but 8 is not
/// what its loss is over. Else the k tried are `CHANCE_CLASSES`.
fn chance_classes(tail: f64, best: f64, model_classes: Option<u64>) -> Option<u64> {
    let known = model_classes.filter(|&k| k >= 2);
    let small = CHANCE_CLASSES.map(u64::from).filter(|_| known.is_none());
    small.chain(known).find(|&k| {
        let chance = (k as f64).ln();
        (tail - chance).abs() <= CHANCE_TOLERANCE * chance
            && best >= chance * (1.0 - 3.0 * CHANCE_TOLERANCE)
    })
}
