//! MLflow's file store (`mlruns/`): read without MLflow. Each run is a
//! directory `mlruns/<experiment id>/<run id>/` holding `meta.yaml` (with
//! `run_id:` and `run_name:`) and `metrics/`, where each metric is a text
//! file named by its key (a key with `/` is a nested path: `train/loss` is
//! `metrics/train/loss`). A metric file has a line per logged value,
//! `<timestamp ms> <value> <step>`; files of old releases have no step,
//! and the line's position stands for it. Values are Python floats (`nan`,
//! `inf`).
//!
//! A folder with `metrics/` and a `meta.yaml` is a run, whatever the
//! `meta.yaml` holds: one that is no UTF-8 is read lossily and one without
//! a `run_id` leaves the run named by its folder, while one that cannot be
//! read (a FIFO, a link out of the root, no permission) makes the run's
//! record an error naming it. A run never vanishes from a scan.
//!
//! Metric files that are links are followed while they stay inside the
//! scanned root (`io::confine`); a link out of it is an error naming it.
//!
//! Everything is capped: the metric files listed per run, the depth of
//! nested keys, the bytes of each file, the length of a line and the
//! points kept. A metric file is streamed, never read whole: memory is
//! bounded by the points kept ([`MAX_POINTS`]), not by the file. Past the
//! cap every other kept point is let go and the stride doubles
//! ([`Thinned`]); non-finite points and the last point are kept.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::curve::{self, LossCurve, RunEnd, SideSeries, Thinning};
use crate::formats::logs::json_line::{python_float, python_int};
use crate::formats::logs::thinned::{Kept, Thinned};
use crate::formats::model_config::{self, OutputClasses};
use crate::io::confine;
use crate::io::files::{self, open_regular};

/// A run's metadata file.
pub const META: &str = "meta.yaml";
/// Most metric files listed in one run.
pub const MAX_METRICS: usize = 10_000;
/// Deepest nesting of a metric key (`a/b/c` is 3).
const MAX_KEY_DEPTH: usize = 8;
/// Largest metric file read (streamed; a line is ~40 bytes: a hundred
/// million points).
pub const MAX_METRIC_BYTES: u64 = 4 << 30;
/// Largest part of a `meta.yaml` read.
const MAX_META_BYTES: u64 = 64 << 10;
/// Points kept from one metric file (16 MiB of them); past it the file's
/// points are thinned (see [`Thinned`]).
pub const MAX_POINTS: usize = 1 << 20;
/// Longest metric line read (MLflow writes under 100 bytes); a longer one
/// is passed over like any line that does not read.
const MAX_LINE: usize = 4096;
/// Bytes read from a metric file at a time.
const CHUNK: usize = 64 << 10;

/// Whether `dir` is an MLflow run: a `metrics/` directory beside a
/// `meta.yaml`, whatever that is (see the module doc: one that cannot be
/// read is the run's error, not a reason to pass it over).
pub fn is_run_dir(dir: &Path) -> bool {
    dir.join("metrics").is_dir() && std::fs::symlink_metadata(dir.join(META)).is_ok()
}

/// The first [`MAX_META_BYTES`] of the `meta.yaml` in `dir`, lossily
/// decoded; an error naming it when it cannot be read (absent, a FIFO or
/// device, a link out of the root, no permission).
pub fn read_meta(dir: &Path) -> Result<String> {
    let path = dir.join(META);
    let file = open_regular(&path, Area::LogFormat)?;
    let mut bytes = Vec::new();
    file.take(MAX_META_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(Area::LogFormat, &path, &e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A top-level `key: value` of a `meta.yaml`'s text (a plain scalar,
/// quotes removed).
pub fn field(meta: &str, key: &str) -> Option<String> {
    meta.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?.trim();
        let value = value.trim_matches(|c| c == '\'' || c == '"');
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// A top-level `key: value` of the `meta.yaml` in `dir`, if it reads.
pub fn meta_field(dir: &Path, key: &str) -> Option<String> {
    field(&read_meta(dir).ok()?, key)
}

/// How a run ended, from MLflow's run status (`meta.yaml`'s `status:`, a
/// number; the SQLite store's `runs.status`, a name): FINISHED, FAILED or
/// KILLED, or RUNNING (a run still going, or one whose process died
/// before it could say). None for anything else.
pub fn run_end(status: &str) -> Option<RunEnd> {
    let said = |name: &str| format!("MLflow's run status is {name}");
    match status.trim() {
        "3" | "FINISHED" => Some(RunEnd::Finished),
        "4" | "FAILED" => Some(RunEnd::Crashed(said("FAILED"))),
        "5" | "KILLED" => Some(RunEnd::Crashed(said("KILLED"))),
        "1" | "RUNNING" => Some(RunEnd::Unfinished(said("still RUNNING"))),
        _ => None,
    }
}

/// How a person finds the run whose `meta.yaml` holds `meta`:
/// `experiment/run name (run id)`, the experiment's name from its own
/// `meta.yaml`; without a `run_id` the run is named by its folder.
fn label_of(run: &Path, meta: &str) -> String {
    let folder = || {
        run.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let id = field(meta, "run_id").unwrap_or_else(folder);
    let name = field(meta, "run_name").unwrap_or_default();
    let experiment = run
        .parent()
        .and_then(|e| meta_field(e, "name"))
        .unwrap_or_default();
    curve::run_label(&experiment, &name, &id)
}

/// How a person finds the run: `experiment/run name (run id)`, from the
/// run's and its experiment's `meta.yaml` (parts left out where missing).
pub fn run_label(run: &Path) -> String {
    label_of(run, &read_meta(run).unwrap_or_default())
}

/// The run's metric keys and their files, sorted by key. A link is
/// followed while it stays inside the root in force; one that leads out
/// of it (or nowhere) is an error naming it. Files that are no regular
/// file are listed too: reading one is refused with the reason.
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
            let mut meta = std::fs::symlink_metadata(&path)
                .map_err(|e| Error::io(Area::LogFormat, &path, &e))?;
            if meta.file_type().is_symlink() {
                if confine::leads_outside(&path) {
                    return Err(Error::new(Area::LogFormat, &path, confine::OUTSIDE));
                }
                meta = std::fs::metadata(&path).map_err(|e| {
                    Error::new(
                        Area::LogFormat,
                        &path,
                        format!("is a metric file's link that leads nowhere readable: {e}"),
                    )
                })?;
            }
            if meta.is_dir() {
                dirs += 1;
                if depth + 1 < MAX_KEY_DEPTH && dirs <= MAX_METRICS {
                    pending.push((path, key, depth + 1));
                }
            } else {
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
/// then the loss by its meaning), with the side series beside it. A
/// `meta.yaml` or a metric file wanted that cannot be read is the error.
pub fn read_run_curve(run: &Path, key: Option<&str>) -> Result<LossCurve> {
    let meta = read_meta(run)?;
    let files = metric_files(run)?;
    let keys: Vec<String> = files.iter().map(|(k, _)| k.clone()).collect();
    let chosen =
        curve::choose_run_series(&keys, key, &DEFAULT_LOSS_KEYS, run, "the MLflow run", "")?;
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
    let kept = read_metric_kept(&path, MAX_POINTS)?;
    let thinned = Thinning::of(&kept);
    let mut side = SideSeries::default();
    let mut failed = None;
    side.fill_from_names(&keys, |k| match read_metric(&path_of(k)?) {
        Ok(points) => Some(points),
        Err(e) => {
            failed.get_or_insert(e);
            None
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    side.ending = field(&meta, "status").and_then(|s| run_end(&s));
    Ok(LossCurve {
        source: "mlflow".to_string(),
        series: chosen,
        side,
        run: label_of(run, &meta),
        thinned,
        output_classes: logged_classes(run),
        output_dir: param(run, curve::OUTPUT_DIR_KEY, curve::MAX_OUTPUT_DIR_BYTES)
            .and_then(|text| curve::output_dir_of(&text)),
        ..curve::assemble(kept.points, vec![path])
    })
}

/// What the loss is a cross-entropy over, from the run's `params/` where
/// HF's MLflow callback logged the model's config (`architectures`,
/// `vocab_size`, ...; each a small text file). A param that cannot be read
/// is no evidence.
fn logged_classes(run: &Path) -> Option<OutputClasses> {
    let (count, kind) =
        model_config::output_classes_logged(|key| param(run, key, model_config::MAX_CONFIG_BYTES))?;
    Some(OutputClasses {
        count,
        kind: kind.to_string(),
        path: run.join("params"),
        source: "MLflow's params".to_string(),
    })
}

/// The text of the run's param `key` (a small file under `params/`, at
/// most `max` bytes); None when it cannot be read, which is no evidence.
fn param(run: &Path, key: &str, max: u64) -> Option<String> {
    let bytes = files::read_small(&run.join("params").join(key), Area::LogFormat, max).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The message of an allocation that failed while `what` was kept.
pub fn out_of_memory(what: &str, e: &std::collections::TryReserveError) -> String {
    format!("could not allocate memory to keep {what} ({e}); not read")
}

/// The `(step, value)` points of one metric file, in file order (a step
/// repeated on consecutive lines kept once, its last value; NaN and
/// infinities kept), thinned past [`MAX_POINTS`].
/// Lines that do not read are passed over (a torn last line of a run
/// still logging).
pub fn read_metric(path: &Path) -> Result<Vec<(i64, f64)>> {
    read_metric_kept(path, MAX_POINTS).map(|kept| kept.points)
}

/// [`read_metric`] keeping at most `cap` points, with how it thinned.
pub fn read_metric_kept(path: &Path, cap: usize) -> Result<Kept<(i64, f64)>> {
    let file = open_regular(path, Area::LogFormat)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(Area::LogFormat, path, &e))?
        .len();
    if len > MAX_METRIC_BYTES {
        return Err(Error::new(
            Area::LogFormat,
            path,
            format!("is {len} bytes, more than the {MAX_METRIC_BYTES}-byte limit"),
        ));
    }
    let mut kept = Thinned::new(cap, |p: &(i64, f64)| !p.1.is_finite());
    let mut failed = None;
    let mut index = 0usize;
    // A step logged again right after itself replaces its value, as it
    // would in the curve (the last of a step wins): a flood of one step
    // neither fills the cap nor thins the rest away.
    let mut held: Option<(i64, f64)> = None;
    for_each_line(file.take(MAX_METRIC_BYTES), |line| {
        index += 1;
        let Some(point) = parse_line(line, index - 1) else {
            return true;
        };
        match held.replace(point) {
            Some(before) if before.0 != point.0 => match kept.push(before) {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            },
            _ => true,
        }
    })
    .map_err(|e| Error::io(Area::LogFormat, path, &e))?;
    let oom = |e: std::collections::TryReserveError| {
        Error::new(Area::LogFormat, path, out_of_memory("its points", &e))
    };
    if let Some(e) = failed {
        return Err(oom(e));
    }
    if let Some(last) = held {
        kept.push(last).map_err(oom)?;
    }
    kept.finish().map_err(oom)
}

/// Call `each` on every line of `reader` (without its `\n`), reading
/// [`CHUNK`] bytes at a time; a line longer than [`MAX_LINE`] is handed
/// over empty (it counts as a line, and reads as none). `each` returning
/// false stops the reading.
fn for_each_line(reader: impl Read, mut each: impl FnMut(&[u8]) -> bool) -> std::io::Result<()> {
    let mut reader = BufReader::with_capacity(CHUNK, reader);
    let mut partial: Vec<u8> = Vec::new();
    let mut too_long = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        let (used, go_on) = match memchr::memchr(b'\n', buf) {
            Some(end) => {
                let go_on = if too_long {
                    each(b"")
                } else if partial.is_empty() {
                    each(&buf[..end])
                } else {
                    partial.extend_from_slice(&buf[..end]);
                    let go_on = each(&partial);
                    partial.clear();
                    go_on
                };
                too_long = false;
                (end + 1, go_on)
            }
            None => {
                if !too_long {
                    if partial.len() + buf.len() > MAX_LINE {
                        too_long = true;
                        partial.clear();
                    } else {
                        partial.extend_from_slice(buf);
                    }
                }
                (buf.len(), true)
            }
        };
        reader.consume(used);
        if !go_on {
            return Ok(());
        }
    }
    if too_long {
        each(b"");
    } else if !partial.is_empty() {
        each(&partial);
    }
    Ok(())
}

/// The point of one metric line, the `index`-th of its file (the step of
/// an old release's two-field line).
fn parse_line(line: &[u8], index: usize) -> Option<(i64, f64)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split_ascii_whitespace();
    let (time, value) = (fields.next()?, fields.next()?);
    python_int(time)?;
    let value = python_float(value)?;
    let step = match fields.next() {
        Some(step) => python_int(step)?,
        None => i64::try_from(index).unwrap_or(i64::MAX),
    };
    fields.next().is_none().then_some((step, value))
}

/// The points of a metric file's text.
pub fn parse_metric(text: &str) -> Vec<(i64, f64)> {
    text.lines()
        .enumerate()
        .filter_map(|(index, line)| parse_line(line.as_bytes(), index))
        .collect()
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

    /// A run folder `<tmp>/root/0/<id>` with a meta.yaml and the given
    /// metric files (key, text).
    fn run_with(tmp: &Path, metrics: &[(&str, &str)]) -> PathBuf {
        let run = tmp.join("root/0/abcd");
        std::fs::create_dir_all(run.join("metrics")).unwrap();
        std::fs::write(run.join(META), "run_id: abcd\nrun_name: base\n").unwrap();
        for (key, text) in metrics {
            let path = run.join("metrics").join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        run
    }

    fn falling(n: usize) -> String {
        (0..n)
            .map(|i| format!("1795815808985 {} {i}\n", 2.0 / (1.0 + i as f64)))
            .collect()
    }

    #[test]
    fn the_run_status_says_how_the_run_ended() {
        let tmp = tempfile::tempdir().unwrap();
        let run = run_with(tmp.path(), &[("loss", &falling(20))]);
        let ending = |status: &str| {
            std::fs::write(run.join(META), format!("run_id: abcd\nstatus: {status}\n")).unwrap();
            read_run_curve(&run, None).unwrap().side.ending
        };
        assert_eq!(ending("3"), Some(RunEnd::Finished));
        assert!(matches!(ending("4"), Some(RunEnd::Crashed(why)) if why.contains("FAILED")));
        assert!(matches!(ending("5"), Some(RunEnd::Crashed(why)) if why.contains("KILLED")));
        assert!(matches!(ending("1"), Some(RunEnd::Unfinished(_))));
        assert_eq!(ending("9"), None);
    }

    #[test]
    fn the_params_hf_logged_say_what_the_loss_is_over() {
        let tmp = tempfile::tempdir().unwrap();
        let run = run_with(tmp.path(), &[("loss", &falling(20))]);
        let params = run.join("params");
        std::fs::create_dir_all(&params).unwrap();
        std::fs::write(params.join("architectures"), "['GPT2LMHeadModel']").unwrap();
        std::fs::write(params.join("vocab_size"), "128").unwrap();
        let curve = read_run_curve(&run, None).unwrap();
        let classes = curve.output_classes.unwrap();
        assert_eq!((classes.count, classes.kind.as_str()), (128, "vocabulary"));
        std::fs::remove_file(params.join("architectures")).unwrap();
        assert_eq!(read_run_curve(&run, None).unwrap().output_classes, None);
    }

    #[test]
    fn a_metric_file_is_streamed_and_thinned_past_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let mut text = falling(10_000);
        text.push_str("1795815808985 nan 10000\n");
        text.push_str(&"9".repeat(3 * MAX_LINE)); // an over-long line
        text.push('\n');
        text.push_str("1795815808985 0.5 10002"); // the last line, no newline
        let run = run_with(tmp.path(), &[("loss", &text)]);
        let path = run.join("metrics/loss");
        let kept = read_metric_kept(&path, 64).unwrap();
        assert_eq!(kept.read, 10_002);
        assert!(kept.stride >= 128 && kept.points.len() <= 65);
        // The curve's counts come from what was read, not what was kept.
        let thinning = Thinning::of(&kept).unwrap();
        assert_eq!((thinning.records, thinning.nonfinite), (10_002, 1));
        assert!(kept.points.iter().any(|p| p.0 == 10_000 && p.1.is_nan()));
        assert_eq!(kept.points.last(), Some(&(10_002, 0.5)));
        // Under the cap the file reads as its text parses.
        let all = read_metric(&path).unwrap();
        assert_eq!(all.len(), 10_002);
        assert_eq!(all[..3], parse_metric(&text)[..3]);
        assert_eq!(all.last(), parse_metric(&text).last());
        // A flood of one step is one point, its last value.
        let mut flood = falling(50);
        flood.push_str(&"1 0.5 49\n".repeat(100_000));
        std::fs::write(&path, &flood).unwrap();
        let kept = read_metric_kept(&path, 64).unwrap();
        assert_eq!((kept.read, kept.stride), (50, 1));
        assert_eq!(kept.points.last(), Some(&(49, 0.5)));
        // Two-field lines count lines, also those that do not read.
        std::fs::write(
            &path,
            format!("1 0.5\n{}\n2 0.25\n", "x".repeat(3 * MAX_LINE)),
        )
        .unwrap();
        assert_eq!(read_metric(&path).unwrap(), vec![(0, 0.5), (2, 0.25)]);
    }

    #[cfg(unix)]
    #[test]
    fn a_meta_yaml_that_does_not_read_never_hides_the_run() {
        let tmp = tempfile::tempdir().unwrap();
        let run = run_with(tmp.path(), &[("loss", &falling(20))]);
        let meta = run.join(META);
        // Not UTF-8: read lossily, the run named.
        std::fs::write(&meta, b"run_id: abcd\nrun_name: caf\xe9\n").unwrap();
        assert!(is_run_dir(&run));
        let curve = read_run_curve(&run, None).unwrap();
        assert_eq!(curve.run, "caf\u{fffd} (abcd)");
        // No run_id: named by its folder.
        std::fs::write(&meta, b"\xff\xfe garbage").unwrap();
        assert_eq!(read_run_curve(&run, None).unwrap().run, "abcd");
        // A FIFO: the run is still one, and its read an error naming it,
        // without blocking.
        std::fs::remove_file(&meta).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&meta).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(is_run_dir(&run));
            let e = read_run_curve(&run, None).unwrap_err();
            assert!(e.message.contains("FIFO") && e.path == meta, "{e}");
            std::fs::remove_file(&meta).unwrap();
        }
        // A link: followed inside the root, an error naming it outside.
        let root = Some(confine::root_of(&tmp.path().join("root")).unwrap());
        let inside = tmp.path().join("root/meta-copy.yaml");
        std::fs::write(&inside, "run_id: abcd\nrun_name: linked\n").unwrap();
        std::os::unix::fs::symlink(&inside, &meta).unwrap();
        confine::within(root.clone(), || {
            assert_eq!(read_run_curve(&run, None).unwrap().run, "linked (abcd)");
        });
        std::fs::remove_file(&meta).unwrap();
        let outside = tmp.path().join("secret.yaml");
        std::fs::write(&outside, "run_id: secret\n").unwrap();
        std::os::unix::fs::symlink(&outside, &meta).unwrap();
        confine::within(root, || {
            assert!(is_run_dir(&run));
            let e = read_run_curve(&run, None).unwrap_err();
            assert!(
                e.message.contains("outside the scanned root") && e.path == meta,
                "{e}"
            );
        });
        // A dangling link is a run too, and its read an error.
        std::fs::remove_file(&meta).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &meta).unwrap();
        assert!(is_run_dir(&run));
        assert!(read_run_curve(&run, None).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn metric_links_are_followed_inside_the_root_and_refused_outside() {
        let tmp = tempfile::tempdir().unwrap();
        let run = run_with(tmp.path(), &[("eval_loss", "1 2.5 1\n")]);
        let root = Some(confine::root_of(&tmp.path().join("root")).unwrap());
        let inside = tmp.path().join("root/kept/loss");
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::write(&inside, falling(30)).unwrap();
        let link = run.join("metrics/loss");
        std::os::unix::fs::symlink(&inside, &link).unwrap();
        // A linked folder of nested keys, inside too.
        std::os::unix::fs::symlink(inside.parent().unwrap(), run.join("metrics/train")).unwrap();
        confine::within(root.clone(), || {
            let keys: Vec<String> = metric_files(&run)
                .unwrap()
                .into_iter()
                .map(|k| k.0)
                .collect();
            assert_eq!(keys, ["eval_loss", "loss", "train/loss"]);
            let curve = read_run_curve(&run, None).unwrap();
            assert_eq!((curve.series.as_str(), curve.steps.len()), ("loss", 30));
            assert_eq!(curve.side.eval_loss, vec![(1, 2.5)]);
        });
        let outside = tmp.path().join("outside-loss");
        std::fs::write(&outside, falling(30)).unwrap();
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        confine::within(root.clone(), || {
            let e = read_run_curve(&run, None).unwrap_err();
            assert!(
                e.message.contains("outside the scanned root") && e.path == link,
                "{e}"
            );
        });
        // Unconfined (--follow-symlinks), it is followed.
        assert_eq!(read_run_curve(&run, None).unwrap().steps.len(), 30);
        // A link to nowhere is an error naming it, not a metric passed over.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &link).unwrap();
        confine::within(root, || {
            let e = read_run_curve(&run, None).unwrap_err();
            assert_eq!(e.path, link, "{e}");
        });
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
