//! The robust rules on what the logs carry beside the loss: the gradient
//! norm (NaN masking, non-finite and zero norms), the learning rate (zero
//! for most of the run), an RL objective's reward (exactly 0 throughout)
//! and the eval loss (non-finite, rising while the training loss falls).

use super::degenerate::margins_runaway;
use super::{number_text, steps_text, upper_median, CURVE_SAMPLE_CAP};
use crate::analysis::series;
use crate::formats::logs::curve::LossCurve;
use crate::verdicts::evidence::Evidence;
use crate::verdicts::{Finding, Value, Verdict};

/// Non-finite gradient norms on more than this share of records (or on the
/// last one) are more than fp16 loss scaling calibrating (WARN); fewer are
/// still said, as a note of a PASS, or a WARN where the loss also barely
/// moved: a NaN gradient beside a flat loss is a run whose updates are
/// being lost.
pub const NONFINITE_GRAD_SHARE: f64 = 0.05;
/// Zero gradient norms or a zero learning rate on more than this share of
/// the logged records: nothing was training for most of the run.
pub const ZERO_SHARE: f64 = 0.5;
/// Eval points needed before the eval loss is judged.
pub const MIN_EVAL_POINTS: usize = 3;
/// Eval points from which the eval's levels are medians of three (see
/// `eval_levels`).
pub const SMOOTH_EVAL_POINTS: usize = 7;
/// An eval loss that gave back more than this share of its fall (first
/// level to best) has risen; less is a wiggle around the level it reached,
/// within a fiftieth of the range the eval covered.
pub const EVAL_GIVE_BACK: f64 = 0.02;
/// Reward points needed before a reward of exactly 0 throughout is judged.
pub const MIN_REWARD_POINTS: usize = 5;
/// Reward points needed before a fall from its peak is judged, and the
/// blocks they are cut into (each block's median is one level).
pub const REWARD_FALL_MIN_POINTS: usize = 20;
pub const REWARD_BLOCKS: usize = 10;
/// A reward that gave back more than this share of its range of levels
/// (peak to lowest) by the end fell from its peak...
pub const REWARD_FALL_SHARE: f64 = 0.5;
/// ... and by more than this share of the peak's size, so that a flat
/// reward's wander is not a fall.
pub const REWARD_FALL_MIN: f64 = 0.1;

/// Findings and evidence from the side series of `curve`.
pub(super) fn side_findings(curve: &LossCurve, max_eval_rise: f64) -> (Vec<Finding>, Evidence) {
    let mut findings = Vec::new();
    let mut evidence = Evidence::new();

    let grad = &curve.side.grad_norm;
    if !grad.is_empty() {
        let s = series::summarize(grad, CURVE_SAMPLE_CAP);
        evidence.put("grad_norm_sampled", points(&s.sampled));
        let (bad, n) = (&s.nonfinite_steps, s.len);
        // The Trainer's NaN masking: NaN gradients, and the loss logged as 0.0.
        let masked = masked_steps(curve);
        let last_bad = bad.last().is_some() && bad.last() == s.sampled.last().map(|p| &p.0);
        let share = bad.len() as f64 / n as f64;
        if !masked.is_empty() {
            findings.push(Finding::new(
                Verdict::Fail,
                "nan_masked",
                format!(
                    "the loss is logged as exactly 0.0 with NaN/inf gradient norms at {} records \
                     (steps {}): the weights went NaN and the trainer masked the loss",
                    masked.len(),
                    steps_text(&masked, 6)
                ),
            ));
        } else if !bad.is_empty() {
            // Isolated ones are noted at PASS here; the trend rules make
            // them a WARN where the loss also barely moved.
            let isolated = !(share > NONFINITE_GRAD_SHARE || last_bad);
            findings.push(Finding::new(
                if isolated {
                    Verdict::Pass
                } else {
                    Verdict::Warn
                },
                "nonfinite_grad_norm",
                format!(
                    "{} NaN/inf gradient norm{} ({} of records{}) at step{} {}{}",
                    bad.len(),
                    if bad.len() == 1 { "" } else { "s" },
                    number_text::percent(share, 1),
                    if last_bad {
                        ", the last one included"
                    } else {
                        ""
                    },
                    if bad.len() == 1 { "" } else { "s" },
                    steps_text(bad, 6),
                    if isolated {
                        "; isolated, as fp16 loss scaling skips a step, but under bf16 or \
                         fp32 a first sign of the run going bad"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if s.zeros as f64 > ZERO_SHARE * n as f64 {
            findings.push(Finding::new(
                Verdict::Warn,
                "zero_gradients",
                format!(
                    "the gradient norm is exactly 0 at {} of {n} logged records: nothing is \
                     being trained (frozen parameters, or a LoRA B and A that cannot move)",
                    s.zeros
                ),
            ));
        }
    }

    let lr = &curve.side.learning_rate;
    if !lr.is_empty() {
        let s = series::summarize(lr, CURVE_SAMPLE_CAP);
        evidence.put("learning_rate_sampled", points(&s.sampled));
        if s.zeros as f64 > ZERO_SHARE * s.len as f64 {
            findings.push(Finding::new(
                Verdict::Warn,
                "zero_learning_rate",
                format!(
                    "the learning rate is 0 at {} of {} logged records",
                    s.zeros, s.len
                ),
            ));
        }
    }

    let rewards = &curve.side.reward;
    if !rewards.is_empty() {
        let s = series::summarize(rewards, CURVE_SAMPLE_CAP);
        evidence.put("reward_sampled", points(&s.sampled));
        // Exactly 0 at every logged step: no completion ever earned a
        // reward (a reward function that never fires, an answer parser
        // that never matches), so the policy gradient had nothing to
        // follow. A real reward of mixed outcomes is 0 only sometimes.
        if s.len >= MIN_REWARD_POINTS && s.zeros == s.len {
            findings.push(Finding::new(
                Verdict::Fail,
                "zero_reward",
                format!(
                    "the reward is exactly 0 at all {} logged steps: no completion ever earned \
                     a reward, so the policy had nothing to learn from (a reward function that \
                     never fires, or an answer that never parses?)",
                    s.len
                ),
            ));
        } else if let Some(fell) = reward_fell(rewards) {
            findings.push(fell);
        }
    }

    let margins = &curve.side.margins;
    if !margins.is_empty() {
        let s = series::summarize(margins, CURVE_SAMPLE_CAP);
        evidence.put("margins_sampled", points(&s.sampled));
        findings.extend(margins_runaway(margins));
    }

    let evals = &curve.side.eval_loss;
    if !evals.is_empty() {
        let s = series::summarize(evals, CURVE_SAMPLE_CAP);
        evidence.put("eval_loss_sampled", points(&s.sampled));
        let bad: Vec<i64> = evals
            .iter()
            .filter(|p| !p.1.is_finite())
            .map(|p| p.0)
            .collect();
        let finite: Vec<(i64, f64)> = evals.iter().copied().filter(|p| p.1.is_finite()).collect();
        if !bad.is_empty() {
            findings.push(Finding::new(
                Verdict::Fail,
                "nonfinite_eval_loss",
                format!(
                    "{} NaN/inf eval losses at steps {}",
                    bad.len(),
                    steps_text(&bad, 6)
                ),
            ));
        }
        if finite.len() >= MIN_EVAL_POINTS && finite.iter().all(|p| p.1 > 0.0) {
            eval_rise(curve, &finite, max_eval_rise, &mut findings, &mut evidence);
        }
    }
    (findings, evidence)
}

/// `reward_fell` (WARN): the reward's end level sits far below its peak.
///
/// What the failure is: an RL run whose reward rose and then collapsed
/// (reward hacking that a later penalty undid, a policy that drifted off
/// its KL anchor, a learning rate too high), or one that only ever fell.
/// The levels are the medians of `REWARD_BLOCKS` blocks of points, so one
/// bad batch is no level. A fall is judged when the end level is below the
/// peak by more than `REWARD_FALL_SHARE` of the levels' range, by more than
/// `REWARD_FALL_MIN` of the peak's size, and by more than three standard
/// errors of a difference of two levels (from the points' own noise): a
/// flat reward whose levels differ only by noise passes at about a 0.1%
/// rate per comparison, ten comparisons a run.
fn reward_fell(rewards: &[(i64, f64)]) -> Option<Finding> {
    let finite: Vec<(i64, f64)> = rewards
        .iter()
        .copied()
        .filter(|p| p.1.is_finite())
        .collect();
    if finite.len() < REWARD_FALL_MIN_POINTS {
        return None;
    }
    let block = finite.len() / REWARD_BLOCKS;
    let levels: Vec<(i64, f64)> = finite
        .chunks(block)
        .filter(|c| c.len() == block)
        .filter_map(|c| {
            let values: Vec<f64> = c.iter().map(|p| p.1).collect();
            Some((c.get(c.len() / 2)?.0, upper_median(&values)?))
        })
        .collect();
    let (peak_step, peak) = levels
        .iter()
        .copied()
        .reduce(|a, b| if b.1 > a.1 { b } else { a })?;
    let lowest = levels.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let (end_step, end) = *levels.last()?;
    // The points' noise from successive differences (robust to a trend).
    let mut diffs: Vec<f64> = finite.windows(2).map(|w| (w[1].1 - w[0].1).abs()).collect();
    diffs.sort_by(f64::total_cmp);
    let sigma = diffs.get(diffs.len() / 2).copied().unwrap_or(0.0) / (0.6745 * 2f64.sqrt());
    let level_sd = 1.2533 * sigma / (block as f64).sqrt();
    let fall = peak - end;
    let fell = end_step > peak_step
        && fall > REWARD_FALL_SHARE * (peak - lowest)
        && fall > REWARD_FALL_MIN * peak.abs()
        && fall > 3.0 * 2f64.sqrt() * level_sd;
    fell.then(|| {
        let g4 = |x: f64| number_text::significant(x, 4);
        Finding::new(
            Verdict::Warn,
            "reward_fell",
            format!(
                "the reward fell from its peak ({} around step {peak_step} -> {} around step \
                 {end_step}, medians of {block} points): the policy lost what it had learned \
                 (reward hacking undone, drift from the reference, a learning rate too high?)",
                g4(peak),
                g4(end)
            ),
        )
    })
}

/// `eval_rising` (WARN): overfitting, the eval loss climbing back from its
/// best while the training loss falls.
///
/// The best is the lowest of the eval's levels ([`eval_levels`]: medians
/// of three from `SMOOTH_EVAL_POINTS` evals, so one lucky low eval is not
/// the best), and the end is the lower of the last two evals, both past
/// the best: a rising tail, not one eval that came out high. It is a rise
/// when the end sits more than `max_eval_rise` above the best *and* has
/// given back more than [`EVAL_GIVE_BACK`] of the fall from the first
/// level to the best: a 0.001 wiggle after a fall of 1.07 is +273% of a
/// tiny best but 0.1% of the fall, and no overfitting. Built for: no false
/// alarm from the noise of a small eval set around a settled level, nor
/// from a loss settled near 0. The evidence keeps the lowest eval logged
/// (`eval_best_loss`) beside the level judged (`eval_best_level`).
fn eval_rise(
    curve: &LossCurve,
    finite: &[(i64, f64)],
    max_eval_rise: f64,
    findings: &mut Vec<Finding>,
    evidence: &mut Evidence,
) {
    let lowest = |points: &[(i64, f64)]| {
        // Ties: the first of equal minima wins.
        points
            .iter()
            .copied()
            .reduce(|acc, p| if p.1 < acc.1 { p } else { acc })
    };
    let levels = eval_levels(finite);
    let (Some((best_step, best)), Some(logged_best)) = (lowest(&levels), lowest(finite)) else {
        return;
    };
    let (Some(&(first_step, first)), Some(&(last_step, last))) = (levels.first(), finite.last())
    else {
        return;
    };
    evidence.put("eval_best_loss", logged_best.1);
    evidence.put("eval_best_step", logged_best.0);
    evidence.put("eval_best_level", best);
    evidence.put("eval_final_loss", last);
    let [before, end] = match finite.len().checked_sub(2).map(|i| &finite[i..]) {
        Some(&[a, b]) => [a, b],
        _ => return,
    };
    if before.0 <= best_step {
        return;
    }
    let end_level = before.1.min(end.1);
    let rise = (end_level - best) / best;
    let fall = first - best;
    let given_back = if fall > 0.0 {
        (end_level - best) / fall
    } else {
        f64::INFINITY
    };
    let train_fell = train_fell_between(&curve.steps, &curve.losses, best_step, last_step);
    if rise > max_eval_rise && given_back > EVAL_GIVE_BACK && train_fell {
        let fell_by = if fall > 0.0 {
            format!(
                ", {} of its fall from {} at step {first_step} given back",
                number_text::percent(given_back, 1),
                number_text::significant(first, 4)
            )
        } else {
            String::new()
        };
        findings.push(Finding::new(
            Verdict::Warn,
            "eval_rising",
            format!(
                "eval loss rose {} from its best ({} at step {best_step} -> {} at step \
                 {last_step}{fell_by}) while the training loss fell: overfitting",
                number_text::percent((last - best) / best, 0),
                number_text::significant(best, 4),
                number_text::significant(last, 4)
            ),
        ));
    }
}

/// The eval loss's levels: with `SMOOTH_EVAL_POINTS` or more points, the
/// median of each three in a row (at the middle one's step), so that one
/// evaluation that came out low by chance (a small or noisy eval set) is
/// not taken for the best the model reached, nor one high last point for
/// where it ended; with fewer, the points themselves.
fn eval_levels(finite: &[(i64, f64)]) -> Vec<(i64, f64)> {
    if finite.len() < SMOOTH_EVAL_POINTS {
        return finite.to_vec();
    }
    finite
        .windows(3)
        .filter_map(|w| {
            let mut v = [w[0].1, w[1].1, w[2].1];
            v.sort_by(f64::total_cmp);
            Some((w.get(1)?.0, v[1]))
        })
        .collect()
}

/// The loss logged at `step` (steps are distinct).
/// The steps whose loss the trainer logged as exactly 0.0 beside a
/// non-finite gradient norm: HF's NaN masking (`nan_masked`).
pub(super) fn masked_steps(curve: &LossCurve) -> Vec<i64> {
    let grad = &curve.side.grad_norm;
    let grad_bad = |step: i64| {
        grad.binary_search_by_key(&step, |p| p.0)
            .is_ok_and(|i| grad.get(i).is_some_and(|p| !p.1.is_finite()))
    };
    curve
        .steps
        .iter()
        .zip(&curve.losses)
        .filter(|&(&s, &v)| v == 0.0 && grad_bad(s))
        .map(|(&s, _)| s)
        .collect()
}

/// The curve with each masked loss (see [`masked_steps`]) read as the NaN
/// it stands for, and those steps; None where nothing was masked. Every
/// rule but `nan_masked`, and the summary and the chart, read this one.
pub(super) fn unmask(curve: &LossCurve) -> Option<(LossCurve, Vec<i64>)> {
    let steps = masked_steps(curve);
    if steps.is_empty() {
        return None;
    }
    let mut c = curve.clone();
    for (s, v) in c.steps.iter().zip(c.losses.iter_mut()) {
        if steps.binary_search(s).is_ok() {
            *v = f64::INFINITY;
        }
    }
    Some((c, steps))
}

/// Whether the training loss is lower around `last` than around `first`
/// (medians of the three finite records nearest each step).
fn train_fell_between(steps: &[i64], losses: &[f64], first: i64, last: i64) -> bool {
    last > first && level_at(steps, losses, last) < level_at(steps, losses, first)
}

/// The upper median of the three finite losses nearest `step` (by step
/// distance, ties by value, as Python sorts the pairs); NaN without any.
fn level_at(steps: &[i64], losses: &[f64], step: i64) -> f64 {
    let mut near: Vec<(i128, f64)> = steps
        .iter()
        .zip(losses)
        .filter(|(_, v)| v.is_finite())
        .map(|(&s, &v)| ((i128::from(s) - i128::from(step)).abs(), v))
        .collect();
    near.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.total_cmp(&b.1)));
    let vals: Vec<f64> = near.iter().take(3).map(|p| p.1).collect();
    upper_median(&vals).unwrap_or(f64::NAN)
}

/// Sampled `(step, value | None)` points as evidence.
fn points(sampled: &[(i64, Option<f64>)]) -> Value {
    Value::Points(
        sampled
            .iter()
            .map(|&(s, v)| (s, v.unwrap_or(f64::NAN)))
            .collect(),
    )
}
