use std::path::{Path, PathBuf};

use super::*;
use crate::error::{Area, Error};
use crate::formats::logs::loss_log::{assemble, SideSeries};

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
    let j = judge_drift(&input(curve(&[3.0, 2.0])), &robust());
    assert!(j
        .message
        .starts_with("2 logged records, fewer than min_steps=3"));
}

#[test]
fn sway_passes_a_smooth_descent_and_warns_with_each_shortfall() {
    let j = judge_drift(&input(curve(&decaying(60))), &sway());
    assert_eq!(j.verdict, Verdict::Pass, "{}", j.message);
    assert_eq!(j.score, j.raw);
    assert!(j
        .message
        .starts_with("smoothness=1.00, convergence_ratio=0.03"));
    let keys: Vec<&str> = j.evidence.0.iter().map(|(k, _)| k.as_str()).collect();
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

    let flat = vec![2.0; 40];
    let j = judge_drift(&input(curve(&flat)), &robust());
    assert_eq!(rules(&j), vec!["no_progress"]);
    assert!(j
        .message
        .starts_with("no_progress: loss did not fall: +0.0% over 40 steps (2 -> 2)"));
    assert_eq!(j.score, Some(0.3));

    let mut spiky = decaying(80);
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
        eval_loss: vec![(0, 2.0), (10, 1.0), (20, 1.1), (39, 1.5)],
        grad_norm: (0..40)
            .map(|s| (s, if s == 39 { f64::NAN } else { 1.0 }))
            .collect(),
        learning_rate: (0..40).map(|s| (s, 0.0)).collect(),
        reward: vec![],
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
        .contains("eval loss rose 50% from its best (1 at step 10 -> 1.5 at step 39)"));
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
