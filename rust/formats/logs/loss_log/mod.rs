//! Stream training logs into one deduplicated loss curve.
//!
//! dlm's JSONL logs are read here; `read_curve_from` also accepts the logs
//! other trainers leave behind (HF `trainer_state.json`, TensorBoard event
//! files, Lightning's `metrics.csv`), read by their own modules and turned
//! into the same curve.
//!
//! Files are read in name order (dlm names them chronologically) through a
//! fixed-size buffer, so memory grows with the number of step records, not
//! with the file size. A later record for the same step replaces an earlier
//! one (a resumed run repeats steps). Lines split like Python's universal
//! newlines: `\n`, `\r\n` and a lone `\r` all end a line.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::damage::Damage;
use crate::formats::logs::json_line::{classify_step, LineKind, StepExtras};
use crate::formats::logs::thinned::Kept;
use crate::formats::logs::{
    csv_log, mlflow_db, mlflow_files, series_names, tfevents, trainer_log, trainer_state, wandb_run,
};
use crate::formats::model_config::OutputClasses;
use crate::io::lfs;
use crate::io::read_once;
use crate::io::walk::files_under;

/// Bytes read per batch; each batch is parsed in parallel pieces.
const BATCH: usize = 8 << 20;
/// Target size of one parallel piece.
const PIECE: usize = 512 << 10;
/// Room kept beyond a batch for the partial line carried into the next.
const CARRY_ROOM: usize = 64 << 10;
/// Longest line kept; a longer one is unreadable (and skipped).
pub const MAX_LINE: usize = 16 << 20;

/// A deduplicated loss curve. Python sees `steps` and `losses` as NumPy
/// arrays (made in the binding), `num_files` and `files`.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossCurve {
    /// Ascending, distinct step numbers.
    pub steps: Vec<i64>,
    /// The loss at each step; non-finite losses are stored as +inf.
    pub losses: Vec<f64>,
    pub num_files: usize,
    /// The files read, in reading order.
    pub files: Vec<PathBuf>,
    /// The format read: `dlm`, `trainer_state`, `tensorboard`, `csv`, or
    /// `trainer_state+tensorboard` for an HF run with both.
    pub source: String,
    /// The series read: `loss` (dlm, trainer state), `eval_loss`, the
    /// TensorBoard tag or the CSV column.
    pub series: String,
    /// Files that ended in a torn record or line (read up to it).
    pub torn_files: Vec<PathBuf>,
    /// Series logged beside the loss (see [`SideSeries`]); empty where the
    /// logs carry none.
    pub side: SideSeries,
    /// How the tracker that kept the log names the run (W&B `project/name
    /// (id)`, MLflow `experiment/run name (id)`); empty for plain files.
    pub run: String,
    /// What the reader could not read and passed over (see [`Damage`]).
    pub damage: Damage,
    /// How the reader thinned a series too long to keep whole (None: every
    /// record is here).
    pub thinned: Option<Thinning>,
    /// What the loss is a cross-entropy over, where the tracker that kept
    /// the log recorded the model's config (W&B's config record, MLflow's
    /// params); a `config.json` on disk is read apart (`model_config`).
    pub output_classes: Option<OutputClasses>,
}

/// How a loss series too long to keep whole was thinned (see
/// [`crate::formats::logs::thinned`]): every `stride`-th record was kept,
/// the non-finite ones beside them, out of `records` read, `nonfinite` of
/// them NaN or infinite. Counts and shares of the whole run are read from
/// here, not from the points kept, where non-finite ones are
/// over-represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thinning {
    pub stride: u64,
    pub records: u64,
    pub nonfinite: u64,
}

impl Thinning {
    /// The thinning of a series kept with non-finite points as its notable
    /// ones (None where nothing was let go).
    pub fn of<T>(kept: &Kept<T>) -> Option<Thinning> {
        (kept.stride > 1).then_some(Thinning {
            stride: kept.stride,
            records: kept.read,
            nonfinite: kept.notable_read,
        })
    }
}

/// What a run logs beside its training loss, each series `(step, value)`
/// ascending by step, a later record for a step winning, non-finite values
/// kept as they were logged (a NaN gradient norm is evidence).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SideSeries {
    /// Loss on held-out data (`eval_loss`, `eval/loss`, `val_loss`, ...).
    pub eval_loss: Vec<(i64, f64)>,
    /// The global gradient norm before clipping (`grad_norm`).
    pub grad_norm: Vec<(i64, f64)>,
    /// The scheduler's learning rate (`learning_rate`, `lr`, `lr-AdamW`, ...).
    pub learning_rate: Vec<(i64, f64)>,
    /// The mean reward of an RL objective (`reward`, `train/reward`,
    /// `rewards/mean`, ...).
    pub reward: Vec<(i64, f64)>,
    /// How far the run got against its plan, where the log says
    /// (`trainer_state.json`, LLaMA-Factory's `trainer_log.jsonl`).
    pub progress: Option<RunProgress>,
    /// How the run ended, where its tracker recorded it (W&B's exit record).
    pub ending: Option<RunEnd>,
}

/// How a run ended, as the tracker that kept its log recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// It ended normally (exit code 0).
    Finished,
    /// It ended in an error; the text says how (`exit code 255`).
    Crashed(String),
    /// The log holds no end: the run was killed, or is still running.
    Unfinished(String),
}

/// The optimizer steps a run took and the steps it was set to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunProgress {
    pub global_step: i64,
    pub max_steps: i64,
}

impl SideSeries {
    /// Whether no side series was found.
    pub fn is_empty(&self) -> bool {
        self.eval_loss.is_empty()
            && self.grad_norm.is_empty()
            && self.learning_rate.is_empty()
            && self.reward.is_empty()
    }

    /// The side series of a trainer state's `log_history`.
    pub fn of_trainer_state(state: &trainer_state::TrainerState) -> SideSeries {
        SideSeries {
            eval_loss: by_step(state.eval_points.clone()),
            grad_norm: by_step(state.grad_norm_points.clone()),
            learning_rate: by_step(state.learning_rate_points.clone()),
            reward: by_step(state.reward_points.clone()),
            progress: state.max_steps.map(|max_steps| RunProgress {
                global_step: state.global_step,
                max_steps,
            }),
            ending: None,
        }
    }

    /// Whether a scalar tag is a known name of a side series (what to keep
    /// beside the loss in the one pass over event files).
    pub fn is_side_name(tag: &str) -> bool {
        let lists = [
            &EVAL_LOSS_NAMES[..],
            &GRAD_NORM_NAMES[..],
            &LEARNING_RATE_NAMES[..],
            &REWARD_NAMES[..],
        ];
        lists
            .iter()
            .flat_map(|names| names.iter())
            .any(|name| match name.strip_suffix('-') {
                Some(_) => tag.starts_with(name),
                None => tag == *name,
            })
            || series_names::is_reward(tag)
    }

    /// Fill the series still empty from the side tags an event-file read
    /// kept (see [`SideSeries::is_side_name`]).
    pub fn fill_from_events(&mut self, mut kept: tfevents::TagPoints) {
        let tags: Vec<String> = kept.keys().cloned().collect();
        self.fill(&tags, |tag| Some(by_step(kept.remove(tag)?)));
    }

    /// Fill the series still empty from the columns of a `metrics.csv`.
    pub fn fill_from_csv(&mut self, path: &Path, columns: &[String]) {
        self.fill(columns, |column| {
            let series = csv_log::read_csv_series(path, Some(column)).ok()?;
            Some(by_step(series.points))
        });
    }

    /// Fill the series still empty from named series (`names`), reading
    /// the one picked for each with `read`.
    pub fn fill_from_names(
        &mut self,
        names: &[String],
        mut read: impl FnMut(&str) -> Option<Vec<(i64, f64)>>,
    ) {
        self.fill(names, |name| Some(by_step(read(name)?)));
    }

    /// Fill each empty series with what `read` gives for the series of
    /// `available` picked for it: the first of its known names, and for
    /// the reward, else a reward read by its meaning
    /// ([`series_names::reward_among`]: SB3's `rollout/ep_rew_mean`,
    /// CleanRL's `charts/episodic_return`, RLlib's, ...).
    fn fill(
        &mut self,
        available: &[String],
        mut read: impl FnMut(&str) -> Option<Vec<(i64, f64)>>,
    ) {
        let reward_by_meaning = || series_names::reward_among(available.iter().map(String::as_str));
        for (series, names, reward) in [
            (&mut self.eval_loss, &EVAL_LOSS_NAMES[..], false),
            (&mut self.grad_norm, &GRAD_NORM_NAMES[..], false),
            (&mut self.learning_rate, &LEARNING_RATE_NAMES[..], false),
            (&mut self.reward, &REWARD_NAMES[..], true),
        ] {
            if !series.is_empty() {
                continue;
            }
            let by_meaning = || reward.then(reward_by_meaning).flatten();
            if let Some(name) = pick(available, names).or_else(by_meaning) {
                *series = read(name).unwrap_or_default();
            }
        }
    }
}

/// Names trainers give the held-out loss: HF (trainer state, TensorBoard),
/// Lightning's common `self.log` names (also with on_epoch's suffix).
pub const EVAL_LOSS_NAMES: [&str; 8] = [
    "eval_loss",
    "eval/loss",
    "val_loss",
    "val/loss",
    "valid_loss",
    "validation_loss",
    "val_loss_epoch",
    "eval_loss_epoch",
];
/// Names of the global gradient norm (HF, and common hand-written loggers).
pub const GRAD_NORM_NAMES: [&str; 4] = [
    "grad_norm",
    "train/grad_norm",
    "gradient_norm",
    "grad_norm_step",
];
/// Names of the learning rate: HF, and Lightning's `LearningRateMonitor`
/// (`lr-<Optimizer>`, matched by prefix after the exact names).
pub const LEARNING_RATE_NAMES: [&str; 4] = ["learning_rate", "train/learning_rate", "lr", "lr-"];
/// Names of an RL objective's mean reward: TRL's (GRPO, RLOO, PPO, online
/// DPO), LLaMA-Factory's and common hand-written loggers'.
pub const REWARD_NAMES: [&str; 8] = [
    "reward",
    "train/reward",
    "rewards/mean",
    "train/rewards/mean",
    "objective/scores",
    "env/reward_mean",
    "reward_mean",
    "mean_reward",
];

/// The first of `names` present in `available` (a name ending in `-` is a
/// prefix, matched against the available names in their order).
fn pick<'a>(available: &'a [String], names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|&name| match name.strip_suffix('-') {
        Some(_) => available
            .iter()
            .find(|a| a.starts_with(name))
            .map(String::as_str),
        None => available.iter().find(|a| *a == name).map(String::as_str),
    })
}

/// Whether `path` is LLaMA-Factory's log rather than a trainer state.
fn state_source(path: &Path) -> LogSource {
    if path
        .file_name()
        .is_some_and(|n| n == trainer_log::TRAINER_LOG)
    {
        LogSource::TrainerLog
    } else {
        LogSource::TrainerState
    }
}

/// The run's state from a `trainer_state.json` or LLaMA-Factory's
/// `trainer_log.jsonl`, by the file's name.
pub fn read_run_state(path: &Path) -> Result<trainer_state::TrainerState> {
    match state_source(path) {
        LogSource::TrainerLog => trainer_log::read_trainer_log(path),
        _ => trainer_state::read_trainer_state(path),
    }
}

/// Whether `e` says the logs are readable but hold no loss series under
/// any name (TensorBoard events, a metrics.csv or a tracker run of other
/// metrics).
pub fn is_no_loss_series(e: &Error) -> bool {
    tfevents::is_missing_loss_tags(e)
        || csv_log::is_missing_loss_column(e)
        || e.details.iter().any(|(key, _)| *key == NO_LOSS_DETAIL)
}

/// The error detail that marks a tracker run with no loss series (see
/// [`is_no_loss_series`]).
const NO_LOSS_DETAIL: &str = "no_loss_series";

/// The series a tracker run's curve is read from, among the run's `keys`:
/// `wanted` when given (a usage error listing the run's series when it has
/// no such one), else the first of the reader's `usual` names present, else
/// the loss by its meaning (`series_names`). `what` names the run in
/// messages ("the W&B run"); `detail` adds to the no-loss message.
pub fn choose_run_series(
    keys: &[String],
    wanted: Option<&str>,
    usual: &[&str],
    at: &Path,
    what: &str,
    detail: &str,
) -> Result<String> {
    let listed = || {
        if keys.is_empty() {
            "none".to_string()
        } else {
            crate::io::excerpt::listed(keys.iter().map(String::as_str))
        }
    };
    match wanted {
        Some(k) => keys.iter().find(|have| *have == k).cloned().ok_or_else(|| {
            Error::new(
                Area::Usage,
                at,
                format!(
                    "{what} has no series {}; it has {}",
                    crate::io::excerpt::quoted(k),
                    listed()
                ),
            )
        }),
        None => series_names::loss_among(usual, keys.iter().map(String::as_str))
            .map(str::to_string)
            .ok_or_else(|| {
                Error::new(
                    Area::LogFormat,
                    at,
                    format!(
                        "{what} logs no loss series (none named as a training or held-out \
                         loss{detail}); series: {}",
                        listed()
                    ),
                )
                .with(NO_LOSS_DETAIL, "true")
            }),
    }
}

/// How a tracker's run is shown so a person can find it: `group/name
/// (id)` (W&B's project, MLflow's experiment), each part left out where
/// empty, the id alone when the run has no name.
pub fn run_label(group: &str, name: &str, id: &str) -> String {
    let mut out = String::new();
    if !group.is_empty() {
        out.push_str(group);
        out.push('/');
    }
    out.push_str(if name.is_empty() { id } else { name });
    if !name.is_empty() && !id.is_empty() {
        out.push_str(&format!(" ({id})"));
    }
    out
}

/// Whether a series name says it is a loss on held-out data.
pub fn is_held_out(name: &str) -> bool {
    series_names::role(name) == series_names::Role::HeldOutLoss
}

/// Points sorted by step, the last one read for each step kept.
pub fn by_step(mut points: Vec<(i64, f64)>) -> Vec<(i64, f64)> {
    points.sort_by_key(|&(step, _)| step);
    let mut out: Vec<(i64, f64)> = Vec::with_capacity(points.len());
    for p in points {
        match out.last_mut() {
            Some(last) if last.0 == p.0 => *last = p,
            _ => out.push(p),
        }
    }
    out
}

impl LossCurve {
    /// The step numbers at curve indices `points`.
    pub fn steps_at(&self, points: &[usize]) -> Vec<i64> {
        points
            .iter()
            .filter_map(|&i| self.steps.get(i).copied())
            .collect()
    }

    /// At most about `cap` evenly strided (step, loss) points, the first and
    /// last always kept; a non-finite loss is None. `cap` must be at least 1.
    pub fn sample(&self, cap: usize) -> Result<Vec<(i64, Option<f64>)>> {
        if cap == 0 {
            return Err(Error::new(Area::Usage, "", "cap must be at least 1"));
        }
        let n = self.steps.len();
        let stride = if n <= cap { 1 } else { n.div_ceil(cap) };
        let mut idx: Vec<usize> = (0..n).step_by(stride).collect();
        if n > 0 && idx.last() != Some(&(n - 1)) {
            idx.push(n - 1);
        }
        Ok(idx
            .into_iter()
            .map(|i| {
                (
                    self.steps[i],
                    self.losses[i].is_finite().then_some(self.losses[i]),
                )
            })
            .collect())
    }
}

fn is_train_log(name: &str) -> bool {
    name.len() >= "train-.jsonl".len() && name.starts_with("train-") && name.ends_with(".jsonl")
}

/// `train-*.jsonl` entries of `dir`, sorted by name.
pub fn train_logs_in(dir: &Path) -> Result<Vec<PathBuf>> {
    read_once::listing("train logs", dir, || {
        crate::io::confine::check_path(dir, Area::LogFormat)?;
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(Area::LogFormat, dir, &e))?;
        let mut files = vec![];
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(Area::LogFormat, dir, &e))?;
            let name = entry.file_name();
            if name.to_str().is_some_and(is_train_log) {
                files.push(entry.path());
            }
        }
        files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        Ok(files)
    })
}

/// The log files a source names: a store dir (its `logs/`), a logs dir, or a file.
pub fn resolve_source(source: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(source).map_err(|e| Error::io(Area::LogFormat, source, &e))?;
    if !meta.is_dir() {
        return Ok(vec![source.to_path_buf()]);
    }
    let logs = source.join("logs");
    if logs.is_dir() {
        train_logs_in(&logs)
    } else {
        train_logs_in(source)
    }
}

/// Whether Python's `str.isspace()` holds for `c` (what `str.strip()`
/// removes); line terminators never reach here.
fn is_py_space_char(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\x1c'..='\x1f'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// The first UTF-8 character of `bytes` and its length, if it is complete and valid.
fn first_char(bytes: &[u8]) -> Option<(char, usize)> {
    let len = match *bytes.first()? {
        b if b < 0x80 => 1,
        b if b >> 5 == 0b110 => 2,
        b if b >> 4 == 0b1110 => 3,
        b if b >> 3 == 0b11110 => 4,
        _ => return None,
    };
    let c = std::str::from_utf8(bytes.get(..len)?)
        .ok()?
        .chars()
        .next()?;
    Some((c, len))
}

/// The line as Python's `str.strip()` would leave it: ASCII and Unicode
/// whitespace (U+00A0, U+2028, U+3000, ...) removed from both ends.
fn strip(line: &[u8]) -> &[u8] {
    let mut start = 0;
    while let Some((c, n)) = first_char(&line[start..]) {
        if !is_py_space_char(c) {
            break;
        }
        start += n;
    }
    let mut end = line.len();
    while end > start {
        // The last character starts at the last byte that is not a
        // continuation byte (0b10xxxxxx), at most 4 bytes back.
        let from = (end.saturating_sub(4)..end)
            .rev()
            .find(|&i| line[i] & 0xc0 != 0x80)
            .unwrap_or(end - 1)
            .max(start);
        match first_char(&line[from..end]) {
            Some((c, n)) if from + n == end && is_py_space_char(c) => end = from,
            _ => break,
        }
    }
    &line[start..end]
}

/// Whether `bytes` (part of one line) holds only whitespace; `carry` holds
/// the bytes of a character split at the previous part's end and is left
/// holding this part's own unfinished tail.
fn only_whitespace(bytes: &[u8], carry: &mut Vec<u8>) -> bool {
    let joined: Vec<u8>;
    let mut rest: &[u8] = if carry.is_empty() {
        bytes
    } else {
        joined = [carry.as_slice(), bytes].concat();
        &joined
    };
    carry.clear();
    while !rest.is_empty() {
        if rest[0] < 0x80 {
            if !is_py_space_char(char::from(rest[0])) {
                return false;
            }
            rest = &rest[1..];
            continue;
        }
        match first_char(rest) {
            Some((c, n)) if is_py_space_char(c) => rest = &rest[n..],
            Some(_) => return false,
            None if rest.len() < 4 => {
                carry.extend_from_slice(rest);
                return true;
            }
            None => return false,
        }
    }
    true
}

/// Where the step lines of a dlm log go: `(step, loss)` records, and for a
/// sink that keeps them, what else each step logged.
pub trait StepSink: Default + Send {
    fn push_step(&mut self, step: i64, loss: f64, extras: StepExtras);
    fn append(&mut self, other: Self);
    /// One non-blank line met; `readable`: whether it parsed (a line that
    /// does not is passed over). Only a sink that counts damage keeps it.
    #[inline]
    fn count_line(&mut self, _readable: bool) {}
    /// The log ends in a line with no line end that does not parse.
    fn torn_tail(&mut self) {}
}

/// The loss curve's records alone.
impl StepSink for Vec<(i64, f64)> {
    #[inline]
    fn push_step(&mut self, step: i64, loss: f64, _: StepExtras) {
        self.push((step, loss));
    }
    fn append(&mut self, mut other: Self) {
        Vec::append(self, &mut other);
    }
}

/// Records and the values logged beside the loss, each side series kept
/// only where a line logged it (16 bytes a value, not 48 a record: the
/// reader's memory traffic is most of its cost after parsing).
#[derive(Default)]
pub struct StepsWithExtras {
    pub records: Vec<(i64, f64)>,
    pub val_loss: Vec<(i64, f64)>,
    pub grad_norm: Vec<(i64, f64)>,
    pub lr: Vec<(i64, f64)>,
    /// Non-blank lines met, and those that did not parse (passed over).
    pub lines: u64,
    pub unreadable_lines: u64,
    /// Logs read so far that ended in a torn line.
    pub torn_logs: usize,
}

impl StepSink for StepsWithExtras {
    #[inline]
    fn push_step(&mut self, step: i64, loss: f64, extras: StepExtras) {
        self.records.push((step, loss));
        if let Some(v) = extras.val_loss {
            self.val_loss.push((step, v));
        }
        if let Some(v) = extras.grad_norm {
            self.grad_norm.push((step, v));
        }
        if let Some(v) = extras.lr {
            self.lr.push((step, v));
        }
    }
    fn append(&mut self, mut other: Self) {
        self.records.append(&mut other.records);
        self.val_loss.append(&mut other.val_loss);
        self.grad_norm.append(&mut other.grad_norm);
        self.lr.append(&mut other.lr);
        self.lines += other.lines;
        self.unreadable_lines += other.unreadable_lines;
        self.torn_logs += other.torn_logs;
    }
    #[inline]
    fn count_line(&mut self, readable: bool) {
        self.lines += 1;
        self.unreadable_lines += u64::from(!readable);
    }
    fn torn_tail(&mut self) {
        self.torn_logs += 1;
    }
}

impl StepsWithExtras {
    /// The side series of these records (reading order; later steps win).
    pub fn side_series(self) -> (Vec<(i64, f64)>, SideSeries) {
        let side = SideSeries {
            eval_loss: by_step(self.val_loss),
            grad_norm: by_step(self.grad_norm),
            learning_rate: by_step(self.lr),
            reward: vec![],
            progress: None,
            ending: None,
        };
        (self.records, side)
    }
}

/// Classify one line; None for a blank one. Over-long lines are unreadable.
fn line_kind(line: &[u8]) -> Option<(LineKind, StepExtras)> {
    if line.len() > MAX_LINE {
        return Some((LineKind::Invalid, StepExtras::default()));
    }
    match strip(line) {
        [] => None,
        stripped => Some(classify_step(stripped)),
    }
}

/// Step records of a run of complete lines. `\r` and `\n` both end a line;
/// the empty "line" inside `\r\n` is blank and skipped, which is exactly
/// what universal newlines give (only line 1's identity matters, below).
fn steps_in<S: StepSink>(lines: &[u8], out: &mut S) {
    let mut start = 0;
    for end in memchr::memchr2_iter(b'\n', b'\r', lines).chain(std::iter::once(lines.len())) {
        take_line(line_kind(&lines[start..end]), out);
        start = end + 1;
    }
}

/// One classified line into `out`: counted (an unreadable one as passed
/// over), and pushed when it is a step record. A blank line is neither.
#[inline]
fn take_line<S: StepSink>(line: Option<(LineKind, StepExtras)>, out: &mut S) {
    match line {
        Some((LineKind::Step(step, loss), extras)) => {
            out.count_line(true);
            out.push_step(step, loss, extras);
        }
        Some((kind, _)) => out.count_line(kind != LineKind::Invalid),
        None => {}
    }
}

/// `steps_in` over a large region, split at line ends and run in parallel.
fn steps_in_parallel<S: StepSink>(region: &[u8], out: &mut S) {
    use rayon::prelude::*;
    if region.len() < 2 * PIECE {
        return steps_in(region, out);
    }
    let mut pieces = Vec::with_capacity(region.len() / PIECE + 1);
    let mut start = 0;
    while start < region.len() {
        let nominal = (start + PIECE).min(region.len());
        let end =
            memchr::memchr(b'\n', &region[nominal..]).map_or(region.len(), |p| nominal + p + 1);
        pieces.push(&region[start..end]);
        start = end;
    }
    let parts: Vec<S> = pieces
        .par_iter()
        .map(|piece| {
            let mut v = S::default();
            steps_in(piece, &mut v);
            v
        })
        .collect();
    for part in parts {
        out.append(part);
    }
}

/// Read up to one batch from `reader`, appended to `buf`; whether the file
/// ended.
fn read_batch<R: Read>(reader: &mut R, buf: &mut Vec<u8>) -> std::result::Result<bool, String> {
    let got = reader
        .take(BATCH as u64)
        .read_to_end(buf)
        .map_err(|e| format!("failed to read: {e}"))?;
    Ok(got < BATCH)
}

/// Append the step records of one log to `out` in file order. Memory stays
/// bounded by two batches plus one line, whatever the file size: the next
/// batch is read while this one is parsed (on this 2-core machine the read
/// was a seventh of the wall time, with a core idle).
pub fn read_steps_from<R: Read + Send, S: StepSink>(
    mut reader: R,
    size_hint: usize,
    out: &mut S,
) -> std::result::Result<(), String> {
    // Small logs (the common case in a store scan) get a small buffer.
    // Room for the partial line carried from one batch to the next, so the
    // buffer is not reallocated (and copied) at the second read.
    let mut buf: Vec<u8> = Vec::with_capacity(size_hint.min(BATCH) + CARRY_ROOM);
    let mut next: Vec<u8> = Vec::new();
    let mut first_line_seen = false;
    // Inside an over-long line: drop bytes up to the next terminator.
    let mut discarding = false;
    // Discarding an over-long *first* line that has been whitespace so far
    // (Python strips it to a blank line, which is fine), and the bytes of a
    // character split between two reads.
    let mut blank_first = false;
    let mut carry = Vec::new();
    let mut eof = read_batch(&mut reader, &mut buf)?;
    loop {
        let end = if eof {
            buf.len()
        } else {
            memchr::memrchr2(b'\n', b'\r', &buf).map_or(0, |p| p + 1)
        };
        let mut from = 0;
        if discarding && end > 0 {
            let line_end = memchr::memchr2(b'\n', b'\r', &buf[..end]);
            let dropped = &buf[..line_end.unwrap_or(end)];
            if blank_first && !only_whitespace(dropped, &mut carry) {
                return Err(format!("first line is longer than {MAX_LINE} bytes"));
            }
            match line_end {
                Some(p) => {
                    from = p + 1;
                    discarding = false;
                    if blank_first {
                        (blank_first, first_line_seen) = (false, true);
                    }
                }
                None => from = end,
            }
        }
        if !first_line_seen && !discarding && from < end {
            let region = &buf[from..end];
            let first_end = memchr::memchr2(b'\n', b'\r', region).unwrap_or(region.len());
            match line_kind(&region[..first_end]) {
                Some((LineKind::Invalid, _)) => {
                    // A Git LFS pointer is small: this batch holds all of it.
                    return Err(lfs::describe_pointer(region)
                        .unwrap_or_else(|| "first line is not valid JSON".into()));
                }
                line => take_line(line, out),
            }
            first_line_seen = true;
            from += first_end;
        }
        if eof {
            // A last line with no line end is the record a crashed or
            // still-running writer was writing: unreadable, it is a torn
            // tail, not damage.
            let whole =
                memchr::memrchr2(b'\n', b'\r', &buf[from..end]).map_or(from, |p| from + p + 1);
            steps_in_parallel(&buf[from..whole], out);
            match line_kind(&buf[whole..end]) {
                Some((LineKind::Invalid, _)) => out.torn_tail(),
                line => take_line(line, out),
            }
            if blank_first && !carry.is_empty() {
                return Err(format!("first line is longer than {MAX_LINE} bytes"));
            }
            return Ok(());
        }
        // The partial last line starts the next batch.
        next.clear();
        next.extend_from_slice(&buf[end..]);
        if next.len() > MAX_LINE {
            if !first_line_seen {
                if !only_whitespace(&next, &mut carry) {
                    return Err(format!("first line is longer than {MAX_LINE} bytes"));
                }
                blank_first = true;
            }
            next.clear();
            discarding = true;
        }
        let (read, ()) = rayon::join(
            || read_batch(&mut reader, &mut next),
            || steps_in_parallel(&buf[from..end], out),
        );
        eof = read?;
        std::mem::swap(&mut buf, &mut next);
    }
}

/// Append the step records of the log at `path` to `out` in file order.
pub fn read_steps<S: StepSink>(path: &Path, out: &mut S) -> Result<()> {
    let file = read_once::sequential(path, Area::LogFormat)?;
    let size = file.len().min(BATCH as u64) as usize;
    read_steps_from(file, size, out).map_err(|msg| {
        if let Some(e) = lfs::pointer_error_in(Area::LogFormat, path) {
            return e; // with its oid and size as details
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let msg = msg.replace("first line", &format!("first line of {name}"));
        Error::new(Area::LogFormat, path, msg)
    })
}

/// Build the curve from records in reading order: sort by step, keep the
/// last record of each step, store non-finite losses as +inf.
pub fn assemble(mut records: Vec<(i64, f64)>, files: Vec<PathBuf>) -> LossCurve {
    // Stable sort keeps reading order within a step; runs of sorted steps
    // (the normal case) make this close to linear.
    records.sort_by_key(|&(step, _)| step);
    let mut steps = Vec::with_capacity(records.len());
    let mut losses = Vec::with_capacity(records.len());
    for (i, &(step, loss)) in records.iter().enumerate() {
        if records.get(i + 1).is_some_and(|next| next.0 == step) {
            continue;
        }
        steps.push(step);
        losses.push(if loss.is_finite() {
            loss
        } else {
            f64::INFINITY
        });
    }
    LossCurve {
        run: String::new(),
        steps,
        losses,
        num_files: files.len(),
        files,
        source: LogSource::Dlm.name().to_string(),
        series: "loss".to_string(),
        torn_files: vec![],
        side: SideSeries::default(),
        damage: Damage::default(),
        thinned: None,
        output_classes: None,
    }
}

/// Read the given files (sorted by file name) into one curve.
pub fn read_loss_curve(files: &[PathBuf]) -> Result<LossCurve> {
    let mut ordered: Vec<PathBuf> = files.to_vec();
    ordered.sort_by(|a, b| a.file_name().cmp(&b.file_name()).then_with(|| a.cmp(b)));
    let mut read = StepsWithExtras::default();
    let mut torn_files = vec![];
    for path in &ordered {
        let torn_before = read.torn_logs;
        read_steps(path, &mut read)?;
        if read.torn_logs > torn_before {
            torn_files.push(path.clone());
        }
    }
    let damage = Damage::of("JSON lines", read.unreadable_lines, read.lines);
    let (records, side) = read.side_series();
    Ok(LossCurve {
        side,
        damage,
        torn_files,
        ..assemble(records, ordered)
    })
}

// ---- any supported format ----

/// The log format a curve was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    /// dlm's `train-*.jsonl` step logs.
    Dlm,
    /// The `log_history` of an HF Trainer `trainer_state.json`.
    TrainerState,
    /// LLaMA-Factory's `trainer_log.jsonl`.
    TrainerLog,
    /// A run of MLflow's file store (`mlruns/<experiment>/<run>/`).
    Mlflow,
    /// A W&B run directory's `run-<id>.wandb` log.
    Wandb,
    /// TensorBoard `events.out.tfevents.*` files.
    TensorBoard,
    /// A Lightning `CSVLogger` `metrics.csv`.
    Csv,
}

impl LogSource {
    /// A stable lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            LogSource::Dlm => "dlm",
            LogSource::TrainerState => "trainer_state",
            LogSource::TrainerLog => "trainer_log",
            LogSource::Mlflow => "mlflow",
            LogSource::Wandb => "wandb",
            LogSource::TensorBoard => "tensorboard",
            LogSource::Csv => "csv",
        }
    }
}

/// What `read_curve_from` accepts, for error messages.
pub const ACCEPTED_SOURCES: &str = "a dlm store, logs directory or .jsonl log; an HF \
    trainer_state.json (or an output directory holding one, or checkpoint-*/); LLaMA-Factory's \
    trainer_log.jsonl; an MLflow run directory (mlruns/<experiment>/<run>/), an MLflow SQLite store \
    (mlflow.db, or one run of it: mlflow.db/<experiment id>/<run id>); a W&B run directory \
    (wandb/run-*/ or offline-run-*/, or its run-<id>.wandb); a TensorBoard \
    events.out.tfevents.* file or a directory holding some; a Lightning metrics.csv";

/// The format at `source` and the files to read, without reading them.
///
/// A file is told by its name: `*.jsonl` (dlm), `*.json` (trainer state),
/// `events.out.tfevents.*`, `*.csv`. A directory is searched in this order,
/// the first match winning:
/// 1. dlm logs (`logs/train-*.jsonl`, or `train-*.jsonl` in it);
/// 2. its own `trainer_state.json` (the final save holds the whole run), or
///    LLaMA-Factory's `trainer_log.jsonl`;
/// 3. event files up to [`MAX_SEARCH_DEPTH`](crate::io::walk::MAX_SEARCH_DEPTH) levels down (HF's `runs/`
///    holds every logged step, also those after the last checkpoint, and a
///    resumed run's new `runs/<date>` directory);
/// 4. the `trainer_state.json` of the highest `checkpoint-<step>/`;
/// 5. a single `metrics.csv` up to `MAX_SEARCH_DEPTH` levels down.
pub fn detect_log_source(source: &Path) -> Result<(LogSource, Vec<PathBuf>)> {
    if let Some((db, _)) = mlflow_db::split_run_path(source) {
        return Ok((LogSource::Mlflow, vec![db]));
    }
    let meta = std::fs::metadata(source).map_err(|e| Error::io(Area::LogFormat, source, &e))?;
    if !meta.is_dir() {
        return file_source(source).map(|kind| (kind, vec![source.to_path_buf()]));
    }
    for logs in [source.join("logs"), source.to_path_buf()] {
        if logs.is_dir() {
            let files = train_logs_in(&logs)?;
            if !files.is_empty() {
                return Ok((LogSource::Dlm, files));
            }
        }
    }
    let state = source.join("trainer_state.json");
    if state.is_file() {
        return Ok((LogSource::TrainerState, vec![state]));
    }
    let log = source.join(trainer_log::TRAINER_LOG);
    if log.is_file() {
        return Ok((LogSource::TrainerLog, vec![log]));
    }
    if mlflow_files::is_run_dir(source) {
        return Ok((LogSource::Mlflow, vec![source.to_path_buf()]));
    }
    if let Some(log) = wandb_run::run_log(source) {
        return Ok((LogSource::Wandb, vec![log]));
    }
    let found = files_under(source, Area::LogFormat, |name| {
        tfevents::is_event_file_name(name) || name == "metrics.csv"
    })?;
    let (events, csvs): (Vec<PathBuf>, Vec<PathBuf>) = found.into_iter().partition(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(tfevents::is_event_file_name)
    });
    if !events.is_empty() {
        return Ok((LogSource::TensorBoard, events));
    }
    if let Some(state) = newest_checkpoint_state(source)? {
        return Ok((LogSource::TrainerState, vec![state]));
    }
    match csvs.len() {
        0 => Err(Error::new(
            Area::LogFormat,
            source,
            format!("holds no training log; expected {ACCEPTED_SOURCES}"),
        )),
        1 => Ok((LogSource::Csv, csvs)),
        n => Err(Error::new(
            Area::LogFormat,
            source,
            format!(
                "holds {n} metrics.csv files ({}); name the one to read",
                csvs.iter()
                    .take(5)
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// The format of a single file, from its name.
fn file_source(path: &Path) -> Result<LogSource> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if name == trainer_log::TRAINER_LOG {
        Ok(LogSource::TrainerLog)
    } else if name.ends_with(".jsonl") {
        Ok(LogSource::Dlm)
    } else if name.ends_with(".wandb") {
        Ok(LogSource::Wandb)
    } else if crate::io::sqlite::is_sqlite(path) {
        Ok(LogSource::Mlflow)
    } else if name.ends_with(".json") {
        Ok(LogSource::TrainerState)
    } else if tfevents::is_event_file_name(&name) {
        Ok(LogSource::TensorBoard)
    } else if name.ends_with(".csv") {
        Ok(LogSource::Csv)
    } else {
        Err(Error::new(
            Area::LogFormat,
            path,
            format!("unknown log format; expected {ACCEPTED_SOURCES}"),
        ))
    }
}

/// The curve of the only run of the MLflow SQLite store at `db`; a store
/// of several runs is an error naming their paths, to pick one.
fn one_run_of_db(db: &Path, tag: Option<&str>) -> Result<LossCurve> {
    let runs = mlflow_db::runs(db)?;
    match runs.as_slice() {
        [one] => mlflow_db::read_run_curve(db, &one.run_id, tag),
        [] => Err(Error::new(
            Area::LogFormat,
            db,
            "the MLflow store holds no run that is not deleted",
        )),
        several => Err(Error::new(
            Area::Usage,
            db,
            format!(
                "the MLflow store holds {} runs; name one by its path: {}",
                several.len(),
                crate::io::excerpt::listed(
                    several
                        .iter()
                        .map(|r| mlflow_db::run_path(db, r).display().to_string())
                        .collect::<Vec<_>>()
                        .iter()
                        .map(String::as_str)
                )
            ),
        )),
    }
}

/// `checkpoint-<step>/trainer_state.json` with the highest step, if any
/// (`last-checkpoint/` counts at its own step).
fn newest_checkpoint_state(dir: &Path) -> Result<Option<PathBuf>> {
    crate::io::confine::check_path(dir, Area::LogFormat)?;
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(Area::LogFormat, dir, &e))?;
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(Area::LogFormat, dir, &e))?;
        let name = entry.file_name();
        let Some(step) = name
            .to_str()
            .and_then(|n| trainer_state::checkpoint_dir_step(n, &entry.path()))
        else {
            continue;
        };
        let state = entry.path().join("trainer_state.json");
        if state.is_file() && !matches!(&best, Some((b, _)) if *b >= step) {
            best = Some((step, state));
        }
    }
    Ok(best.map(|(_, path)| path))
}

fn unknown_series(source: &Path, format: &str, tag: &str, accepted: &str) -> Error {
    Error::new(
        Area::Usage,
        source,
        format!(
            "a {format} has no series {}; it has {accepted}",
            crate::io::excerpt::quoted(tag)
        ),
    )
}

/// Read the loss curve at `source` in whichever supported format it is
/// (see `detect_log_source`). `tag` names the series: a TensorBoard tag or
/// CSV column (default: the first of `tfevents::DEFAULT_LOSS_TAGS` /
/// `csv_log::DEFAULT_LOSS_COLUMNS` present), `eval_loss` for a trainer
/// state's evaluation points; a dlm log has only `loss`.
pub fn read_curve_from(source: &Path, tag: Option<&str>) -> Result<LossCurve> {
    let (kind, files) = detect_log_source(source)?;
    let read = |series: &str, points: Vec<(i64, f64)>, files: Vec<PathBuf>, torn_files| {
        Ok(LossCurve {
            source: kind.name().to_string(),
            series: series.to_string(),
            torn_files,
            ..assemble(points, files)
        })
    };
    match kind {
        LogSource::Dlm => {
            if let Some(tag) = tag.filter(|t| *t != "loss") {
                return Err(unknown_series(source, "dlm log", tag, "only \"loss\""));
            }
            // `train_logs_in` lists them in name order, the reading order.
            read_loss_curve(&files)
        }
        LogSource::TrainerState | LogSource::TrainerLog => {
            let path = files.first().map_or(source, PathBuf::as_path);
            let eval = match tag {
                None | Some("loss" | "train/loss") => false,
                Some("eval_loss" | "eval/loss") => true,
                Some(other) => {
                    return Err(unknown_series(
                        path,
                        if kind == LogSource::TrainerLog {
                            trainer_log::TRAINER_LOG
                        } else {
                            "trainer_state.json"
                        },
                        other,
                        "\"loss\" and \"eval_loss\"",
                    ))
                }
            };
            let state = read_run_state(path)?;
            let side = SideSeries::of_trainer_state(&state);
            let curve = if eval {
                read("eval_loss", state.eval_points, files, vec![])
            } else {
                read("loss", state.train_points, files, vec![])
            };
            curve.map(|c| LossCurve { side, ..c })
        }
        LogSource::Mlflow => match mlflow_db::split_run_path(source) {
            Some((db, run_id)) => mlflow_db::read_run_curve(&db, &run_id, tag),
            None if !source.is_dir() => one_run_of_db(source, tag),
            None => mlflow_files::read_run_curve(source, tag),
        },
        LogSource::Wandb => {
            let log = files.first().map_or(source, PathBuf::as_path);
            wandb_run::read_run_curve(log, tag)
        }
        LogSource::TensorBoard => {
            let (series, kept) =
                tfevents::read_scalar_series_and(&files, tag, &SideSeries::is_side_name)?;
            let mut side = SideSeries::default();
            side.fill_from_events(kept);
            read(&series.tag, series.points, series.files, series.torn_files)
                .map(|c| LossCurve { side, ..c })
        }
        LogSource::Csv => {
            let path = files.first().map_or(source, PathBuf::as_path);
            let series = csv_log::read_csv_series(path, tag)?;
            let torn = if series.torn_last_line {
                files.clone()
            } else {
                vec![]
            };
            let mut side = SideSeries::default();
            side.fill_from_csv(path, &series.columns);
            read(&series.column, series.points, files, torn).map(|c| LossCurve { side, ..c })
        }
    }
}

/// The logs of an HF Trainer output dir: the newest `trainer_state.json`
/// (the output dir's own, else the highest checkpoint's) and the TensorBoard
/// event files under `runs/`; None when it has neither.
pub fn hf_run_sources(run: &Path) -> Option<(Option<PathBuf>, Vec<PathBuf>)> {
    // Anything but a directory there is read (a FIFO or device is then
    // refused by the reader, with an error naming it, not passed over).
    let present = |p: &PathBuf| std::fs::metadata(p).is_ok_and(|m| !m.is_dir());
    // The run's own state; else LLaMA-Factory's log, which holds every
    // logged step, also those after the last checkpoint; else the newest
    // checkpoint's state.
    let state = [
        run.join("trainer_state.json"),
        run.join(trainer_log::TRAINER_LOG),
    ]
    .into_iter()
    .find(present)
    .or_else(|| newest_checkpoint_state(run).ok().flatten());
    let runs = run.join("runs");
    let events = if runs.is_dir() {
        tfevents::event_files(&runs).unwrap_or_default()
    } else {
        vec![]
    };
    (state.is_some() || !events.is_empty()).then_some((state, events))
}

/// The loss curve of an HF Trainer run: `log_history` of the newest
/// `trainer_state.json`, with TensorBoard's `train/loss` points on top
/// where the run also logged to TensorBoard (a later point for a step wins,
/// so the events' values stand where both have the step). `log_history`
/// hides a NaN loss by default (`logging_nan_inf_filter`); events logged
/// without that filter show it.
pub fn read_hf_run_curve(run: &Path) -> Result<LossCurve> {
    let Some((state, events)) = hf_run_sources(run) else {
        return Err(Error::new(
            Area::Missing,
            run,
            "no trainer_state.json and no TensorBoard events under runs/",
        ));
    };
    let mut points = vec![];
    let mut files = vec![];
    let mut torn = vec![];
    let mut sources = vec![];
    let mut side = SideSeries::default();
    if let Some(path) = state {
        let state = read_run_state(&path)?;
        side = SideSeries::of_trainer_state(&state);
        points.extend(state.train_points);
        sources.push(state_source(&path).name());
        files.push(path);
    }
    let mut series_name = "loss".to_string();
    if !events.is_empty() {
        match tfevents::read_scalar_series_and(&events, None, &SideSeries::is_side_name) {
            // A held-out loss found by its name is no addition to the
            // training loss of the trainer state.
            Ok((series, _)) if !files.is_empty() && is_held_out(&series.tag) => {}
            Ok((series, kept)) => {
                if files.is_empty() {
                    series_name.clone_from(&series.tag);
                }
                side.fill_from_events(kept);
                points.extend(series.points);
                files.extend(series.files);
                torn.extend(series.torn_files);
                sources.push(LogSource::TensorBoard.name());
            }
            // Events without a loss tag (only eval metrics, or only the final
            // summary of a run shorter than logging_steps) add nothing.
            Err(e) if tfevents::is_missing_loss_tags(&e) && !files.is_empty() => {}
            // Event files left as Git LFS pointers (a clone without `git lfs
            // pull`) add nothing beside a trainer state that was read.
            Err(e) if lfs::is_pointer_error(&e) && !files.is_empty() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(LossCurve {
        source: sources.join("+"),
        series: series_name,
        torn_files: torn,
        side,
        ..assemble(points, files)
    })
}

/// The curve at `source`, whatever its format (see `read_curve_from`), or an
/// HF Trainer output dir's merged curve (see `read_hf_run_curve`).
pub fn read_curve(source: &Path, tag: Option<&str>) -> Result<LossCurve> {
    let is_hf_run = source.is_dir()
        && !source.join("logs").is_dir()
        && tag.is_none()
        && hf_run_sources(source)
            .is_some_and(|(state, events)| state.is_some() && !events.is_empty());
    if is_hf_run {
        read_hf_run_curve(source)
    } else {
        read_curve_from(source, tag)
    }
}

#[cfg(test)]
mod tests;
