//! Find stores under roots and gather what each probe needs, in parallel.
//!
//! A store is a directory with `adapter/` and/or `logs/`. Under `adapter/`
//! live either one adapter (`current.txt`, `versions/vNNNN/`) or several
//! named ones one level deeper. This module only collects inputs (loss
//! curves, training states, layer groupings); the verdicts are computed by
//! the Python probes, so a scan and a single probe can never disagree.

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use rayon::prelude::*;

use crate::adapter_weights::{self, AdapterWeights};
use crate::attribution::{self, Attribution};
use crate::error::{Area, Error, Result};
use crate::layers::{self, LayerGrouping};
use crate::loss_log::{self, LossCurve};
use crate::safetensors_header::read_header;
use crate::torch_state::{self, TrainingState};

/// Deepest directory level the walk descends to below a root.
const MAX_DEPTH: usize = 64;
/// Largest `current.txt` read.
const MAX_POINTER_BYTES: u64 = 4096;

/// One store to probe, and the adapter versions in it to probe.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub store: PathBuf,
    pub versions: Vec<PathBuf>,
    /// Adapters whose versions could not be determined: (path, reason).
    pub broken: Vec<(PathBuf, String)>,
    /// Whether the store's loss curve is probed (false when the root was
    /// one adapter version).
    pub with_logs: bool,
}

/// Something the walk could not look into.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub path: PathBuf,
    pub message: String,
}

/// The targets found under some roots and what could not be searched.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovery {
    pub targets: Vec<Target>,
    pub problems: Vec<Problem>,
}

fn is_store(dir: &Path) -> bool {
    dir.join("adapter").is_dir() || dir.join("logs").is_dir()
}

/// A directory that holds one trained adapter version.
fn is_version_dir(dir: &Path) -> bool {
    dir.join(layers::ADAPTER_WEIGHTS).is_file() || dir.join(torch_state::STATE_FILE).is_file()
}

fn is_adapter_root(dir: &Path) -> bool {
    dir.join("current.txt").is_file() || dir.join("versions").is_dir()
}

/// `versions/vNNNN` dirs of an adapter root, sorted by name.
fn all_versions(adapter_root: &Path) -> std::result::Result<Vec<PathBuf>, String> {
    let versions = adapter_root.join("versions");
    let entries =
        fs::read_dir(&versions).map_err(|e| format!("cannot list {}: {e}", versions.display()))?;
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    Ok(out)
}

/// The version `current.txt` points at, which must stay inside the adapter root.
fn current_version(adapter_root: &Path) -> std::result::Result<PathBuf, String> {
    let pointer = adapter_root.join("current.txt");
    let meta = fs::metadata(&pointer).map_err(|_| {
        "current.txt is missing, so the current version is unknown (use --all-versions to \
         probe every version)"
            .to_string()
    })?;
    if !meta.is_file() {
        return Err("current.txt is not a regular file".into());
    }
    if meta.len() > MAX_POINTER_BYTES {
        return Err(format!(
            "current.txt is {} bytes, not a version pointer",
            meta.len()
        ));
    }
    let text = fs::read(&pointer).map_err(|e| format!("cannot read current.txt: {e}"))?;
    let text = String::from_utf8(text).map_err(|_| "current.txt is not UTF-8".to_string())?;
    let rel = Path::new(text.trim());
    let escapes = rel.as_os_str().is_empty()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err(format!(
            "current.txt holds {:?}, not a path inside the adapter directory",
            text.trim()
        ));
    }
    let version = adapter_root.join(rel);
    if !version.is_dir() {
        return Err(format!(
            "current.txt points at {}, which does not exist",
            rel.display()
        ));
    }
    Ok(version)
}

/// The target for one store directory.
fn store_target(store: &Path, all: bool) -> Target {
    let mut target = Target {
        store: store.to_path_buf(),
        versions: vec![],
        broken: vec![],
        with_logs: true,
    };
    let adapter = store.join("adapter");
    if !adapter.is_dir() {
        return target;
    }
    let roots: Vec<PathBuf> = if is_adapter_root(&adapter) {
        vec![adapter]
    } else {
        let mut named: Vec<PathBuf> = fs::read_dir(&adapter)
            .map(|it| it.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        named.retain(|p| p.is_dir() && is_adapter_root(p));
        named.sort();
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
    target
}

/// The store an adapter version dir belongs to: `<store>/adapter[/<name>]/versions/<v>`.
fn enclosing_store(version: &Path) -> Option<PathBuf> {
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

#[cfg(unix)]
fn dir_id(meta: &fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn dir_id(_meta: &fs::Metadata) -> (u64, u64) {
    (0, 0)
}

struct Walk {
    all: bool,
    seen: Mutex<HashSet<(u64, u64)>>,
    targets: Mutex<Vec<Target>>,
    problems: Mutex<Vec<Problem>>,
}

impl Walk {
    fn problem(&self, path: &Path, message: String) {
        if let Ok(mut p) = self.problems.lock() {
            p.push(Problem {
                path: path.to_path_buf(),
                message,
            });
        }
    }

    /// Visit `dir`; `ancestors` are the ids on the path from the root.
    fn visit(&self, dir: &Path, ancestors: &[(u64, u64)]) {
        let meta = match fs::metadata(dir) {
            Ok(m) => m,
            Err(e) => return self.problem(dir, format!("cannot read: {e}")),
        };
        let id = dir_id(&meta);
        if ancestors.contains(&id) {
            return self.problem(
                dir,
                "symlink loop: leads back to a directory above it".into(),
            );
        }
        if !self.seen.lock().map(|mut s| s.insert(id)).unwrap_or(false) {
            return; // reached twice through links: probe it once
        }
        if is_store(dir) {
            let target = store_target(dir, self.all);
            if let Ok(mut t) = self.targets.lock() {
                t.push(target);
            }
            return;
        }
        if ancestors.len() >= MAX_DEPTH {
            return self.problem(dir, format!("deeper than {MAX_DEPTH} levels, not searched"));
        }
        let entries = match fs::read_dir(dir) {
            Ok(it) => it,
            Err(e) => return self.problem(dir, format!("cannot list: {e}")),
        };
        let mut subdirs = vec![];
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            let path = entry.path();
            if !hidden && path.is_dir() {
                subdirs.push(path);
            }
        }
        let mut chain = ancestors.to_vec();
        chain.push(id);
        subdirs.par_iter().for_each(|sub| self.visit(sub, &chain));
    }
}

/// Find the targets under `roots`: each root may be a store, an adapter
/// version dir, or any directory with stores at any depth below it.
pub fn discover(roots: &[PathBuf], all: bool) -> Discovery {
    let walk = Walk {
        all,
        seen: Mutex::new(HashSet::new()),
        targets: Mutex::new(vec![]),
        problems: Mutex::new(vec![]),
    };
    for root in roots {
        if !root.exists() {
            walk.problem(root, "does not exist".into());
        } else if !root.is_dir() {
            walk.problem(root, "is not a directory".into());
        } else if is_version_dir(root) && !is_store(root) {
            // One adapter version: probe it alone, inside its store if it has one.
            let store = enclosing_store(root).unwrap_or_else(|| root.clone());
            if let Ok(mut t) = walk.targets.lock() {
                t.push(Target {
                    store,
                    versions: vec![root.clone()],
                    broken: vec![],
                    with_logs: false,
                });
            }
        } else {
            walk.visit(root, &[]);
        }
    }
    let mut targets = walk.targets.into_inner().unwrap_or_default();
    targets.sort_by(|a, b| {
        a.store
            .cmp(&b.store)
            .then_with(|| a.versions.cmp(&b.versions))
    });
    let mut problems = walk.problems.into_inner().unwrap_or_default();
    problems.sort_by(|a, b| a.path.cmp(&b.path));
    Discovery { targets, problems }
}

/// What reading a store's logs gave.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, eq, eq_int, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogsStatus {
    /// The store has no `logs/` directory.
    NoLogsDir,
    /// `logs/` holds no training log.
    NoFiles,
    /// A curve was read.
    Curve,
    /// The logs exist but cannot be read (`error` says why).
    Failed,
}

/// Everything `training_drift` needs about one store.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct DriftInput {
    pub store: PathBuf,
    pub logs_dir: PathBuf,
    pub files: Vec<PathBuf>,
    pub status: LogsStatus,
    /// Present when `status` is `Curve`.
    pub curve: Option<LossCurve>,
    /// Present when `status` is `Failed`.
    pub error: Option<Error>,
}

pub fn drift_input(store: &Path) -> DriftInput {
    let logs_dir = store.join("logs");
    let mut input = DriftInput {
        store: store.to_path_buf(),
        logs_dir: logs_dir.clone(),
        files: vec![],
        status: LogsStatus::NoLogsDir,
        curve: None,
        error: None,
    };
    if !logs_dir.is_dir() {
        return input;
    }
    let read = loss_log::train_logs_in(&logs_dir).and_then(|files| {
        input.files = files;
        if input.files.is_empty() {
            Ok(None)
        } else {
            loss_log::read_loss_curve(&input.files).map(Some)
        }
    });
    match read {
        Ok(None) => input.status = LogsStatus::NoFiles,
        Ok(Some(curve)) => {
            input.status = LogsStatus::Curve;
            input.curve = Some(curve);
        }
        Err(e) => {
            input.status = LogsStatus::Failed;
            input.error = Some(e);
        }
    }
    input
}

/// Everything `gradient_ghost` needs about one adapter version: the state
/// or why it could not be read; for `rules="sway"` the layer grouping of the
/// seed (`grouping`, or `grouping_error`); for `rules="robust"` the exact
/// attribution of param ids to (layer, slot) (`attribution`, or why not in
/// `attribution_error`) and any failure to read the adapter weights' header
/// (`weights_error`). The adapter is only looked at once the state is read.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct GhostInput {
    pub adapter: PathBuf,
    pub state: Option<TrainingState>,
    pub error: Option<Error>,
    pub grouping: Option<LayerGrouping>,
    pub grouping_error: Option<Error>,
    pub attribution: Option<Attribution>,
    pub attribution_error: Option<String>,
    pub weights_error: Option<Error>,
}

pub fn ghost_input(adapter: &Path) -> GhostInput {
    let mut input = GhostInput {
        adapter: adapter.to_path_buf(),
        state: None,
        error: None,
        grouping: None,
        grouping_error: None,
        attribution: None,
        attribution_error: None,
        weights_error: None,
    };
    let state = match torch_state::read_training_state(adapter) {
        Ok(state) => state,
        Err(e) => {
            input.error = Some(e);
            return input;
        }
    };
    let weights = layers::adapter_weights_path(adapter);
    let header = if weights.exists() {
        read_header(&weights)
    } else {
        Err(Error::new(
            Area::Missing,
            &weights,
            "adapter weights not found beside the optimizer state",
        ))
    };
    match header {
        Ok(header) => {
            let names = header.tensors.iter().map(|t| t.name.as_str());
            match layers::group_keys(names, Some(state.per_param.len() as u64)) {
                Ok(g) => input.grouping = Some(g),
                Err(msg) => {
                    input.grouping_error = Some(Error::new(Area::LayerGrouping, &weights, msg))
                }
            }
            let keys: Vec<(String, Vec<u64>)> = header
                .tensors
                .into_iter()
                .map(|t| (t.name, t.shape))
                .collect();
            let params: Vec<(i64, Vec<u64>)> = state
                .per_param
                .iter()
                .map(|p| (p.param_id, p.shape.clone()))
                .collect();
            match attribution::attribute(&keys, &params) {
                Ok(a) => input.attribution = Some(a),
                Err(why) => input.attribution_error = Some(why),
            }
        }
        Err(e) => {
            let why = format!("adapter weights unreadable: {e}");
            input.grouping_error = Some(Error::new(Area::LayerGrouping, &weights, why));
            input.weights_error = Some(e);
        }
    }
    input.state = Some(state);
    input
}

/// What `adapter_weights` needs about one adapter version: its weights
/// report, or why it could not be read.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct WeightsInput {
    pub adapter: PathBuf,
    pub weights: Option<AdapterWeights>,
    pub error: Option<Error>,
}

pub fn weights_input(adapter: &Path) -> WeightsInput {
    let (weights, error) = match adapter_weights::read_adapter_weights(adapter) {
        Ok(w) => (Some(w), None),
        Err(e) => (None, Some(e)),
    };
    WeightsInput {
        adapter: adapter.to_path_buf(),
        weights,
        error,
    }
}

/// Probe inputs for one target.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone)]
pub struct TargetInputs {
    pub store: PathBuf,
    pub drift: Option<DriftInput>,
    pub ghosts: Vec<GhostInput>,
    pub weights: Vec<WeightsInput>,
    pub broken: Vec<(PathBuf, String)>,
}

/// Which probes a gathering pass reads inputs for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub drift: bool,
    pub ghost: bool,
    pub weights: bool,
}

/// Gather the inputs of many targets in parallel, in target order.
pub fn probe_targets(targets: &[Target], wanted: Wanted) -> Vec<TargetInputs> {
    targets
        .par_iter()
        .map(|t| TargetInputs {
            store: t.store.clone(),
            drift: (wanted.drift && t.with_logs).then(|| drift_input(&t.store)),
            ghosts: per_version(&t.versions, wanted.ghost, ghost_input),
            weights: per_version(&t.versions, wanted.weights, weights_input),
            broken: t.broken.clone(),
        })
        .collect()
}

/// `read` of every version, in parallel and in order (nothing when `on` is false).
fn per_version<T: Send>(versions: &[PathBuf], on: bool, read: fn(&Path) -> T) -> Vec<T> {
    if on {
        versions.par_iter().map(|v| read(v)).collect()
    } else {
        vec![]
    }
}

/// A rayon pool of `workers` threads (None: one per core).
pub fn pool(workers: Option<usize>) -> Result<rayon::ThreadPool> {
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = workers {
        if n == 0 {
            return Err(Error::new(Area::Usage, "", "workers must be at least 1"));
        }
        builder = builder.num_threads(n);
    }
    builder
        .build()
        .map_err(|e| Error::new(Area::Usage, "", format!("cannot start worker threads: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkdirs(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }

    fn version(store: &Path, adapter: &str, v: &str) -> PathBuf {
        let dir = mkdirs(store, &format!("{adapter}/versions/{v}"));
        fs::write(dir.join(torch_state::STATE_FILE), b"x").unwrap();
        dir
    }

    #[test]
    fn finds_flat_and_multi_stores_at_any_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let flat = mkdirs(tmp.path(), "team/a/flat");
        version(&flat, "adapter", "v0001");
        let v2 = version(&flat, "adapter", "v0002");
        fs::write(flat.join("adapter/current.txt"), "versions/v0002\n").unwrap();
        let multi = mkdirs(tmp.path(), "team/b/multi");
        let chat = version(&multi, "adapter/chat", "v0001");
        fs::write(multi.join("adapter/chat/current.txt"), "versions/v0001").unwrap();
        version(&multi, "adapter/code", "v0001"); // no current.txt
        let logs_only = mkdirs(tmp.path(), "logs-only/logs");
        let d = discover(&[tmp.path().to_path_buf()], false);
        assert!(d.problems.is_empty(), "{:?}", d.problems);
        let stores: Vec<&PathBuf> = d.targets.iter().map(|t| &t.store).collect();
        assert_eq!(
            stores,
            vec![&logs_only.parent().unwrap().to_path_buf(), &flat, &multi]
        );
        assert_eq!(d.targets[1].versions, vec![v2]);
        assert_eq!(d.targets[2].versions, vec![chat]);
        assert_eq!(d.targets[2].broken.len(), 1);
        assert!(d.targets[2].broken[0].1.contains("current.txt is missing"));
        let all = discover(&[tmp.path().to_path_buf()], true);
        assert_eq!(all.targets[1].versions.len(), 2);
        assert_eq!(all.targets[2].versions.len(), 2);
    }

    #[test]
    fn a_version_dir_root_is_probed_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let v = version(tmp.path(), "adapter", "v0003");
        let d = discover(std::slice::from_ref(&v), false);
        assert_eq!(d.targets.len(), 1);
        assert_eq!(d.targets[0].store, tmp.path());
        assert_eq!(d.targets[0].versions, vec![v]);
        assert!(!d.targets[0].with_logs);
    }

    #[test]
    fn hostile_pointers_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        version(tmp.path(), "adapter", "v0001");
        for bad in ["../../etc", "/etc", "", "versions/v0009"] {
            fs::write(tmp.path().join("adapter/current.txt"), bad).unwrap();
            let t = store_target(tmp.path(), false);
            assert!(t.versions.is_empty(), "{bad}");
            assert_eq!(t.broken.len(), 1, "{bad}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn symlink_loops_are_reported_not_followed_forever() {
        let tmp = tempfile::tempdir().unwrap();
        let a = mkdirs(tmp.path(), "a/b");
        std::os::unix::fs::symlink(tmp.path().join("a"), a.join("loop")).unwrap();
        mkdirs(tmp.path(), "a/store/logs");
        let d = discover(&[tmp.path().to_path_buf()], false);
        assert_eq!(d.targets.len(), 1);
        assert_eq!(d.problems.len(), 1);
        assert!(d.problems[0].message.contains("loop"));
    }

    #[test]
    fn missing_roots_are_problems() {
        let d = discover(&[PathBuf::from("/no/such/root")], false);
        assert!(d.targets.is_empty());
        assert_eq!(d.problems[0].message, "does not exist");
    }
}
