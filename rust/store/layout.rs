//! The store layouts a scan recognises, the versions in each, and what
//! each version holds.
//!
//! - `dlm`: `adapter/[<name>/]{current.txt, versions/vNNNN/}` and `logs/`.
//! - `hf-trainer`: an HF Trainer / TRL / axolotl output directory: its
//!   `checkpoint-N/` directories (and `last-checkpoint/`, which the Hub's
//!   `hub_strategy="checkpoint"` pushes) are the versions, oldest to newest
//!   by step (a number, so 40 < 80 < 120; `last-checkpoint` at the
//!   `global_step` of its `trainer_state.json`, the newer on a tie); the
//!   curve is `trainer_state.json` plus TensorBoard events under `runs/`.
//!   Recognised by `trainer_state.json`, a checkpoint or `training_args.bin`.
//! - `lightning`: a directory holding `*.ckpt` files (directly or under
//!   `checkpoints/`), or a `metrics.csv` (a CSVLogger run without
//!   checkpoints), e.g. `lightning_logs/version_0/`; each checkpoint is a
//!   version (newest: `last.ckpt`, else the highest step), the curve is
//!   `metrics.csv` or TensorBoard events.
//! - `peft`: a bare `save_pretrained` adapter directory (config + weights,
//!   no training state): weights-only checks.
//!
//! A PEFT model holding several adapters saves the default one at the top
//! and each other one in a `<name>/` subfolder with its own config and
//! weights (`named_adapters`); those subfolders are versions too, listed
//! right after the version they are saved in (a bare PEFT directory, an HF
//! checkpoint or the root given), so every adapter is judged.
//! - `tensorboard`: a directory of TensorBoard event files and nothing else
//!   known: a log-only run.
//!
//! What a version holds is its *checkpoint kind*: `adapter` (a LoRA
//! adapter: every dlm and PEFT version, an HF checkpoint with
//! `adapter_model.*` or `adapter_config.json`), `full` (a whole model: an HF
//! checkpoint with `model.safetensors`, its sharded index or
//! `pytorch_model.bin`; a Lightning `.ckpt`) or `logs` (no weights: e.g. a
//! `checkpoint-N/` with only `trainer_state.json`). A store's kind is its
//! newest version's, `logs` when it has no version but logs, None when its
//! versions could not be determined.
//!
//! Classification looks at names and file types (one directory listing);
//! the only file read is `last-checkpoint/trainer_state.json`, for its step.
//! Listings go through `io::confine::list_dir`, so a directory reached
//! through a link out of the scanned root is not listed; a directory of a
//! store that cannot be listed (permissions, a link out of the root) is a
//! `broken` entry naming it, so the store's records say so instead of
//! passing without it.
//! `rng_state.pth` and `training_args.bin` are never opened by anything.

use std::cmp::Ordering;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::analysis::layers::ADAPTER_WEIGHTS;
use crate::error::Area;
use crate::formats::logs::tfevents::is_event_file_name;
use crate::formats::logs::trainer_state::{checkpoint_dir_step, LAST_CHECKPOINT};
use crate::io::confine;
use crate::io::files::read_small;
use crate::io::read_once::{self, Kind};
use crate::store::model_files;
use crate::store::torch_state::STATE_FILE;

/// Largest `current.txt` read.
const MAX_POINTER_BYTES: u64 = 4096;
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const TRAINER_STATE: &str = "trainer_state.json";
pub const HF_OPTIMIZER: &str = "optimizer.pt";
/// What `Trainer.save_model` writes beside every save.
pub const TRAINING_ARGS: &str = "training_args.bin";
pub const PICKLED_ADAPTER: &str = "adapter_model.bin";

/// What a walk problem is called in `Target::layout`: a directory the scan
/// could not list (its records are errors) and a link it did not follow out
/// of the root (its records are skips). Such a target has no versions and
/// one `broken` entry saying why.
pub const UNREADABLE: &str = "unreadable";
pub const OUTSIDE_ROOT: &str = "outside-root";

/// What a layout calls itself in records.
pub const DLM: &str = "dlm";
pub const HF_TRAINER: &str = "hf-trainer";
pub const LIGHTNING: &str = "lightning";
pub const PEFT: &str = "peft";
pub const TENSORBOARD: &str = "tensorboard";
/// A training log kept as a CSV by another framework than Lightning:
/// Keras's CSVLogger (`epoch,loss,val_loss,...`, under any file name),
/// Ultralytics' `results.csv` (with its `args.yaml`).
pub const CSV_LOG: &str = "csv-log";
/// A LoRA safetensors file of another tool than PEFT (kohya's sd-scripts,
/// LyCORIS, diffusers' `save_lora_weights`): the file is the store, and
/// its only version.
pub const LORA_FILE: &str = "lora-file";
/// An mlx-lm adapter folder: `adapters.safetensors` and mlx-lm's
/// `adapter_config.json` (`lora_parameters`).
pub const MLX: &str = "mlx";
/// A run of MLflow's file store: `mlruns/<experiment id>/<run id>/`.
pub const MLFLOW: &str = "mlflow";
/// A W&B run directory: `wandb/run-<date>-<id>/` (or `offline-run-...`).
pub const WANDB: &str = "wandb";
/// The link W&B keeps in `wandb/` to its newest run: the run itself is
/// found under its own name.
pub const WANDB_LATEST_RUN: &str = "latest-run";
/// Where trackers keep runs inside a training output directory: W&B's
/// folder and MLflow's file store.
pub const TRACKER_FOLDERS: [&str; 2] = ["wandb", "mlruns"];

/// What a checkpoint holds, in records' `checkpoint_kind`.
pub const ADAPTER: &str = "adapter";
pub const FULL: &str = "full";
pub const LOGS: &str = "logs";

/// One store to probe, the adapter versions in it, and its layout.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub store: PathBuf,
    /// `dlm`, `hf-trainer`, `lightning`, `peft` or `tensorboard`.
    pub layout: String,
    /// Version directories (or, for Lightning, checkpoint files).
    pub versions: Vec<PathBuf>,
    /// Adapters whose versions could not be determined: (path, reason).
    pub broken: Vec<(PathBuf, String)>,
    /// Whether the store's loss curve is probed (false when the root was
    /// one dlm adapter version).
    pub with_logs: bool,
    /// Where the loss curve is read when not from the store itself: an HF
    /// checkpoint given alone is judged by its own `trainer_state.json`.
    pub log_root: Option<PathBuf>,
    /// What the newest version holds (`adapter`, `full`, `logs`; see the
    /// module doc); None when the store's versions could not be determined.
    pub checkpoint_kind: Option<String>,
    /// The scanned root (resolved) the readers stay in (`io::confine`);
    /// None to follow links anywhere.
    pub root: Option<PathBuf>,
}

impl Target {
    fn new(store: &Path, layout: &str) -> Target {
        Target {
            store: store.to_path_buf(),
            layout: layout.to_string(),
            versions: vec![],
            broken: vec![],
            with_logs: true,
            log_root: None,
            checkpoint_kind: None,
            root: confine::current().map(|r| r.as_path().to_path_buf()),
        }
    }

    /// A walk problem at `path` (`UNREADABLE` or `OUTSIDE_ROOT`) as a target.
    pub fn problem(path: &Path, layout: &str, why: String) -> Target {
        let mut t = Target::new(path, layout);
        t.with_logs = false;
        t.broken.push((path.to_path_buf(), why));
        t
    }

    /// The target with its `checkpoint_kind` set from its versions.
    fn kind_set(mut self) -> Target {
        self.checkpoint_kind = match self.versions.last() {
            Some(newest) => Some(checkpoint_kind(newest, &self.layout).to_string()),
            None if self.broken.is_empty() => Some(LOGS.to_string()),
            None => None,
        };
        self
    }
}

/// What the version at `version` of a store of `layout` holds: `adapter`,
/// `full` or `logs` (see the module doc).
pub fn checkpoint_kind(version: &Path, layout: &str) -> &'static str {
    match layout {
        DLM | PEFT | LORA_FILE | MLX => ADAPTER,
        LIGHTNING => FULL,
        _ if holds_adapter(version) => ADAPTER,
        _ if model_files::holds_model(version) => FULL,
        _ => LOGS,
    }
}

/// Whether `path` is there and not a directory: a FIFO or device where a
/// log belongs still makes the store (its reader then refuses the file and
/// says so) instead of hiding it.
fn present(path: &Path) -> bool {
    !matches!(read_once::kind(path), Kind::Missing | Kind::Dir)
}

/// Whether `dir` holds a PEFT adapter (its weights or its config).
pub fn holds_adapter(dir: &Path) -> bool {
    read_once::is_file(&dir.join(ADAPTER_WEIGHTS))
        || read_once::is_file(&dir.join(PICKLED_ADAPTER))
        || read_once::is_file(&dir.join(ADAPTER_CONFIG))
}

/// The other adapters of a PEFT multi-adapter save in `dir`: its
/// subfolders that are adapters of their own (config and weights), sorted
/// by name. Hidden folders are not looked into.
pub fn named_adapters(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(String, PathBuf)> = entries(dir)
        .into_iter()
        .filter(|(name, p)| !name.starts_with('.') && p.is_dir() && is_bare_peft(p))
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// `versions`, each followed by the named adapters saved inside it.
fn with_named_adapters(versions: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(versions.len());
    for v in versions {
        let named = if v.is_dir() {
            named_adapters(&v)
        } else {
            vec![]
        };
        out.push(v);
        out.extend(named);
    }
    out
}

/// The entries of `dir` (names and paths); empty when it cannot be listed
/// (`unlistable` finds those; the walk reports the store directory itself).
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    confine::list_dir(dir, Area::Missing).unwrap_or_default()
}

/// Why the directory `dir` cannot be listed (permissions, a link out of the
/// scanned root), or None when it can, or is not a directory.
pub fn unlistable(dir: &Path) -> Option<String> {
    // Asked once per store: its caller has just asked whether `dir` is one.
    if !read_once::is_dir(dir) {
        return None;
    }
    let e = confine::can_list(dir, Area::Missing).err()?;
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    Some(if e.message == confine::OUTSIDE {
        format!("{name}/ {}", e.message)
    } else {
        format!(
            "{name}/ cannot be listed ({}); what it holds is not checked",
            e.message
        )
    })
}

/// The store's own subdirectories (not hidden) that cannot be listed, as
/// `broken` entries: what they hold would otherwise pass unseen.
fn unlistable_children(store: &Path) -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> = entries(store)
        .into_iter()
        .filter(|(name, _)| !name.starts_with('.'))
        .filter_map(|(_, p)| Some((p.clone(), unlistable(&p)?)))
        .collect();
    out.sort();
    out
}

/// Paths in the order people number things: component by component, runs
/// of digits compared as numbers (`checkpoint-40` < `checkpoint-120`), the
/// rest as text; ties (`v01` and `v1`) by the plain text.
pub fn natural_path_cmp(a: &Path, b: &Path) -> Ordering {
    let mut left = a.components();
    let mut right = b.components();
    loop {
        match (left.next(), right.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let o = natural_cmp(
                    &x.as_os_str().to_string_lossy(),
                    &y.as_os_str().to_string_lossy(),
                );
                if o.is_ne() {
                    return o;
                }
            }
        }
    }
}

/// Text with runs of digits compared as numbers (of any length).
fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(c), Some(d)) if c.is_ascii_digit() && d.is_ascii_digit() => {
                let run = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_digit()).count();
                let (n, m) = (run(x), run(y));
                let strip = |s: &[u8]| -> usize { s.iter().take_while(|b| **b == b'0').count() };
                let (dx, dy) = (&x[strip(&x[..n]).min(n)..n], &y[strip(&y[..m]).min(m)..m]);
                let o = dx.len().cmp(&dy.len()).then_with(|| dx.cmp(dy));
                if o.is_ne() {
                    return o;
                }
                (x, y) = (&x[n..], &y[m..]);
            }
            (Some(c), Some(d)) => {
                if c != d {
                    return c.cmp(d);
                }
                (x, y) = (&x[1..], &y[1..]);
            }
        }
    }
}

// ---- dlm ----

/// A dlm store: `adapter/` or `logs/`. A W&B run directory also has a
/// `logs/` folder (the SDK's debug logs): it is no dlm store.
pub fn is_dlm_store(dir: &Path) -> bool {
    // The GAP monitor writes its logs/ into an HF Trainer's output dir
    // (`JsonlSink.for_store(output_dir, ...)`): that stays an HF run, whose
    // checkpoint-N/ folders are its versions.
    read_once::is_dir(&dir.join("adapter"))
        || (read_once::is_dir(&dir.join("logs"))
            && !crate::formats::logs::wandb_run::is_run_dir(dir)
            && !is_hf_output(dir)
            // kohya's sd-scripts log to `logs/` beside its LoRA files.
            && lora_files(dir).is_empty())
}

fn is_adapter_root(dir: &Path) -> bool {
    read_once::is_file(&dir.join("current.txt")) || read_once::is_dir(&dir.join("versions"))
}

/// A directory that holds one trained version: an adapter, a model, or
/// an optimizer state.
pub fn is_version_dir(dir: &Path) -> bool {
    read_once::is_file(&dir.join(ADAPTER_WEIGHTS))
        || present(&dir.join(STATE_FILE))
        || present(&dir.join(HF_OPTIMIZER))
        || model_files::holds_model(dir)
}

/// `versions/vNNNN` dirs of an adapter root, in numeric order (`v9` before `v10`).
fn all_versions(adapter_root: &Path) -> std::result::Result<Vec<PathBuf>, String> {
    let versions = adapter_root.join("versions");
    let listed = confine::list_dir(&versions, Area::Missing)
        .map_err(|e| format!("cannot list {}: {}", versions.display(), e.message))?;
    let mut out: Vec<PathBuf> = listed
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| p.is_dir())
        .collect();
    out.sort_by(|a, b| natural_path_cmp(a, b));
    Ok(out)
}

/// The version `current.txt` points at, which must stay inside the adapter root.
fn current_version(adapter_root: &Path) -> std::result::Result<PathBuf, String> {
    let pointer = adapter_root.join("current.txt");
    let text = read_small(&pointer, Area::Missing, MAX_POINTER_BYTES).map_err(|e| {
        if e.area == Area::Missing && !pointer.exists() {
            "current.txt is missing, so the current version is unknown (use --all-versions to \
             probe every version)"
                .to_string()
        } else {
            format!("current.txt: {}", e.message)
        }
    })?;
    let text = String::from_utf8(text).map_err(|_| "current.txt is not UTF-8".to_string())?;
    let rel = Path::new(text.trim());
    let escapes = rel.as_os_str().is_empty()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err(format!(
            "current.txt holds {}, not a path inside the adapter directory",
            crate::io::excerpt::quoted(text.trim())
        ));
    }
    let version = adapter_root.join(rel);
    if confine::leads_outside(&version) {
        return Err(format!(
            "current.txt points at {}, which {}",
            crate::io::excerpt::quoted(text.trim()),
            confine::OUTSIDE
        ));
    }
    if !read_once::is_dir(&version) {
        return Err(format!(
            "current.txt points at {}, which does not exist",
            crate::io::excerpt::quoted(text.trim())
        ));
    }
    Ok(version)
}

/// The target for a dlm store directory.
pub fn dlm_target(store: &Path, all: bool) -> Target {
    let mut target = Target::new(store, DLM);
    let adapter = store.join("adapter");
    if !read_once::is_dir(&adapter) {
        return target;
    }
    if let Some(why) = unlistable(&adapter) {
        target.broken.push((adapter, why));
        return target.kind_set();
    }
    let roots: Vec<PathBuf> = if is_adapter_root(&adapter) {
        vec![adapter]
    } else {
        let mut named: Vec<PathBuf> = entries(&adapter).into_iter().map(|(_, p)| p).collect();
        for p in &named {
            if let Some(why) = unlistable(p) {
                target.broken.push((p.clone(), why));
            }
        }
        named.retain(|p| p.is_dir() && is_adapter_root(p) && unlistable(p).is_none());
        named.sort_by(|a, b| natural_path_cmp(a, b));
        named
    };
    for root in roots {
        let found = if all {
            all_versions(&root)
        } else {
            current_version(&root).map(|v| vec![v])
        };
        match found {
            Ok(v) => target.versions.extend(v),
            Err(reason) => target.broken.push((root, reason)),
        }
    }
    target.kind_set()
}

/// The dlm store an adapter version dir belongs to: `<store>/adapter[/<name>]/versions/<v>`.
pub fn enclosing_dlm_store(version: &Path) -> Option<PathBuf> {
    let versions = version.parent()?;
    if versions.file_name()? != "versions" {
        return None;
    }
    let adapter_root = versions.parent()?;
    if adapter_root.file_name()? == "adapter" {
        return adapter_root.parent().map(Path::to_path_buf);
    }
    let adapter = adapter_root.parent()?;
    if adapter.file_name()? == "adapter" {
        return adapter.parent().map(Path::to_path_buf);
    }
    None
}

// ---- HF Trainer ----

/// `N` of a `checkpoint-N` directory name.
pub fn checkpoint_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Whether a checkpoint directory holds anything a probe reads.
fn holds_checkpoint(dir: &Path) -> bool {
    present(&dir.join(TRAINER_STATE)) || is_version_dir(dir) || holds_adapter(dir)
}

/// The checkpoint directories of an HF output dir (`checkpoint-N/`, and
/// `last-checkpoint/`), oldest first: by step as a number, then
/// `last-checkpoint` after a `checkpoint-N` of the same step.
pub fn hf_checkpoints(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, bool, PathBuf)> = entries(dir)
        .into_iter()
        .filter(|(name, p)| {
            (checkpoint_step(name).is_some() || name == LAST_CHECKPOINT) && p.is_dir()
        })
        .filter(|(_, p)| holds_checkpoint(p))
        .filter_map(|(name, path)| {
            let step = checkpoint_dir_step(&name, &path)?;
            Some((step, name == LAST_CHECKPOINT, path))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(step, _, p)| (step, p)).collect()
}

/// Whether `dir` holds TensorBoard event files (directly).
fn has_event_files(dir: &Path) -> bool {
    entries(dir)
        .iter()
        .any(|(name, p)| is_event_file_name(name) && present(p))
}

/// An HF output dir. A `runs/` folder alone does not make one: any
/// directory may hold one beside other stores, and the walk would stop
/// there; its `runs/<date>/` events are then found as a TensorBoard store.
pub fn is_hf_output(dir: &Path) -> bool {
    present(&dir.join(TRAINER_STATE))
        || present(&dir.join(crate::formats::logs::trainer_log::TRAINER_LOG))
        || dir.join(TRAINING_ARGS).is_file()
        || !hf_checkpoints(dir).is_empty()
}

/// The target for an HF Trainer output directory: its checkpoints (all, or
/// the newest); a run saved without checkpoints is its own single version
/// when it holds an adapter or a model, and a log-only run otherwise.
pub fn hf_target(dir: &Path, all: bool) -> Target {
    let mut target = Target::new(dir, HF_TRAINER);
    target.broken = unlistable_children(dir);
    let checkpoints = hf_checkpoints(dir);
    if checkpoints.is_empty() {
        if dir.join(ADAPTER_WEIGHTS).is_file() || model_files::holds_model(dir) {
            target.versions.push(dir.to_path_buf());
        }
    } else if all {
        target.versions = checkpoints.into_iter().map(|(_, p)| p).collect();
    } else if let Some((_, newest)) = checkpoints.into_iter().last() {
        target.versions.push(newest);
    }
    let mut target = target.kind_set();
    target.versions = with_named_adapters(std::mem::take(&mut target.versions));
    target
}

// ---- Lightning ----

/// The step a Lightning checkpoint name carries (`...step=1234...`), if any.
fn ckpt_step(name: &str) -> Option<u64> {
    let at = name.find("step=")? + "step=".len();
    let digits: String = name[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `*.ckpt` files in `dir` and in `dir/checkpoints`, oldest first: by the
/// step in the name, then by name, `last.ckpt` last.
pub fn lightning_checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(bool, u64, String, PathBuf)> = [dir.to_path_buf(), dir.join("checkpoints")]
        .iter()
        .flat_map(|d| entries(d))
        .filter(|(name, path)| name.ends_with(".ckpt") && path.is_file())
        .map(|(name, path)| {
            (
                name.starts_with("last"),
                ckpt_step(&name).unwrap_or(0),
                name,
                path,
            )
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, _, _, p)| p).collect()
}

/// A Lightning run: checkpoints, or the logs of a run saved without them
/// (CSVLogger's `metrics.csv`, or TensorBoardLogger's events beside the
/// `hparams.yaml` Lightning writes).
pub fn is_lightning_dir(dir: &Path) -> bool {
    present(&dir.join("metrics.csv"))
        || (dir.join("hparams.yaml").is_file() && has_event_files(dir))
        || !lightning_checkpoints(dir).is_empty()
}

pub fn lightning_target(dir: &Path, all: bool) -> Target {
    let mut target = Target::new(dir, LIGHTNING);
    target.broken = unlistable_children(dir);
    let checkpoints = lightning_checkpoints(dir);
    if all {
        target.versions = checkpoints;
    } else if let Some(newest) = checkpoints.into_iter().last() {
        target.versions.push(newest);
    }
    target.kind_set()
}

// ---- bare PEFT ----

pub fn is_bare_peft(dir: &Path) -> bool {
    let weights = [dir.join(ADAPTER_WEIGHTS), dir.join("adapter_model.bin")];
    let has_weights = weights.iter().any(|w| w.is_file());
    // Adapter weights left as a Git LFS pointer (a clone without `git lfs
    // pull`), even without their config: a store whose record names the
    // pointer, not a folder passed over in silence.
    let pointer = || {
        weights
            .iter()
            .any(|w| crate::io::lfs::pointer_error_in(Area::Weights, w).is_some())
    };
    has_weights && (dir.join(ADAPTER_CONFIG).is_file() || pointer())
}

pub fn peft_target(dir: &Path) -> Target {
    let mut target = Target::new(dir, PEFT);
    target.versions = with_named_adapters(vec![dir.to_path_buf()]);
    target.kind_set()
}

// ---- LoRA files of other tools, mlx-lm adapters ----

/// Most `*.safetensors` files of one folder whose header is read to tell a
/// LoRA file (a folder of model shards or images holds more: the rest are
/// passed over).
pub const MAX_LORA_FILES_LOOKED_AT: usize = 256;

/// Names of safetensors files that are no LoRA file of another tool: PEFT's
/// and mlx-lm's adapters (their folder is the store), models and shards.
fn is_reserved_weights_name(name: &str) -> bool {
    name == ADAPTER_WEIGHTS
        || name.ends_with(crate::formats::mlx_config::MLX_WEIGHTS)
        || name.starts_with("model")
        || name.starts_with("diffusion_pytorch_model")
        || name.starts_with("pytorch_model")
}

/// Whether the file at `path` is a LoRA file of another tool (its header
/// names kohya, LyCORIS, mlx-lm or diffusers LoRA tensors; see
/// `formats::lora_keys::file_format`). A header that cannot be read is no
/// LoRA file here (the folder is then said to hold it and nothing read).
pub fn is_lora_file(path: &Path) -> bool {
    crate::formats::safetensors_header::read_header(path)
        .ok()
        .and_then(|h| crate::formats::lora_keys::file_format(&h))
        .is_some()
}

/// The LoRA files of other tools in `dir`, by name (at most
/// [`MAX_LORA_FILES_LOOKED_AT`] looked at).
pub fn lora_files(dir: &Path) -> Vec<PathBuf> {
    let mut named: Vec<(String, PathBuf)> = entries(dir)
        .into_iter()
        .filter(|(name, p)| {
            name.ends_with(".safetensors")
                && !name.starts_with('.')
                && !is_reserved_weights_name(name)
                && fs::metadata(p).is_ok_and(|m| m.is_file())
        })
        .collect();
    named.sort_by(|a, b| natural_cmp(&a.0, &b.0));
    named
        .into_iter()
        .take(MAX_LORA_FILES_LOOKED_AT)
        .map(|(_, p)| p)
        .filter(|p| is_lora_file(p))
        .collect()
}

/// The target of one LoRA file of another tool: the file is the store and
/// its version; its log is what sits beside it.
pub fn lora_file_target(file: &Path) -> Target {
    let mut t = Target::new(file, LORA_FILE);
    t.versions.push(file.to_path_buf());
    t.kind_set()
}

/// An mlx-lm adapter folder: `adapters.safetensors` beside an
/// `adapter_config.json` with `lora_parameters`.
pub fn is_mlx_dir(dir: &Path) -> bool {
    use crate::formats::mlx_config::{is_mlx_config, MLX_WEIGHTS};
    read_once::is_file(&dir.join(MLX_WEIGHTS))
        && read_small(&dir.join(ADAPTER_CONFIG), Area::Weights, 1 << 20)
            .is_ok_and(|bytes| is_mlx_config(&bytes))
}

pub fn mlx_target(dir: &Path) -> Target {
    let mut t = Target::new(dir, MLX);
    t.versions.push(dir.to_path_buf());
    t.kind_set()
}

// ---- tracker runs inside a training output dir ----

/// The tracker runs a training output dir keeps inside it (W&B's
/// `wandb/run-*/`, MLflow's `mlruns/<experiment>/<run>/`), oldest first:
/// W&B's by the date in their names (`run-` and `offline-run-` alike),
/// MLflow's by path. `latest-run` is not listed twice.
pub fn tracker_runs(dir: &Path) -> Vec<PathBuf> {
    let mut wandb: Vec<(String, PathBuf)> = entries(&dir.join("wandb"))
        .into_iter()
        .filter(|(name, p)| {
            name != WANDB_LATEST_RUN && p.is_dir() && crate::formats::logs::wandb_run::is_run_dir(p)
        })
        .map(|(name, p)| {
            let date = name.trim_start_matches("offline-").to_string();
            (date, p)
        })
        .collect();
    wandb.sort();
    let mut out: Vec<PathBuf> = wandb.into_iter().map(|(_, p)| p).collect();
    let mut mlflow: Vec<PathBuf> = entries(&dir.join("mlruns"))
        .into_iter()
        .filter(|(name, p)| !name.starts_with('.') && p.is_dir())
        .flat_map(|(_, experiment)| entries(&experiment))
        .map(|(_, run)| run)
        .filter(|run| run.is_dir() && crate::formats::logs::mlflow_files::is_run_dir(run))
        .collect();
    mlflow.sort();
    out.extend(mlflow);
    out
}

// ---- MLflow's SQLite store ----

/// One target per run of the MLflow SQLite store `db` (see
/// `formats::logs::mlflow_db`: each is named by a path below the file); a
/// store whose runs cannot be listed is one target, the file.
pub fn mlflow_db_targets(db: &Path) -> Vec<Target> {
    use crate::formats::logs::mlflow_db;
    match mlflow_db::runs(db) {
        // A store of no runs is one store whose record says so.
        Ok(runs) if runs.is_empty() => vec![Target::new(db, MLFLOW).kind_set()],
        Ok(runs) => runs
            .iter()
            .map(|run| Target::new(&mlflow_db::run_path(db, run), MLFLOW).kind_set())
            .collect(),
        // The file as the one store: its log read fails again, with this
        // reason, in an error record.
        Err(_) => vec![Target::new(db, MLFLOW).kind_set()],
    }
}

/// The MLflow SQLite store in `dir` (an SQLite file called `mlflow.db`),
/// when it holds one. Its tables are not checked here: a damaged store is
/// found, and its target says why it cannot be read.
pub fn mlflow_db_in(dir: &Path) -> Option<PathBuf> {
    use crate::formats::logs::mlflow_db;
    let is_db = |db: &PathBuf| fs::metadata(db).is_ok_and(|m| m.is_file());
    let by_name = || {
        let db = dir.join(mlflow_db::DB_NAME);
        (is_db(&db) && crate::io::sqlite::is_sqlite(&db)).then_some(db)
    };
    // Every folder the walk visits is asked: one listing answers, and the
    // names are looked at before any path is built. A folder that cannot
    // be listed may still be entered: its mlflow.db is looked up by name.
    let Ok(names) = confine::list_names(dir, Area::Missing) else {
        return by_name();
    };
    if names.iter().any(|n| n == mlflow_db::DB_NAME) {
        if let Some(db) = by_name() {
            return Some(db);
        }
    }
    // Another name (`mlruns.db`, `tracking.db`): told by its tables.
    let mut named: Vec<PathBuf> = names
        .iter()
        .filter(|n| n.to_string_lossy().ends_with(".db"))
        .map(|n| dir.join(n))
        .filter(is_db)
        .collect();
    named.sort();
    named
        .into_iter()
        .take(MAX_DB_FILES_LOOKED_AT)
        .find(|p| mlflow_db::is_store(p))
}

/// Most `*.db` files of one folder opened to find an MLflow store.
pub const MAX_DB_FILES_LOOKED_AT: usize = 8;

// ---- TensorBoard only ----

/// A folder of TensorBoard event files: a run that left only its logs.
pub fn is_tensorboard_dir(dir: &Path) -> bool {
    has_event_files(dir)
}

pub fn tensorboard_target(dir: &Path) -> Target {
    Target::new(dir, TENSORBOARD).kind_set()
}

/// The training-log CSV of a `csv-log` store (see [`CSV_LOG`]).
pub fn training_csv(dir: &Path) -> Option<PathBuf> {
    let files = entries(dir).into_iter().map(|(_, p)| p);
    crate::formats::logs::csv_log::training_csv_in(files)
}

/// The target a directory is, when it is one of the layouts (checked in
/// this order: dlm, HF Trainer, Lightning, bare PEFT, mlx-lm, an MLflow
/// run, a W&B run, TensorBoard, a training-log CSV); None to look deeper.
/// LoRA files of other tools are stores of their own ([`lora_files`]),
/// looked for where a folder is none of these.
pub fn classify(dir: &Path, all: bool) -> Option<Target> {
    if is_dlm_store(dir) {
        Some(dlm_target(dir, all))
    } else if is_hf_output(dir) {
        Some(hf_target(dir, all))
    } else if is_lightning_dir(dir) {
        Some(lightning_target(dir, all))
    } else if is_bare_peft(dir) {
        Some(peft_target(dir))
    } else if is_mlx_dir(dir) {
        Some(mlx_target(dir))
    } else if crate::formats::logs::mlflow_files::is_run_dir(dir) {
        Some(Target::new(dir, MLFLOW).kind_set())
    } else if crate::formats::logs::wandb_run::is_run_dir(dir) {
        Some(Target::new(dir, WANDB).kind_set())
    } else if is_tensorboard_dir(dir) {
        Some(tensorboard_target(dir))
    } else if training_csv(dir).is_some() {
        Some(Target::new(dir, CSV_LOG).kind_set())
    } else {
        None
    }
}

// ---- what a walk passes over, and why ----

/// The subfolders of a target's store that its layout does not read, with
/// why (the walk stops at a store, so they are not searched either):
/// hidden ones, checkpoint directories holding nothing a probe reads,
/// folders of a dlm `adapter/` that are no adapter, and any other folder.
pub fn unclaimed(target: &Target) -> Vec<(PathBuf, String)> {
    let store = &target.store;
    let mut out = vec![];
    let mut listed = entries(store);
    listed.sort();
    for (name, path) in listed {
        if !path.is_dir() {
            continue;
        }
        let why = if name.starts_with('.') {
            Some("hidden directory: not searched".to_string())
        } else {
            unclaimed_reason(&target.layout, &name, &path, target)
        };
        if let Some(why) = why {
            out.push((path, why));
        }
    }
    if target.layout == DLM {
        let adapter = store.join("adapter");
        if adapter.is_dir() && !is_adapter_root(&adapter) {
            let mut named = entries(&adapter);
            named.sort();
            for (name, path) in named {
                if path.is_dir() && !name.starts_with('.') && !is_adapter_root(&path) {
                    out.push((
                        path,
                        "in a dlm adapter/ folder but no adapter: no current.txt and no \
                         versions/"
                            .to_string(),
                    ));
                }
            }
        }
    }
    out
}

fn unclaimed_reason(layout: &str, name: &str, path: &Path, target: &Target) -> Option<String> {
    let outside = || {
        Some(format!(
            "inside the {layout} store {}, and no part of its layout: not searched",
            target.store.display()
        ))
    };
    if target.versions.iter().any(|v| v == path) {
        return None;
    }
    match layout {
        DLM if name == "adapter" || name == "logs" => None,
        HF_TRAINER if name == "logs" => None, // the GAP monitor's run logs
        HF_TRAINER if checkpoint_step(name).is_some() || name == LAST_CHECKPOINT => {
            (!holds_checkpoint(path)).then(|| {
                "checkpoint directory holding nothing a probe reads (no trainer_state.json, \
                 optimizer.pt, adapter or model weights)"
                    .to_string()
            })
        }
        HF_TRAINER if name == "runs" => None,
        // The run's tracker log: part of this store (read when the run left
        // no trainer state or events), not a store of its own.
        HF_TRAINER | LIGHTNING if TRACKER_FOLDERS.contains(&name) => None,
        HF_TRAINER if is_bare_peft(path) => Some(
            "an adapter of the run's final save: the run's checkpoints are probed instead"
                .to_string(),
        ),
        LIGHTNING if name == "checkpoints" => None,
        // kohya's TensorBoard logs, read for the files beside them.
        LORA_FILE if name == "logs" => None,
        PEFT if path.join(ADAPTER_CONFIG).is_file() => Some(format!(
            "{ADAPTER_CONFIG} without adapter weights ({ADAPTER_WEIGHTS} or {PICKLED_ADAPTER})"
        )),
        _ => outside(),
    }
}

/// Why a directory with no subfolder is no store, in words.
pub fn why_not_a_store(dir: &Path) -> String {
    let names: Vec<String> = entries(dir).into_iter().map(|(n, _)| n).collect();
    if names.is_empty() {
        return "empty directory".to_string();
    }
    let has = |n: &str| names.iter().any(|x| x == n);
    if has(ADAPTER_CONFIG) {
        return format!(
            "{ADAPTER_CONFIG} without adapter weights ({ADAPTER_WEIGHTS} or {PICKLED_ADAPTER})"
        );
    }
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if checkpoint_step(name).is_some() || name == LAST_CHECKPOINT {
        return "checkpoint directory holding nothing a probe reads (no trainer_state.json, \
                optimizer.pt, adapter or model weights)"
            .to_string();
    }
    let weights: Vec<&String> = names
        .iter()
        .filter(|n| {
            [".safetensors", ".bin", ".pt", ".pth"]
                .iter()
                .any(|e| n.ends_with(e))
        })
        .take(3)
        .collect();
    if !weights.is_empty() {
        return format!(
            "holds {} but no adapter_config.json, trainer_state.json, optimizer.pt or \
             other file a layout recognises",
            weights
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    "holds nothing a layout recognises (no adapter, checkpoint, optimizer state or \
     training log)"
        .to_string()
}

/// When a root is one version inside a known store (a dlm version dir, an
/// HF `checkpoint-N/`), that version alone, inside its store. A checkpoint
/// brings the adapters saved in its subfolders and its own log (the
/// `trainer_state.json` the Trainer wrote at that step).
pub fn version_root(root: &Path) -> Option<Target> {
    if is_dlm_store(root) {
        return None;
    }
    if is_version_dir(root) {
        if let Some(store) = enclosing_dlm_store(root) {
            let mut t = Target::new(&store, DLM);
            t.versions.push(root.to_path_buf());
            t.with_logs = false;
            return Some(t.kind_set());
        }
    }
    let name = root.file_name()?.to_str()?;
    let parent = root.parent()?;
    let is_checkpoint = checkpoint_step(name).is_some() || name == LAST_CHECKPOINT;
    if is_checkpoint && holds_checkpoint(root) {
        let mut t = Target::new(parent, HF_TRAINER);
        t.versions.push(root.to_path_buf());
        t.log_root = Some(root.to_path_buf());
        let mut t = t.kind_set();
        t.versions = with_named_adapters(std::mem::take(&mut t.versions));
        return Some(t);
    }
    None
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
