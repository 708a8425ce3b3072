//! MLflow's SQLite tracking store (`mlflow.db`: MLflow 3's default
//! `sqlite:///mlflow.db`), read without MLflow through [`crate::io::sqlite`].
//! Three of its tables are read: `experiments` (id, name), `runs`
//! (`run_uuid`, `name`, `experiment_id`, `lifecycle_stage`, `start_time`)
//! and `metrics` (`run_uuid`, `key`, `step`, `value`, `is_nan`,
//! `timestamp`). Deleted runs are passed over.
//!
//! A run has no folder of its own, so it is named by a path below the
//! file, as the file store names it below `mlruns/`:
//! `<dir>/mlflow.db/<experiment id>/<run id>`. Readers given such a path
//! read that run from the file. A run id that is no plain name (`/etc/passwd`,
//! `..`, one holding `/`, `\`, `%` or a control character) is named by its
//! escaped form ([`id_name`]: `%2Fetc%2Fpasswd`), so it never names a path
//! outside the file.
//!
//! Linear in the file, whatever its indexes: every query is one scan of
//! one table, with no join and no `ORDER BY` (a crafted file has no
//! indexes, and a query per run would make a scan quadratic in runs). A
//! scan lists a file's runs ([`runs`]) and the first run read from it then
//! reads `metrics` once for all the runs listed, keeping each run's keys
//! and the points of the series a curve may read (the loss candidates and
//! the side series); each later run takes what was kept for it, and when
//! the last has, nothing is held. A run read on its own (a path given to
//! `read_loss_curve`) is read with one pass too. Each pass is one
//! connection, with the step budget of the file's size. A cell of the
//! wrong type spoils only the run whose row it is (its record says why);
//! a series is thinned past [`mlflow_files::MAX_POINTS`] as the file
//! store's are, and a file keeps at most [`MAX_POINTS`] points in all.
//!
//! MLflow stores a NaN as `is_nan = 1` (value 0) and an infinity as the
//! largest finite double; both are read back as what was logged.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::types::ValueRef;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::{Area, Error, Result};
use crate::formats::logs::curve::{self, LossCurve, RunEnd, SideSeries, Thinning};
use crate::formats::logs::mlflow_files::{self, DEFAULT_LOSS_KEYS};
use crate::formats::logs::series_names;
use crate::formats::logs::thinned::Thinned;
use crate::formats::model_config::{self, OutputClasses};
use crate::io::confine;
use crate::io::excerpt::quoted;
use crate::io::sqlite::{self, Db};

/// The file's name where MLflow 3 puts it by default.
pub const DB_NAME: &str = "mlflow.db";
/// Most runs listed from one file.
pub const MAX_RUNS: usize = 100_000;
/// Most metric keys of one run.
pub const MAX_METRICS: usize = 10_000;
/// Most points kept from one file, over all its runs and series.
pub const MAX_POINTS: usize = 16 << 20;
/// Most distinct (run, key) pairs kept from one file.
const MAX_FILE_KEYS: usize = 4 << 20;
/// Files whose listed runs wait to be read (a scan that does not read
/// them, with no `training_drift`, leaves them; the oldest is let go).
const MAX_LISTED: usize = 16;

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
        curve::run_label(&self.experiment, &self.name, &self.run_id)
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
    db.join(run.experiment_id.to_string())
        .join(id_name(&run.run_id))
}

/// A run id as one plain path component: `%`, `/`, `\` and control
/// characters written `%XX` (their UTF-8 bytes), `.` and `..` as `%2E`
/// and `%2E%2E`, the empty id as `%`. MLflow's own ids (32 hex digits)
/// are their own names.
pub fn id_name(id: &str) -> String {
    match id {
        "" => return "%".to_string(),
        "." | ".." => return id.replace('.', "%2E"),
        _ => {}
    }
    let mut out = String::with_capacity(id.len());
    for c in id.chars() {
        if matches!(c, '%' | '/' | '\\') || c.is_control() {
            let mut utf8 = [0u8; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The run id that [`id_name`] wrote as `name`, if it is one.
fn id_of_name(name: &str) -> Option<String> {
    if name == "%" {
        return Some(String::new());
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes.get(at + 1..at + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The store file and run id a run path names (see the module doc), when
/// `path` is one: two levels below an SQLite file.
pub fn split_run_path(path: &Path) -> Option<(PathBuf, String)> {
    let run_id = id_of_name(path.file_name()?.to_str()?)?;
    let experiment = path.parent()?;
    experiment.file_name()?.to_str()?.parse::<i64>().ok()?;
    let db = experiment.parent()?;
    let is_file = std::fs::metadata(db).is_ok_and(|m| m.is_file());
    (is_file && sqlite::is_sqlite(db)).then(|| (db.to_path_buf(), run_id))
}

/// A cell as text, whatever SQLite holds in it (bytes that are no UTF-8
/// lossily); None for NULL.
fn cell_text(value: ValueRef<'_>) -> Option<Cow<'_, str>> {
    match value {
        ValueRef::Null => None,
        ValueRef::Integer(i) => Some(Cow::Owned(i.to_string())),
        ValueRef::Real(f) => Some(Cow::Owned(f.to_string())),
        ValueRef::Text(b) | ValueRef::Blob(b) => Some(String::from_utf8_lossy(b)),
    }
}

/// What SQLite holds in a cell, for messages.
fn cell_kind(value: ValueRef<'_>) -> &'static str {
    match value {
        ValueRef::Null => "NULL",
        ValueRef::Integer(_) => "an integer",
        ValueRef::Real(_) => "a real",
        ValueRef::Text(_) => "text",
        ValueRef::Blob(_) => "a blob",
    }
}

fn cell<'r>(row: &'r rusqlite::Row<'_>, i: usize) -> ValueRef<'r> {
    row.get_ref(i).unwrap_or(ValueRef::Null)
}

/// A run's row of `runs`, as read.
#[derive(Debug, Clone)]
struct RunRow {
    info: RunInfo,
    start_time: Option<i64>,
    deleted: bool,
    /// Why the run cannot be read (a cell of the wrong type), if so.
    problem: Option<String>,
    /// The params that say the model's outputs (`model_config::CLASS_KEYS`),
    /// as HF's MLflow callback logged them.
    params: BTreeMap<String, String>,
    /// How the run ended, by its `runs.status`.
    ending: Option<RunEnd>,
}

/// The store's runs, each id once (its first row), by experiment, start
/// time and id: one pass over `experiments` and one over `runs`.
fn list_runs(db: &Db) -> Result<Vec<RunRow>> {
    let mut experiments: FxHashMap<i64, String> = FxHashMap::default();
    if db.has_table("experiments") {
        db.for_each_row("SELECT experiment_id, name FROM experiments", &[], |row| {
            if let ValueRef::Integer(id) = cell(row, 0) {
                if experiments.len() < MAX_RUNS {
                    let name = cell_text(cell(row, 1)).unwrap_or_default();
                    experiments.entry(id).or_insert_with(|| name.into_owned());
                }
            }
            Ok(())
        })?;
    }
    let mut seen: FxHashSet<String> = FxHashSet::default();
    let mut out: Vec<RunRow> = vec![];
    let mut active = 0usize;
    // `runs.status` says how a run ended; a store without the column says
    // nothing of it.
    let with_status = db.has_column("runs", "status");
    let query = if with_status {
        "SELECT run_uuid, name, experiment_id, lifecycle_stage, start_time, status FROM runs"
    } else {
        "SELECT run_uuid, name, experiment_id, lifecycle_stage, start_time FROM runs"
    };
    db.for_each_row(query, &[], |row| {
        let id = cell_text(cell(row, 0)).unwrap_or_default();
        if seen.contains(id.as_ref()) {
            return Ok(());
        }
        let deleted = matches!(cell(row, 3), ValueRef::Text(b"deleted"));
        if !deleted {
            if active >= MAX_RUNS {
                return Err(Error::new(
                    Area::LogFormat,
                    db.path(),
                    format!("holds more than {MAX_RUNS} runs where this reader reads at most that"),
                ));
            }
            active += 1;
        } else if seen.len() >= 2 * MAX_RUNS {
            return Ok(()); // deleted runs past the cap: only read by name
        }
        let mut problem = None;
        let experiment_id = match cell(row, 2) {
            ValueRef::Integer(i) => i,
            ValueRef::Null => 0,
            other => {
                let parsed = cell_text(other).and_then(|t| t.trim().parse::<i64>().ok());
                parsed.unwrap_or_else(|| {
                    problem = Some(format!(
                        "its row of runs holds {} where the experiment_id belongs",
                        cell_kind(other)
                    ));
                    0
                })
            }
        };
        let start_time = match cell(row, 4) {
            ValueRef::Integer(i) => Some(i),
            _ => None,
        };
        seen.insert(id.to_string());
        out.push(RunRow {
            info: RunInfo {
                run_id: id.into_owned(),
                name: cell_text(cell(row, 1)).unwrap_or_default().into_owned(),
                experiment_id,
                experiment: experiments.get(&experiment_id).cloned().unwrap_or_default(),
            },
            start_time,
            deleted,
            problem,
            params: BTreeMap::new(),
            ending: with_status
                .then(|| cell_text(cell(row, 5)).and_then(|t| mlflow_files::run_end(&t)))
                .flatten(),
        });
        Ok(())
    })?;
    if db.has_table("params") {
        read_class_params(db, &mut out)?;
    }
    out.sort_by(|a, b| {
        (a.info.experiment_id, a.start_time, &a.info.run_id).cmp(&(
            b.info.experiment_id,
            b.start_time,
            &b.info.run_id,
        ))
    });
    Ok(out)
}

/// Longest param value kept (an `id2label` of many labels is long).
const MAX_PARAM_VALUE: usize = 1 << 20;

/// Put into each row the params that say its model's outputs: one pass
/// over the `params` rows of those keys.
fn read_class_params(db: &Db, rows: &mut [RunRow]) -> Result<()> {
    let index: FxHashMap<String, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.info.run_id.clone(), i))
        .collect();
    let keys = model_config::CLASS_KEYS
        .iter()
        .chain([&curve::OUTPUT_DIR_KEY])
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    db.for_each_row(
        &format!("SELECT run_uuid, key, value FROM params WHERE key IN ({keys})"),
        &[],
        |row| {
            let (Some(id), Some(key), Some(value)) = (
                cell_text(cell(row, 0)),
                cell_text(cell(row, 1)),
                cell_text(cell(row, 2)),
            ) else {
                return Ok(()); // a cell of the wrong type: no evidence
            };
            if let Some(&i) = index.get(id.as_ref()) {
                if value.len() <= MAX_PARAM_VALUE {
                    if let Some(r) = rows.get_mut(i) {
                        r.params.insert(key.into_owned(), value.into_owned());
                    }
                }
            }
            Ok(())
        },
    )
}

/// The store's runs that are not deleted, by experiment then start time.
/// They are remembered for the scan that lists them: the first of them
/// read has `metrics` read once for all (see the module doc).
pub fn runs(path: &Path) -> Result<Vec<RunInfo>> {
    let rows: Vec<RunRow> = list_runs(&open_store(path)?)?
        .into_iter()
        .filter(|r| !r.deleted)
        .collect();
    remember(path, &rows);
    Ok(rows.into_iter().map(|r| r.info).collect())
}

/// Whether `path` is an SQLite file with MLflow's `runs` and `metrics`
/// tables, whatever its name (`mlflow.db`, `mlruns.db`, ...).
pub fn is_store(path: &Path) -> bool {
    sqlite::is_sqlite(path) && open_store(path).is_ok()
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

/// One logged value: step, timestamp, value (as logged).
type Point = (i64, i64, f64);

/// What a pass over `metrics` kept of one run.
#[derive(Debug, Clone, Default)]
struct RunSeries {
    /// Every distinct key of the run, with its points where a curve may
    /// read them.
    series: FxHashMap<String, Option<Thinned<Point>>>,
    /// Why the run cannot be read (a cell of the wrong type, a cap), if so.
    problem: Option<String>,
}

impl RunSeries {
    fn spoil(&mut self, why: String) {
        self.problem.get_or_insert(why);
        self.series = FxHashMap::default();
    }
}

/// Whether a curve read with `tag` may read the metric `key`: the loss
/// (`tag`, else any key the loss may be chosen from) or a side series.
fn may_read(key: &str, tag: Option<&str>) -> bool {
    let one = [key.to_string()];
    let loss = match tag {
        Some(t) => key == t,
        None => {
            series_names::loss_among(&DEFAULT_LOSS_KEYS, one.iter().map(String::as_str)).is_some()
        }
    };
    let mut side = false;
    SideSeries::default().fill_from_names(&one, |_| {
        side = true;
        None
    });
    loss || side
}

/// The point of a row's `step`, `value`, `is_nan` and `timestamp` cells,
/// or what is wrong with it.
fn point_of(
    step: ValueRef<'_>,
    value: ValueRef<'_>,
    is_nan: ValueRef<'_>,
    time: ValueRef<'_>,
) -> std::result::Result<Point, String> {
    let wrong = |what: &str, v: ValueRef<'_>| format!("{} where the {what} belongs", cell_kind(v));
    let step = match step {
        ValueRef::Integer(i) => i,
        ValueRef::Null => 0,
        other => return Err(wrong("step", other)),
    };
    let value = match value {
        ValueRef::Real(f) => f,
        ValueRef::Integer(i) => i as f64,
        ValueRef::Null => f64::NAN,
        other => return Err(wrong("value", other)),
    };
    let is_nan = match is_nan {
        ValueRef::Integer(i) => i != 0,
        ValueRef::Null => false,
        other => return Err(wrong("is_nan flag", other)),
    };
    let time = match time {
        ValueRef::Integer(i) => i,
        _ => 0, // only orders a step's values
    };
    Ok((step, time, logged_value(value, is_nan)))
}

/// One pass over `metrics`: for each run of `wanted`, its keys and the
/// points of the series a curve read with `tag` may read.
fn read_metrics(
    db: &Db,
    wanted: &FxHashSet<String>,
    tag: Option<&str>,
) -> Result<FxHashMap<String, RunSeries>> {
    let mut runs: FxHashMap<String, RunSeries> = wanted
        .iter()
        .map(|id| (id.clone(), RunSeries::default()))
        .collect();
    #[cfg(test)]
    tests::PASSES.with(|n| n.set(n.get() + 1));
    let mut decided: FxHashMap<String, bool> = FxHashMap::default();
    let (mut pairs, mut points) = (0usize, 0usize);
    db.for_each_row(
        "SELECT run_uuid, key, step, value, is_nan, timestamp FROM metrics",
        &[],
        |row| {
            let id = cell_text(cell(row, 0)).unwrap_or_default();
            let Some(run) = runs.get_mut(id.as_ref()) else {
                return Ok(());
            };
            if run.problem.is_some() {
                return Ok(());
            }
            let key = cell_text(cell(row, 1)).unwrap_or_default();
            if !run.series.contains_key(key.as_ref()) {
                if run.series.len() >= MAX_METRICS {
                    run.spoil(format!("it has more than {MAX_METRICS} metric keys"));
                    return Ok(());
                }
                if pairs >= MAX_FILE_KEYS {
                    run.spoil(format!(
                        "the file holds more than {MAX_FILE_KEYS} metric keys over its runs"
                    ));
                    return Ok(());
                }
                pairs += 1;
                let keep = match decided.get(key.as_ref()) {
                    Some(&keep) => keep,
                    None => {
                        let keep = may_read(&key, tag);
                        if decided.len() < MAX_FILE_KEYS {
                            decided.insert(key.to_string(), keep);
                        }
                        keep
                    }
                };
                let kept = keep
                    .then(|| Thinned::new(mlflow_files::MAX_POINTS, |p: &Point| !p.2.is_finite()));
                run.series.insert(key.to_string(), kept);
            }
            let Some(Some(series)) = run.series.get_mut(key.as_ref()) else {
                return Ok(());
            };
            match point_of(cell(row, 2), cell(row, 3), cell(row, 4), cell(row, 5)) {
                Ok(point) if points < MAX_POINTS => {
                    let before = series.len();
                    series.push(point).map_err(|e| {
                        Error::new(
                            Area::LogFormat,
                            db.path(),
                            mlflow_files::out_of_memory("its metrics", &e),
                        )
                    })?;
                    points = points - before + series.len();
                }
                Ok(_) => run.spoil(format!(
                    "the file holds more than the {MAX_POINTS} points read from one file"
                )),
                Err(why) => run.spoil(format!("a row of its metric {} holds {why}", quoted(&key))),
            }
            Ok(())
        },
    )?;
    Ok(runs)
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
    if key.is_none() {
        if let Some((row, read)) = take_listed(path, run_id) {
            return curve_of(path, &row, read?, None);
        }
    }
    let db = open_store(path)?;
    let row = list_runs(&db)?
        .into_iter()
        .find(|r| r.info.run_id == run_id)
        .ok_or_else(|| {
            Error::new(
                Area::Missing,
                path,
                format!("holds no MLflow run {}", quoted(run_id)),
            )
        })?;
    let wanted: FxHashSet<String> = [run_id.to_string()].into_iter().collect();
    let read = read_metrics(&db, &wanted, key)?
        .remove(run_id)
        .unwrap_or_default();
    curve_of(path, &row, read, key)
}

/// The curve of the run of `row` from what a pass kept of it.
fn curve_of(path: &Path, row: &RunRow, read: RunSeries, key: Option<&str>) -> Result<LossCurve> {
    let info = &row.info;
    if let Some(why) = row.problem.as_ref().or(read.problem.as_ref()) {
        return Err(Error::new(
            Area::LogFormat,
            path,
            format!("its MLflow run {} cannot be read: {why}", info.label()),
        ));
    }
    let mut keys: Vec<String> = read.series.keys().cloned().collect();
    keys.sort();
    let chosen = curve::choose_run_series(
        &keys,
        key,
        &DEFAULT_LOSS_KEYS,
        path,
        &format!("the MLflow run {}", info.label()),
        "",
    )?;
    let mut kept: FxHashMap<String, Vec<(i64, f64)>> = FxHashMap::default();
    let mut thinned = None;
    for (k, series) in read.series {
        if let Some(series) = series {
            let finished = series.finish().map_err(|e| {
                Error::new(
                    Area::LogFormat,
                    path,
                    mlflow_files::out_of_memory("its metrics", &e),
                )
            })?;
            if k == chosen {
                thinned = Thinning::of(&finished);
            }
            let mut points = finished.points;
            points.sort_by_key(|&(step, time, _)| (step, time));
            kept.insert(k, points.into_iter().map(|(s, _, v)| (s, v)).collect());
        }
    }
    let Some(points) = kept.get(&chosen).cloned() else {
        return Err(Error::new(
            Area::LogFormat,
            path,
            format!("the metric {} was not kept while reading", quoted(&chosen)),
        ));
    };
    let mut side = SideSeries::default();
    side.fill_from_names(&keys, |k| kept.get(k).cloned());
    side.ending = row.ending.clone();
    let output_classes =
        model_config::output_classes_logged(|k| row.params.get(k).cloned()).map(|(count, kind)| {
            OutputClasses {
                count,
                kind: kind.to_string(),
                path: path.to_path_buf(),
                source: "MLflow's params".to_string(),
            }
        });
    Ok(LossCurve {
        source: "mlflow".to_string(),
        series: chosen,
        side,
        run: info.label(),
        thinned,
        output_classes,
        output_dir: row
            .params
            .get(curve::OUTPUT_DIR_KEY)
            .and_then(|v| curve::output_dir_of(v)),
        ..curve::assemble(points, vec![path.to_path_buf()])
    })
}

// ---- one pass per file for a scan ----

/// What identifies a store file for a scan: the root in force, the path,
/// and the file's device, inode, length and change time (a file changed
/// since its runs were listed is read afresh).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileKey {
    root: confine::Root,
    path: PathBuf,
    id: (u64, u64, u64, Option<std::time::SystemTime>),
}

fn file_key(path: &Path) -> Option<FileKey> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let (dev, ino) = {
        use std::os::unix::fs::MetadataExt;
        (meta.dev(), meta.ino())
    };
    #[cfg(not(unix))]
    let (dev, ino) = (0, 0);
    Some(FileKey {
        root: confine::current(),
        path: path.to_path_buf(),
        id: (dev, ino, meta.len(), meta.modified().ok()),
    })
}

/// A store file whose runs a scan listed, to be read in one pass.
struct Listed {
    file: FileKey,
    state: Mutex<ListedState>,
}

#[derive(Default)]
struct ListedState {
    /// The runs listed and not yet read: their rows, and how many reads
    /// each still awaits (a file listed twice is read twice).
    pending: FxHashMap<String, (RunRow, u32)>,
    /// What the pass kept for the runs pending when it was made (or why
    /// it failed), once it is.
    read: Option<Result<FxHashMap<String, RunSeries>>>,
}

static LISTED: Mutex<Vec<Arc<Listed>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Remember the runs of `path` just listed, for [`take_listed`].
fn remember(path: &Path, rows: &[RunRow]) {
    let Some(file) = file_key(path) else {
        return;
    };
    let mut listed = lock(&LISTED);
    if let Some(entry) = listed.iter().find(|l| l.file == file) {
        // Not yet read (and not being read): the same runs await one more read.
        if let Ok(mut state) = entry.state.try_lock() {
            if state.read.is_none() {
                for row in rows {
                    let id = row.info.run_id.clone();
                    state.pending.entry(id).or_insert((row.clone(), 0)).1 += 1;
                }
                return;
            }
        }
    }
    listed.retain(|l| l.file != file);
    let pending = rows
        .iter()
        .map(|r| (r.info.run_id.clone(), (r.clone(), 1)))
        .collect();
    listed.push(Arc::new(Listed {
        file,
        state: Mutex::new(ListedState {
            pending,
            read: None,
        }),
    }));
    if listed.len() > MAX_LISTED {
        listed.remove(0);
    }
}

/// The row of run `run_id` of `path` and what the file's one pass kept of
/// it, when a scan listed it and has not read it yet (the pass is made by
/// the first run read); None to read it on its own.
fn take_listed(path: &Path, run_id: &str) -> Option<(RunRow, Result<RunSeries>)> {
    let file = file_key(path)?;
    let entry = lock(&LISTED).iter().find(|l| l.file == file).cloned()?;
    let (row, read, drained) = {
        let mut state = lock(&entry.state);
        let (row, left) = {
            let (row, count) = state.pending.get_mut(run_id)?;
            *count -= 1;
            (row.clone(), *count)
        };
        if state.read.is_none() {
            let wanted: FxHashSet<String> = state.pending.keys().cloned().collect();
            let read = open_store(path).and_then(|db| read_metrics(&db, &wanted, None));
            state.read = Some(read);
        }
        if left == 0 {
            state.pending.remove(run_id);
        }
        let read = match state.read.as_mut() {
            Some(Ok(runs)) if left == 0 => Ok(runs.remove(run_id).unwrap_or_default()),
            Some(Ok(runs)) => Ok(runs.get(run_id).cloned().unwrap_or_default()),
            Some(Err(e)) => Err(e.clone()),
            None => Ok(RunSeries::default()),
        };
        (row, read, state.pending.is_empty())
    };
    if drained {
        lock(&LISTED).retain(|l| !Arc::ptr_eq(l, &entry));
    }
    Some((row, read))
}

#[cfg(test)]
mod tests;
