//! MLflow's SQLite tracking store (`mlflow.db`: MLflow 3's default
//! `sqlite:///mlflow.db`), read without MLflow through [`crate::io::sqlite`].
//! Three of its tables are read: `experiments` (id, name), `runs`
//! (`run_uuid`, `name`, `experiment_id`, `lifecycle_stage`) and `metrics`
//! (`key`, `value`, `step`, `is_nan`, `run_uuid`, indexed by run, key and
//! step). Deleted runs are passed over.
//!
//! A run has no folder of its own, so it is named by a path below the
//! file, as the file store names it below `mlruns/`:
//! `<dir>/mlflow.db/<experiment id>/<run id>`. Readers given such a path
//! read that run from the file.
//!
//! MLflow stores a NaN as `is_nan = 1` (value 0) and an infinity as the
//! largest finite double; both are read back as what was logged.

use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::loss_log::{self, LossCurve, SideSeries};
use crate::formats::logs::mlflow_files::DEFAULT_LOSS_KEYS;
use crate::io::sqlite::{self, Db};

/// The file's name where MLflow 3 puts it by default.
pub const DB_NAME: &str = "mlflow.db";
/// Most runs listed from one file.
pub const MAX_RUNS: usize = 100_000;
/// Most metric keys listed for one run.
pub const MAX_METRICS: usize = 10_000;
/// Most points read from one metric.
pub const MAX_POINTS: usize = 20_000_000;

/// One run of the store.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub run_id: String,
    pub name: String,
    pub experiment_id: i64,
    pub experiment: String,
}

impl RunInfo {
    /// `experiment/run name (run id)`.
    pub fn label(&self) -> String {
        loss_log::run_label(&self.experiment, &self.name, &self.run_id)
    }
}

/// Whether `path` is an SQLite file holding MLflow's tables.
pub fn is_mlflow_db(path: &Path) -> bool {
    sqlite::is_sqlite(path)
        && Db::open(path, Area::LogFormat).is_ok_and(|db| {
            ["runs", "metrics", "experiments"]
                .iter()
                .all(|t| db.has_table(t))
        })
}

/// The path that names `run` of the store at `db`.
pub fn run_path(db: &Path, run: &RunInfo) -> PathBuf {
    db.join(run.experiment_id.to_string()).join(&run.run_id)
}

/// The store file and run id a run path names (see the module doc), when
/// `path` is one: two levels below an SQLite file.
pub fn split_run_path(path: &Path) -> Option<(PathBuf, String)> {
    let run_id = path.file_name()?.to_str()?;
    let experiment = path.parent()?;
    experiment.file_name()?.to_str()?.parse::<i64>().ok()?;
    let db = experiment.parent()?;
    let is_file = std::fs::metadata(db).is_ok_and(|m| m.is_file());
    (is_file && sqlite::is_sqlite(db)).then(|| (db.to_path_buf(), run_id.to_string()))
}

fn text(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<String> {
    Ok(row.get::<_, Option<String>>(i)?.unwrap_or_default())
}

/// The columns of a run and its experiment's name, `WHERE` left to add.
const RUN_COLUMNS: &str = "SELECT r.run_uuid, r.name, r.experiment_id, e.name \
    FROM runs r LEFT JOIN experiments e ON e.experiment_id = r.experiment_id";

/// A row of [`RUN_COLUMNS`].
fn run_info(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunInfo> {
    Ok(RunInfo {
        run_id: text(row, 0)?,
        name: text(row, 1)?,
        experiment_id: row.get::<_, Option<i64>>(2)?.unwrap_or_default(),
        experiment: text(row, 3)?,
    })
}

/// The store's runs that are not deleted, by experiment then start time.
pub fn runs(path: &Path) -> Result<Vec<RunInfo>> {
    let db = open_store(path)?;
    db.rows(
        &format!(
            "{RUN_COLUMNS} WHERE coalesce(r.lifecycle_stage, 'active') != 'deleted' \
             ORDER BY r.experiment_id, r.start_time, r.run_uuid"
        ),
        &[],
        MAX_RUNS,
        run_info,
    )
}

fn open_store(path: &Path) -> Result<Db> {
    let db = Db::open(path, Area::LogFormat)?;
    if !["runs", "metrics"].iter().all(|t| db.has_table(t)) {
        return Err(Error::new(
            Area::LogFormat,
            path,
            "is an SQLite file without MLflow's runs and metrics tables",
        ));
    }
    Ok(db)
}

/// The `(step, value)` points of metric `key` of run `run_id`, by step.
fn read_metric(db: &Db, run_id: &str, key: &str) -> Result<Vec<(i64, f64)>> {
    db.rows(
        "SELECT step, value, is_nan FROM metrics WHERE run_uuid = ?1 AND key = ?2 \
         ORDER BY step, timestamp",
        &[&run_id, &key],
        MAX_POINTS,
        |row| {
            let step = row.get::<_, Option<i64>>(0)?.unwrap_or_default();
            let value = row.get::<_, Option<f64>>(1)?.unwrap_or(f64::NAN);
            let is_nan = row.get::<_, Option<i64>>(2)?.unwrap_or(0) != 0;
            Ok((step, logged_value(value, is_nan)))
        },
    )
}

/// What was logged, from how MLflow stored it.
fn logged_value(value: f64, is_nan: bool) -> f64 {
    if is_nan {
        f64::NAN
    } else if value == f64::MAX {
        f64::INFINITY
    } else if value == f64::MIN {
        f64::NEG_INFINITY
    } else {
        value
    }
}

/// The loss curve of run `run_id` in the store at `path`: the metric
/// `key` (default: the usual loss names, then the loss by its meaning),
/// with the side series beside it.
pub fn read_run_curve(path: &Path, run_id: &str, key: Option<&str>) -> Result<LossCurve> {
    let db = open_store(path)?;
    let info = db
        .rows(
            &format!("{RUN_COLUMNS} WHERE r.run_uuid = ?1"),
            &[&run_id],
            1,
            run_info,
        )?
        .pop()
        .ok_or_else(|| {
            Error::new(
                Area::Missing,
                path,
                format!("holds no MLflow run {}", crate::io::excerpt::quoted(run_id)),
            )
        })?;
    let keys = db.rows(
        "SELECT DISTINCT key FROM metrics WHERE run_uuid = ?1 ORDER BY key",
        &[&run_id],
        MAX_METRICS,
        |row| text(row, 0),
    )?;
    let chosen = loss_log::choose_run_series(
        &keys,
        key,
        &DEFAULT_LOSS_KEYS,
        path,
        &format!("the MLflow run {}", info.label()),
        "",
    )?;
    let points = read_metric(&db, run_id, &chosen)?;
    let mut side = SideSeries::default();
    side.fill_from_names(&keys, |k| read_metric(&db, run_id, k).ok());
    Ok(LossCurve {
        source: "mlflow".to_string(),
        series: chosen,
        side,
        run: info.label(),
        ..loss_log::assemble(points, vec![path.to_path_buf()])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    /// A store with MLflow's three tables, as its migrations leave them
    /// (columns read here only).
    fn store(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT);
             CREATE TABLE runs (run_uuid TEXT PRIMARY KEY, name TEXT, experiment_id INTEGER,
                                lifecycle_stage TEXT, start_time INTEGER);
             CREATE TABLE metrics (key TEXT, value REAL, timestamp INTEGER, run_uuid TEXT,
                                   step INTEGER, is_nan INTEGER);
             INSERT INTO experiments VALUES (1, 'sft');
             INSERT INTO runs VALUES ('r1', 'good', 1, 'active', 1), ('r2', 'gone', 1, 'deleted', 2),
                                     ('r3', NULL, 1, 'active', 3);",
        )
        .unwrap();
        conn
    }

    fn log(conn: &Connection, run: &str, key: &str, step: i64, value: f64, is_nan: bool) {
        conn.execute(
            "INSERT INTO metrics VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            rusqlite::params![key, value, step * 10, run, step, is_nan as i64],
        )
        .unwrap();
    }

    #[test]
    fn runs_are_listed_and_named_and_their_curves_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DB_NAME);
        let conn = store(&path);
        for step in 0..5 {
            log(
                &conn,
                "r1",
                "train/nll_loss",
                step,
                2.0 - step as f64 / 10.0,
                false,
            );
            log(&conn, "r1", "learning_rate", step, 1e-4, false);
        }
        log(&conn, "r1", "train/nll_loss", 5, 0.0, true);
        log(&conn, "r1", "train/nll_loss", 6, f64::MAX, false);
        log(&conn, "r3", "accuracy", 0, 0.5, false);
        drop(conn);
        assert!(is_mlflow_db(&path));
        let found = runs(&path).unwrap();
        let ids: Vec<&str> = found.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(ids, ["r1", "r3"], "the deleted run is passed over");
        assert_eq!(found[0].label(), "sft/good (r1)");
        assert_eq!(found[1].label(), "sft/r3");
        let at = run_path(&path, &found[0]);
        assert_eq!(at, path.join("1").join("r1"));
        assert_eq!(split_run_path(&at), Some((path.clone(), "r1".to_string())));
        assert_eq!(split_run_path(&path.join("x").join("r1")), None);
        let curve = read_run_curve(&path, "r1", None).unwrap();
        assert_eq!(curve.series, "train/nll_loss");
        assert_eq!(curve.run, "sft/good (r1)");
        assert_eq!(curve.steps, (0..7).collect::<Vec<_>>());
        assert!(curve.losses[5].is_infinite() && curve.losses[6].is_infinite());
        assert_eq!(curve.side.learning_rate.len(), 5);
        let e = read_run_curve(&path, "r3", None).unwrap_err();
        assert!(loss_log::is_no_loss_series(&e), "{}", e.message);
        let e = read_run_curve(&path, "nope", None).unwrap_err();
        assert_eq!(e.area, Area::Missing);
        let e = read_run_curve(&path, "r1", Some("nope")).unwrap_err();
        assert_eq!(e.area, Area::Usage);
    }

    #[test]
    fn other_sqlite_files_are_no_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE runs (x INTEGER);")
            .unwrap();
        assert!(!is_mlflow_db(&path));
        assert!(runs(&path).is_err());
    }
}
