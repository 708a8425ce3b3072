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
//! - **Bounded.** Up to [`KEEP_RECORDS`] records of each series are kept
//!   whole, so the contract above is exact for any run that logs fewer
//!   (a fine-tune logging every step for 65,536 steps). Past it the
//!   history is thinned as the MLflow readers thin a long metric
//!   ([`Thinned`]): an even sample of the whole run, its last record, and
//!   beside the sample every non-finite loss and every loss that jumped
//!   past `JUMP_TRIGGER` times the judged level (while they are few),
//!   with exact counts of the records and non-finite losses read.
//!   Memory, and the cost of one judgement, stay bounded by the cap; the
//!   schedule counts records read, and judges at least every
//!   `KEEP_RECORDS / 16` of them.

use std::path::PathBuf;

use crate::formats::logs::curve::{LossCurve, RunProgress, SideSeries, Thinning};
use crate::formats::logs::gap_log::{GapLog, GapRecord};
use crate::formats::logs::thinned::Thinned;
use crate::formats::model_config::OutputClasses;
use crate::store::probe_inputs::{DriftInput, LogsStatus};
use crate::verdicts::drift::{judge_drift, DriftOptions};
use crate::verdicts::gap::{judge_gap_records, GapInput, GapOptions};
use crate::verdicts::weights::factor_scale::{judge_factor_scale, FactorNorm};
use crate::verdicts::{Judged, Value, Verdict};

/// Records judged on every observation while the run has at most this many.
pub const JUDGE_EVERY_RECORD: usize = 128;
/// Non-finite losses in a row at the end that no later record undoes (the
/// weights have gone NaN; one or two are fp16 loss scaling recovering).
pub const FINAL_NONFINITE_RUN: usize = 3;
/// A loss this many times the last judged end level asks for a judgement
/// before the schedule does (and is kept beside a thinned history).
const JUMP_TRIGGER: f64 = 2.0;
/// Rules the guard does not apply mid-run: every run starts short.
const MID_RUN_UNJUDGED: [&str; 1] = ["tiny_run"];
/// Records of each series kept whole; past it the history is thinned
/// (see the module doc). A judgement then costs a few milliseconds.
pub const KEEP_RECORDS: usize = 1 << 16;

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

/// A loss record as the history keeps it: step, loss (non-finite as
/// +inf) and whether it is kept beside a thinned sample (non-finite, or a
/// jump).
type LossPoint = (i64, f64, bool);

fn notable_loss(p: &LossPoint) -> bool {
    p.2
}

fn nonfinite_point(p: &(i64, f64)) -> bool {
    !p.1.is_finite()
}

/// The run's records as the readers would have assembled them (ascending
/// by step, the last record of a step winning), thinned past `keep`.
#[derive(Clone)]
struct History {
    loss: Thinned<LossPoint>,
    grad_norm: Thinned<(i64, f64)>,
    learning_rate: Thinned<(i64, f64)>,
    eval_loss: Thinned<(i64, f64)>,
    reward: Thinned<(i64, f64)>,
    /// Steps with a loss, and those whose loss is not finite.
    records: u64,
    nonfinite: u64,
    /// Non-finite losses in a row at the newest steps.
    trailing_nonfinite: usize,
}

impl History {
    fn new(keep: usize) -> History {
        History {
            loss: Thinned::new(keep, notable_loss),
            grad_norm: Thinned::new(keep, nonfinite_point),
            learning_rate: Thinned::new(keep, nonfinite_point),
            eval_loss: Thinned::new(keep, nonfinite_point),
            reward: Thinned::new(keep, nonfinite_point),
            records: 0,
            nonfinite: 0,
            trailing_nonfinite: 0,
        }
    }

    /// Take a loss; `jump` keeps it beside a thinned sample.
    fn put_loss(&mut self, step: i64, loss: f64, jump: bool) {
        let bad = !loss.is_finite();
        let point = (step, if bad { f64::INFINITY } else { loss }, bad || jump);
        match put(&mut self.loss, point, |p| p.0) {
            Placed::Newest => {
                self.records += 1;
                self.trailing_nonfinite = if bad { self.trailing_nonfinite + 1 } else { 0 };
            }
            Placed::ReplacedNewest(before) => {
                self.nonfinite = self
                    .nonfinite
                    .saturating_sub(u64::from(!before.1.is_finite()));
                let run =
                    (self.trailing_nonfinite).saturating_sub(usize::from(!before.1.is_finite()));
                self.trailing_nonfinite = if bad { run + 1 } else { 0 };
            }
            Placed::Replaced(before) => {
                self.nonfinite = self
                    .nonfinite
                    .saturating_sub(u64::from(!before.1.is_finite()));
            }
            Placed::Inserted => self.records += 1,
        }
        self.nonfinite += u64::from(bad);
    }

    fn put_side(&mut self, step: i64, values: [Option<f64>; 4]) {
        let [grad_norm, learning_rate, eval_loss, reward] = values;
        for (series, value) in [
            (&mut self.grad_norm, grad_norm),
            (&mut self.learning_rate, learning_rate),
            (&mut self.eval_loss, eval_loss),
            (&mut self.reward, reward),
        ] {
            if let Some(v) = value {
                put(series, (step, v), |p| p.0);
            }
        }
    }

    /// The history as the curve a log reader would hand the rules.
    fn curve(&self) -> LossCurve {
        let (steps, losses) = self.loss.points().map(|p| (p.0, p.1)).unzip();
        let side = |t: &Thinned<(i64, f64)>| t.points().copied().collect();
        LossCurve {
            source: "guard".into(),
            series: "loss".into(),
            steps,
            losses,
            side: SideSeries {
                eval_loss: side(&self.eval_loss),
                grad_norm: side(&self.grad_norm),
                learning_rate: side(&self.learning_rate),
                reward: side(&self.reward),
                // The guard is not fed margins: a runaway is judged offline.
                margins: vec![],
                progress: None,
                ending: None,
            },
            thinned: (self.loss.stride() > 1).then_some(Thinning {
                stride: self.loss.stride(),
                records: self.records,
                nonfinite: self.nonfinite,
            }),
            ..LossCurve::default()
        }
    }

    /// Forget every record after `step`: the run was rolled back to the
    /// checkpoint saved there, and what it logged since is of a timeline
    /// its trainer discarded.
    fn rewind(&mut self, step: i64) {
        let past = |p: &(i64, f64)| p.0 > step;
        let dropped_nonfinite = self
            .loss
            .points()
            .filter(|p| p.0 > step && !p.1.is_finite())
            .count() as u64;
        let dropped = self.loss.drop_newest_while(|p| p.0 > step);
        self.records = self.records.saturating_sub(dropped);
        self.nonfinite = self.nonfinite.saturating_sub(dropped_nonfinite);
        for series in [
            &mut self.grad_norm,
            &mut self.learning_rate,
            &mut self.eval_loss,
            &mut self.reward,
        ] {
            series.drop_newest_while(past);
        }
        let newest: Vec<f64> = self.loss.points().map(|p| p.1).collect();
        self.trailing_nonfinite = newest.iter().rev().take_while(|v| !v.is_finite()).count();
    }

    /// The newest step of any series.
    fn last_step(&self) -> Option<i64> {
        let newest = |t: &Thinned<(i64, f64)>| t.points().last().map(|p| p.0);
        [
            self.loss.points().last().map(|p| p.0),
            newest(&self.eval_loss),
            newest(&self.grad_norm),
            newest(&self.reward),
        ]
        .into_iter()
        .flatten()
        .max()
    }
}

/// Where [`put`] placed a point.
enum Placed<T> {
    /// After every step so far.
    Newest,
    /// Over the newest point, of the same step (what it held).
    ReplacedNewest(T),
    /// Over a kept point of an earlier step (what it held).
    Replaced(T),
    /// Among the kept points, at an earlier step none held.
    Inserted,
}

/// Put `point` at its step (`step_of`): a step after the newest is read
/// on (and may be thinned away later); the newest step again replaces
/// it; an earlier step (a resumed run) replaces the kept point of that
/// step or goes in among the kept points, in step order. A point the
/// memory for which cannot be had is not kept.
fn put<T: Copy>(series: &mut Thinned<T>, point: T, step_of: fn(&T) -> i64) -> Placed<T> {
    let step = step_of(&point);
    let newest = series.newest_mut();
    match newest {
        Some(p) if step_of(p) == step => {
            let before = *p;
            *p = point;
            return Placed::ReplacedNewest(before);
        }
        Some(p) if step_of(p) > step => {}
        _ => {
            let _ = series.push(point);
            return Placed::Newest;
        }
    }
    let kept = series.kept_mut();
    match kept.binary_search_by_key(&step, step_of) {
        Ok(i) => match kept.get_mut(i) {
            Some(p) => Placed::Replaced(std::mem::replace(p, point)),
            None => Placed::Inserted,
        },
        Err(i) => {
            kept.insert(i, point);
            Placed::Inserted
        }
    }
}

/// The online state of one run.
#[derive(Clone)]
pub struct Guard {
    options: DriftOptions,
    history: History,
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
    /// The LoRA factor check's finding on the live model, as of its newest
    /// look (`factors_blown_up`; see [`Guard::observe_factors`]).
    factor_findings: Vec<GuardFinding>,
}

/// GAP records the guard keeps: enough for every online rule (two in a
/// row, a layer's recent history, growth over the window).
pub const GAP_WINDOW: usize = 64;

impl Guard {
    /// A guard judging by `options`; `classes` is what the loss is a
    /// cross-entropy over, where the caller knows (the model's config).
    pub fn new(options: DriftOptions, classes: Option<OutputClasses>) -> Guard {
        Guard::keeping(options, classes, KEEP_RECORDS)
    }

    /// A guard keeping `keep` records of each series whole.
    pub fn keeping(options: DriftOptions, classes: Option<OutputClasses>, keep: usize) -> Guard {
        Guard {
            options,
            history: History::new(keep),
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
            factor_findings: vec![],
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
        self.judge_gap(step);
        self.verdict()
    }

    /// Judge the GAP window; a finding keeps the step it was first seen at.
    fn judge_gap(&mut self, step: i64) {
        if self.gap.is_empty() {
            self.gap_findings.clear();
            return;
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
    }

    /// Take the LoRA A factors' norms of the live model at `step` (each
    /// linear module's rank, input features and ||A||_F; `init` is PEFT's
    /// `init_lora_weights`) and return the verdict so far. The rule is
    /// `adapter_weights`' `factors_blown_up`, as it would judge an adapter
    /// saved now: a FAIL there (A 100x its start) is one here, which no
    /// later record undoes. Each look replaces the last one's finding; a
    /// finding keeps the step it was first seen at while it holds.
    pub fn observe_factors(&mut self, step: i64, init: &str, modules: Vec<FactorNorm>) -> Verdict {
        let found = judge_factor_scale(init, modules.into_iter()).and_then(|(_, f)| f);
        self.factor_findings = match found {
            None => vec![],
            Some(f) => vec![GuardFinding {
                step: self
                    .factor_findings
                    .iter()
                    .find(|g| g.verdict == f.verdict)
                    .map_or(step, |g| g.step),
                rule: f.rule.to_string(),
                verdict: f.verdict,
                message: f.message,
            }],
        };
        self.verdict()
    }

    /// Roll the run back to `step` (its trainer restored the checkpoint
    /// saved there): forget every record after it and judge what is left,
    /// so the run that goes on from `step` is judged as a continuation of
    /// the kept timeline, not as a new run, and the discarded steps count
    /// for nothing. A finding that still holds keeps the step it was first
    /// seen at; one first seen after `step` is gone with its records.
    /// Returns the verdict of the kept timeline.
    pub fn rewind(&mut self, step: i64) -> Verdict {
        self.history.rewind(step);
        self.gap.retain(|r| r.step <= step);
        self.gap_findings.retain(|f| f.step <= step);
        self.factor_findings.retain(|f| f.step <= step);
        self.findings.retain(|f| f.step <= step);
        self.judged_at = 0;
        self.early_from = 0;
        self.last_level = f64::NAN;
        self.judge_gap(step);
        if self.num_records() > 0 {
            self.judge_now(step);
        } else {
            self.verdict = Verdict::Pass;
            self.findings.clear();
        }
        self.verdict()
    }

    /// The plan the run was set for (`max_steps`), so that a run that
    /// stops early is judged as its trainer state would be.
    pub fn set_max_steps(&mut self, max_steps: Option<i64>) {
        self.max_steps = max_steps;
    }

    /// `curve` judged as a logged run's.
    fn judge(options: &DriftOptions, curve: LossCurve, classes: &Option<OutputClasses>) -> Judged {
        let input = DriftInput {
            store: PathBuf::new(),
            layout: "guard".into(),
            logs_dir: PathBuf::new(),
            files: vec![],
            status: LogsStatus::Curve,
            curve: Some(curve),
            error: None,
            note: None,
            output_classes: classes.clone(),
            guard: None,
        };
        judge_drift(&input, options)
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
        let jump = loss.is_some_and(|v| v > JUMP_TRIGGER * self.last_level);
        if let Some(v) = loss {
            self.history.put_loss(step, v, jump);
        }
        self.history
            .put_side(step, [grad_norm, learning_rate, eval_loss, reward]);
        let n = self.num_records();
        let asks = jump
            || loss.is_some_and(|v| !v.is_finite())
            || grad_norm.is_some_and(|v| !v.is_finite())
            || eval_loss.is_some();
        let due = n <= JUDGE_EVERY_RECORD
            || n * 16 >= self.judged_at * 17
            || n - self.judged_at.min(n) >= KEEP_RECORDS / 16;
        if due || (asks && n >= self.early_from) {
            self.judge_now(step);
        }
        self.verdict()
    }

    fn judge_now(&mut self, step: i64) {
        let judged = Guard::judge(&self.options, self.history.curve(), &self.classes);
        let n = self.num_records();
        self.judged_at = n;
        self.early_from = n + (n / 64).min(KEEP_RECORDS / 64);
        if let Some(Value::Float(level)) = judged.evidence.get("tail_loss") {
            self.last_level = *level;
        }
        let trailing_nonfinite = self.history.trailing_nonfinite;
        let mut current = carried_forward(&self.findings, &judged, step, |rule, verdict| {
            if verdict == Verdict::Fail && !is_final(rule, trailing_nonfinite) {
                Verdict::Warn
            } else {
                verdict
            }
        });
        // Mid-run every run is a few steps long at first.
        current.retain(|f| !MID_RUN_UNJUDGED.contains(&f.rule.as_str()));
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

    /// The online verdict so far (the loss's, the GAP monitor's and the
    /// LoRA factors').
    pub fn verdict(&self) -> Verdict {
        self.gap_findings
            .iter()
            .chain(&self.factor_findings)
            .map(|f| f.verdict)
            .fold(self.verdict, Verdict::max)
    }

    /// The findings of the last judgements (the loss's, the GAP
    /// monitor's, then the LoRA factors'), with the step each was first
    /// seen.
    pub fn findings(&self) -> Vec<GuardFinding> {
        self.findings
            .iter()
            .chain(&self.gap_findings)
            .chain(&self.factor_findings)
            .cloned()
            .collect()
    }

    /// Records taken so far (steps with a loss).
    pub fn num_records(&self) -> usize {
        usize::try_from(self.history.records).unwrap_or(usize::MAX)
    }

    /// Every record seen (the history, thinned past [`KEEP_RECORDS`]),
    /// judged as `training_drift` judges a logged run.
    pub fn result(&self) -> Judged {
        let mut curve = self.history.curve();
        curve.side.progress = self.max_steps.map(|max_steps| RunProgress {
            global_step: self.history.last_step().unwrap_or(0),
            max_steps,
        });
        Guard::judge(&self.options, curve, &self.classes)
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
        let c = g.history.curve();
        assert_eq!(c.steps, vec![10, 15, 20]);
        assert_eq!(c.losses, vec![3.0, 2.4, 1.9]);
        assert_eq!(c.side.eval_loss, vec![(10, 2.5)]);
    }

    #[test]
    fn a_rewound_run_is_judged_as_the_timeline_it_kept() {
        // Healthy to step 40, blown up from 45 (far above ln K), rolled
        // back to the checkpoint at 40, then healthy again.
        let k = OutputClasses {
            count: 128,
            kind: "vocabulary".into(),
            path: PathBuf::new(),
            source: "test".into(),
        };
        let mut g = Guard::new(DriftOptions::defaults("robust"), Some(k));
        for step in 1..=40 {
            assert_eq!(
                g.observe(step, Some(decaying(step)), None, None, None, None),
                Verdict::Pass
            );
        }
        for step in 41..=44 {
            g.observe(step, Some(decaying(step)), None, None, None, None);
        }
        for step in 45..=47 {
            g.observe(step, Some(f64::NAN), Some(f64::NAN), None, None, None);
        }
        assert_eq!(g.verdict(), Verdict::Fail, "{:?}", g.findings());
        assert_eq!(g.num_records(), 47);
        assert_eq!(g.rewind(40), Verdict::Pass, "{:?}", g.findings());
        assert_eq!(g.num_records(), 40);
        assert!(g.findings().is_empty(), "{:?}", g.findings());
        // The continuation: the same steps again, healthy this time.
        for step in 41..=120 {
            let v = g.observe(step, Some(decaying(step)), None, None, None, None);
            assert_eq!(v, Verdict::Pass, "step {step}: {:?}", g.findings());
        }
        assert_eq!(g.num_records(), 120);
        assert_eq!(g.result().verdict, Verdict::Pass);
        // What a discarded timeline left is nowhere in the kept one.
        assert!(g.history.curve().losses.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn a_finding_before_the_rewind_point_keeps_its_first_step() {
        let mut g = robust();
        for step in 1..=60 {
            g.observe(step, Some(1.0 + 0.05 * step as f64), None, None, None, None);
        }
        let first = g
            .findings()
            .iter()
            .find(|f| f.rule == "diverged")
            .unwrap()
            .step;
        assert!(first < 55);
        g.rewind(55);
        let kept = g.findings();
        let diverged = kept.iter().find(|f| f.rule == "diverged").unwrap();
        assert_eq!(diverged.step, first);
        assert_eq!(g.num_records(), 55);
    }

    #[test]
    fn blown_up_factors_on_the_live_model_fail_and_a_rollback_clears_them() {
        let mut g = robust();
        let kaiming = |ratio: f64| {
            (0..4)
                .map(|_| FactorNorm {
                    rank: 8,
                    in_features: 64,
                    norm_a: ratio * (8.0f64 / 3.0).sqrt(),
                })
                .collect::<Vec<_>>()
        };
        for step in 1..=20 {
            g.observe(step, Some(decaying(step)), None, None, None, None);
            assert_eq!(g.observe_factors(step, "true", kaiming(1.5)), Verdict::Pass);
        }
        g.observe(21, Some(4.85), None, None, None, None);
        assert_eq!(g.observe_factors(21, "true", kaiming(46.0)), Verdict::Warn);
        g.observe(22, Some(4.85), None, None, None, None);
        assert_eq!(g.observe_factors(22, "true", kaiming(788.0)), Verdict::Fail);
        let found = g.findings();
        let f = found.iter().find(|f| f.rule == "factors_blown_up").unwrap();
        assert_eq!((f.step, f.verdict), (22, Verdict::Fail));
        // An init the rule cannot judge says nothing.
        assert_eq!(g.observe_factors(22, "pissa", kaiming(788.0)), g.verdict());
        g.observe_factors(22, "true", kaiming(788.0));
        assert_eq!(g.rewind(20), Verdict::Pass, "{:?}", g.findings());
    }

    /// A noisy loss falling slowly over `n` records.
    fn slow(i: i64, n: i64) -> f64 {
        2.0 * (-(i as f64) / (n as f64 / 3.0)).exp()
            + 1.0
            + 0.05 * ((i * 7919 % 13) as f64 / 6.0 - 1.0)
    }

    type Run = Box<dyn Fn(i64, i64) -> (Option<f64>, Option<f64>)>;

    /// `(loss, eval_loss)` of each record of the runs a thinned history
    /// must judge as a whole one does.
    fn runs() -> Vec<(&'static str, Run)> {
        vec![
            ("healthy", Box::new(|i, n| (Some(slow(i, n)), None))),
            (
                "climbs in its last third",
                Box::new(|i, n| {
                    let over = (i - 2 * n / 3).max(0) as f64 / n as f64;
                    (Some(slow(i, n) + 12.0 * over), None)
                }),
            ),
            (
                "one NaN",
                Box::new(|i, n| (Some(if i == n / 2 { f64::NAN } else { slow(i, n) }), None)),
            ),
            (
                "1% NaN",
                Box::new(|i, n| (Some(if i % 100 == 7 { f64::NAN } else { slow(i, n) }), None)),
            ),
            (
                "10% NaN",
                Box::new(|i, n| (Some(if i % 10 == 7 { f64::NAN } else { slow(i, n) }), None)),
            ),
            (
                "NaN from 90%",
                Box::new(|i, n| {
                    (
                        Some(if i >= n * 9 / 10 {
                            f64::NAN
                        } else {
                            slow(i, n)
                        }),
                        None,
                    )
                }),
            ),
            (
                "one spike",
                Box::new(|i, n| (Some(if i == n / 2 { 40.0 } else { slow(i, n) }), None)),
            ),
            (
                "eval climbs",
                Box::new(|i, n| {
                    let eval = (i % 50 == 0).then(|| 1.5 + 2.0 * i as f64 / n as f64);
                    (Some(slow(i, n)), eval)
                }),
            ),
        ]
    }

    /// The online verdict at each record and the final result of `run`
    /// over `n` records, the history kept whole up to `keep` records.
    fn replay(run: &Run, n: i64, keep: usize) -> (Guard, Vec<Verdict>) {
        let mut g = Guard::keeping(DriftOptions::defaults("robust"), None, keep);
        let online = (1..=n)
            .map(|i| {
                let (loss, eval) = run(i, n);
                g.observe(i, loss, Some(1.0), None, eval, None)
            })
            .collect();
        (g, online)
    }

    fn rules(judged: &Judged) -> Vec<(String, Verdict)> {
        let mut rules: Vec<_> = findings_of(judged)
            .into_iter()
            .map(|(rule, verdict, _)| (rule, verdict))
            .collect();
        rules.sort();
        rules
    }

    #[test]
    fn a_thinned_history_judges_as_the_whole_one_does() {
        let n = 4_000;
        for (name, run) in runs() {
            let (whole, whole_online) = replay(&run, n, usize::MAX);
            let (thin, thin_online) = replay(&run, n, 256);
            assert!(thin.history.loss.stride() >= 8, "{name}: not thinned");
            assert_eq!(whole.history.loss.stride(), 1);
            let (a, b) = (whole.result(), thin.result());
            assert_eq!(
                a.verdict, b.verdict,
                "{name}: {} | {}",
                a.message, b.message
            );
            assert_eq!(
                rules(&a),
                rules(&b),
                "{name}: {} | {}",
                a.message,
                b.message
            );
            // The run is stopped by both or neither, and within the stride
            // of each other.
            let first_fail = |online: &[Verdict]| online.iter().position(|v| *v == Verdict::Fail);
            let (a, b) = (first_fail(&whole_online), first_fail(&thin_online));
            assert_eq!(a.is_some(), b.is_some(), "{name}: stopped at {a:?} | {b:?}");
            assert_eq!(
                b.is_some(),
                name == "NaN from 90%",
                "{name}: stopped at {b:?}"
            );
            assert_eq!(whole.num_records(), thin.num_records());
        }
    }

    #[test]
    fn memory_is_bounded_past_the_cap_and_counts_stay_exact() {
        let mut g = Guard::keeping(DriftOptions::defaults("robust"), None, 256);
        let n = 200_000;
        for i in 1..=n {
            let loss = if i % 1000 == 500 {
                f64::NAN
            } else {
                slow(i, n)
            };
            g.observe(i, Some(loss), Some(1.0), Some(1e-4), None, None);
        }
        let h = &g.history;
        assert!(h.loss.points().count() <= 257 + 256 / 4);
        assert!(h.grad_norm.points().count() <= 257);
        assert_eq!((h.records, h.nonfinite), (200_000, 200));
        let judged = g.result();
        assert_eq!(
            judged.evidence.get("num_records"),
            Some(&Value::Int(200_000))
        );
        let finding = findings_of(&judged)
            .into_iter()
            .find(|f| f.0 == "nonfinite_loss")
            .unwrap();
        assert_eq!(finding.1, Verdict::Warn, "{}", finding.2);
        assert!(
            finding
                .2
                .starts_with("200 NaN/inf losses (0.1% of records)"),
            "{}",
            finding.2
        );
        // A record of a step seen again replaces it, thinned or not.
        g.observe(n, Some(0.5), None, None, None, None);
        assert_eq!(g.history.loss.points().last(), Some(&(n, 0.5, false)));
        assert_eq!(g.num_records(), 200_000);
    }

    #[test]
    fn a_first_record_far_above_ln_k_stops_the_run_at_once() {
        let classes = OutputClasses {
            count: 128,
            kind: "vocabulary".into(),
            path: PathBuf::from("config.json"),
            source: "config.json".to_string(),
        };
        let mut g = Guard::new(DriftOptions::defaults("robust"), Some(classes));
        let v = g.observe(10, Some(587.0 * 128f64.ln()), None, None, None, None);
        assert_eq!(v, Verdict::Fail, "{:?}", g.findings());
        assert_eq!(g.findings()[0].rule, "worse_than_uniform");
        assert_eq!(g.findings()[0].step, 10);
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
