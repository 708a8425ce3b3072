//! `stopped_early`: a run that stopped after a handful of optimizer steps
//! of the many it was set for; `tiny_run`: a run of at most
//! [`TINY_RUN_STEPS`] optimizer steps, planned or not; `crashed` and
//! `unfinished`: a run whose tracker recorded an error exit, or no end.
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

//!
//! `tiny_run` (FAIL): a run whose trainer says it took at most
//! `TINY_RUN_STEPS` optimizer steps (else whose last logged step is at most
//! that) trained nothing worth shipping, whether it crashed there or was
//! set for so few (a smoke test, `max_steps` left from debugging): a LoRA's
//! B factors have barely left zero. Built for: no false alarm on a series
//! logged per epoch (a name with `epoch` in it: five epochs can be a whole
//! run), whose steps are not optimizer steps.

//!
//! `crashed` / `unfinished` (WARN): W&B writes an exit record with the
//! process's exit code when a run ends. A non-zero code is a crash (an
//! exception, an out-of-memory kill the SDK saw); a log torn inside a
//! record with no exit record is a run killed hard or still running.
//! Either way the curve is what the run logged before it ended, not a run
//! that reached its end, so the verdict is never a clean PASS and says how
//! far it got. Built for: no false alarm on a run that finished (exit code
//! 0); a log that ends cleanly between records but lacks its exit record
//! (a sync that dropped it: one healthy public run) is noted, not warned.

use crate::formats::logs::curve::{LossCurve, RunEnd};
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
    // The Trainer's closing entry says train() returned: stopped on
    // purpose (an early-stopping callback), not killed.
    let why = if curve.side.ending == Some(RunEnd::Finished) {
        "the Trainer closed it there (an early-stopping callback or should_training_stop?)"
    } else {
        "it crashed, ran out of memory or was stopped"
    };
    stopped.then(|| {
        Finding::new(
            Verdict::Fail,
            "stopped_early",
            format!(
                "the run stopped at optimizer step {} of the {} it was set for (max_steps): \
                 too few steps to have trained; {why}",
                number_text::thousands(i128::from(p.global_step)),
                number_text::thousands(i128::from(p.max_steps))
            ),
        )
    })
}

/// The most optimizer steps of a run judged too short to have trained.
pub const TINY_RUN_STEPS: i64 = 5;

/// The `tiny_run` finding (see the module doc).
pub(super) fn tiny_run(curve: &LossCurve) -> Option<Finding> {
    let (steps, said_by) = match curve.side.progress {
        Some(p) if !curve.progress_from.is_empty() => (p.global_step, curve.progress_from.as_str()),
        Some(p) => (p.global_step, "its trainer state's global_step"),
        None => {
            if curve.per_epoch || curve.series.to_ascii_lowercase().contains("epoch") {
                return None;
            }
            let (&first, &last) = (curve.steps.first()?, curve.steps.last()?);
            if first < 0 {
                return None;
            }
            (last, "its last logged step")
        }
    };
    // A tracker's step is whatever the loop logged with (an epoch under
    // Keras's autolog, a GAN's per-epoch means): only where the steps are
    // known to count optimizer steps is a short log a FAIL.
    let counted = curve.side.progress.is_some() || counts_optimizer_steps(curve);
    (0..=TINY_RUN_STEPS).contains(&steps).then(|| {
        let plural = if steps == 1 { "" } else { "s" };
        if counted {
            Finding::new(
                Verdict::Fail,
                "tiny_run",
                format!(
                    "the run took {steps} optimizer step{plural} ({said_by}): too few to have \
                     trained, planned or not (a smoke test, a debugging max_steps, or a crash)"
                ),
            )
        } else {
            Finding::new(
                Verdict::Warn,
                "tiny_run",
                format!(
                    "the log ends at step {steps} ({said_by}): if its steps are optimizer \
                     steps, too few to have trained; this log does not say (a tracker's \
                     steps can be epochs)"
                ),
            )
        }
    })
}

/// Whether the curve's steps are known to be optimizer steps: dlm's and
/// the HF Trainer's own logs, and the `train/loss` the Trainer reports to
/// TensorBoard, W&B and MLflow at its global step. Lightning's
/// `metrics.csv` step column is its global step too.
fn counts_optimizer_steps(curve: &LossCurve) -> bool {
    let source = curve.source.as_str();
    let own_log = source == "dlm" || source.starts_with("trainer_state") || source == "trainer_log";
    let lightning_csv = source == "csv" && !curve.per_epoch;
    own_log || lightning_csv || curve.series == "train/loss"
}

/// The `crashed` or `unfinished` finding (see the module doc).
pub(super) fn ended_badly(curve: &LossCurve) -> Option<Finding> {
    let last = curve.steps.last().map_or_else(
        || "before its first logged loss".to_string(),
        |s| format!("after step {}", number_text::thousands(i128::from(*s))),
    );
    match curve.side.ending.as_ref()? {
        RunEnd::Finished => None,
        RunEnd::Crashed(why) => Some(Finding::new(
            Verdict::Warn,
            "crashed",
            format!("the run crashed {last} ({why}): judged on what it logged before it ended"),
        )),
        RunEnd::Unfinished(why) => Some(Finding::new(
            // A log torn mid-record ended with its process; one that ends
            // between records may have lost only its exit record (noted).
            if curve.torn_files.is_empty() {
                Verdict::Pass
            } else {
                Verdict::Warn
            },
            "unfinished",
            format!(
                "{why}: the run was killed {last}, or is still running; judged on what it \
                 logged so far"
            ),
        )),
    }
}
