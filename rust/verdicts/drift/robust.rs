//! `rules="robust"`: trend verdicts (diverged, unstable, regressed, no
//! progress), spikes against the curve's own noise at a stated false-alarm
//! rate, non-finite losses, and the side series ([`super::side`]). README's
//! "How the robust drift rules are built" states each rule.

use super::degenerate::degenerate_finding;
use super::jump::order_jump;
use super::progress::{ended_badly, stopped_early, tiny_run};
use super::side::{side_findings, unmask};
use super::spikes::Spikes;
use super::stuck::stuck_finding;
use super::trend::{trend_finding, Trend, TrendLimits};
use super::uniform::{record_far_above, uniform_finding, Levels};
use super::{
    change_text, curve_sampled, int_value, need, sample_indices, span_text, step_span, steps_text,
    thinned_span_text, upper_median, DriftOptions, KIND,
};
use crate::analysis::robust_curve::{self, RobustCurve, RobustParams};
use crate::formats::logs::curve::LossCurve;
use crate::formats::model_config::OutputClasses;
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{findings_value, number_text, worst, Finding, Judged, Value, Verdict};

/// A final loss that is not finite, or more than this share of non-finite
/// steps, makes non-finite losses a FAIL rather than a WARN.
pub const NONFINITE_FAIL_SHARE: f64 = 0.05;
/// A series whose start is below this, and below this share of its largest
/// value, starts at zero rather than at a loss (a KL-regularised RL objective).
pub const NEAR_ZERO_START: f64 = 1e-3;
/// Points of the robust analysis's noise blocks (its default).
const SCALE_BLOCK: usize = 64;

/// The robust options, all set.
struct Opts {
    min_spike_records: usize,
    trend_window: usize,
    spike_false_alarm: f64,
    spike_z: f64,
    min_spike_rise: f64,
    spike_fall_share: f64,
    max_spike_events: usize,
    min_relative_drop: f64,
    max_regression: f64,
    max_eval_rise: f64,
}

impl Opts {
    fn of(o: &DriftOptions) -> Result<Opts, String> {
        let r = o.rules.as_str();
        Ok(Opts {
            min_spike_records: need(o.min_spike_records, "min_spike_records", r)?,
            trend_window: need(o.trend_window, "trend_window", r)?,
            spike_false_alarm: need(o.spike_false_alarm, "spike_false_alarm", r)?,
            spike_z: need(o.spike_z, "spike_z", r)?,
            min_spike_rise: need(o.min_spike_rise, "min_spike_rise", r)?,
            spike_fall_share: need(o.spike_fall_share, "spike_fall_share", r)?,
            max_spike_events: need(o.max_spike_events, "max_spike_events", r)?,
            min_relative_drop: need(o.min_relative_drop, "min_relative_drop", r)?,
            max_regression: need(o.max_regression, "max_regression", r)?,
            max_eval_rise: need(o.max_eval_rise, "max_eval_rise", r)?,
        })
    }

    /// `DriftOptions.to_dict()`: `rules` and the robust options, in field order.
    fn to_evidence(&self, o: &DriftOptions) -> Evidence {
        let mut e = Evidence::new();
        e.put("rules", o.rules.as_str());
        e.put("min_steps", o.min_steps);
        e.put("min_spike_records", self.min_spike_records);
        e.put("trend_window", self.trend_window);
        e.put("spike_false_alarm", self.spike_false_alarm);
        e.put("spike_z", self.spike_z);
        e.put("min_spike_rise", self.min_spike_rise);
        e.put("spike_fall_share", self.spike_fall_share);
        e.put("max_spike_events", self.max_spike_events);
        e.put("min_relative_drop", self.min_relative_drop);
        e.put("max_regression", self.max_regression);
        e.put("max_eval_rise", self.max_eval_rise);
        e
    }
}

/// What every robust answer shares: the evidence the result starts from
/// and the side series' findings, appended to the loss's own.
struct Finish {
    base: Evidence,
    side: Vec<Finding>,
}

impl Finish {
    /// The answer from the loss's findings: the worst verdict of all; PASS
    /// keeps `score` and says `summary`, else the score is 0.3 (WARN) or 0
    /// and the message lists every finding.
    fn answer(
        self,
        mut findings: Vec<Finding>,
        summary: &str,
        score: f64,
        raw: Option<f64>,
        extra: Evidence,
    ) -> Judged {
        findings.extend(self.side);
        // Findings at PASS are notes: said in the message and kept under
        // `notes`, never among the findings (each of those is a WARN or a
        // FAIL): an isolated NaN gradient norm of a run that learned, a
        // W&B log that lost only its exit record.
        let (notes, findings): (Vec<Finding>, Vec<Finding>) = findings
            .into_iter()
            .partition(|f| f.verdict == Verdict::Pass);
        let verdict = worst(&findings);
        let mut evidence = self.base;
        evidence.put("findings", findings_value(&findings));
        if !notes.is_empty() {
            evidence.put("notes", findings_value(&notes));
        }
        evidence.extend(extra);
        let noted: String = notes
            .iter()
            .map(|f| format!("; noted: {}", f.message))
            .collect();
        let (score, message) = if verdict == Verdict::Pass {
            (score, format!("{summary}{noted}"))
        } else {
            let listed: Vec<String> = findings
                .iter()
                .map(|f| format!("{}: {}", f.rule, f.message))
                .collect();
            let score = if verdict == Verdict::Warn { 0.3 } else { 0.0 };
            (score, format!("{} ({summary}){noted}", listed.join("; ")))
        };
        let mut judged = Judged::bare(KIND, verdict, message)
            .with_score(score)
            .with_evidence(evidence);
        judged.raw = raw;
        judged
    }
}

pub(super) fn judge(
    curve: &LossCurve,
    o: &DriftOptions,
    classes: Option<&OutputClasses>,
) -> Result<Judged, String> {
    let opts = Opts::of(o)?;
    let params = RobustParams {
        trend_window: opts.trend_window,
        spike_z: opts.spike_z,
        min_spike_rise: opts.min_spike_rise,
        scale_block: SCALE_BLOCK,
        spike_false_alarm: opts.spike_false_alarm,
        spike_fall_share: opts.spike_fall_share,
    };
    robust_curve::check_params(&params).map_err(|e| e.to_string())?;
    // `nan_masked` is found on the records as logged; every other rule,
    // the summary and the chart read a masked 0.0 as the NaN it stands for.
    let (side, side_evidence) = side_findings(curve, opts.max_eval_rise);
    let unmasked = unmask(curve);
    let masked_steps: Vec<i64> = unmasked.as_ref().map_or_else(Vec::new, |(_, s)| s.clone());
    let curve = unmasked.as_ref().map_or(curve, |(c, _)| c);
    let (steps, losses) = (&curve.steps, &curve.losses);
    let num_steps = steps.len();
    let span = match &curve.thinned {
        Some(t) => thinned_span_text(steps, t),
        None => span_text(steps),
    };
    let mut base = Evidence::new();
    base.put("rules", "robust");
    base.put("num_steps", num_steps);
    base.put(
        "num_records",
        curve.thinned.map_or(num_steps as u64, |t| t.records),
    );
    if let Some(t) = curve.thinned {
        // Every `stride`-th record was kept (with the non-finite ones).
        base.put("thinned", t.stride);
    }
    base.put("step_span", int_value(step_span(steps)));
    base.put("num_log_files", curve.num_files);
    base.put("log_format", curve.source.as_str());
    base.put("curve_sampled", curve_sampled(curve));
    base.extend(side_evidence);
    base.put("thresholds", opts.to_evidence(o));
    let finish = Finish { base, side };

    let nonfinite_steps: Vec<i64> = steps
        .iter()
        .zip(losses)
        .filter(|(_, v)| !v.is_finite())
        .map(|(&s, _)| s)
        .collect();
    let analysed = robust_curve::analyse(losses, &params);
    let Some(a) = analysed.filter(|_| nonfinite_steps.len() < num_steps) else {
        let finding = Finding::new(
            Verdict::Fail,
            "nonfinite_loss",
            format!("all {num_steps} logged losses are NaN or infinite"),
        );
        let mut extra = Evidence::new();
        extra.put("nonfinite_steps", Value::from(steps.clone()));
        return Ok(finish.answer(
            vec![finding],
            &format!("no finite loss {span}"),
            0.0,
            None,
            extra,
        ));
    };

    let mut findings: Vec<Finding> = stopped_early(curve)
        .or_else(|| tiny_run(curve))
        .into_iter()
        .chain(ended_badly(curve))
        .collect();
    // Non-finite losses that are all masked ones are nan_masked's to say.
    let only_masked = nonfinite_steps.iter().all(|s| masked_steps.contains(s));
    if let Some(&last) = nonfinite_steps.last().filter(|_| !only_masked) {
        let last_bad = Some(&last) == steps.last();
        // A thinned curve keeps its non-finite records beside the sample:
        // the run's count and share come from what was read.
        let (count, records) = match curve.thinned {
            Some(t) => (t.nonfinite.max(1), t.records.max(1)),
            None => (nonfinite_steps.len() as u64, num_steps as u64),
        };
        let share = count as f64 / records as f64;
        let severe = last_bad || share > NONFINITE_FAIL_SHARE;
        let shown = steps_text(&nonfinite_steps, 6);
        let unkept = count.saturating_sub(nonfinite_steps.len() as u64);
        findings.push(Finding::new(
            if severe { Verdict::Fail } else { Verdict::Warn },
            "nonfinite_loss",
            format!(
                "{count} NaN/inf losses ({} of records{}) at steps {shown}{}",
                number_text::percent(share, 1),
                if last_bad {
                    ", the last one included"
                } else {
                    ""
                },
                if unkept > 0 {
                    format!(", {unkept} more among the records not kept")
                } else {
                    String::new()
                }
            ),
        ));
    }

    let head = a.head_level;
    if let Some(degenerate) = degenerate_finding(curve, a.relative_drop(), classes) {
        findings.push(degenerate);
        let mut extra = Evidence::new();
        extra.put("objective", "degenerate");
        extra.put("nonfinite_steps", Value::from(nonfinite_steps));
        let summary = format!(
            "loss {} -> {} {span}",
            number_text::significant(a.head_level, 4),
            number_text::significant(a.tail_level, 4)
        );
        return Ok(finish.answer(findings, &summary, 0.0, None, extra));
    }
    if !curve.side.reward.is_empty() {
        return Ok(judged_by_reward(
            curve,
            findings,
            nonfinite_steps,
            &span,
            finish,
        ));
    }
    if !(is_positive_loss(losses) && head > 0.0) {
        let (first, last) = finite_ends(losses.iter().copied());
        let summary = format!(
            "objective {} -> {} {span}; not a positive loss (it goes negative or starts at or \
             near 0: an RL, KL or log-ratio objective?), so only NaN/inf and the side series are \
             judged, not its trend or spikes",
            number_text::significant(first, 4),
            number_text::significant(last, 4)
        );
        let mut extra = Evidence::new();
        extra.put("objective", "not_positive");
        extra.put("nonfinite_steps", Value::from(nonfinite_steps));
        return Ok(finish.answer(findings, &summary, 0.6, None, extra));
    }
    Ok(judge_trend(
        curve,
        &a,
        &opts,
        classes,
        findings,
        nonfinite_steps,
        &span,
        finish,
    ))
}

/// The first and the last finite value (NaN where there is none).
fn finite_ends(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut finite = values.filter(|v| v.is_finite());
    let first = finite.next().unwrap_or(f64::NAN);
    (first, finite.last().unwrap_or(first))
}

/// An RL run (it logs a reward): judged by its reward's rules
/// (`side_findings`) and the loss's NaN/inf only. A value loss grows as
/// the returns it predicts grow, a policy loss and an entropy bonus move
/// with the policy; none of them falls as a run improves, so their trend
/// says nothing of the run (PPO's value loss climbing 3x while the reward
/// rose 1 -> 50 is a healthy run).
fn judged_by_reward(
    curve: &LossCurve,
    findings: Vec<Finding>,
    nonfinite_steps: Vec<i64>,
    span: &str,
    finish: Finish,
) -> Judged {
    let (r0, r1) = finite_ends(curve.side.reward.iter().map(|p| p.1));
    let (l0, l1) = finite_ends(curve.losses.iter().copied());
    let g4 = |x: f64| number_text::significant(x, 4);
    let summary = format!(
        "an RL run, judged by its reward: {} -> {} {span}; its loss {} -> {} is shown, not \
         judged (value, policy and entropy losses move with the policy, not with progress)",
        g4(r0),
        g4(r1),
        g4(l0),
        g4(l1)
    );
    let mut extra = Evidence::new();
    extra.put("objective", "rl");
    extra.put("nonfinite_steps", Value::from(nonfinite_steps));
    finish.answer(findings, &summary, 0.6, None, extra)
}

/// The trend, spike and noise rules of a positive loss (`a.head_level > 0`):
/// the trend's summary and the spike events are computed once, each rule's
/// finding is a function of them, and the evidence is written once.
#[allow(clippy::too_many_arguments)]
fn judge_trend(
    curve: &LossCurve,
    a: &RobustCurve,
    o: &Opts,
    classes: Option<&OutputClasses>,
    mut findings: Vec<Finding>,
    nonfinite_steps: Vec<i64>,
    span: &str,
    mut finish: Finish,
) -> Judged {
    let (steps, losses) = (&curve.steps, &curve.losses);
    let num_steps = steps.len();
    let trend = Trend::of(a, steps);
    let spikes = Spikes::of(a, steps, o.min_spike_records);
    let limits = TrendLimits {
        min_relative_drop: o.min_relative_drop,
        max_regression: o.max_regression,
        trend_window: o.trend_window,
    };
    findings.extend(spikes.finding(a, o.max_spike_events, o.spike_false_alarm, num_steps));
    findings.extend(trend_finding(curve, a, &trend, &limits, span));
    // An isolated NaN gradient norm is a WARN beside a loss whose fall is
    // within what noise alone moves its level: no sign that the updates
    // it lost were made up.
    if trend.drop < o.min_relative_drop.max(trend.level_noise) {
        for f in findings.iter_mut().chain(finish.side.iter_mut()) {
            if f.rule == "nonfinite_grad_norm" && f.verdict == Verdict::Pass {
                f.verdict = Verdict::Warn;
                f.message.push_str(
                    ", beside a loss whose fall is within its noise (no sign the run learned)",
                );
            }
        }
    }
    let climbed = ["diverged", "unstable"];
    if !findings.iter().any(|f| climbed.contains(&f.rule)) {
        findings.extend(order_jump(a, steps, o.trend_window));
    }
    if let Some(classes) = classes {
        let levels = Levels {
            head: trend.head,
            tail: trend.tail,
            last_eval: curve
                .side
                .eval_loss
                .iter()
                .rev()
                .copied()
                .find(|p| p.1.is_finite()),
            best_eval: curve
                .side
                .eval_loss
                .iter()
                .copied()
                .filter(|p| p.1.is_finite())
                .reduce(|a, b| if b.1 < a.1 { b } else { a }),
        };
        findings.extend(uniform_finding(classes, &levels));
        if !findings
            .iter()
            .any(|f| f.rule == "worse_than_uniform" || f.rule == "overfit")
        {
            findings.extend(record_far_above(
                classes,
                steps,
                losses,
                &curve.side.eval_loss,
            ));
        }
    }
    // A trend judged diverged, unstable or regressed says more than
    // "stuck"; a stuck run says why it made no progress.
    let trend_rules = [
        "diverged",
        "unstable",
        "regressed",
        "worse_than_uniform",
        "overfit",
    ];
    if !findings.iter().any(|f| trend_rules.contains(&f.rule)) {
        let k = classes.map(|c| c.count);
        if let Some(stuck) = stuck_finding(curve, a, num_steps, k) {
            findings.retain(|f| f.rule != "no_progress");
            findings.push(stuck);
        }
    }

    let g4 = |x: f64| number_text::significant(x, 4);
    let noise_text = if a.relative {
        number_text::percent(a.noise, 1)
    } else {
        number_text::significant(a.noise, 3)
    };
    let mut summary = format!(
        "loss {} -> {} ({}) {span}, noise {noise_text}",
        g4(trend.head),
        g4(trend.tail),
        change_text(trend.head, trend.tail)
    );
    if findings.is_empty() && finish.side.is_empty() {
        let note = spikes.note(num_steps, o.min_spike_records);
        summary.push_str(&format!("; {note}, no NaN/inf losses"));
    }
    let score = 0.6 + 0.4 * (trend.drop.max(0.0) / 0.5).min(1.0);

    let mut e = Evidence::new();
    trend.put_evidence(&mut e);
    e.put("noise", a.noise);
    e.put("noise_is_relative", a.relative);
    spikes.put_evidence(&mut e, a);
    e.put("nonfinite_steps", Value::from(nonfinite_steps));
    let step = |i: usize| steps.get(i).copied().unwrap_or(0);
    let trend_sampled = sample_indices(num_steps, super::CURVE_SAMPLE_CAP)
        .into_iter()
        .map(|i| {
            let t = a.trend.get(i).copied().unwrap_or(f64::NAN);
            Value::List(vec![Value::Int(step(i)), Value::Float(t)])
        })
        .collect();
    e.put("trend_sampled", Value::List(trend_sampled));
    finish.answer(findings, &summary, score, Some(trend.drop), e)
}

/// Whether the series reads as a loss to be minimised from a positive start.
///
/// Cross-entropy and its kin start well above zero and stay >= 0; exact
/// zeros later on are judged (NaN masking, memorisation). A negative value,
/// a start at or below zero, or a start that is near zero next to the rest
/// of the series (GRPO's loss grows from ~1e-8 with its KL term) is some
/// other objective, for which "fell by x%" means nothing.
fn is_positive_loss(losses: &[f64]) -> bool {
    let finite: Vec<f64> = losses.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() || finite.iter().any(|&v| v < 0.0) {
        return false;
    }
    let head = finite.get(..3).unwrap_or(&finite);
    let Some(start) = upper_median(head) else {
        return false;
    };
    let largest = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let near_zero = start < NEAR_ZERO_START && start < NEAR_ZERO_START * largest;
    start > 0.0 && !near_zero
}
