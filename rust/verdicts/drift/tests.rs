use std::path::{Path, PathBuf};

use super::*;
use crate::error::{Area, Error};
use crate::formats::logs::curve::{self, assemble, SideSeries};

fn curve(losses: &[f64]) -> LossCurve {
    curve_at(&(0..losses.len() as i64).collect::<Vec<_>>(), losses)
}

fn curve_at(steps: &[i64], losses: &[f64]) -> LossCurve {
    let records = steps.iter().copied().zip(losses.iter().copied()).collect();
    assemble(records, vec![PathBuf::from("/r/logs/train-1.jsonl")])
}

fn input(curve: LossCurve) -> DriftInput {
    DriftInput {
        store: PathBuf::from("/r"),
        layout: "dlm".into(),
        logs_dir: PathBuf::from("/r/logs"),
        files: curve.files.clone(),
        status: LogsStatus::Curve,
        curve: Some(curve),
        error: None,
        note: None,
        output_classes: None,
        guard: None,
    }
}

fn decaying(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| 4.0 * 0.93f64.powi(i as i32) + 0.05)
        .collect()
}

fn robust() -> DriftOptions {
    DriftOptions::defaults("robust")
}

fn sway() -> DriftOptions {
    DriftOptions::defaults("sway")
}

fn rules(j: &Judged) -> Vec<String> {
    match j.evidence.get("findings") {
        Some(Value::List(items)) => items
            .iter()
            .filter_map(|f| match f {
                Value::Map(m) => match m.get("rule") {
                    Some(Value::Text(r)) => Some(r.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

#[test]
fn states_without_a_curve_skip_or_error_with_their_reason() {
    let mut i = input(curve(&[1.0]));
    i.curve = None;
    i.status = LogsStatus::NoLogsDir;
    let j = judge_drift(&i, &robust());
    assert_eq!(
        (j.verdict, j.message.as_str()),
        (Verdict::Skip, "/r has no logs/ directory")
    );
    i.note = Some("a bare PEFT adapter".into());
    assert_eq!(judge_drift(&i, &robust()).message, "a bare PEFT adapter");
    i.note = Some(String::new());
    i.status = LogsStatus::NoFiles;
    let j = judge_drift(&i, &sway());
    assert_eq!(j.message, "no train-*.jsonl files in /r/logs");
    i.status = LogsStatus::Failed;
    i.error = Some(Error::new(Area::LogFormat, "/r//logs/x.jsonl", "bad line"));
    let j = judge_drift(&i, &robust());
    assert_eq!(j.verdict, Verdict::Error);
    assert_eq!(j.message, "/r/logs/x.jsonl: bad line");
    assert_eq!(
        j.evidence.get("log_paths"),
        Some(&Value::List(vec!["/r/logs/train-1.jsonl".into()]))
    );
    assert_eq!((j.score, j.raw), (None, None));
}

#[test]
fn a_short_curve_skips_naming_records_and_steps() {
    let j = judge_drift(&input(curve_at(&[0, 500, 1500], &[3.0, 2.0, 1.0])), &sway());
    assert_eq!(j.verdict, Verdict::Skip);
    assert_eq!(
        j.message,
        "3 logged records over 1,501 steps, fewer than min_steps=10: too short a curve to judge"
    );
    assert_eq!(j.evidence.get("num_steps"), Some(&Value::Int(3)));
    let j = judge_drift(&input(curve_at(&[100, 200], &[3.0, 2.0])), &robust());
    assert!(j
        .message
        .starts_with("2 logged records over 101 steps, fewer than min_steps=3"));
}

#[test]
fn a_run_of_five_steps_or_fewer_fails_planned_or_not() {
    // The last logged step says it (no trainer state beside the log).
    for steps in [&[0i64][..], &[1, 2][..], &[1, 3, 5][..]] {
        let losses: Vec<f64> = steps.iter().map(|&s| 3.0 - 0.1 * s as f64).collect();
        let j = judge_drift(&input(curve_at(steps, &losses)), &robust());
        assert_eq!(j.verdict, Verdict::Fail, "{steps:?}: {}", j.message);
        assert_eq!(rules(&j), ["tiny_run"], "{}", j.message);
    }
    // One step more is judged as any run.
    let j = judge_drift(&input(curve_at(&[1, 3, 6], &[3.0, 2.8, 2.6])), &robust());
    assert!(
        !rules(&j).contains(&"tiny_run".to_string()),
        "{}",
        j.message
    );
    // Planned for 3 and reached it: still too few (the trainer's count wins).
    let mut c = curve_at(&[], &[]);
    c.side.progress = Some(curve::RunProgress {
        global_step: 3,
        max_steps: 3,
    });
    let j = judge_drift(&input(c), &robust());
    assert_eq!(rules(&j), ["tiny_run"], "{}", j.message);
    assert!(
        j.message.contains("3 optimizer steps (its trainer state"),
        "{}",
        j.message
    );
    // Epochs are not optimizer steps: five epochs can be a whole run.
    let mut c = curve_at(&[0, 1, 2, 3, 4], &[2.0, 1.5, 1.2, 1.0, 0.9]);
    c.series = "epoch_loss".into();
    let j = judge_drift(&input(c), &robust());
    assert!(
        !rules(&j).contains(&"tiny_run".to_string()),
        "{}",
        j.message
    );
}

#[test]
// 0.6931 is ln 2 as TRL logs it (4 decimals), on purpose.
#[allow(clippy::approx_constant)]
fn no_learning_signal_fails_a_single_zero_most_zeros_a_constant_and_a_collapsed_preference() {
    let j = judge_drift(&input(curve_at(&[40], &[0.0])), &robust());
    assert_eq!(rules(&j), ["degenerate_loss"], "{}", j.message);
    assert!(
        j.message.contains("exactly 0 at its only record"),
        "{}",
        j.message
    );
    // Exactly 0 at more than half the records, after a tiny start.
    let mut mostly: Vec<f64> = vec![2e-6; 20];
    mostly.extend([0.0; 30]);
    let j = judge_drift(&input(curve(&mostly)), &robust());
    assert_eq!(rules(&j), ["degenerate_loss"], "{}", j.message);
    assert!(
        j.message.contains("exactly 0 at 30 of its 50 records"),
        "{}",
        j.message
    );
    // Zeros the trainer wrote for NaN gradients are nan_masked's, not this
    // rule's, nor the trend's or the summary's.
    let mut after_a_real_start = decaying(20);
    after_a_real_start.extend([0.0; 30]);
    let mut masked = curve(&after_a_real_start);
    masked.side.grad_norm = (20..50).map(|s| (s, f64::NAN)).collect();
    let j = judge_drift(&input(masked), &robust());
    assert!(
        !rules(&j).contains(&"degenerate_loss".to_string()),
        "{}",
        j.message
    );
    assert_eq!(rules(&j), ["nan_masked"], "{}", j.message);
    // The summary reads the masked zeros as NaN: it ends at the last real loss.
    assert!(j.message.contains("-> 1.057 "), "{}", j.message);
    assert!(!j.message.contains("-> 0 "), "{}", j.message);
    // The same value to the last bit at every record.
    let j = judge_drift(&input(curve(&[2.25; 30])), &robust());
    assert_eq!(rules(&j), ["constant_loss"], "{}", j.message);
    // A stuck loss that batches still move is not constant.
    let stuck: Vec<f64> = (0..30).map(|i| 2.3 + 0.001 * f64::from(i % 3)).collect();
    let j = judge_drift(&input(curve(&stuck)), &robust());
    assert!(
        !rules(&j).contains(&"constant_loss".to_string()),
        "{}",
        j.message
    );
    // DPO: ln 2 at the start, exactly 0 at the end (TRL logs 4 decimals).
    let dpo = curve_at(&[1, 10, 20, 30], &[0.6931, 0.1628, 0.0, 0.0]);
    let j = judge_drift(&input(dpo), &robust());
    assert!(
        rules(&j).contains(&"preference_collapse".to_string()),
        "{}",
        j.message
    );
    assert_eq!(j.verdict, Verdict::Fail);
    // A DPO run that ends low but positive is judged as any curve.
    let dpo = curve_at(&[1, 10, 20, 30], &[0.6931, 0.45, 0.31, 0.28]);
    let j = judge_drift(&input(dpo), &robust());
    assert!(
        !rules(&j).contains(&"preference_collapse".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn sway_passes_a_smooth_descent_and_warns_with_each_shortfall() {
    let j = judge_drift(&input(curve(&decaying(60))), &sway());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert_eq!(j.score, j.raw);
    assert!(j
        .message
        .starts_with("smoothness=1.00, convergence_ratio=0.03"));
    let keys: Vec<&str> = j.evidence.0.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(keys[..3], ["rules", "final_loss", "initial_loss"]);
    assert_eq!(keys.last(), Some(&"thresholds"));

    let flat: Vec<f64> = (0..40)
        .map(|i| 2.0 + if i % 2 == 0 { 0.3 } else { -0.3 })
        .collect();
    let j = judge_drift(&input(curve(&flat)), &sway());
    assert_eq!(j.verdict, Verdict::Warn);
    assert!(
        j.message.contains("; smoothness 0.00 is below 0.7"),
        "{}",
        j.message
    );
    assert!(
        j.message.contains("convergence_ratio 0.74 is above 0.7"),
        "{}",
        j.message
    );
    assert_eq!(j.score, Some(0.0));
}

#[test]
fn robust_passes_a_healthy_run_with_a_clean_summary() {
    let j = judge_drift(&input(curve(&decaying(60))), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert!(j.message.starts_with("loss 3.") && j.message.contains("over 60 steps"));
    assert!(
        j.message.ends_with("; no spikes, no NaN/inf losses"),
        "{}",
        j.message
    );
    assert_eq!(j.score, Some(1.0));
    assert!(rules(&j).is_empty());
    let Some(Value::Map(t)) = j.evidence.get("thresholds") else {
        panic!("no thresholds")
    };
    assert_eq!(t.0.len(), 12);
    assert!(matches!(j.evidence.get("trend_sampled"), Some(Value::List(l)) if l.len() == 60));
}

#[test]
fn robust_fails_when_no_loss_is_finite() {
    let j = judge_drift(&input(curve(&[f64::NAN; 5])), &robust());
    assert_eq!(j.verdict, Verdict::Fail);
    assert_eq!(
        j.message,
        "nonfinite_loss: all 5 logged losses are NaN or infinite (no finite loss over 5 steps)"
    );
    assert_eq!((j.score, j.raw), (Some(0.0), None));
}

#[test]
fn robust_judges_other_objectives_for_nan_only() {
    let rl: Vec<f64> = (0..30).map(|i| -0.5 + 0.01 * f64::from(i)).collect();
    let j = judge_drift(&input(curve(&rl)), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert_eq!((j.score, j.raw), (Some(0.6), None));
    assert!(j
        .message
        .starts_with("objective -0.5 -> -0.21 over 30 steps; not a positive loss"));
    assert_eq!(
        j.evidence.get("objective"),
        Some(&Value::Text("not_positive".into()))
    );
}

#[test]
fn robust_trend_rules_fire() {
    let rising: Vec<f64> = (0..40).map(|i| 1.0 + 0.05 * f64::from(i)).collect();
    let j = judge_drift(&input(curve(&rising)), &robust());
    assert_eq!(
        (j.verdict, rules(&j)),
        (Verdict::Fail, vec!["diverged".to_string()])
    );
    assert_eq!(j.score, Some(0.0));
    assert!(j.raw.is_some_and(|r| r < 0.0));

    let flat: Vec<f64> = (0..40).map(|i| 2.0 + 1e-4 * f64::from(i % 2)).collect();
    let j = judge_drift(&input(curve(&flat)), &robust());
    assert_eq!(rules(&j), vec!["no_progress"]);
    assert!(
        j.message.starts_with(
            "no_progress: loss did not fall (a 2% fall required) over 40 steps (2 -> 2)"
        ),
        "{}",
        j.message
    );
    assert_eq!(j.score, Some(0.3));

    // A small fall is said as one: how far, against how far it had to go.
    let barely: Vec<f64> = (0..40).map(|i| 0.5 - 0.000_2 * f64::from(i)).collect();
    let j = judge_drift(&input(curve(&barely)), &robust());
    assert_eq!(rules(&j), vec!["no_progress"]);
    assert!(
        j.message.starts_with("no_progress: loss fell only "),
        "{}",
        j.message
    );
    assert!(
        j.message.contains("(< 2% required) over 40 steps"),
        "{}",
        j.message
    );

    // Settling at 0.35, well above a near-zero trend (see
    // one_hard_batch_on_a_near_zero_loss_is_an_outlier_not_a_spike).
    let mut spiky: Vec<f64> = decaying(80).iter().map(|v| v + 0.3).collect();
    if let Some(v) = spiky.get_mut(50) {
        *v = 3.0;
    }
    if let Some(v) = spiky.get_mut(30) {
        *v = f64::NAN;
    }
    let j = judge_drift(&input(curve(&spiky)), &robust());
    assert_eq!(
        rules(&j),
        vec!["nonfinite_loss", "loss_spikes"],
        "{}",
        j.message
    );
    assert_eq!(j.verdict, Verdict::Warn);
    assert!(j
        .message
        .contains("1 NaN/inf losses (1.2% of records) at steps 30"));
    assert!(j.message.contains("1 loss spike beyond"));
    assert_eq!(
        j.evidence.get("spike_steps"),
        Some(&Value::List(vec![Value::Int(50)]))
    );
}

#[test]
fn robust_side_series_findings() {
    let mut c = curve(&decaying(40));
    if let Some(v) = c.losses.get_mut(39) {
        *v = 0.0;
    }
    c.side = SideSeries {
        eval_loss: vec![(0, 2.0), (10, 1.0), (20, 1.3), (39, 1.5)],
        grad_norm: (0..40)
            .map(|s| (s, if s == 39 { f64::NAN } else { 1.0 }))
            .collect(),
        learning_rate: (0..40).map(|s| (s, 0.0)).collect(),
        reward: vec![],
        margins: vec![],
        progress: None,
        ending: None,
    };
    let j = judge_drift(&input(c), &robust());
    assert_eq!(j.verdict, Verdict::Fail);
    assert_eq!(
        rules(&j),
        vec!["nan_masked", "zero_learning_rate", "eval_rising"],
        "{}",
        j.message
    );
    assert!(j
        .message
        .contains("eval loss rose 50% from its best (1 at step 10 -> 1.5 at step 39, 30.0% of its fall from 2 \
         at step 0 given back)"));
    assert_eq!(j.evidence.get("eval_best_step"), Some(&Value::Int(10)));
}

#[test]
fn text_helpers_spell_as_python() {
    assert_eq!(span_text(&[5]), "over 1 step");
    assert_eq!(span_text(&[0, 10, 20]), "over 21 steps (3 logged records)");
    assert_eq!(span_text(&[0, 1]), "over 2 steps");
    assert_eq!(
        steps_text(&[1, 2, 3, 4, 5, 6, 7, 8], 6),
        "1, 2, 3, 4, 5, 6 and 2 more"
    );
    assert_eq!(step_span(&[i64::MIN, i64::MAX]), 1i128 << 64);
    assert_eq!(
        number_text::thousands(1i128 << 64),
        "18,446,744,073,709,551,616"
    );
    assert_eq!(path_text::display(Path::new("/a//b/./c/")), "/a/b/c");
    assert_eq!(path_text::display(Path::new("//net/x")), "//net/x");
    assert_eq!(path_text::display(Path::new("///x")), "/x");
    assert_eq!(path_text::display(Path::new("./")), ".");
    assert_eq!(path_text::display(Path::new("a/../b")), "a/../b");
    assert_eq!(sample_indices(5, 2), vec![0, 3, 4]);
    assert_eq!(upper_median(&[3.0, 1.0]), Some(3.0));
}

#[test]
fn the_series_judged_is_named_and_a_held_out_one_said_first() {
    let mut train = curve(&decaying(60));
    train.series = "train/nll_loss".into();
    train.source = "csv".into();
    let j = judge_drift(&input(train), &robust());
    assert_eq!(
        j.evidence.get("series"),
        Some(&Value::from("train/nll_loss"))
    );
    assert_eq!(j.evidence.get("log_source"), Some(&Value::from("csv")));
    assert!(j.message.starts_with("loss "), "{}", j.message);

    let mut dev = curve(&decaying(60));
    dev.series = "dev_loss".into();
    let j = judge_drift(&input(dev), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert!(
        j.message.starts_with(
            "judged on the held-out loss \"dev_loss\" (no training loss is logged): loss "
        ),
        "{}",
        j.message
    );
    // The seeds' rules keep the seeds' record.
    let mut dev = curve(&decaying(60));
    dev.series = "dev_loss".into();
    let j = judge_drift(&input(dev), &sway());
    assert!(j.evidence.get("series").is_none() && j.message.starts_with("smoothness"));
}

/// A noisy flat series around `level` (a fixed pseudo-random pattern of
/// +-`jitter`), `n` records.
fn flat(level: f64, jitter: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| level * (1.0 + jitter * (((i * 7919) % 13) as f64 / 6.0 - 1.0)))
        .collect()
}

#[test]
fn a_loss_stuck_at_a_chance_level_warns_at_chance() {
    // A 3-class classifier predicting the prior: ln 3 throughout.
    for k in [2u32, 3, 10] {
        let c = curve(&flat(f64::from(k).ln(), 0.005, 60));
        let j = judge_drift(&input(c), &robust());
        assert_eq!(j.verdict, Verdict::Warn, "k={k}: {}", j.message);
        assert_eq!(rules(&j), ["at_chance"], "k={k}");
        assert!(j.message.contains(&format!("ln({k})")), "{}", j.message);
    }
    // A collapse to ln 2 after a short fall (0.74 -> 0.693, then flat).
    let mut losses: Vec<f64> = (0..10).map(|i| 0.74 - 0.0047 * f64::from(i)).collect();
    losses.extend(flat(std::f64::consts::LN_2, 0.002, 190));
    let j = judge_drift(&input(curve(&losses)), &robust());
    assert_eq!(rules(&j), ["at_chance"], "{}", j.message);
}

#[test]
fn near_a_chance_level_but_learning_is_no_alarm() {
    // Falls from ln 2 well below it: a classifier that learned.
    let losses: Vec<f64> = (0..80)
        .map(|i| 0.3 + (std::f64::consts::LN_2 - 0.3) * 0.95f64.powi(i))
        .collect();
    let j = judge_drift(&input(curve(&losses)), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    // Flat, but 3% away from every ln(k) of k <= 10 (between ln 3 and ln 4).
    let j = judge_drift(&input(curve(&flat(1.25, 0.005, 60))), &robust());
    assert!(
        !rules(&j).contains(&"at_chance".to_string()),
        "{}",
        j.message
    );
    // Too few records to call it stuck.
    let j = judge_drift(&input(curve(&flat(3f64.ln(), 0.005, 9))), &robust());
    assert!(
        !rules(&j).contains(&"at_chance".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn a_barely_moving_loss_with_a_flat_eval_is_not_learning() {
    // A regression loss ~950 that wanders 5% while the eval holds at 681.
    let losses: Vec<f64> = flat(950.0, 0.02, 25)
        .iter()
        .enumerate()
        .map(|(i, v)| v - 2.0 * i as f64)
        .collect();
    let mut c = curve(&losses);
    c.side.eval_loss = (0..5).map(|i| (i * 5, 681.6 - 0.1 * i as f64)).collect();
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert_eq!(rules(&j), ["not_learning"]);
    // The same training loss with an eval that fell 10%: learning.
    c.side.eval_loss = (0..5)
        .map(|i| (i * 5, 681.6 * (1.0 - 0.025 * i as f64)))
        .collect();
    let j = judge_drift(&input(c.clone()), &robust());
    assert!(
        !rules(&j).contains(&"not_learning".to_string()),
        "{}",
        j.message
    );
    // A training loss that fell 30% with a flat eval: memorising, not stuck.
    let mut fell = curve(&decaying(25).iter().map(|v| v + 2.0).collect::<Vec<_>>());
    fell.side.eval_loss = (0..5).map(|i| (i * 5, 2.5)).collect();
    let j = judge_drift(&input(fell), &robust());
    assert!(
        !rules(&j).contains(&"not_learning".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn a_reward_of_exactly_zero_throughout_fails() {
    // GRPO's policy loss sits near 0 by construction: only the side series
    // are judged, and a reward that never left 0 is the fault.
    let policy: Vec<f64> = (0..40).map(|i| 1e-4 * f64::from(i % 5) - 2e-4).collect();
    let mut c = curve(&policy);
    c.side.reward = (0..40).map(|s| (s, 0.0)).collect();
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert_eq!(rules(&j), ["zero_reward"]);
    // Rewards of mixed outcomes are 0 only sometimes: no finding.
    c.side.reward = (0..40)
        .map(|s| (s, if s % 3 == 0 { 0.0 } else { 0.5 }))
        .collect();
    let j = judge_drift(&input(c.clone()), &robust());
    assert!(rules(&j).is_empty(), "{}", j.message);
    // Too few points to tell.
    c.side.reward = (0..4).map(|s| (s, 0.0)).collect();
    let j = judge_drift(&input(c), &robust());
    assert!(rules(&j).is_empty(), "{}", j.message);
}

#[test]
fn one_low_evaluation_is_not_the_best_an_eval_rise_is_measured_from() {
    // A noisy, flat eval (~0.28) with one evaluation that came out low.
    let noisy = [
        0.314, 0.255, 0.267, 0.232, 0.303, 0.272, 0.254, 0.283, 0.294, 0.294, 0.288,
    ];
    let mut c = curve(&decaying(110));
    c.side.eval_loss = noisy
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as i64 * 10, v))
        .collect();
    let j = judge_drift(&input(c.clone()), &robust());
    assert!(
        !rules(&j).contains(&"eval_rising".to_string()),
        "{}",
        j.message
    );
    // An eval that bottoms out and climbs for good is overfitting.
    let rising = [
        0.40, 0.33, 0.29, 0.27, 0.28, 0.30, 0.33, 0.36, 0.39, 0.42, 0.45,
    ];
    c.side.eval_loss = rising
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as i64 * 10, v))
        .collect();
    let j = judge_drift(&input(c), &robust());
    assert_eq!(rules(&j), ["eval_rising"], "{}", j.message);
}

fn with_classes(curve: LossCurve, count: u64, kind: &str) -> DriftInput {
    DriftInput {
        output_classes: Some(crate::formats::model_config::OutputClasses {
            count,
            kind: kind.into(),
            path: PathBuf::from("/r/config.json"),
            source: "config.json".to_string(),
        }),
        ..input(curve)
    }
}

#[test]
fn a_run_that_stopped_a_handful_of_steps_in_fails_even_when_short() {
    use crate::formats::logs::curve::RunProgress;
    let progress = |global_step, max_steps| {
        Some(RunProgress {
            global_step,
            max_steps,
        })
    };
    // One record of a run set for 1,000 steps that stopped at step 6: too
    // short for every other rule, judged by the trainer's own count.
    let mut c = curve_at(&[5], &[9.07]);
    c.side.progress = progress(6, 1000);
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert_eq!(rules(&j), ["stopped_early"]);
    assert!(j.message.contains("step 6 of the 1,000"), "{}", j.message);
    // A planned smoke test (6 of 6) and early stopping past half the plan
    // are no fault; sway keeps the seeds' skip.
    for (done, planned) in [(6, 6), (30, 50), (60, 1000)] {
        c.side.progress = progress(done, planned);
        let j = judge_drift(&input(c.clone()), &robust());
        assert_eq!(j.verdict, Verdict::Skip, "{done}/{planned}: {}", j.message);
    }
    c.side.progress = progress(6, 1000);
    assert_eq!(judge_drift(&input(c), &sway()).verdict, Verdict::Skip);
    // With a long enough log the finding joins the others.
    let mut long = curve(&decaying(40));
    long.side.progress = progress(40, 5000);
    let j = judge_drift(&input(long.clone()), &robust());
    assert_eq!(rules(&j), ["stopped_early"], "{}", j.message);
    assert!(j.message.contains("it crashed"), "{}", j.message);
    // The Trainer's closing entry: ended on purpose, said so, still too few.
    long.side.ending = Some(curve::RunEnd::Finished);
    let j = judge_drift(&input(long), &robust());
    assert_eq!(rules(&j), ["stopped_early"], "{}", j.message);
    assert!(
        j.message.contains("the Trainer closed it there"),
        "{}",
        j.message
    );
    let Some(Value::Map(facts)) = j.evidence.get("run_facts") else {
        panic!("no run_facts");
    };
    assert_eq!(
        facts.get("completion"),
        Some(&Value::Text("ended_early".into()))
    );
}

#[test]
fn a_loss_far_above_the_uniform_guess_fails() {
    // lr=10 on a GPT-2: the first record is already in the thousands and
    // "falls" 80% from there.
    let blown: Vec<f64> = (0..30).map(|i| 3000.0 * 0.95f64.powi(i) + 400.0).collect();
    let j = judge_drift(&with_classes(curve(&blown), 50257, "vocabulary"), &robust());
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert!(rules(&j).contains(&"worse_than_uniform".to_string()));
    assert!(
        j.message.contains("50,257-token vocabulary"),
        "{}",
        j.message
    );
    // Without a config there is no K: a regression loss of 3,000 is fine.
    let j = judge_drift(&input(curve(&blown)), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    // A healthy fine-tune, and one from scratch starting at ln(K) + a bit.
    let healthy = decaying(40);
    let j = judge_drift(
        &with_classes(curve(&healthy), 32000, "vocabulary"),
        &robust(),
    );
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    let scratch: Vec<f64> = (0..40).map(|i| 3.0 + 7.9 * 0.9f64.powi(i)).collect();
    let j = judge_drift(
        &with_classes(curve(&scratch), 50257, "vocabulary"),
        &robust(),
    );
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    // An absurd eval loss on a sane training loss.
    let mut c = curve(&healthy);
    c.side.eval_loss = vec![(0, 2.0), (20, 1.5), (39, 900.0)];
    let j = judge_drift(&with_classes(c, 32000, "vocabulary"), &robust());
    assert!(
        rules(&j).contains(&"worse_than_uniform".to_string()),
        "{}",
        j.message
    );
    assert!(j.message.contains("eval loss at step 39"), "{}", j.message);
    // Blown up before the first record, then back to a sane level: WARN.
    let mut back = vec![60.0, 45.0, 30.0];
    back.extend(decaying(40));
    let j = judge_drift(&with_classes(curve(&back), 3, "labels"), &robust());
    assert!(
        rules(&j).contains(&"blown_up_start".to_string()),
        "{}",
        j.message
    );
    assert!(j.message.contains("its 3 labels"), "{}", j.message);
}

#[test]
fn a_loss_flat_at_ln_of_the_config_classes_is_at_chance() {
    // 20 labels: ln 20 lies beyond CHANCE_CLASSES, so only the config names it.
    let c = curve(&flat(20f64.ln(), 0.004, 60));
    assert_eq!(
        judge_drift(&input(c.clone()), &robust()).verdict,
        Verdict::Warn
    );
    assert!(!rules(&judge_drift(&input(c.clone()), &robust())).contains(&"at_chance".into()));
    let j = judge_drift(&with_classes(c, 20, "labels"), &robust());
    assert_eq!(rules(&j), ["at_chance"], "{}", j.message);
    assert!(j.message.contains("ln(20)"), "{}", j.message);
}

#[test]
fn a_loss_of_zero_from_the_first_record_fails_unless_it_is_rl() {
    let zeros = curve(&[0.0; 50]);
    let j = judge_drift(&input(zeros.clone()), &robust());
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert_eq!(rules(&j), ["degenerate_loss"]);
    assert!(j.message.contains("exactly 0 at all 50"), "{}", j.message);
    let tiny: Vec<f64> = (0..50).map(|i| 1e-6 * (1.0 + f64::from(i % 3))).collect();
    let j = judge_drift(&input(curve(&tiny)), &robust());
    assert_eq!(rules(&j), ["degenerate_loss"], "{}", j.message);
    // A healthy descent logged in a tiny unit is still a descent.
    let scaled: Vec<f64> = decaying(50).iter().map(|v| v * 1e-6).collect();
    let j = judge_drift(&input(curve(&scaled)), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    // An RL run logs its reward: its policy loss near 0 is by construction.
    let mut rl = zeros;
    rl.side.reward = (0..50).map(|s| (s, 0.2 + 0.01 * (s % 4) as f64)).collect();
    let j = judge_drift(&input(rl), &robust());
    assert!(
        !rules(&j).contains(&"degenerate_loss".into()),
        "{}",
        j.message
    );
    // A memorising run reaches 0 after a real start.
    let mut memorised = decaying(30);
    memorised.extend([0.0; 20]);
    let j = judge_drift(&input(curve(&memorised)), &robust());
    assert!(
        !rules(&j).contains(&"degenerate_loss".into()),
        "{}",
        j.message
    );
}

#[test]
fn a_jump_of_orders_of_magnitude_is_judged_on_a_log_scale() {
    // A regression loss from 1e8 to ~5 that sits at 2e6 for a stretch.
    let mut losses: Vec<f64> = (0..40).map(|i| 1e8 * 0.6f64.powi(i) + 5.0).collect();
    losses.extend(std::iter::repeat_n(2e6, 12));
    losses.extend(flat(8.0, 0.05, 30));
    let j = judge_drift(&input(curve(&losses)), &robust());
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert_eq!(rules(&j), ["order_jump"], "{}", j.message);
    // A near-zero loss whose trend wanders 2.2 decades (heavy-tailed
    // batches) is no jump.
    let mut wander: Vec<f64> = (0..40).map(|i| 0.5 * 0.7f64.powi(i) + 1e-4).collect();
    wander.extend(flat(1.6e-2, 0.05, 12));
    wander.extend(flat(2e-3, 0.05, 30));
    let j = judge_drift(&input(curve(&wander)), &robust());
    assert!(!rules(&j).contains(&"order_jump".into()), "{}", j.message);
    // The same descent with no jump, and a near-zero loss bouncing 10x.
    losses.truncate(40);
    losses.extend(flat(8.0, 0.05, 42));
    assert_eq!(
        judge_drift(&input(curve(&losses)), &robust()).verdict,
        Verdict::Pass
    );
    let mut bounce = decaying(60);
    bounce.extend(flat(0.5, 0.05, 12));
    let j = judge_drift(&input(curve(&bounce)), &robust());
    assert!(!rules(&j).contains(&"order_jump".into()), "{}", j.message);
}

#[test]
fn a_reward_that_falls_from_its_peak_warns() {
    let policy: Vec<f64> = (0..100).map(|i| 1e-4 * f64::from(i % 5) - 2e-4).collect();
    let mut c = curve(&policy);
    let jitter = |s: i64| 0.02 * ((s * 7919 % 13) as f64 / 6.0 - 1.0);
    // Rises 0.1 -> 0.8 by step 50, then collapses to 0.2.
    c.side.reward = (0..100)
        .map(|s| {
            let level = if s < 50 {
                0.1 + 0.014 * s as f64
            } else {
                0.8 - 0.012 * (s - 50) as f64
            };
            (s, level + jitter(s))
        })
        .collect();
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert_eq!(rules(&j), ["reward_fell"]);
    // A reward that rises and holds, and a noisy flat one: no finding.
    c.side.reward = (0..100)
        .map(|s| (s, (0.1 + 0.014 * s as f64).min(0.8) + jitter(s)))
        .collect();
    assert!(rules(&judge_drift(&input(c.clone()), &robust())).is_empty());
    c.side.reward = (0..100).map(|s| (s, 0.5 + 5.0 * jitter(s))).collect();
    assert!(rules(&judge_drift(&input(c), &robust())).is_empty());
}

#[test]
fn one_hard_batch_on_a_near_zero_loss_is_an_outlier_not_a_spike() {
    // A classifier that fits nearly every example: 0.5 -> ~0.002, one
    // batch at 100x the trend.
    let mut losses: Vec<f64> = (0..200)
        .map(|i| 0.5 * 0.9f64.powi(i) + 0.002 * (1.0 + 0.1 * f64::from(i % 3)))
        .collect();
    losses[150] = 0.2;
    let j = judge_drift(&input(curve(&losses)), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert_eq!(
        j.evidence.get("batch_outlier_steps"),
        Some(&Value::List(vec![Value::Int(150)]))
    );
    // The loss held up over three records: the run lost what it learned.
    losses[151] = 0.15;
    losses[152] = 0.12;
    let j = judge_drift(&input(curve(&losses)), &robust());
    assert_eq!(rules(&j), ["loss_spikes"], "{}", j.message);
    // Away from zero the same single record is a spike.
    let mut high: Vec<f64> = (0..200)
        .map(|i| 1.0 + 2.0 * 0.98f64.powi(i) + 0.01 * f64::from(i % 3))
        .collect();
    high[150] = 6.0;
    let j = judge_drift(&input(curve(&high)), &robust());
    assert_eq!(rules(&j), ["loss_spikes"], "{}", j.message);
}

#[test]
fn one_high_last_evaluation_is_not_where_the_eval_ended() {
    // Five evaluations falling, the last one 26% above the best (the
    // near-zero ViT eval of the shared corpora): no sustained rise.
    let mut c = curve(&decaying(70));
    c.side.eval_loss = vec![
        (10, 0.47),
        (20, 0.077),
        (30, 0.0675),
        (40, 0.0674),
        (50, 0.0431),
        (60, 0.0544),
    ];
    let j = judge_drift(&input(c.clone()), &robust());
    assert!(!rules(&j).contains(&"eval_rising".into()), "{}", j.message);
    // Two evaluations past the best, both well above it: overfitting.
    c.side.eval_loss = vec![
        (10, 0.47),
        (20, 0.077),
        (30, 0.0431),
        (40, 0.06),
        (50, 0.065),
        (60, 0.07),
    ];
    let j = judge_drift(&input(c), &robust());
    assert_eq!(rules(&j), ["eval_rising"], "{}", j.message);
}

#[test]
fn a_loss_that_blew_up_in_its_first_records_and_never_came_back_fails() {
    // 2.57 at the first record, 5.25 by the third, then ~3.6 for good: the
    // start level (a median of the first records) already sits high.
    let mut losses = vec![2.57, 3.35, 5.25, 4.13, 4.04, 3.93, 3.86, 3.75];
    losses.extend(flat(3.6, 0.02, 100));
    let j = judge_drift(&input(curve(&losses)), &robust());
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    assert!(rules(&j).contains(&"diverged".into()), "{}", j.message);
    assert!(
        j.message.contains("above its first record"),
        "{}",
        j.message
    );
    // A warm-up bump that falls past the first record is healthy.
    let mut warm = vec![2.5, 3.2, 3.0];
    warm.extend(decaying(60).iter().map(|v| v * 0.6));
    let j = judge_drift(&input(curve(&warm)), &robust());
    assert!(!rules(&j).contains(&"diverged".into()), "{}", j.message);
    // A first record low by chance on a flat noisy run: within the noise.
    let mut flat_run = vec![3.3];
    flat_run.extend(flat(3.6, 0.05, 100));
    let j = judge_drift(&input(curve(&flat_run)), &robust());
    assert!(!rules(&j).contains(&"diverged".into()), "{}", j.message);
}

#[test]
fn a_crashed_or_unfinished_run_is_never_a_clean_pass() {
    let mut c = curve_at(&(1..=40).map(|s| s * 10).collect::<Vec<_>>(), &decaying(40));
    c.side.ending = Some(curve::RunEnd::Finished);
    assert_eq!(
        judge_drift(&input(c.clone()), &robust()).verdict,
        Verdict::Pass
    );
    c.side.ending = Some(curve::RunEnd::Crashed("exit code 255".into()));
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(
        (j.verdict, rules(&j)),
        (Verdict::Warn, vec!["crashed".to_string()])
    );
    assert!(
        j.message.contains("after step 400 (exit code 255)"),
        "{}",
        j.message
    );
    c.side.ending = Some(curve::RunEnd::Unfinished("no exit record".into()));
    c.torn_files = vec![PathBuf::from("/r/run-x.wandb")];
    let j = judge_drift(&input(c), &robust());
    assert_eq!(rules(&j), ["unfinished"], "{}", j.message);
    // Too short for the trend rules, it is still said rather than skipped.
    let mut short = curve_at(&[100, 200], &[3.0, 2.0]);
    short.side.ending = Some(curve::RunEnd::Crashed("exit code 1".into()));
    let j = judge_drift(&input(short), &robust());
    assert_eq!(
        (j.verdict, rules(&j)),
        (Verdict::Warn, vec!["crashed".to_string()])
    );
}

#[test]
fn an_eval_rise_is_measured_against_how_far_the_eval_fell() {
    let mut c = curve(&decaying(100));
    // Fell 1.07 -> 0.0003, then wiggles at 0.002: +500% of a tiny best,
    // 0.2% of the fall.
    let mut evals = vec![(0, 1.07), (10, 0.2), (20, 0.01)];
    evals.extend((3..12).map(|i| (i * 8, if i < 7 { 0.0003 } else { 0.002 })));
    c.side.eval_loss = evals;
    let j = judge_drift(&input(c.clone()), &robust());
    assert!(
        !rules(&j).contains(&"eval_rising".to_string()),
        "{}",
        j.message
    );
    // Seven evals that turn up while training falls: caught on the rising
    // tail, the logged best kept in the evidence.
    c.side.eval_loss = [1.2, 1.0, 0.9, 0.95, 1.1, 1.3, 1.45]
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as i64 * 14, v))
        .collect();
    let j = judge_drift(&input(c), &robust());
    assert_eq!(rules(&j), ["eval_rising"], "{}", j.message);
    assert_eq!(j.evidence.get("eval_best_loss"), Some(&Value::Float(0.9)));
}

#[test]
fn an_isolated_nan_gradient_norm_is_said_and_warns_beside_a_flat_loss() {
    let grad = |n: i64| {
        (0..n)
            .map(|s| (s, if s == 20 { f64::NAN } else { 1.0 }))
            .collect()
    };
    let mut learning = curve(&decaying(60));
    learning.side.grad_norm = grad(60);
    let j = judge_drift(&input(learning), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert!(
        j.message.contains("noted: 1 NaN/inf gradient norm"),
        "{}",
        j.message
    );
    let mut flat = curve(
        &(0..60)
            .map(|i| 2.2 - 0.002 * f64::from(i) + 0.05 * f64::from(i % 3))
            .collect::<Vec<_>>(),
    );
    flat.side.grad_norm = grad(60);
    let j = judge_drift(&input(flat), &robust());
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    assert!(
        rules(&j).contains(&"nonfinite_grad_norm".to_string()),
        "{}",
        j.message
    );
    assert!(
        j.message
            .contains("beside a loss whose fall is within its noise"),
        "{}",
        j.message
    );
}

#[test]
fn a_log_that_ends_between_records_without_its_exit_record_is_noted() {
    let mut c = curve(&decaying(40));
    c.side.ending = Some(curve::RunEnd::Unfinished("no exit record".into()));
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert!(j.message.contains("noted: no exit record"), "{}", j.message);
    c.torn_files = vec![PathBuf::from("/r/run-x.wandb")];
    let j = judge_drift(&input(c), &robust());
    assert_eq!(rules(&j), ["unfinished"], "{}", j.message);
}

#[test]
#[allow(clippy::approx_constant)] // 0.6931: ln 2 as TRL logs it
fn the_run_facts_say_how_it_ended_what_it_optimised_and_where_that_was_read() {
    let facts = |j: &Judged| match j.evidence.get("run_facts") {
        Some(Value::Map(m)) => m.clone(),
        other => panic!("no run_facts: {other:?}"),
    };
    let text = |j: &Judged| match j.evidence.get("run_facts_text") {
        Some(Value::Text(t)) => t.clone(),
        other => panic!("no run_facts_text: {other:?}"),
    };
    let mut c = curve_at(&(1..=40).map(|s| s * 10).collect::<Vec<_>>(), &decaying(40));
    c.side.ending = Some(curve::RunEnd::Finished);
    let j = judge_drift(&with_classes(c.clone(), 32_000, "vocabulary"), &robust());
    let f = facts(&j);
    assert_eq!(f.get("completion"), Some(&Value::from("finished")));
    assert_eq!(f.get("objective"), Some(&Value::from("causal_lm")));
    assert_eq!(f.get("classes"), Some(&Value::Int(32_000)));
    assert_eq!(f.get("logging_every"), Some(&Value::Int(10)));
    assert_eq!(
        text(&j),
        "finished at step 400 (exit code 0); a language model, vocabulary 32,000 from \
         /r/config.json"
    );
    // The trainer's count against its plan; an RL run by its reward.
    c.side.ending = None;
    c.side.progress = Some(curve::RunProgress {
        global_step: 400,
        max_steps: 1000,
    });
    c.side.reward = (1..=40).map(|s| (s * 10, 0.5)).collect();
    let j = judge_drift(&input(c), &robust());
    assert!(
        text(&j).starts_with("stopped at step 400 of 1,000 (the trainer state); RL"),
        "{}",
        text(&j)
    );
    // A start at ln 2: DPO, or a two-class classifier (its config says which).
    let c = curve(&[0.6931, 0.6, 0.5, 0.45, 0.41]);
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(
        facts(&j).get("objective"),
        Some(&Value::from("preference_or_binary"))
    );
    let j = judge_drift(&with_classes(c, 2, "labels"), &robust());
    assert_eq!(
        facts(&j).get("objective"),
        Some(&Value::from("classification"))
    );
}

#[test]
fn when_k_is_known_only_ln_k_is_a_chance_level() {
    // A LoRA on an already trained base, flat at 2.07, vocabulary 128.
    let c = curve(&flat(8f64.ln(), 0.004, 60));
    let j = judge_drift(&input(c.clone()), &robust());
    assert!(
        rules(&j).contains(&"at_chance".to_string()),
        "{}",
        j.message
    );
    let j = judge_drift(&with_classes(c, 128, "vocabulary"), &robust());
    assert!(
        !rules(&j).contains(&"at_chance".to_string()),
        "{}",
        j.message
    );
    // At ln 128 itself it is at chance.
    let j = judge_drift(
        &with_classes(curve(&flat(128f64.ln(), 0.004, 60)), 128, "vocabulary"),
        &robust(),
    );
    assert!(
        rules(&j).contains(&"at_chance".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn a_two_class_classifier_the_config_names_is_no_preference_collapse() {
    let to_zero = curve_at(&[1, 10, 20, 30, 40], &[0.69, 0.3, 0.01, 0.0, 0.0]);
    let j = judge_drift(&input(to_zero.clone()), &robust());
    assert!(
        rules(&j).contains(&"preference_collapse".to_string()),
        "{}",
        j.message
    );
    let j = judge_drift(&with_classes(to_zero, 2, "labels"), &robust());
    assert!(
        !rules(&j).contains(&"preference_collapse".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn one_record_far_above_ln_k_fails_at_that_record() {
    let ln_k = 128f64.ln();
    // The first record of a run at lr=10: 587x ln K, alone.
    let j = judge_drift(
        &with_classes(curve_at(&[10], &[587.0 * ln_k]), 128, "vocabulary"),
        &robust(),
    );
    assert_eq!(
        (j.verdict, rules(&j)),
        (Verdict::Fail, vec!["worse_than_uniform".to_string()])
    );
    assert!(
        j.message.contains("the loss at step 10 is"),
        "{}",
        j.message
    );
    // An eval loss alone can say it.
    let mut c = curve_at(&[10, 20], &[2.0, 1.9]);
    c.side.eval_loss = vec![(20, 470.0 * ln_k)];
    let j = judge_drift(&with_classes(c, 128, "vocabulary"), &robust());
    assert!(
        j.message.contains("the eval loss at step 20"),
        "{}",
        j.message
    );
    // 3x is a start that came back (a WARN at most), not this rule's.
    let mut falling = vec![3.0 * ln_k];
    falling.extend(decaying(40).iter().map(|v| v * 0.5));
    let j = judge_drift(&with_classes(curve(&falling), 128, "vocabulary"), &robust());
    assert!(
        !rules(&j).contains(&"worse_than_uniform".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn preference_margins_that_run_away_warn_and_single_digits_do_not() {
    let steps: Vec<i64> = (1..=12).map(|i| i * 10).collect();
    let losses = [
        std::f64::consts::LN_2,
        0.6,
        0.5,
        0.42,
        0.36,
        0.3,
        0.26,
        0.22,
        0.19,
        0.17,
        0.15,
        0.14,
    ];
    let with_margins = |ends: f64| {
        let mut c = curve_at(&steps, &losses);
        c.side.margins = steps
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, ends * i as f64 / 11.0))
            .collect();
        c
    };
    let healthy = judge_drift(&input(with_margins(4.4)), &robust());
    assert!(
        !rules(&healthy).contains(&"margins_runaway".to_string()),
        "{}",
        healthy.message
    );
    assert!(healthy.evidence.get("margins_sampled").is_some());
    let away = judge_drift(&input(with_margins(141.0)), &robust());
    assert!(
        rules(&away).contains(&"margins_runaway".to_string()),
        "{}",
        away.message
    );
    assert_eq!(away.verdict, Verdict::Warn);
    // One wild last record is not the end level (the median of the last three).
    let mut one = with_margins(4.4);
    one.side.margins.last_mut().unwrap().1 = 500.0;
    let j = judge_drift(&input(one), &robust());
    assert!(
        !rules(&j).contains(&"margins_runaway".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn an_eval_past_ln_k_beside_a_fitted_training_loss_is_overfitting_not_a_blow_up() {
    // The issue's run: train falls to 0.014, eval 5.13 -> 7.58 over K = 128.
    let steps: Vec<i64> = (1..=40).map(|i| i * 5).collect();
    let losses: Vec<f64> = (0..40)
        .map(|i| 4.8 * (-(i as f64) / 6.0).exp() + 0.014)
        .collect();
    let mut c = curve_at(&steps, &losses);
    c.side.eval_loss = vec![(40, 5.13), (80, 5.6), (120, 6.4), (160, 7.1), (200, 7.58)];
    let j = judge_drift(&with_classes(c.clone(), 128, "vocabulary"), &robust());
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
    let r = rules(&j);
    assert!(r.contains(&"overfit".to_string()), "{}", j.message);
    assert!(
        !r.contains(&"worse_than_uniform".to_string()),
        "{}",
        j.message
    );
    assert!(j.message.contains("5.13 at step 40"), "{}", j.message);
    assert!(
        !j.message.contains("learning rate far too high"),
        "{}",
        j.message
    );
    // A training loss that did not fit its data beside the same eval: blown up.
    let noisy: Vec<f64> = (0..40).map(|i| 4.0 + 0.1 * (i % 3) as f64).collect();
    let mut flat = curve_at(&steps, &noisy);
    flat.side.eval_loss = c.side.eval_loss.clone();
    let j = judge_drift(&with_classes(flat, 128, "vocabulary"), &robust());
    assert!(
        rules(&j).contains(&"worse_than_uniform".to_string()),
        "{}",
        j.message
    );
}

#[test]
fn a_short_tracker_log_of_unknown_steps_warns_where_optimizer_steps_fail() {
    let mut c = curve_at(&[0, 1, 2, 3, 4], &[2.87, 2.1, 1.7, 1.4, 1.29]);
    c.source = "mlflow".into();
    c.series = "generator_loss".into();
    let j = judge_drift(&input(c.clone()), &robust());
    assert_eq!(rules(&j), ["tiny_run"], "{}", j.message);
    assert_eq!(j.verdict, Verdict::Warn, "{}", j.message);
    // The Trainer's train/loss is logged at its global step: a FAIL.
    c.series = "train/loss".into();
    let j = judge_drift(&input(c), &robust());
    assert_eq!(j.verdict, Verdict::Fail, "{}", j.message);
}

#[test]
fn a_small_fall_within_the_noise_is_no_progress_and_a_real_one_is() {
    // 100 records wandering around 3.0 with 5% noise a record, the first
    // ones a little higher by chance; and a real 4% fall under less noise.
    let wobble = |i: usize| 0.15 * (((i * 7919) % 13) as f64 / 6.0 - 1.0);
    let flat: Vec<f64> = (0..100)
        .map(|i| 3.0 + wobble(i) + if i < 12 { 0.09 } else { 0.0 })
        .collect();
    let j = judge_drift(&input(curve(&flat)), &robust());
    assert!(
        rules(&j).contains(&"no_progress".to_string()),
        "{}",
        j.message
    );
    assert!(j.message.contains("within its noise"), "{}", j.message);
    let falling: Vec<f64> = (0..100)
        .map(|i| 3.0 * (1.0 - 0.04 * i as f64 / 99.0) + wobble(i) * 0.2)
        .collect();
    let j = judge_drift(&input(curve(&falling)), &robust());
    assert!(
        !rules(&j).contains(&"no_progress".to_string()),
        "{}",
        j.message
    );
}
