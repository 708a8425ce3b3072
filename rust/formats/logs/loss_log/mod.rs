//! Find a run's training logs in any supported format and read them into
//! one loss curve.
//!
//! dlm's JSON lines ([`dlm_log`]), HF `trainer_state.json`, LLaMA-Factory's
//! `trainer_log.jsonl`, TensorBoard event files, Lightning's `metrics.csv`,
//! W&B run directories and MLflow stores are each read by their own
//! module; this one tells which a path holds, picks the reader and hands
//! back the [`LossCurve`].

use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::curve::{
    assemble, is_held_out, LossCurve, SideSeries, DLM_SOURCE, NO_LOSS_DETAIL,
};
use crate::formats::logs::damage::Damage;
use crate::formats::logs::dlm_log::{read_loss_curve, train_logs_in};
use crate::formats::logs::{
    csv_log, mlflow_db, mlflow_files, tfevents, trainer_log, trainer_state, wandb_run,
};
use crate::formats::model_config::{self, OutputClasses};
use crate::io::lfs;
use crate::io::walk::files_under;

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
            LogSource::Dlm => DLM_SOURCE,
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
        // Readable, and empty: nothing to judge, said as such (a skip).
        [] => Err(Error::new(
            Area::LogFormat,
            db,
            "the MLflow store holds 0 runs (none that is not deleted): nothing to judge",
        )
        .with(NO_LOSS_DETAIL, "true")),
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
            let output_classes = classes_of_events(&series);
            read(&series.tag, series.points, series.files, series.torn_files).map(|c| LossCurve {
                side,
                output_classes,
                ..c
            })
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
            let damage = Damage::of(
                "CSV rows",
                series.skipped_rows,
                series.rows + series.skipped_rows,
            );
            // Epochs, or rows of a log without a step column (one per epoch
            // in Keras's): not optimizer steps.
            let per_epoch = series.step_column != "step";
            read(&series.column, series.points, files, torn).map(|c| LossCurve {
                side,
                damage,
                per_epoch,
                ..c
            })
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
    let mut output_classes = None;
    if !events.is_empty() {
        match tfevents::read_scalar_series_and(&events, None, &SideSeries::is_side_name) {
            // A held-out loss found by its name is no addition to the
            // training loss of the trainer state.
            Ok((series, _)) if !files.is_empty() && is_held_out(&series.tag) => {}
            Ok((series, kept)) => {
                if files.is_empty() {
                    series_name.clone_from(&series.tag);
                }
                output_classes = classes_of_events(&series);
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
        output_classes,
        ..assemble(points, files)
    })
}

/// K from the `model_config` text an HF run's event files carry.
fn classes_of_events(series: &tfevents::ScalarSeries) -> Option<OutputClasses> {
    let (path, text) = series.model_config.as_ref()?;
    let (count, kind) = model_config::output_classes(text)?;
    Some(OutputClasses {
        count,
        kind: kind.to_string(),
        path: path.clone(),
        source: "the TensorBoard model_config text".to_string(),
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
