//! Training logs: each trainer's format read into the same loss curve.
//!
//! One module per format (dlm's JSON lines, HF `trainer_state.json`,
//! TensorBoard event files, Lightning/CSV `metrics.csv`) and [`loss_log`],
//! which finds a run's logs, picks the reader and merges what it reads
//! into one deduplicated series. [`series_names`] tells from a name
//! whether a series is the training loss, a held-out loss or neither.

pub mod csv_log;
pub mod damage;
pub mod gap_log;
pub mod json_line;
pub mod loss_log;
pub mod mlflow_db;
pub mod mlflow_files;
pub mod series_names;
pub mod tfevents;
pub mod thinned;
pub mod trainer_log;
pub mod trainer_state;
pub mod wandb_run;
