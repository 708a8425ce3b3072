//! training_drift's rules (both rule sets): the loss curve and its side
//! series judged from a [`DriftInput`].
//!
//! `rules="robust"` ([`robust`], with the side series in [`side`]) gates CI
//! on trends, spikes against the curve's own noise and non-finite values;
//! `rules="sway"` ([`sway`]) is dlm-sway's smoothness, convergence ratio and
//! MAD spike count. This is their one implementation (unit tests per rule
//! in `tests.rs`; `tests/test_drift_kernel.py` holds the verdicts to their
//! properties: logging cadence, scale, NaN and climbs). Numbers in messages
//! are spelled by [`number_text`].

mod damage;
mod degenerate;
mod facts;
mod jump;
mod progress;
mod robust;
mod side;
mod spikes;
mod stuck;
mod sway;
#[cfg(test)]
mod tests;
mod trend;
mod uniform;

use crate::formats::logs::curve::{self, LossCurve};
use crate::formats::model_config::OutputClasses;
use crate::io::path_text;
use crate::store::probe_inputs::{DriftInput, LogsStatus};
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{error_text, number_text, Judged, Value, Verdict};

pub const KIND: &str = "training_drift";

/// Sampled points kept of each curve in the evidence.
pub const CURVE_SAMPLE_CAP: usize = 512;

/// The resolved options (Python's `DriftOptions`, read by attribute).
/// `rules` picks the rule set; the options of the other rule set are None.
#[cfg_attr(feature = "python", derive(pyo3::FromPyObject))]
#[derive(Debug, Clone, PartialEq)]
pub struct DriftOptions {
    pub rules: String,
    pub min_steps: usize,
    // rules="sway"
    pub rolling_window: Option<usize>,
    pub spike_sigma: Option<f64>,
    pub assert_smoothness_gte: Option<f64>,
    pub assert_convergence_ratio_lte: Option<f64>,
    pub assert_instability_events_lte: Option<usize>,
    // rules="robust"
    pub min_spike_records: Option<usize>,
    pub trend_window: Option<usize>,
    pub spike_false_alarm: Option<f64>,
    pub spike_z: Option<f64>,
    pub min_spike_rise: Option<f64>,
    pub spike_fall_share: Option<f64>,
    pub max_spike_events: Option<usize>,
    pub min_relative_drop: Option<f64>,
    pub max_regression: Option<f64>,
    pub max_eval_rise: Option<f64>,
}

impl DriftOptions {
    /// The default options of a rule set (`"robust"` or `"sway"`), as
    /// Python's `DriftOptions(rules=...)` resolves them.
    pub fn defaults(rules: &str) -> DriftOptions {
        let sway = rules == "sway";
        DriftOptions {
            rules: rules.to_string(),
            min_steps: if sway { 10 } else { 3 },
            rolling_window: sway.then_some(10),
            spike_sigma: sway.then_some(3.0),
            assert_smoothness_gte: sway.then_some(0.7),
            assert_convergence_ratio_lte: sway.then_some(0.7),
            assert_instability_events_lte: sway.then_some(0),
            min_spike_records: (!sway).then_some(20),
            trend_window: (!sway).then_some(11),
            spike_false_alarm: (!sway).then_some(0.005),
            spike_z: (!sway).then_some(6.0),
            min_spike_rise: (!sway).then_some(0.1),
            spike_fall_share: (!sway).then_some(0.1),
            max_spike_events: (!sway).then_some(0),
            min_relative_drop: (!sway).then_some(0.02),
            max_regression: (!sway).then_some(0.1),
            max_eval_rise: (!sway).then_some(0.2),
        }
    }
}

/// The verdict for one store.
pub fn judge_drift(input: &DriftInput, o: &DriftOptions) -> Judged {
    let note = input.note.as_deref().filter(|n| !n.is_empty());
    match input.status {
        LogsStatus::NoLogsDir => {
            let message = note.map_or_else(
                || {
                    format!(
                        "{} has no logs/ directory",
                        path_text::display(&input.store)
                    )
                },
                str::to_string,
            );
            return Judged::bare(KIND, Verdict::Skip, message);
        }
        LogsStatus::NoFiles => {
            let message = note.map_or_else(
                || {
                    format!(
                        "no train-*.jsonl files in {}",
                        path_text::display(&input.logs_dir)
                    )
                },
                str::to_string,
            );
            return Judged::bare(KIND, Verdict::Skip, message);
        }
        LogsStatus::Failed => {
            let message = error_text(input.error.as_ref());
            let paths: Vec<Value> = input
                .files
                .iter()
                .map(|p| path_text::display(p).into())
                .collect();
            let mut evidence = Evidence::new();
            evidence.put("log_paths", Value::List(paths));
            return Judged::bare(KIND, Verdict::Error, message).with_evidence(evidence);
        }
        LogsStatus::Curve => {}
    }
    let Some(curve) = &input.curve else {
        return Judged::bare(KIND, Verdict::Error, "the logs were read but hold no curve");
    };
    let num_steps = curve.steps.len();
    let short = num_steps < o.min_steps;
    let stopped = if short && o.rules != "sway" {
        // Masked zeros are NaN here too, never a loss of 0 (see side::unmask).
        let unmasked = side::unmask(curve);
        short_run_findings(
            unmasked.as_ref().map_or(curve, |(c, _)| c),
            input.output_classes.as_ref(),
        )
    } else {
        vec![]
    };
    if !stopped.is_empty() {
        // Too short a curve for the trend rules, but the trainer's own
        // count, the steps logged or the only record say why: judged, not
        // skipped.
        let mut evidence = Evidence::new();
        evidence.put("rules", o.rules.as_str());
        evidence.put("num_steps", num_steps);
        evidence.put("num_log_files", curve.num_files);
        let verdict = crate::verdicts::worst(&stopped);
        let message = stopped
            .iter()
            .map(|f| format!("{}: {}", f.rule, f.message))
            .collect::<Vec<_>>()
            .join("; ");
        evidence.put("findings", crate::verdicts::findings_value(&stopped));
        if let Some(c) = &input.output_classes {
            put_classes(&mut evidence, c);
        }
        let score = if verdict == Verdict::Warn { 0.3 } else { 0.0 };
        let mut judged = Judged::bare(KIND, verdict, message)
            .with_score(score)
            .with_evidence(evidence);
        name_the_series(&mut judged, curve);
        put_the_facts(&mut judged, curve, input.output_classes.as_ref());
        return judged;
    }
    if num_steps == 0 {
        // A run known from its file's facts alone (a LoRA file's ss_*
        // header): what it holds is said, the step-count rules found
        // nothing.
        if let Some(note) = note {
            let mut judged = Judged::bare(KIND, Verdict::Skip, note.to_string());
            put_the_facts(&mut judged, curve, input.output_classes.as_ref());
            return judged;
        }
    }
    if num_steps < o.min_steps {
        let span = step_span(&curve.steps);
        let over = if span > num_steps as i128 {
            format!(" over {} steps", number_text::thousands(span))
        } else {
            String::new()
        };
        let mut evidence = Evidence::new();
        evidence.put("num_steps", num_steps);
        evidence.put("num_log_files", curve.num_files);
        let message = format!(
            "{num_steps} logged records{over}, fewer than min_steps={}: too short a curve to judge",
            o.min_steps
        );
        return Judged::bare(KIND, Verdict::Skip, message).with_evidence(evidence);
    }
    if o.rules == "sway" {
        // The seeds' record, exactly: no series naming.
        return sway::judge(curve, o).unwrap_or_else(|e| Judged::bare(KIND, Verdict::Error, e));
    }
    let classes = input.output_classes.as_ref();
    let mut judged =
        robust::judge(curve, o, classes).unwrap_or_else(|e| Judged::bare(KIND, Verdict::Error, e));
    if let Some(c) = classes {
        put_classes(&mut judged.evidence, c);
    }
    if let Some(g) = &input.guard {
        judged.evidence.put("guard_verdict", g.verdict.as_str());
        judged.evidence.put("guard_stopped_at", g.stopped_at);
        if let Some(step) = g.stopped_at {
            judged.message = format!(
                "{}; adapterprobe's guard stopped the run at step {step} (verdict {})",
                judged.message, g.verdict
            );
        }
    }
    damage::say_the_damage(&mut judged, curve);
    name_the_series(&mut judged, curve);
    put_the_facts(&mut judged, curve, classes);
    judged
}

/// The run's facts in the evidence: `run_facts`, and `run_facts_text`
/// that says them.
/// `output_classes` (K), `output_classes_kind` and `output_classes_source`
/// (where K was read, in words).
fn put_classes(evidence: &mut Evidence, c: &OutputClasses) {
    evidence.put("output_classes", c.count);
    evidence.put("output_classes_kind", c.kind.as_str());
    evidence.put("output_classes_source", c.source.as_str());
}

fn put_the_facts(judged: &mut Judged, curve: &LossCurve, classes: Option<&OutputClasses>) {
    let (facts, text) = facts::run_facts(curve, classes);
    judged.evidence.put("run_facts", Value::Map(facts));
    judged.evidence.put("run_facts_text", text);
}

/// What a curve too short for the trend rules still shows: a run stopped
/// far short of its plan or of a handful of steps, a loss of exactly 0, a
/// run that crashed.
fn short_run_findings(
    curve: &LossCurve,
    classes: Option<&OutputClasses>,
) -> Vec<crate::verdicts::Finding> {
    let mut findings: Vec<_> = progress::stopped_early(curve)
        .or_else(|| progress::tiny_run(curve))
        .into_iter()
        .collect();
    findings.extend(degenerate::degenerate_finding(curve, f64::NAN, classes));
    findings.extend(classes.and_then(|c| {
        uniform::record_far_above(c, &curve.steps, &curve.losses, &curve.side.eval_loss)
    }));
    findings.extend(progress::ended_badly(curve));
    findings.retain(|f| f.verdict != Verdict::Pass);
    findings
}

/// Put the series judged in the evidence (`series`, with the log format as
/// `log_source`), and where it is a held-out loss, because the run logged
/// no training loss, say so first in the message.
fn name_the_series(judged: &mut Judged, curve: &LossCurve) {
    if curve.series.is_empty() {
        return;
    }
    judged.evidence.put("series", curve.series.as_str());
    if !curve.source.is_empty() {
        judged.evidence.put("log_source", curve.source.as_str());
    }
    if !curve.run.is_empty() {
        judged.evidence.put("run", curve.run.as_str());
    }
    if let Some(dir) = &curve.output_dir {
        judged.evidence.put("trainer_output_dir", dir.as_str());
    }
    if curve::is_held_out(&curve.series) {
        judged.message = format!(
            "judged on the held-out loss {} (no training loss is logged): {}",
            crate::io::excerpt::quoted(&curve.series),
            judged.message
        );
    }
}

/// An option the rule set needs, or why it is missing (the Python options
/// class always sets it; a struct built by hand may not).
fn need<T: Copy>(value: Option<T>, name: &str, rules: &str) -> Result<T, String> {
    value.ok_or_else(|| format!("option {name} is not set for rules={rules:?}"))
}

/// The curve's points sampled for evidence (non-finite losses as None).
fn curve_sampled(curve: &LossCurve) -> Value {
    let points = sample_indices(curve.steps.len(), CURVE_SAMPLE_CAP)
        .into_iter()
        .filter_map(|i| Some((*curve.steps.get(i)?, *curve.losses.get(i)?)))
        .collect();
    Value::Points(points)
}

/// The indices `LossCurve::sample` keeps: an even stride, the last point always.
fn sample_indices(n: usize, cap: usize) -> Vec<usize> {
    let cap = cap.max(1);
    let stride = if n <= cap { 1 } else { n.div_ceil(cap) };
    let mut idx: Vec<usize> = (0..n).step_by(stride).collect();
    if n > 0 && idx.last() != Some(&(n - 1)) {
        idx.push(n - 1);
    }
    idx
}

/// `steps[-1] - steps[0] + 1` (0 for no steps), without overflow.
fn step_span(steps: &[i64]) -> i128 {
    match (steps.first(), steps.last()) {
        (Some(&a), Some(&b)) => i128::from(b) - i128::from(a) + 1,
        _ => 0,
    }
}

/// An evidence integer of a wide value (saturated to i64; steps are i64).
fn int_value(n: i128) -> Value {
    Value::Int(i64::try_from(n).unwrap_or(if n < 0 { i64::MIN } else { i64::MAX }))
}

/// Up to `limit` steps, `", "`-joined, then `" and N more"`.
fn steps_text(steps: &[i64], limit: usize) -> String {
    let shown: Vec<String> = steps.iter().take(limit).map(i64::to_string).collect();
    let mut out = shown.join(", ");
    if steps.len() > limit {
        out.push_str(&format!(" and {} more", steps.len() - limit));
    }
    out
}

/// `"over 2,750 steps (6 logged records)"`: training steps and records, both.
fn span_text(steps: &[i64]) -> String {
    let n = steps.len();
    let s = if n != 1 { "s" } else { "" };
    let span = step_span(steps);
    if span == n as i128 {
        return format!("over {} step{s}", number_text::count(n));
    }
    format!(
        "over {} steps ({} logged record{s})",
        number_text::thousands(span),
        number_text::count(n)
    )
}

/// [`span_text`] of a thinned curve: the records read, and how many
/// were kept.
fn thinned_span_text(steps: &[i64], thinned: &curve::Thinning) -> String {
    format!(
        "over {} steps ({} logged records, 1 in {} kept)",
        number_text::thousands(step_span(steps)),
        number_text::thousands(i128::from(thinned.records)),
        number_text::thousands(i128::from(thinned.stride))
    )
}

/// The change from head to tail with its sign: `+0.5%` is a rise.
fn change_text(head: f64, tail: f64) -> String {
    number_text::signed_percent((tail - head) / head.abs(), 1)
}

/// `sorted(values)[len(values) // 2]`: the upper median of finite values
/// (None when empty).
fn upper_median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}
