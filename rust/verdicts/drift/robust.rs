//! `rules="robust"`: trend verdicts (diverged, unstable, regressed, no
//! progress), spikes against the curve's own noise at a stated false-alarm
//! rate, non-finite losses, and the side series ([`super::side`]). README's
//! "How the robust drift rules are built" states each rule.

use super::degenerate::degenerate_finding;
use super::progress::{ended_badly, stopped_early, tiny_run};
use super::side::{side_findings, unmask};
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
/// The smoothed loss climbing this share above its start (or three noise
/// scales, if more) mid-run is an instability, wherever the run ends.
pub const UNSTABLE_RISE: f64 = 0.25;
/// A series whose start is below this, and below this share of its largest
/// value, starts at zero rather than at a loss (a KL-regularised RL objective).
pub const NEAR_ZERO_START: f64 = 1e-3;
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
const STUCK_MIN_RECORDS: usize = 10;
const STUCK_MIN_EVALS: usize = 3;
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

/// The trend, spike and noise rules of a positive loss (`a.head_level > 0`).
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
    let step = |i: usize| steps.get(i).copied().unwrap_or(0);
    let (head, tail, best) = (a.head_level, a.tail_level, a.best_level);
    let drop = a.relative_drop();
    let regression = a.relative_regression();
    // How far apart two level estimates may be by noise alone (3 standard errors).
    let level_noise = 3.0 * a.noise * (if a.relative { 1.0 } else { 1.0 / head })
        / (a.level_points as f64).sqrt();

    let judge_spikes = num_steps >= o.min_spike_records;
    let events = if judge_spikes {
        a.spikes.as_slice()
    } else {
        &[]
    };
    let (events, outliers): (Vec<_>, Vec<_>) = events
        .iter()
        .partition(|e| !is_batch_outlier(e, &a.trend, head));
    let spikes: Vec<Spike> = events
        .iter()
        .map(|e| Spike {
            start_step: step(e.start),
            end_step: step(e.end),
            peak_step: step(e.peak),
            rise: e.rise,
            relative_rise: e.relative_rise,
            z: e.z.is_finite().then_some(e.z),
        })
        .collect();
    if spikes.len() > o.max_spike_events {
        let parts: Vec<String> = spikes
            .iter()
            .take(6)
            .map(|s| {
                let size = if a.relative {
                    format!("+{} over trend", number_text::percent(s.relative_rise, 0))
                } else {
                    format!("+{}", number_text::significant(s.rise, 3))
                };
                let scales = match s.z {
                    Some(z) => format!(", {} noise scales)", number_text::fixed(z, 0)),
                    None => ", noise-free curve)".to_string(),
                };
                format!("step {} ({size}{scales}", s.peak_step)
            })
            .collect();
        let more = if spikes.len() > 6 {
            format!(" and {} more", spikes.len() - 6)
        } else {
            String::new()
        };
        findings.push(Finding::new(
            Verdict::Warn,
            "loss_spikes",
            format!(
                "{} loss spike{} beyond {} noise scales (a {} false-alarm threshold for \
                 {num_steps} records): {}{more}",
                spikes.len(),
                if spikes.len() != 1 { "s" } else { "" },
                number_text::fixed(a.spike_threshold, 1),
                rate_text(o.spike_false_alarm),
                parts.join("; ")
            ),
        ));
    }

    let best_step = step(a.best_index);
    let change = change_text(head, tail);
    let rise = -drop;
    // The trend's highest point past the start: a healthy run's smoothed loss
    // does not climb far above where it began, even when it ends lower.
    let peak = a.peak_level;
    let peak_rise = (peak - head) / head;
    // NaN policy of these limits: f64::max ignores a NaN operand, so a
    // NaN noise estimate leaves the fixed floor as the limit.
    let unstable_limit = UNSTABLE_RISE.max(if a.relative {
        3.0 * a.noise
    } else {
        3.0 * a.noise / head
    });
    let g4 = |x: f64| number_text::significant(x, 4);
    if rise > level_noise.max(0.05) {
        findings.push(Finding::new(
            Verdict::Fail,
            "diverged",
            format!(
                "loss ended {} above where it started ({} -> {} {span}; best {} at step {best_step})",
                number_text::percent(rise, 0),
                g4(head),
                g4(tail),
                g4(best)
            ),
        ));
    } else if let Some((first_step, first, above)) = never_back_to_first(curve, a) {
        findings.push(Finding::new(
            Verdict::Fail,
            "diverged",
            format!(
                "loss ended {} above its first record ({} at step {first_step} -> {} {span}) \
                 and its trend never got back down to it (best {} at step {best_step}): it \
                 blew up within the first records",
                number_text::percent(above, 0),
                g4(first),
                g4(tail),
                g4(best)
            ),
        ));
    } else if peak_rise > unstable_limit {
        findings.push(Finding::new(
            Verdict::Warn,
            "unstable",
            format!(
                "the loss trend climbed {} above where it started ({} -> {} at step {}) before \
                 ending at {}",
                number_text::percent(peak_rise, 0),
                g4(head),
                g4(peak),
                step(a.peak_index),
                g4(tail)
            ),
        ));
    } else if regression
        > o.max_regression
            .max(regression_noise(a, num_steps, head, o.trend_window))
    {
        findings.push(Finding::new(
            Verdict::Warn,
            "regressed",
            format!(
                "loss climbed back from its best by {} of its starting level ({} at step \
                 {best_step} -> {} at the end), more than {}",
                number_text::percent(regression, 0),
                g4(best),
                g4(tail),
                number_text::percent(o.max_regression, 0)
            ),
        ));
    } else if drop < o.min_relative_drop && thirds_drop_bound(losses, a.noise) < o.min_relative_drop
    {
        // Even allowing for noise, it fell less than required.
        findings.push(Finding::new(
            Verdict::Warn,
            "no_progress",
            no_progress_text(drop, o.min_relative_drop, span, g4(head), g4(tail)),
        ));
    }

    // An isolated NaN gradient norm is a WARN beside a loss whose fall is
    // within what noise alone moves its level: no sign that the updates
    // it lost were made up.
    if drop < o.min_relative_drop.max(level_noise) {
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
        if let Some(jump) = order_jump(a, steps, o.trend_window) {
            findings.push(jump);
        }
    }
    if let Some(classes) = classes {
        let levels = Levels {
            head,
            tail,
            last_eval: curve
                .side
                .eval_loss
                .iter()
                .rev()
                .copied()
                .find(|p| p.1.is_finite()),
        };
        findings.extend(uniform_finding(classes, &levels));
        if !findings.iter().any(|f| f.rule == "worse_than_uniform") {
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
    let trend_rules = ["diverged", "unstable", "regressed", "worse_than_uniform"];
    if !findings.iter().any(|f| trend_rules.contains(&f.rule)) {
        let k = classes.map(|c| c.count);
        if let Some(stuck) = stuck_finding(curve, a, num_steps, k) {
            findings.retain(|f| f.rule != "no_progress");
            findings.push(stuck);
        }
    }

    let noise_text = if a.relative {
        number_text::percent(a.noise, 1)
    } else {
        number_text::significant(a.noise, 3)
    };
    let spike_note = if judge_spikes {
        "no spikes".to_string()
    } else {
        format!(
            "spikes not judged ({num_steps} records, fewer than {})",
            o.min_spike_records
        )
    };
    let mut summary = format!(
        "loss {} -> {} ({change}) {span}, noise {noise_text}",
        g4(head),
        g4(tail)
    );
    if findings.is_empty() && finish.side.is_empty() {
        summary.push_str(&format!("; {spike_note}, no NaN/inf losses"));
    }
    let score = 0.6 + 0.4 * (drop.max(0.0) / 0.5).min(1.0);

    let mut e = Evidence::new();
    e.put("head_loss", head);
    e.put("tail_loss", tail);
    e.put("best_loss", best);
    e.put("best_step", best_step);
    e.put("relative_drop", drop);
    e.put("relative_regression", regression);
    e.put("noise", a.noise);
    e.put("noise_is_relative", a.relative);
    e.put("spikes_judged", judge_spikes);
    e.put("spike_threshold", a.spike_threshold);
    e.put(
        "spikes",
        Value::List(spikes.iter().map(Spike::to_value).collect()),
    );
    e.put(
        "spike_steps",
        Value::from(spikes.iter().map(|s| s.peak_step).collect::<Vec<i64>>()),
    );
    e.put(
        "batch_outlier_steps",
        Value::from(outliers.iter().map(|x| step(x.peak)).collect::<Vec<i64>>()),
    );
    e.put("nonfinite_steps", Value::from(nonfinite_steps));
    let trend_sampled = sample_indices(num_steps, super::CURVE_SAMPLE_CAP)
        .into_iter()
        .map(|i| {
            let t = a.trend.get(i).copied().unwrap_or(f64::NAN);
            Value::List(vec![Value::Int(step(i)), Value::Float(t)])
        })
        .collect();
    e.put("trend_sampled", Value::List(trend_sampled));
    finish.answer(findings, &summary, score, Some(drop), e)
}

/// A run that blew up within its first records, inside the start level's
/// window, so the start level already sits high: its trend never got back
/// down to the first record, and it ended more than `UNSTABLE_RISE` (or 3
/// noise scales) above it. A healthy run falls below its first record, even
/// one that came out low by chance; a warm-up bump (the second record above
/// the first) is followed by a fall past both. `(step, first, rise)`.
/// The `no_progress` message: how far the loss fell, against the fall
/// required, said once.
fn no_progress_text(drop: f64, required: f64, span: &str, head: String, tail: String) -> String {
    let required = number_text::percent(required, 0);
    if drop > 0.0 {
        let fell = number_text::percent(drop, 1);
        format!("loss fell only {fell} (< {required} required) {span} ({head} -> {tail})")
    } else {
        format!("loss did not fall (a {required} fall required) {span} ({head} -> {tail})")
    }
}

fn never_back_to_first(curve: &LossCurve, a: &RobustCurve) -> Option<(i64, f64, f64)> {
    let (i, &first) = curve
        .losses
        .iter()
        .enumerate()
        .find(|(_, v)| v.is_finite())?;
    if first <= 0.0 {
        return None;
    }
    let noise = if a.relative {
        a.noise
    } else {
        a.noise / a.head_level
    };
    let above = (a.tail_level - first) / first;
    let limit = UNSTABLE_RISE.max(3.0 * noise);
    (a.best_level > first && above > limit)
        .then(|| (curve.steps.get(i).copied().unwrap_or(0), first, above))
}

/// A run that never learned: its loss trend barely moved (`BARELY_MOVED`)
/// and either sits at the chance level ln(k) of a k-class task without
/// ever getting below it (`at_chance`: a classifier that predicts the
/// prior, or a model that collapsed to it), or its held-out loss stayed
/// flat (`not_learning`: the training loss wanders while nothing
/// generalises). Both WARN: a stuck run is not broken data, and a person
/// should look (a flat loss can be intended, e.g. a probe run); neither is
/// judged on fewer than `STUCK_MIN_RECORDS` records.
fn stuck_finding(
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
fn order_jump(a: &RobustCurve, steps: &[i64], window: usize) -> Option<Finding> {
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

/// A trend below this share of the start level has learned nearly every
/// example: see [`is_batch_outlier`].
pub const NEAR_ZERO_TREND: f64 = 0.05;
/// Records an event at a near-zero trend must span to be a spike.
pub const NEAR_ZERO_SPIKE_RECORDS: usize = 3;

/// Whether a spike event is one hard batch on a near-zero loss rather than
/// an instability.
///
/// Once a classifier fits nearly every example (its trend under
/// `NEAR_ZERO_TREND` of where it started), a record's loss is the error of
/// the few examples it still gets wrong, so one batch holding a hard or
/// mislabelled example sits at 100x the trend and the next is back on it:
/// heavy-tailed noise, not the run losing what it learned. An instability
/// at that level keeps the loss up while the optimizer recovers, over
/// several records; an event of fewer than `NEAR_ZERO_SPIKE_RECORDS` is
/// an outlier, listed in the evidence (`batch_outlier_steps`) but no
/// finding. Above the near-zero level every event that stands out counts.
fn is_batch_outlier(e: &robust_curve::SpikeEvent, trend: &[f64], head: f64) -> bool {
    let level = trend.get(e.peak).copied().unwrap_or(f64::NAN);
    let records = e.end.saturating_sub(e.start) + 1;
    level < NEAR_ZERO_TREND * head && records < NEAR_ZERO_SPIKE_RECORDS
}

/// A rate as a percentage with as many decimals as it needs, up to 2
/// (`1%`, `0.5%`, `0.25%`).
fn rate_text(rate: f64) -> String {
    let hundredths = (rate * 1e4).round();
    let decimals = if hundredths % 100.0 == 0.0 {
        0
    } else if hundredths % 10.0 == 0.0 {
        1
    } else {
        2
    };
    number_text::percent(rate, decimals)
}

/// One spike event as the evidence lists it.
struct Spike {
    start_step: i64,
    end_step: i64,
    peak_step: i64,
    rise: f64,
    relative_rise: f64,
    /// None: a noise-free curve.
    z: Option<f64>,
}

impl Spike {
    fn to_value(&self) -> Value {
        let mut e = Evidence::new();
        e.put("start_step", self.start_step);
        e.put("end_step", self.end_step);
        e.put("peak_step", self.peak_step);
        e.put("rise", self.rise);
        e.put("relative_rise", self.relative_rise);
        e.put("z", self.z);
        Value::Map(e)
    }
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

/// How far above its best a healthy run's end level can sit by noise
/// alone, as a share of the start: three standard errors of the end level
/// (a median of `level_points` records) plus the expected depth of the
/// lowest of the trend's independent windows below the true level (the
/// best level is a minimum, so it is biased low by about sqrt(2 ln m) of
/// them).
fn regression_noise(a: &RobustCurve, n: usize, head: f64, window: usize) -> f64 {
    let per_point = 1.2533 * a.noise; // standard error factor of a median
    let tail_scale = if a.relative { a.tail_level.abs() } else { 1.0 };
    let best_scale = if a.relative { a.best_level.abs() } else { 1.0 };
    let w = window.max(1);
    let windows = (n / w).max(2);
    let end = 3.0 * per_point * tail_scale / (a.level_points as f64).sqrt();
    let low = per_point * best_scale / (w as f64).sqrt() * (2.0 * (windows as f64).ln()).sqrt();
    (end + low) / head
}

/// An upper bound on how far the loss fell, from the medians of the first
/// and last thirds of the records (more points than the start and end
/// levels, so a flat curve is told from a noisy one): the relative drop
/// plus three standard errors of a median of that many points.
fn thirds_drop_bound(losses: &[f64], noise: f64) -> f64 {
    let finite: Vec<f64> = losses.iter().copied().filter(|v| v.is_finite()).collect();
    let third = (finite.len() / 3).max(1);
    let first = finite.get(..third).and_then(upper_median);
    let last = finite
        .get(finite.len().saturating_sub(third)..)
        .and_then(upper_median);
    let (Some(first), Some(last)) = (first, last) else {
        return f64::INFINITY;
    };
    if first.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return f64::INFINITY; // nothing to measure a fall against
    }
    (first - last) / first + 3.0 * 1.2533 * noise / (third as f64).sqrt()
}
