//! `worse_than_uniform` and `blown_up_start`: a cross-entropy judged
//! against ln(K), the loss of a uniform guess over the K outputs the saved
//! model's `config.json` names (its vocabulary, or its labels).
//!
//! What the failure is: a model that knows nothing, predicting every
//! output alike, scores exactly ln(K); training only takes the loss down
//! from there. A mean cross-entropy far above ln(K) takes confidently
//! wrong logits, which healthy weights never produce: the weights blew up
//! (a learning rate of 10 sends a 4.9 loss to thousands inside the first
//! logging window). The curve's shape cannot show this when the blow-up
//! came before the first record: from 3,000 to 500 reads as an 83% fall.
//!
//! - FAIL `worse_than_uniform`: the loss's end level, or the last eval
//!   loss, above `UNIFORM_MARGIN` x ln(K).
//! - FAIL `overfit` in its place when only the eval loss is past the
//!   margin and the training loss fits its data (under `FITS_TRAINING` x
//!   ln(K)): memorisation, not a blow-up, is the cause named.
//! - WARN `blown_up_start`: the start level above `BLOWN_START` x ln(K)
//!   while the end is sane (it blew up and came back; look at the weights).
//!
//! False alarms it is built for: none from a mean per-token cross-entropy,
//! which is what HF Trainer, TRL, Lightning's recipes and OLMo-core log.
//! A model at initialisation scores ln(K) plus a small term for its
//! logits' spread (GPT-2 from scratch: 10.9 against ln 50,257 = 10.8);
//! a pretrained model's first batch with a broken accumulation scaling
//! (the Gemma 3 run of the shared corpora: 14.8 against 12.5) stays under
//! the margins. A loss summed over tokens instead of averaged would read
//! as blown up: it is not a cross-entropy per prediction, and a loop that
//! logs one next to a saved `config.json` is the rule's stated blind spot.

use crate::formats::model_config::OutputClasses;
use crate::verdicts::{number_text, Finding, Verdict};

/// An end level above this many times ln(K) is worse than a uniform guess
/// by more than any initialisation scores.
pub const UNIFORM_MARGIN: f64 = 1.5;
/// A start level above this many times ln(K) blew up before its first record.
pub const BLOWN_START: f64 = 3.0;
/// One record (a loss or an eval loss) above this many times ln(K) is a
/// FAIL at that record, however short the curve: no healthy run logs one
/// (initialisation scores about 1x; the worst healthy first batch seen,
/// 1.2x).
pub const FAR_ABOVE: f64 = 10.0;

/// The levels of the series judged.
pub(super) struct Levels {
    pub head: f64,
    pub tail: f64,
    /// The last finite eval loss, if any.
    pub last_eval: Option<(i64, f64)>,
    /// The lowest finite eval loss logged, if any.
    pub best_eval: Option<(i64, f64)>,
}

/// A training loss that ends below this share of ln(K) has learned its
/// training data: an eval loss past the margin beside it (and under
/// `FAR_ABOVE` x ln(K), past which no model is merely overconfident) is
/// overfitting, not weights that blew up (those fit no data).
pub const FITS_TRAINING: f64 = 0.5;

/// `ln(K) = x, the loss of a uniform guess over ...` with where K was read.
fn reference(classes: &OutputClasses) -> String {
    let what = if classes.kind == "labels" {
        format!("its {} labels", number_text::count(classes.count as usize))
    } else {
        format!(
            "its {}-token vocabulary",
            number_text::thousands(i128::from(classes.count))
        )
    };
    let from = &classes.source;
    format!(
        "ln({}) = {}, the loss of a uniform guess over {what} ({from})",
        number_text::thousands(i128::from(classes.count)),
        number_text::significant((classes.count as f64).ln(), 4)
    )
}

/// FAIL `worse_than_uniform` at the first record (a loss, else an eval
/// loss) above `FAR_ABOVE` x ln(K): judged on any curve, one record long
/// or thousands, so a run at lr=10 whose first logged loss is 587x ln(K)
/// is stopped there, not three records later.
pub(super) fn record_far_above(
    classes: &OutputClasses,
    steps: &[i64],
    losses: &[f64],
    evals: &[(i64, f64)],
) -> Option<Finding> {
    if classes.count < 2 {
        return None;
    }
    let uniform = (classes.count as f64).ln();
    let far = |v: f64| v.is_finite() && v > FAR_ABOVE * uniform;
    let (subject, step, value) = steps
        .iter()
        .zip(losses)
        .find(|(_, &v)| far(v))
        .map(|(&s, &v)| ("the loss", s, v))
        .or_else(|| {
            evals
                .iter()
                .find(|p| far(p.1))
                .map(|&(s, v)| ("the eval loss", s, v))
        })?;
    Some(Finding::new(
        Verdict::Fail,
        "worse_than_uniform",
        format!(
            "{subject} at step {step} is {}, {}x {}: no healthy run logs a record that far \
             above a uniform guess, so its weights blew up (a learning rate far too high?)",
            number_text::significant(value, 4),
            number_text::fixed(value / uniform, 0),
            reference(classes)
        ),
    ))
}

/// FAIL `overfit`: the eval loss past the margin while the training loss
/// fits its data (under [`FITS_TRAINING`] x ln(K)): the model is
/// confidently wrong on held-out data because it memorised the training
/// set; the cause named is overfitting, with the best eval logged (where
/// to stop), not a learning rate that blew the weights up.
fn overfit(step: i64, eval: f64, uniform: f64, levels: &Levels, reference: &str) -> Finding {
    let g4 = |x: f64| number_text::significant(x, 4);
    let best = levels
        .best_eval
        .map(|(s, v)| {
            format!(
                "; its best eval was {} at step {s}, the point to stop at",
                g4(v)
            )
        })
        .unwrap_or_default();
    Finding::new(
        Verdict::Fail,
        "overfit",
        format!(
            "the eval loss at step {step} is {}, {}x {reference}, while the training loss \
             ends at {}: the model memorised its training data and is confidently wrong on \
             held-out data (overfitting, not a blow-up){best}",
            g4(eval),
            number_text::fixed(eval / uniform, 1),
            g4(levels.tail)
        ),
    )
}

/// What the output count says of these levels (None: nothing to report).
pub(super) fn uniform_finding(classes: &OutputClasses, levels: &Levels) -> Option<Finding> {
    if classes.count < 2 {
        return None;
    }
    let uniform = (classes.count as f64).ln();
    let over = |x: f64| x / uniform;
    let g4 = |x: f64| number_text::significant(x, 4);
    let reference = reference(classes);
    let eval_bad = levels
        .last_eval
        .filter(|&(_, v)| v.is_finite() && over(v) > UNIFORM_MARGIN);
    if over(levels.tail) > UNIFORM_MARGIN || eval_bad.is_some() {
        let (subject, value) = match eval_bad {
            Some((step, v)) if over(levels.tail) <= UNIFORM_MARGIN => {
                if over(levels.tail) < FITS_TRAINING && over(v) <= FAR_ABOVE {
                    return Some(overfit(step, v, uniform, levels, &reference));
                }
                (format!("the eval loss at step {step} is"), v)
            }
            _ => ("the loss ends at".to_string(), levels.tail),
        };
        return Some(Finding::new(
            Verdict::Fail,
            "worse_than_uniform",
            format!(
                "{subject} {}, {}x {reference}: the model is far worse than one that knows \
                 nothing, so its weights blew up (a learning rate far too high?)",
                g4(value),
                number_text::fixed(over(value), 1)
            ),
        ));
    }
    (over(levels.head) > BLOWN_START).then(|| {
        Finding::new(
            Verdict::Warn,
            "blown_up_start",
            format!(
                "the loss starts at {}, {}x {reference}, before it falls to {}: it blew up \
                 before its first record",
                g4(levels.head),
                number_text::fixed(over(levels.head), 1),
                g4(levels.tail)
            ),
        )
    })
}
