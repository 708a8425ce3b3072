//! `run_facts`: what the run was, read from its logs before any rule
//! judges it, put in the evidence and said in words.
//!
//! Why: a verdict means different things for a run that finished and one
//! that crashed, for a language model's loss and an RL run's value loss.
//! The facts come from what the files record, each with where it was
//! read: how the run ended (W&B's exit record, the trainer state's
//! `global_step` against `max_steps`), what it optimised (a reward logged
//! beside the loss: RL; a loss starting at ln 2: a preference loss or a
//! two-class classifier; the
//! model config's head: a causal LM or a classifier over K), and which
//! series it logged, at what cadence.

use super::degenerate::starts_at_ln2;
use crate::formats::logs::curve::{LossCurve, RunEnd};
use crate::formats::model_config::{self, OutputClasses};
use crate::io::path_text;
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{number_text, Value};

/// The run's facts (see the module doc) and the sentence that says them.
pub(super) fn run_facts(curve: &LossCurve, classes: Option<&OutputClasses>) -> (Evidence, String) {
    let mut facts = Evidence::new();
    let (state, completion_text) = completion(curve);
    facts.put("completion", state);
    facts.put("completion_text", completion_text.as_str());
    if let Some(p) = curve.side.progress {
        facts.put("steps_done", p.global_step);
        facts.put("steps_planned", p.max_steps);
    } else if let Some(&last) = curve.steps.last() {
        facts.put("steps_done", last);
    }
    let (objective, objective_text) = objective(curve, classes);
    facts.put("objective", objective);
    facts.put("objective_text", objective_text.as_str());
    if let Some(c) = classes {
        facts.put("classes", c.count);
    }
    let mut series: Vec<Value> = vec![];
    if !curve.series.is_empty() {
        series.push(curve.series.as_str().into());
    }
    let side = &curve.side;
    for (name, present) in [
        ("eval_loss", !side.eval_loss.is_empty()),
        ("grad_norm", !side.grad_norm.is_empty()),
        ("learning_rate", !side.learning_rate.is_empty()),
        ("reward", !side.reward.is_empty()),
    ] {
        if present {
            series.push(name.into());
        }
    }
    facts.put("series", Value::List(series));
    if let Some(cadence) = cadence(&curve.steps) {
        facts.put("logging_every", cadence);
    }
    if !curve.settings.is_empty() {
        let mut settings = Evidence::new();
        for (name, value) in &curve.settings {
            settings.put(name.clone(), value.as_str());
        }
        facts.put("settings", Value::Map(settings));
    }
    (facts, format!("{completion_text}; {objective_text}"))
}

/// `finished`, `crashed`, `unfinished`, `stopped` or `unknown`, and the
/// words with where they were read.
fn completion(curve: &LossCurve) -> (&'static str, String) {
    let last = curve.steps.last().copied();
    let at = |step: Option<i64>| {
        step.map_or_else(String::new, |s| {
            format!(" at step {}", number_text::thousands(i128::from(s)))
        })
    };
    let from = if curve.progress_from.is_empty() {
        "the trainer state"
    } else {
        curve.progress_from.as_str()
    };
    match (&curve.side.ending, curve.side.progress) {
        (Some(RunEnd::Crashed(why)), _) => ("crashed", format!("crashed{} ({why})", at(last))),
        (Some(RunEnd::Unfinished(why)), _) => {
            ("unfinished", format!("unfinished{} ({why})", at(last)))
        }
        (_, Some(p)) if p.global_step >= p.max_steps => (
            "finished",
            format!(
                "finished at step {} of {} ({from})",
                number_text::thousands(i128::from(p.global_step)),
                number_text::thousands(i128::from(p.max_steps))
            ),
        ),
        (Some(RunEnd::Finished), Some(p)) => (
            "ended_early",
            format!(
                "ended at step {} of {}, closed by the Trainer (an early stop, not a crash; \
                 the trainer state)",
                number_text::thousands(i128::from(p.global_step)),
                number_text::thousands(i128::from(p.max_steps))
            ),
        ),
        (_, Some(p)) => (
            "stopped",
            format!(
                "stopped at step {} of {} ({from})",
                number_text::thousands(i128::from(p.global_step)),
                number_text::thousands(i128::from(p.max_steps))
            ),
        ),
        (Some(RunEnd::Finished), None) => {
            ("finished", format!("finished{} (exit code 0)", at(last)))
        }
        (None, None) => ("unknown", format!("ended{}, how is not recorded", at(last))),
    }
}

/// `rl`, `preference_or_binary`, `causal_lm`, `classification` or
/// `unknown`, and why. A start at ln 2 alone cannot tell DPO from a
/// two-class classifier (both start there), so it names both.
fn objective(curve: &LossCurve, classes: Option<&OutputClasses>) -> (&'static str, String) {
    if !curve.side.reward.is_empty() {
        return ("rl", "RL: it logs a reward".to_string());
    }
    let first = curve.losses.iter().copied().find(|v| v.is_finite());
    if classes.is_none() && first.is_some_and(starts_at_ln2) {
        return (
            "preference_or_binary",
            "a loss starting at ln 2: a preference loss (DPO and kin) or a two-class \
             classifier"
                .to_string(),
        );
    }
    match classes {
        Some(c) => {
            let from = if c.source == model_config::CONFIG_JSON {
                path_text::display(&c.path)
            } else {
                c.source.clone()
            };
            if c.kind == "vocabulary" {
                (
                    "causal_lm",
                    format!(
                        "a language model, vocabulary {} from {from}",
                        number_text::thousands(i128::from(c.count))
                    ),
                )
            } else {
                (
                    "classification",
                    format!(
                        "a classifier, {} labels from {from}",
                        number_text::thousands(i128::from(c.count))
                    ),
                )
            }
        }
        None => ("unknown", "objective not recorded".to_string()),
    }
}

/// The step between records most often logged (None under 2 records).
fn cadence(steps: &[i64]) -> Option<i64> {
    let mut gaps: Vec<i64> = steps
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect();
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2).copied()
}
