//! Training logs: each trainer's format read into the same loss curve.
//!
//! One module per format (dlm's JSON lines in [`dlm_log`], HF
//! `trainer_state.json`, LLaMA-Factory's `trainer_log.jsonl`, TensorBoard
//! event files, `metrics.csv`, W&B run directories, MLflow stores), each
//! building the [`curve::LossCurve`] that [`curve`] defines; [`loss_log`]
//! finds a run's logs and picks the reader. [`series_names`] tells from a
//! name whether a series is the training loss, a held-out loss, a reward
//! or neither. Readers import the curve, never `loss_log`, so the
//! dependency runs one way.

pub mod csv_log;
pub mod curve;
pub mod damage;
pub mod dlm_log;
pub mod gap_log;
pub mod json_line;
pub mod loss_log;
pub mod mlflow_db;
pub mod mlflow_files;
pub mod mlx_log;
pub mod series_names;
pub mod tfevents;
pub mod thinned;
pub mod trainer_log;
pub mod trainer_state;
pub mod wandb_run;
