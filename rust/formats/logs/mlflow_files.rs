//! MLflow's file store (`mlruns/`): read without MLflow. Each run is a
//! directory `mlruns/<experiment id>/<run id>/` holding `meta.yaml` (with
//! `run_id:` and `run_name:`) and `metrics/`, where each metric is a text
//! file named by its key (a key with `/` is a nested path: `train/loss` is
//! `metrics/train/loss`). A metric file has a line per logged value,
//! `<timestamp ms> <value> <step>`; files of old releases have no step,
//! and the line's position stands for it. Values are Python floats (`nan`,
//! `inf`).
//!
//! Everything is capped: the metric files listed per run, the depth of
//! nested keys, the bytes of each file.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::json_line::{python_float, python_int};
use crate::formats::logs::loss_log::{self, LossCurve, SideSeries};
use crate::io::confine;
use crate::io::files::{open_regular, read_small};

/// A run's metadata file.
pub const META: &str = "meta.yaml";
/// Most metric files listed in one run.
pub const MAX_METRICS: usize = 10_000;
/// Deepest nesting of a metric key (`a/b/c` is 3).
const MAX_KEY_DEPTH: usize = 8;
/// Largest metric file read (a line is ~40 bytes: millions of points).
pub const MAX_METRIC_BYTES: u64 = 256 << 20;
/// Largest `meta.yaml` read.
const MAX_META_BYTES: u64 = 64 << 10;

/// Whether `dir` is an MLflow run: a `meta.yaml` naming a `run_id` beside
/// a `metrics/` directory.
pub fn is_run_dir(dir: &Path) -> bool {
    dir.join("metrics").is_dir() && meta_field(dir, "run_id").is_some()
}

/// A top-level `key: value` of the run's `meta.yaml` (a plain scalar,
/// quotes removed), if the file reads.
pub fn meta_field(dir: &Path, key: &str) -> Option<String> {
    let file = open_regular(&dir.join(META), Area::LogFormat).ok()?;
    let mut text = String::new();
    file.take(MAX_META_BYTES).read_to_string(&mut text).ok()?;
    text.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?.trim();
        let value = value.trim_matches(|c| c == '\'' || c == '"');
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// How a person finds the run: `experiment/run name (run id)`, from the
/// run's and its experiment's `meta.yaml` (parts left out where missing).
pub fn run_label(run: &Path) -> String {
    let id = meta_field(run, "run_id").unwrap_or_default();
    let name = meta_field(run, "run_name").unwrap_or_default();
    let experiment = run
        .parent()
        .and_then(|e| meta_field(e, "name"))
        .unwrap_or_default();
    loss_log::run_label(&experiment, &name, &id)
}

/// The run's metric keys and their files, sorted by key.
pub fn metric_files(run: &Path) -> Result<Vec<(String, PathBuf)>> {
    let root = run.join("metrics");
    let mut out = vec![];
    let mut pending = vec![(root.clone(), String::new(), 0usize)];
    let mut dirs = 0usize;
    while let Some((dir, prefix, depth)) = pending.pop() {
        for (name, path) in confine::list_dir(&dir, Area::LogFormat)? {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| Error::io(Area::LogFormat, &path, &e))?;
            if meta.is_dir() {
                dirs += 1;
                if depth + 1 < MAX_KEY_DEPTH && dirs <= MAX_METRICS {
                    pending.push((path, key, depth + 1));
                }
            } else if meta.is_file() {
                if out.len() >= MAX_METRICS {
                    return Err(Error::new(
                        Area::LogFormat,
                        &root,
                        format!("holds more than {MAX_METRICS} metric files; not an MLflow run"),
                    ));
                }
                out.push((key, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Metric keys tried first for the training loss, before the keys are read
/// by their meaning (`series_names`).
pub const DEFAULT_LOSS_KEYS: [&str; 5] = [
    "loss",
    "train_loss",
    "train/loss",
    "training_loss",
    "train_loss_step",
];

/// The run's loss curve: the metric `key` (default: the usual loss names,
/// then the loss by its meaning), with the side series beside it.
pub fn read_run_curve(run: &Path, key: Option<&str>) -> Result<LossCurve> {
    let files = metric_files(run)?;
    let keys: Vec<String> = files.iter().map(|(k, _)| k.clone()).collect();
    let chosen =
        loss_log::choose_run_series(&keys, key, &DEFAULT_LOSS_KEYS, run, "the MLflow run", "")?;
    let path_of = |k: &str| {
        files
            .iter()
            .find(|(have, _)| have == k)
            .map(|(_, p)| p.clone())
    };
    let Some(path) = path_of(&chosen) else {
        return Err(Error::new(
            Area::LogFormat,
            run,
            "a listed metric file vanished",
        ));
    };
    let points = read_metric(&path)?;
    let mut side = SideSeries::default();
    side.fill_from_names(&keys, |k| read_metric(&path_of(k)?).ok());
    Ok(LossCurve {
        source: "mlflow".to_string(),
        series: chosen,
        side,
        run: run_label(run),
        ..loss_log::assemble(points, vec![path])
    })
}

/// The `(step, value)` points of one metric file, in file order (not
/// deduplicated; NaN and infinities kept). Lines that do not read are
/// passed over (a torn last line of a run still logging).
pub fn read_metric(path: &Path) -> Result<Vec<(i64, f64)>> {
    let bytes = read_small(path, Area::LogFormat, MAX_METRIC_BYTES)?;
    Ok(parse_metric(&String::from_utf8_lossy(&bytes)))
}

/// The points of a metric file's text.
pub fn parse_metric(text: &str) -> Vec<(i64, f64)> {
    let mut points = vec![];
    for (index, line) in text.lines().enumerate() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(time), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        if python_int(time).is_none() {
            continue;
        }
        let Some(value) = python_float(value) else {
            continue;
        };
        let step = match fields.next() {
            Some(step) => match python_int(step) {
                Some(s) => s,
                None => continue,
            },
            None => i64::try_from(index).unwrap_or(i64::MAX),
        };
        if fields.next().is_none() {
            points.push((step, value));
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_with_and_without_steps() {
        let text = "1795815808985 2.0 0\n1795815808987 1.25 10\n1795815808989 nan 20\n\
                    bad line\n1795815808990 -inf 30\n17958 1.0 x\n1 2 3 4\nnot 1.0 5\n";
        let points = parse_metric(text);
        assert_eq!(points[..2], [(0, 2.0), (10, 1.25)]);
        assert!(points[2].1.is_nan() && points[2].0 == 20);
        assert_eq!(points[3], (30, f64::NEG_INFINITY));
        assert_eq!(points.len(), 4);
        // An old release's two-field lines: the line's position is the step.
        assert_eq!(parse_metric("1 0.5\n2 0.25\n"), vec![(0, 0.5), (1, 0.25)]);
    }

    #[test]
    fn a_run_directory_and_its_nested_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("1234/abcd");
        std::fs::create_dir_all(run.join("metrics/train")).unwrap();
        std::fs::write(run.join(META), "run_id: abcd\nrun_name: 'baseline'\n").unwrap();
        std::fs::write(run.join("metrics/train/loss"), "1 2.0 0\n2 1.0 1\n").unwrap();
        std::fs::write(run.join("metrics/eval_loss"), "1 2.5 1\n").unwrap();
        assert!(is_run_dir(&run));
        assert!(!is_run_dir(tmp.path().join("1234").as_path()));
        assert_eq!(meta_field(&run, "run_name").as_deref(), Some("baseline"));
        let keys: Vec<String> = metric_files(&run)
            .unwrap()
            .into_iter()
            .map(|k| k.0)
            .collect();
        assert_eq!(keys, ["eval_loss", "train/loss"]);
    }

    proptest::proptest! {
        /// Any text: no panic, a point per line at most, and written
        /// points come back exactly between junk lines.
        #[test]
        fn metric_text_reads_back(
            points in proptest::collection::vec((0i64..1_000_000, -1e6f64..1e6), 0..30),
            junk in "[a-z ]{0,12}",
        ) {
            let mut text = String::new();
            for (step, value) in &points {
                text.push_str(&format!("1795815808985 {value:?} {step}\n{junk}\n"));
            }
            let read = parse_metric(&text);
            proptest::prop_assert!(read.len() <= text.lines().count());
            let written: Vec<(i64, f64)> = points.clone();
            let kept: Vec<(i64, f64)> = read.into_iter().filter(|p| written.contains(p)).collect();
            proptest::prop_assert_eq!(kept, written);
        }
    }
}
