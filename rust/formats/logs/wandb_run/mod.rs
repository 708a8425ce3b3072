//! W&B's local run directories, read without `wandb`. Every run the SDK
//! logs, online or offline (`report_to="wandb"` in HF Trainer, Lightning's
//! `WandbLogger`), leaves `wandb/run-<date>-<id>/` (`offline-run-...` when
//! offline) holding `run-<id>.wandb`: the record log the SDK syncs from
//! (see [`framing`]). Its records are protobuf messages (`wandb_internal.
//! proto`'s `Record`); two are read here, field by field ([`wire`]):
//!
//! - `run` (field 17): the run's id, project, entity and display name;
//! - `history` (field 2): one logged row, items of a key (`key`, or the
//!   path `nested_key`, joined with `.`) and a value (`value_json`, or the
//!   typed `number`/`integer` of older releases), and the row's step.
//!
//! A row's step is the trainer's own where it logged one
//! (`train/global_step` from HF's callback, `trainer/global_step` from
//! Lightning, `global_step`), else W&B's step (`_step`): W&B counts log
//! calls, so an HF run's eval row and train row for one optimizer step
//! have different W&B steps but the same `train/global_step`. Keys starting
//! with `_` are W&B's bookkeeping (`_runtime`, `_timestamp`) and no series.
//!
//! Caps: the bytes read ([`MAX_RUN_BYTES`]), each record's size, the keys
//! kept ([`MAX_KEYS`]) and the points kept ([`MAX_POINTS`]).

pub mod framing;
pub mod wire;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::curve::{self, LossCurve, RunEnd, SideSeries};
use crate::formats::logs::damage::Damage;
use crate::formats::logs::json_line::python_float;
use crate::formats::model_config::{self, OutputClasses};
use crate::io::confine;
use crate::io::files::{open_regular, read_full};
use crate::io::lfs;
use wire::{Fields, Wire};

/// Largest `.wandb` log read; what lies beyond is not read (and the curve
/// says the file was cut there).
pub const MAX_RUN_BYTES: u64 = 4 << 30;
/// Most distinct series kept from one run.
pub const MAX_KEYS: usize = 4096;
/// Most points kept over all series of one run.
pub const MAX_POINTS: usize = 32 << 20;
/// Longest key kept.
const MAX_KEY_BYTES: usize = 1024;

const RECORD_HISTORY: u64 = 2;
const RECORD_RUN: u64 = 17;
/// `RunExitRecord`: written when the run ends (`exit_code`, field 1).
const RECORD_EXIT: u64 = 18;
/// `ConfigRecord`: the run's config (`update`, field 1: items of `key` and
/// `value_json`, field 16), where HF's callback logs the model's config.
const RECORD_CONFIG: u64 = 5;
/// Longest config value kept (an `id2label` of many labels is long).
const MAX_CONFIG_VALUE: usize = 1 << 20;

/// Keys tried first for the training loss, before the keys are read by
/// their meaning (`series_names`): HF's callback, then the plain names.
pub const DEFAULT_LOSS_KEYS: [&str; 4] = ["train/loss", "loss", "train_loss", "train_loss_step"];

/// Keys that carry the trainer's own step, in the order trusted.
const STEP_KEYS: [&str; 3] = ["train/global_step", "trainer/global_step", "global_step"];

/// What a run log holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WandbRun {
    pub id: String,
    pub name: String,
    pub project: String,
    pub entity: String,
    /// Each numeric series by key: `(step, value)` in logging order,
    /// non-finite values kept.
    pub series: BTreeMap<String, Vec<(i64, f64)>>,
    /// History rows read.
    pub rows: usize,
    /// The log ended inside a record (a run still writing) or was cut at
    /// [`MAX_RUN_BYTES`].
    pub torn: bool,
    /// Blocks with a chunk that did not check, and records too large to keep.
    pub corrupt_blocks: usize,
    pub oversized_records: usize,
    /// Blocks of the log read, the damaged ones included.
    pub blocks: usize,
    /// Bytes of the log read, and those passed over as damaged.
    pub bytes: u64,
    pub skipped_bytes: u64,
    /// Points or keys left out at the caps.
    pub capped: bool,
    /// The exit code of the run's exit record (None: the log has none).
    pub exit_code: Option<i64>,
    /// The config values that say the model's outputs
    /// (`model_config::CLASS_KEYS`), as JSON text, the last update winning.
    pub model_config: BTreeMap<String, String>,
}

impl WandbRun {
    /// How a person finds the run: `project/name (id)`, parts left out
    /// where the log has none.
    pub fn label(&self) -> String {
        curve::run_label(&self.project, &self.name, &self.id)
    }
}

/// Whether a file name is a run log (`run-<id>.wandb`).
pub fn is_run_log_name(name: &str) -> bool {
    name.starts_with("run-") && name.ends_with(".wandb") && name.len() > "run-.wandb".len()
}

/// The run log in `dir`, if it holds one (the newest by name if several).
pub fn run_log(dir: &Path) -> Option<PathBuf> {
    confine::list_dir(dir, Area::LogFormat)
        .ok()?
        .into_iter()
        .filter(|(name, path)| {
            is_run_log_name(name) && std::fs::metadata(path).is_ok_and(|m| !m.is_dir())
        })
        .map(|(_, path)| path)
        .max()
}

/// Whether `dir` is a W&B run directory: named as W&B names them
/// (`run-...`, `offline-run-...`) or holding the SDK's `files/` folder, and
/// holding a `run-<id>.wandb`. The name and folder are looked at first so
/// that the walk lists no other directory for this.
pub fn is_run_dir(dir: &Path) -> bool {
    let named = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("run-") || n.starts_with("offline-run-"));
    (named || dir.join("files").is_dir()) && run_log(dir).is_some()
}

/// Read the run log at `path`.
pub fn read_run(path: &Path) -> Result<WandbRun> {
    let file = open_regular(path, Area::LogFormat)?;
    let mut reader = std::io::BufReader::new(file.take(MAX_RUN_BYTES));
    let mut head = [0u8; 7];
    let got =
        read_full(&mut reader, &mut head).map_err(|e| Error::io(Area::LogFormat, path, &e))?;
    let head = &head[..got];
    if head != framing::HEADER {
        if let Some(e) = lfs::pointer_error_at(Area::LogFormat, path, head) {
            return Err(e);
        }
        let why = if framing::has_header(head) {
            "is a W&B run log of a version this reader does not know (its header is not \
             \":W&B\" 0xBEE1 version 0)"
        } else {
            "is not a W&B run log: it does not start with \":W&B\""
        };
        return Err(Error::new(Area::LogFormat, path, why));
    }
    let mut run = parse_run(reader);
    if run.1 {
        return Err(Error::new(
            Area::LogFormat,
            path,
            "could not be read to the end (an I/O error)",
        ));
    }
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    if len > MAX_RUN_BYTES {
        run.0.torn = true;
    }
    Ok(run.0)
}

/// The run in the log read from `reader` (positioned after the header),
/// and whether reading stopped at an I/O error.
pub fn parse_run(reader: impl Read) -> (WandbRun, bool) {
    let mut records = framing::Records::after_header(reader);
    let mut run = WandbRun::default();
    let mut points = 0usize;
    while let Some(record) = records.next_record() {
        for (field, value) in Fields::new(&record) {
            match (field, value) {
                (RECORD_HISTORY, Wire::Bytes(row)) => {
                    run.rows += 1;
                    add_row(&mut run, &mut points, row);
                }
                (RECORD_RUN, Wire::Bytes(meta)) => read_run_meta(&mut run, meta),
                (RECORD_EXIT, Wire::Bytes(exit)) => run.exit_code = Some(exit_code(exit)),
                (RECORD_CONFIG, Wire::Bytes(config)) => read_config(&mut run, config),
                _ => {}
            }
        }
    }
    run.torn |= records.torn;
    run.corrupt_blocks = records.corrupt;
    run.oversized_records = records.oversized;
    run.blocks = records.blocks;
    run.bytes = records.bytes;
    run.skipped_bytes = records.skipped_bytes;
    (run, records.io_error.is_some())
}

/// The `exit_code` of a `RunExitRecord` (an int32: a negative one is
/// written as a ten-byte varint; absent, it is protobuf's default 0).
fn exit_code(exit: &[u8]) -> i64 {
    Fields::new(exit)
        .find_map(|(field, value)| match (field, value) {
            (1, Wire::Varint(n)) => Some(i64::from(n as u32 as i32)),
            _ => None,
        })
        .unwrap_or(0)
}

/// Keep the config items that say the model's outputs.
fn read_config(run: &mut WandbRun, config: &[u8]) {
    for (field, value) in Fields::new(config) {
        let (1, Wire::Bytes(item)) = (field, value) else {
            continue;
        };
        let (mut key, mut json) = (None, None);
        for (field, value) in Fields::new(item) {
            match (field, value) {
                (1, Wire::Bytes(b)) => key = Some(wire::text(&b[..b.len().min(MAX_KEY_BYTES)])),
                (16, Wire::Bytes(b)) if b.len() <= MAX_CONFIG_VALUE => json = Some(wire::text(b)),
                _ => {}
            }
        }
        if let (Some(key), Some(json)) = (key, json) {
            if model_config::CLASS_KEYS.contains(&key.as_str()) || key == curve::OUTPUT_DIR_KEY {
                run.model_config.insert(key, json);
            }
        }
    }
}

fn read_run_meta(run: &mut WandbRun, meta: &[u8]) {
    for (field, value) in Fields::new(meta) {
        let Wire::Bytes(bytes) = value else { continue };
        let slot = match field {
            1 => &mut run.id,
            2 => &mut run.entity,
            3 => &mut run.project,
            8 => &mut run.name,
            _ => continue,
        };
        let text = wire::text(&bytes[..bytes.len().min(MAX_KEY_BYTES)]);
        if !text.is_empty() {
            *slot = text;
        }
    }
}

/// One history item's key and numeric value (None: not a number).
fn read_item(item: &[u8]) -> Option<(String, Option<f64>)> {
    let mut key = String::new();
    let mut nested: Vec<String> = vec![];
    let mut value = None;
    for (field, wire) in Fields::new(item) {
        match (field, wire) {
            (1, Wire::Bytes(b)) => key = wire::text(b),
            (2, Wire::Bytes(b)) if nested.len() < 16 => nested.push(wire::text(b)),
            (5, Wire::Varint(n)) => value = Some(wire::zigzag(n) as f64),
            (6, Wire::Fixed64(bits)) => value = Some(f64::from_bits(bits)),
            (8 | 16, Wire::Bytes(b)) => {
                if let Ok(text) = std::str::from_utf8(b) {
                    value = json_number(text);
                }
            }
            _ => {}
        }
    }
    if key.is_empty() {
        key = nested.join(".");
    }
    (!key.is_empty() && key.len() <= MAX_KEY_BYTES).then_some((key, value))
}

/// A JSON value's number: W&B writes non-finite values as `NaN`,
/// `Infinity` and `-Infinity`; strings, objects (histograms, tables) and
/// booleans are no number.
fn json_number(text: &str) -> Option<f64> {
    let t = text.trim();
    if t.len() > 64 || t.starts_with(['"', '{', '[']) {
        return None;
    }
    python_float(t)
}

fn add_row(run: &mut WandbRun, points: &mut usize, row: &[u8]) {
    let mut items: Vec<(String, f64)> = vec![];
    let mut wandb_step: Option<i64> = None;
    for (field, wire) in Fields::new(row) {
        match (field, wire) {
            (1, Wire::Bytes(item)) => {
                if let Some((key, Some(value))) = read_item(item) {
                    if items.len() < MAX_KEYS {
                        items.push((key, value));
                    }
                }
            }
            (2, Wire::Bytes(step)) => {
                for (f, w) in Fields::new(step) {
                    if let (1, Wire::Varint(n)) = (f, w) {
                        wandb_step = Some(n as i64);
                    }
                }
            }
            _ => {}
        }
    }
    let whole = |v: f64| (v.is_finite() && v.fract() == 0.0 && v.abs() < 9e15).then_some(v as i64);
    let own_step = STEP_KEYS.iter().find_map(|k| {
        items
            .iter()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| whole(*v))
    });
    let underscore_step = items
        .iter()
        .find(|(k, _)| k == "_step")
        .and_then(|(_, v)| whole(*v));
    let step = own_step
        .or(wandb_step)
        .or(underscore_step)
        .unwrap_or(i64::try_from(run.rows).unwrap_or(i64::MAX));
    for (key, value) in items {
        if key.starts_with('_') || STEP_KEYS.contains(&key.as_str()) {
            continue;
        }
        if *points >= MAX_POINTS {
            run.capped = true;
            return;
        }
        let known = run.series.len();
        match run.series.get_mut(&key) {
            Some(series) => series.push((step, value)),
            None if known < MAX_KEYS => {
                run.series.insert(key, vec![(step, value)]);
            }
            None => {
                run.capped = true;
                continue;
            }
        }
        *points += 1;
    }
}

/// The loss curve of the W&B run in `dir` (a run directory, or its
/// `run-<id>.wandb`): the series `key` (default: the usual loss names,
/// then the loss by its meaning), with the side series beside it.
pub fn read_run_curve(dir: &Path, key: Option<&str>) -> Result<LossCurve> {
    let log = if dir.is_dir() {
        run_log(dir).ok_or_else(|| Error::new(Area::Missing, dir, "holds no run-<id>.wandb"))?
    } else {
        dir.to_path_buf()
    };
    let run = read_run(&log)?;
    curve_of(&run, &log, key)
}

/// The curve of a run read from `log`.
pub fn curve_of(run: &WandbRun, log: &Path, key: Option<&str>) -> Result<LossCurve> {
    let keys: Vec<String> = run.series.keys().cloned().collect();
    let chosen = curve::choose_run_series(
        &keys,
        key,
        &DEFAULT_LOSS_KEYS,
        log,
        "the W&B run",
        &format!("; {} history rows", run.rows),
    )?;
    let points = run.series.get(&chosen).cloned().unwrap_or_default();
    let mut side = SideSeries::default();
    side.fill_from_names(&keys, |k| run.series.get(k).cloned());
    side.ending = Some(match run.exit_code {
        Some(0) => RunEnd::Finished,
        Some(code) => RunEnd::Crashed(format!("the W&B log's exit record says exit code {code}")),
        None => RunEnd::Unfinished(
            if run.torn {
                "the W&B log ends in a torn record with no exit record"
            } else {
                "the W&B log has no exit record"
            }
            .to_string(),
        ),
    });
    let torn = if run.torn {
        vec![log.to_path_buf()]
    } else {
        vec![]
    };
    // Counted in bytes: a damaged block loses the rest of itself and any
    // record that spans into it, which a count of blocks would overstate.
    let damage = Damage::of("bytes of the W&B log", run.skipped_bytes, run.bytes);
    let output_classes =
        model_config::output_classes_logged(|key| run.model_config.get(key).cloned()).map(
            |(count, kind)| OutputClasses {
                count,
                kind: kind.to_string(),
                path: log.to_path_buf(),
                source: "W&B's config record".to_string(),
            },
        );
    Ok(LossCurve {
        source: "wandb".to_string(),
        series: chosen,
        side,
        torn_files: torn,
        run: run.label(),
        damage,
        output_classes,
        output_dir: run
            .model_config
            .get(curve::OUTPUT_DIR_KEY)
            .and_then(|v| curve::output_dir_of(v)),
        ..curve::assemble(points, vec![log.to_path_buf()])
    })
}

#[cfg(test)]
mod tests;
