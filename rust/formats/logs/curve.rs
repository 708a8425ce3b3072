//! The loss curve every reader produces, and what rides beside it.
//!
//! A leaf of the log readers: each format's module builds a [`LossCurve`]
//! (with [`assemble`]) and fills its [`SideSeries`], and
//! [`loss_log`](super::loss_log) finds a run's logs and picks the reader.
//! Nothing here reads a file of its own but the side columns of a
//! `metrics.csv` handed to [`SideSeries::fill_from_csv`].

use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::damage::Damage;
use crate::formats::logs::thinned::Kept;
use crate::formats::logs::{csv_log, series_names, tfevents, trainer_state};
use crate::formats::model_config::OutputClasses;

/// The `source` of a curve read from dlm's JSON lines (what [`assemble`]
/// gives; other readers set their own).
pub const DLM_SOURCE: &str = "dlm";

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
    /// The output folder the trainer wrote to, as the tracker recorded its
    /// arguments (HF's W&B and MLflow callbacks log `output_dir`): how a
    /// scan tells that a tracker run and an HF output folder are one run.
    pub output_dir: Option<String>,
    /// Whether the steps count epochs, not optimizer steps (a Keras
    /// CSVLogger's or Ultralytics' `epoch` column, or the rows of a CSV
    /// without a step column): five epochs can be a whole run.
    pub per_epoch: bool,
    /// The run's settings as a file beside the log records them (kohya's
    /// `ss_*` header, mlx-lm's config): (name, value as written).
    pub settings: Vec<(String, String)>,
    /// Where `side.progress` was read, in words, when not from a trainer
    /// state (`the LoRA file's ss_* header`, `mlx-lm's adapter_config.json`).
    pub progress_from: String,
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
    /// A preference trainer's mean reward margin between chosen and
    /// rejected answers (TRL's DPO family: `rewards/margins`).
    pub margins: Vec<(i64, f64)>,
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
            margins: by_step(state.margin_points.clone()),
            progress: state.max_steps.map(|max_steps| RunProgress {
                global_step: state.global_step,
                max_steps,
            }),
            ending: state.closed.then_some(RunEnd::Finished),
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
            &MARGIN_NAMES[..],
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
        // A held-out loss logged in parts (Ultralytics' val/*_loss) is read
        // as their sum.
        let mut columns = columns.to_vec();
        columns.extend(csv_log::summed_columns(&columns));
        self.fill(&columns, |column| {
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
            (&mut self.margins, &MARGIN_NAMES[..], false),
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
pub const EVAL_LOSS_NAMES: [&str; 9] = [
    "eval_loss",
    "eval/loss",
    "val_loss",
    "val/loss",
    "valid_loss",
    "validation_loss",
    "val_loss_epoch",
    "eval_loss_epoch",
    "val/*_loss",
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
pub const LEARNING_RATE_NAMES: [&str; 5] = [
    "learning_rate",
    "train/learning_rate",
    "lr",
    "lr-",
    "lr/unet", // kohya's sd-scripts
];
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

/// Names of a preference trainer's mean reward margin: TRL's DPO family
/// as the Trainer's log, TensorBoard and W&B carry it.
pub const MARGIN_NAMES: [&str; 3] = ["rewards/margins", "train/rewards/margins", "margins"];

/// The name under which HF's tracker callbacks log the Trainer's output
/// folder (W&B's config, MLflow's params).
pub const OUTPUT_DIR_KEY: &str = "output_dir";
/// Longest logged `output_dir` taken for a path.
pub const MAX_OUTPUT_DIR_BYTES: u64 = 4096;

/// The text of a logged `output_dir` (JSON text, as W&B keeps its config
/// values, or plain text, as MLflow keeps params), None when empty or too
/// long to be a path.
pub fn output_dir_of(logged: &str) -> Option<String> {
    let text = logged.trim();
    let text = serde_json::from_str::<String>(text).unwrap_or_else(|_| text.to_string());
    let fits = text.len() as u64 <= MAX_OUTPUT_DIR_BYTES;
    (!text.is_empty() && fits && !text.contains('\0')).then_some(text)
}

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

/// The error detail that marks a tracker run with no loss series (see
/// [`is_no_loss_series`](super::loss_log::is_no_loss_series)).
pub const NO_LOSS_DETAIL: &str = "no_loss_series";

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
        source: DLM_SOURCE.to_string(),
        series: "loss".to_string(),
        torn_files: vec![],
        side: SideSeries::default(),
        damage: Damage::default(),
        thinned: None,
        output_classes: None,
        output_dir: None,
        per_epoch: false,
        settings: vec![],
        progress_from: String::new(),
    }
}
