//! `stopped_early`: a run that stopped after a handful of optimizer steps
//! of the many it was set for.
//!
//! What the failure is: the trainer was told to take `max_steps` steps and
//! its state says it took far fewer, so the weights saw almost no training
//! (a crash, an out-of-memory kill, a job pre-empted and never resumed). A
//! curve of three records cannot show this, so it is judged from the
//! trainer's own count (`trainer_state.json`'s `global_step` and
//! `max_steps`, LLaMA-Factory's `current_steps` and `total_steps`), even
//! where the log is too short for any other rule.
//!
//! False alarms it is built for: none from planned short runs. A run that
//! reached its plan, however short (a 12-step smoke test, 60 steps of a
//! small dataset), is not flagged; nor is one that got past half its plan
//! (early stopping) or past `STOPPED_EARLY_STEPS` (a checkpoint kept from a
//! long run has trained enough to judge by its curve).

use crate::formats::logs::loss_log::LossCurve;
use crate::verdicts::{number_text, Finding, Verdict};

/// Fewer optimizer steps than this is too few to have trained (the seeds'
/// `min_steps_threshold` of gradient_ghost).
pub const STOPPED_EARLY_STEPS: i64 = 50;

/// The FAIL finding of a run that stopped after fewer than
/// `STOPPED_EARLY_STEPS` optimizer steps and before half of its plan.
pub(super) fn stopped_early(curve: &LossCurve) -> Option<Finding> {
    let p = curve.side.progress?;
    let stopped = (0..STOPPED_EARLY_STEPS).contains(&p.global_step)
        && p.global_step.saturating_mul(2) <= p.max_steps;
    stopped.then(|| {
        Finding::new(
            Verdict::Fail,
            "stopped_early",
            format!(
                "the run stopped at optimizer step {} of the {} it was set for (max_steps): \
                 too few steps to have trained; it crashed, ran out of memory or was stopped",
                number_text::thousands(i128::from(p.global_step)),
                number_text::thousands(i128::from(p.max_steps))
            ),
        )
    })
}
