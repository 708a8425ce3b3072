//! The `training_drift` rules judged online, one record at a time, for a
//! run that is still training (Python's `adapterprobe.Guard`).
//!
//! There is no second implementation of the rules here: the guard keeps
//! the run's records as the log readers would have assembled them (sorted
//! by step, the last record of a step winning, non-finite losses as +inf,
//! side series by step) and asks [`judge_drift`] about them. What it adds
//! is when to ask and what an answer means mid-run:
//!
//! - **When.** Judging is O(n), so it is not done on every record: every
//!   record while the run is short (`JUDGE_EVERY_RECORD`), then whenever
//!   the record count has grown by a sixteenth since the last judgement,
//!   which keeps the work amortised O(1) per record. A record that could
//!   change the answer at once (a non-finite loss or gradient norm, a loss
//!   far above the last judged level, an eval loss) asks sooner, at most
//!   once every `n / 64` records so a run stuck high cannot make every
//!   record O(n).
//! - **What FAIL means.** Offline, FAIL means "do not ship"; online it
//!   means "stop now", and a healthy run must never be stopped. A FAIL
//!   finding that more records could undo (a loss above its start that may
//!   still fall, a share of NaN records that more finite ones dilute, a
//!   reward still at 0 early in an RL run) is held at WARN mid-run. Only
//!   findings no later record can take back stay FAIL online
//!   ([`is_final`]): NaN-masked losses (the weights are NaN), the loss
//!   non-finite at its last `FINAL_NONFINITE_RUN` records, a loss or eval
//!   loss far worse than a uniform guess.
//! - **The contract.** [`Guard::result`] judges every record seen with the
//!   offline semantics, so after a run's last record it is exactly what
//!   `training_drift` says of the same logged run.

use std::path::PathBuf;

use crate::formats::logs::gap_log::{GapLog, GapRecord};
use crate::formats::logs::loss_log::{LossCurve, RunProgress};
use crate::formats::model_config::OutputClasses;
use crate::store::probe_inputs::{DriftInput, LogsStatus};
use crate::verdicts::drift::{judge_drift, DriftOptions};
use crate::verdicts::gap::{judge_gap_records, GapInput, GapOptions};
use crate::verdicts::{Judged, Value, Verdict};

/// Records judged on every observation while the run has at most this many.
pub const JUDGE_EVERY_RECORD: usize = 128;
/// Non-finite losses in a row at the end that no later record undoes (the
/// weights have gone NaN; one or two are fp16 loss scaling recovering).
pub const FINAL_NONFINITE_RUN: usize = 3;
/// A loss this many times the last judged end level asks for a judgement
/// before the schedule does.
const JUMP_TRIGGER: f64 = 2.0;

/// One finding as the guard reports it: when it was first seen.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardFinding {
    pub rule: String,
    /// The step of the record at which the finding was first reported.
    pub step: i64,
    /// The online verdict (a FAIL that later records could undo is WARN).
    pub verdict: Verdict,
    pub message: String,
}

/// The online state of one run.
#[derive(Clone)]
pub struct Guard {
    options: DriftOptions,
    /// The records as the readers would have assembled them.
    curve: LossCurve,
    classes: Option<OutputClasses>,
    /// The plan (`max_steps`), judged only by [`Guard::result`]: mid-run
    /// every run is short of its plan.
    max_steps: Option<i64>,
    /// Records at the last judgement, and the record count at which a
    /// record that asks for one may have it.
    judged_at: usize,
    early_from: usize,
    /// The end level of the last judgement (NaN before one).
    last_level: f64,
    verdict: Verdict,
    findings: Vec<GuardFinding>,
    /// The GAP monitor's newest records (at most `GAP_WINDOW`), their rules'
    /// options and their online findings.
    gap: Vec<GapRecord>,
    gap_options: GapOptions,
    gap_findings: Vec<GuardFinding>,
}

/// GAP records the guard keeps: enough for every online rule (two in a
/// row, a layer's recent history, growth over the window).
pub const GAP_WINDOW: usize = 64;

impl Guard {
    /// A guard judging by `options`; `classes` is what the loss is a
    /// cross-entropy over, where the caller knows (the model's config).
    pub fn new(options: DriftOptions, classes: Option<OutputClasses>) -> Guard {
        let curve = LossCurve {
            source: "guard".into(),
            series: "loss".into(),
            ..LossCurve::default()
        };
        Guard {
            options,
            curve,
            classes,
            max_steps: None,
            judged_at: 0,
            early_from: 0,
            last_level: f64::NAN,
            verdict: Verdict::Pass,
            findings: vec![],
            gap: vec![],
            gap_options: GapOptions::defaults("robust"),
            gap_findings: vec![],
        }
    }

    /// Take the GAP monitor's statistics of one sampled step (its summary
    /// keys, as `GAPMonitor.latest` holds them) and return the online
    /// verdict so far, the loss's and the monitor's together.
    pub fn observe_gap(&mut self, step: i64, stats: Vec<(String, f64)>) -> Verdict {
        let stats: Vec<(String, f64)> = stats
            .into_iter()
            .filter(|(k, _)| k.starts_with("gap/summary/") || k.ends_with("/nonfinite"))
            .take(crate::formats::logs::gap_log::MAX_KEYS)
            .collect();
        let record = GapRecord { step, stats };
        match self.gap.iter().position(|r| r.step >= step) {
            Some(i) if self.gap[i].step == step => self.gap[i] = record,
            Some(i) => self.gap.insert(i, record),
            None => self.gap.push(record),
        }
        if self.gap.len() > GAP_WINDOW {
            self.gap.remove(0);
        }
        let input = GapInput {
            log: Some(GapLog {
                records: std::mem::take(&mut self.gap),
                files: vec![],
                thinned: 1,
                cut_records: 0,
            }),
            error: None,
        };
        let judged = judge_gap_records(&input, &self.gap_options, true);
        if let Some(log) = input.log {
            self.gap = log.records;
        }
        self.gap_findings = carried_forward(&self.gap_findings, &judged, step, |_, v| v);
        self.verdict()
    }

    /// The plan the run was set for (`max_steps`), so that a run that
    /// stops early is judged as its trainer state would be.
    pub fn set_max_steps(&mut self, max_steps: Option<i64>) {
        self.max_steps = max_steps;
    }

    /// `curve` judged as a logged run's: it is lent to a `DriftInput` for
    /// the judgement and taken back.
    fn judge(
        options: &DriftOptions,
        curve: &mut LossCurve,
        classes: &Option<OutputClasses>,
    ) -> Judged {
        let input = DriftInput {
            store: PathBuf::new(),
            layout: "guard".into(),
            logs_dir: PathBuf::new(),
            files: vec![],
            status: LogsStatus::Curve,
            curve: Some(std::mem::take(curve)),
            error: None,
            note: None,
            output_classes: classes.clone(),
            guard: None,
        };
        let judged = judge_drift(&input, options);
        if let Some(back) = input.curve {
            *curve = back;
        }
        judged
    }

    /// Take one logged record and return the online verdict so far.
    pub fn observe(
        &mut self,
        step: i64,
        loss: Option<f64>,
        grad_norm: Option<f64>,
        learning_rate: Option<f64>,
        eval_loss: Option<f64>,
        reward: Option<f64>,
    ) -> Verdict {
        let curve = &mut self.curve;
        if let Some(v) = loss {
            let stored = if v.is_finite() { v } else { f64::INFINITY };
            insert_parallel(&mut curve.steps, &mut curve.losses, step, stored);
        }
        let side = &mut curve.side;
        for (series, value) in [
            (&mut side.grad_norm, grad_norm),
            (&mut side.learning_rate, learning_rate),
            (&mut side.eval_loss, eval_loss),
            (&mut side.reward, reward),
        ] {
            if let Some(v) = value {
                insert_point(series, step, v);
            }
        }
        let n = curve.steps.len();
        let asks = loss.is_some_and(|v| !v.is_finite() || v > JUMP_TRIGGER * self.last_level)
            || grad_norm.is_some_and(|v| !v.is_finite())
            || eval_loss.is_some();
        let due = n <= JUDGE_EVERY_RECORD || n * 16 >= self.judged_at * 17;
        if due || (asks && n >= self.early_from) {
            self.judge_now(step);
        }
        self.verdict()
    }

    fn judge_now(&mut self, step: i64) {
        let judged = Guard::judge(&self.options, &mut self.curve, &self.classes);
        let n = self.curve.steps.len();
        self.judged_at = n;
        self.early_from = n + n / 64;
        if let Some(Value::Float(level)) = judged.evidence.get("tail_loss") {
            self.last_level = *level;
        }
        let trailing_nonfinite = self
            .curve
            .losses
            .iter()
            .rev()
            .take_while(|v| !v.is_finite())
            .count();
        let current = carried_forward(&self.findings, &judged, step, |rule, verdict| {
            if verdict == Verdict::Fail && !is_final(rule, trailing_nonfinite) {
                Verdict::Warn
            } else {
                verdict
            }
        });
        self.verdict = match judged.verdict {
            // Too few records, or nothing to judge yet: nothing found.
            Verdict::Skip => Verdict::Pass,
            Verdict::Error => Verdict::Error,
            _ => current
                .iter()
                .map(|f| f.verdict)
                .max()
                .unwrap_or(Verdict::Pass),
        };
        self.findings = current;
    }

    /// The online verdict so far (the loss's and the GAP monitor's).
    pub fn verdict(&self) -> Verdict {
        self.gap_findings
            .iter()
            .map(|f| f.verdict)
            .fold(self.verdict, Verdict::max)
    }

    /// The findings of the last judgements (the loss's, then the GAP
    /// monitor's), with the step each was first seen.
    pub fn findings(&self) -> Vec<GuardFinding> {
        self.findings
            .iter()
            .chain(&self.gap_findings)
            .cloned()
            .collect()
    }

    /// Records taken so far.
    pub fn num_records(&self) -> usize {
        self.curve.steps.len()
    }

    /// Every record seen, judged as `training_drift` judges a logged run.
    pub fn result(&self) -> Judged {
        let mut curve = self.curve.clone();
        let last = [
            curve.steps.last(),
            curve.side.eval_loss.last().map(|p| &p.0),
            curve.side.grad_norm.last().map(|p| &p.0),
            curve.side.reward.last().map(|p| &p.0),
        ]
        .into_iter()
        .flatten()
        .copied()
        .max();
        curve.side.progress = self.max_steps.map(|max_steps| RunProgress {
            global_step: last.unwrap_or(0),
            max_steps,
        });
        Guard::judge(&self.options, &mut curve, &self.classes)
    }
}

/// The findings of `judged` as the guard reports them: each keeps the step
/// at which `previous` first reported its rule (else `step`), and its
/// verdict as `online` maps it.
fn carried_forward(
    previous: &[GuardFinding],
    judged: &Judged,
    step: i64,
    online: impl Fn(&str, Verdict) -> Verdict,
) -> Vec<GuardFinding> {
    findings_of(judged)
        .into_iter()
        .map(|(rule, verdict, message)| GuardFinding {
            step: previous
                .iter()
                .find(|f| f.rule == rule)
                .map_or(step, |f| f.step),
            verdict: online(&rule, verdict),
            rule,
            message,
        })
        .collect()
}

/// Whether a FAIL finding stands whatever records come next.
fn is_final(rule: &str, trailing_nonfinite: usize) -> bool {
    match rule {
        "nan_masked" | "worse_than_uniform" => true,
        "nonfinite_loss" => trailing_nonfinite >= FINAL_NONFINITE_RUN,
        _ => false,
    }
}

/// `(rule, verdict, message)` of each finding in a judgement's evidence.
fn findings_of(judged: &Judged) -> Vec<(String, Verdict, String)> {
    let Some(Value::List(items)) = judged.evidence.get("findings") else {
        return vec![];
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Map(m) = item else { return None };
            let text = |key: &str| match m.get(key) {
                Some(Value::Text(t)) => Some(t.clone()),
                _ => None,
            };
            let verdict = Verdict::parse(&text("verdict")?)?;
            Some((text("rule")?, verdict, text("message")?))
        })
        .collect()
}

/// Put `(step, value)` into parallel ascending `steps`/`values`, a record
/// at an existing step replacing it (the readers keep the last record of
/// a step). Appending is O(1); a step from the past (a resumed run) is a
/// binary search and an insert.
fn insert_parallel(steps: &mut Vec<i64>, values: &mut Vec<f64>, step: i64, value: f64) {
    match steps.last() {
        None => {}
        Some(&last) if step > last => {}
        Some(_) => match steps.binary_search(&step) {
            Ok(i) => {
                if let Some(v) = values.get_mut(i) {
                    *v = value;
                }
                return;
            }
            Err(i) => {
                steps.insert(i, step);
                values.insert(i, value);
                return;
            }
        },
    }
    steps.push(step);
    values.push(value);
}

/// Put `(step, value)` into an ascending side series (same rule).
fn insert_point(series: &mut Vec<(i64, f64)>, step: i64, value: f64) {
    match series.binary_search_by_key(&step, |p| p.0) {
        Ok(i) => {
            if let Some(p) = series.get_mut(i) {
                p.1 = value;
            }
        }
        Err(i) if i == series.len() => series.push((step, value)),
        Err(i) => series.insert(i, (step, value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn robust() -> Guard {
        Guard::new(DriftOptions::defaults("robust"), None)
    }

    fn decaying(i: i64) -> f64 {
        4.0 * 0.97f64.powi(i as i32) + 0.5 + 0.02 * ((i * 7919 % 13) as f64 / 6.0 - 1.0)
    }

    #[test]
    fn a_healthy_run_passes_throughout_and_matches_the_offline_verdict() {
        let mut g = robust();
        for step in 1..=400 {
            let v = g.observe(
                step,
                Some(decaying(step)),
                Some(1.0),
                Some(1e-4),
                None,
                None,
            );
            assert_eq!(v, Verdict::Pass, "step {step}: {:?}", g.findings());
        }
        assert_eq!(g.result().verdict, Verdict::Pass);
        assert_eq!(g.num_records(), 400);
    }

    #[test]
    fn a_loss_above_its_start_is_held_at_warn_but_nan_weights_fail() {
        let mut g = robust();
        // A climb: offline FAIL (diverged), online WARN: it may still fall.
        for step in 1..=60 {
            g.observe(step, Some(1.0 + 0.05 * step as f64), None, None, None, None);
        }
        assert_eq!(g.verdict(), Verdict::Warn, "{:?}", g.findings());
        assert_eq!(g.result().verdict, Verdict::Fail);
        let findings = g.findings();
        let diverged = findings.iter().find(|f| f.rule == "diverged").unwrap();
        assert_eq!(diverged.verdict, Verdict::Warn);
        assert!(diverged.step < 60, "first seen at {}", diverged.step);
        // Non-finite losses, three in a row: the weights went NaN; stop now.
        for step in 61..=63 {
            g.observe(step, Some(f64::NAN), Some(f64::NAN), None, None, None);
        }
        assert_eq!(g.verdict(), Verdict::Fail, "{:?}", g.findings());
    }

    #[test]
    fn one_nonfinite_loss_is_not_a_stop() {
        let mut g = robust();
        for step in 1..=100 {
            let loss = if step == 50 {
                f64::INFINITY
            } else {
                decaying(step)
            };
            let v = g.observe(step, Some(loss), None, None, None, None);
            assert_ne!(v, Verdict::Fail, "step {step}: {:?}", g.findings());
        }
    }

    #[test]
    fn records_are_assembled_as_the_readers_assemble_them() {
        let mut g = robust();
        // The eval log of a step arrives after its train log; a resumed
        // run logs an earlier step again.
        g.observe(10, Some(3.0), None, None, None, None);
        g.observe(10, None, None, None, Some(2.5), None);
        g.observe(20, Some(2.0), None, None, None, None);
        g.observe(15, Some(2.4), None, None, None, None);
        g.observe(20, Some(1.9), None, None, None, None);
        let c = &g.curve;
        assert_eq!(c.steps, vec![10, 15, 20]);
        assert_eq!(c.losses, vec![3.0, 2.4, 1.9]);
        assert_eq!(c.side.eval_loss, vec![(10, 2.5)]);
    }

    #[test]
    fn judging_is_spaced_out_on_long_runs() {
        let mut g = robust();
        let mut judged = 0;
        let mut last = 0;
        for step in 1..=20_000 {
            g.observe(step, Some(decaying(step % 500 + 1)), None, None, None, None);
            if g.judged_at != last {
                judged += 1;
                last = g.judged_at;
            }
        }
        // 128 judgements while short, then one per sixteenth of growth.
        assert!(judged < 128 + 16 * 10, "{judged} judgements");
    }

    fn gap(grads: f64, params: f64) -> Vec<(String, f64)> {
        vec![
            ("gap/summary/grads/l2_norm".into(), grads),
            (
                "gap/summary/grads/nonfinite".into(),
                f64::from(u8::from(!grads.is_finite())),
            ),
            ("gap/summary/params/nonfinite".into(), params),
            ("gap/grads/model.x.weight/mean".into(), 1.0), // not a key the rules read
        ]
    }

    #[test]
    fn monitor_records_one_overflow_warns_two_in_a_row_or_nan_weights_fail() {
        let mut g = robust();
        for step in 0..5 {
            assert_eq!(g.observe_gap(step * 2, gap(1.0, 0.0)), Verdict::Pass);
        }
        // an fp16 overflow: the next record may be finite again
        assert_eq!(g.observe_gap(10, gap(f64::INFINITY, 0.0)), Verdict::Warn);
        assert_eq!(g.observe_gap(12, gap(1.0, 0.0)), Verdict::Warn);
        assert_eq!(g.observe_gap(14, gap(f64::INFINITY, 0.0)), Verdict::Warn);
        assert_eq!(g.observe_gap(16, gap(f64::NAN, 0.0)), Verdict::Fail);
        let nonfinite: Vec<_> = g
            .findings()
            .into_iter()
            .filter(|f| f.rule == "nonfinite")
            .collect();
        assert_eq!(nonfinite[0].step, 10); // first reported at the first overflow
        let mut g = robust();
        g.observe_gap(2, gap(1.0, 0.0));
        assert_eq!(g.observe_gap(4, gap(1.0, 3.0)), Verdict::Fail);
        // the loss verdict and the monitor's combine
        assert_eq!(
            g.observe(4, Some(2.0), None, None, None, None),
            Verdict::Fail
        );
    }

    #[test]
    fn the_monitors_window_is_bounded() {
        let mut g = robust();
        for step in 0..1000 {
            g.observe_gap(step, gap(1.0, 0.0));
        }
        assert_eq!(g.gap.len(), GAP_WINDOW);
        assert_eq!(g.gap[0].step, 1000 - GAP_WINDOW as i64);
    }
}
