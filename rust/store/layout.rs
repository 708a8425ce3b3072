//! The store layouts a scan recognises, and the adapter versions in each.
//!
//! - `dlm`: `adapter/[<name>/]{current.txt, versions/vNNNN/}` and `logs/`.
//! - `hf-trainer`: an HF Trainer / TRL / axolotl output directory: its
//!   `checkpoint-N/` directories are the versions (newest: highest N), the
//!   curve is `trainer_state.json` plus TensorBoard events under `runs/`.
//! - `lightning`: a directory holding `*.ckpt` files (directly or under
//!   `checkpoints/`), e.g. `lightning_logs/version_0/`; each checkpoint is a
//!   version (newest: `last.ckpt`, else the highest step), the curve is
//!   `metrics.csv` or TensorBoard events.
//! - `peft`: a bare `save_pretrained` adapter directory (config + weights,
//!   no training state): weights-only checks.
//!
//! Classification only looks at names and file types (one directory listing);
//! nothing is read here. `rng_state.pth` and `training_args.bin` are never
//! opened by anything.

use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::analysis::layers::ADAPTER_WEIGHTS;
use crate::error::Area;
use crate::io::files::read_small;
use crate::store::torch_state::STATE_FILE;

/// Largest `current.txt` read.
const MAX_POINTER_BYTES: u64 = 4096;
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const TRAINER_STATE: &str = "trainer_state.json";
pub const HF_OPTIMIZER: &str = "optimizer.pt";

/// What a layout calls itself in records.
pub const DLM: &str = "dlm";
pub const HF_TRAINER: &str = "hf-trainer";
pub const LIGHTNING: &str = "lightning";
pub const PEFT: &str = "peft";

/// One store to probe, the adapter versions in it, and its layout.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub store: PathBuf,
    /// `dlm`, `hf-trainer`, `lightning` or `peft`.
    pub layout: String,
    /// Version directories (or, for Lightning, checkpoint files).
    pub versions: Vec<PathBuf>,
    /// Adapters whose versions could not be determined: (path, reason).
    pub broken: Vec<(PathBuf, String)>,
    /// Whether the store's loss curve is probed (false when the root was
    /// one adapter version).
    pub with_logs: bool,
}

impl Target {
    fn new(store: &Path, layout: &str) -> Target {
        Target {
            store: store.to_path_buf(),
            layout: layout.to_string(),
            versions: vec![],
            broken: vec![],
            with_logs: true,
        }
    }
}

/// The entries of `dir` (names and paths); empty when it cannot be listed
/// (the walk reports unlistable directories itself).
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                .collect()
        })
        .unwrap_or_default()
}

// ---- dlm ----

pub fn is_dlm_store(dir: &Path) -> bool {
    dir.join("adapter").is_dir() || dir.join("logs").is_dir()
}

fn is_adapter_root(dir: &Path) -> bool {
    dir.join("current.txt").is_file() || dir.join("versions").is_dir()
}

/// A directory that holds one trained adapter version.
pub fn is_version_dir(dir: &Path) -> bool {
    dir.join(ADAPTER_WEIGHTS).is_file()
        || dir.join(STATE_FILE).is_file()
        || dir.join(HF_OPTIMIZER).is_file()
}

/// `versions/vNNNN` dirs of an adapter root, sorted by name.
fn all_versions(adapter_root: &Path) -> std::result::Result<Vec<PathBuf>, String> {
    let versions = adapter_root.join("versions");
    let listed =
        fs::read_dir(&versions).map_err(|e| format!("cannot list {}: {e}", versions.display()))?;
    let mut out: Vec<PathBuf> = listed
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

/// The target for a dlm store directory.
pub fn dlm_target(store: &Path, all: bool) -> Target {
    let mut target = Target::new(store, DLM);
    let adapter = store.join("adapter");
    if !adapter.is_dir() {
        return target;
    }
    let roots: Vec<PathBuf> = if is_adapter_root(&adapter) {
        vec![adapter]
    } else {
        let mut named: Vec<PathBuf> = entries(&adapter).into_iter().map(|(_, p)| p).collect();
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

/// The `checkpoint-N/` directories of an HF output dir, by N.
pub fn hf_checkpoints(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = entries(dir)
        .into_iter()
        .filter_map(|(name, path)| Some((checkpoint_step(&name)?, path)))
        .filter(|(_, p)| p.is_dir())
        .filter(|(_, p)| {
            p.join(TRAINER_STATE).is_file()
                || p.join(HF_OPTIMIZER).is_file()
                || p.join(ADAPTER_WEIGHTS).is_file()
        })
        .collect();
    found.sort();
    found
}

pub fn is_hf_output(dir: &Path) -> bool {
    dir.join(TRAINER_STATE).is_file() || !hf_checkpoints(dir).is_empty()
}

/// The target for an HF Trainer output directory: its checkpoints (all, or
/// the newest); a run saved without checkpoints is its own single version.
pub fn hf_target(dir: &Path, all: bool) -> Target {
    let mut target = Target::new(dir, HF_TRAINER);
    let checkpoints = hf_checkpoints(dir);
    if checkpoints.is_empty() {
        if dir.join(ADAPTER_WEIGHTS).is_file() {
            target.versions.push(dir.to_path_buf());
        }
    } else if all {
        target.versions = checkpoints.into_iter().map(|(_, p)| p).collect();
    } else if let Some((_, newest)) = checkpoints.into_iter().last() {
        target.versions.push(newest);
    }
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

pub fn is_lightning_dir(dir: &Path) -> bool {
    !lightning_checkpoints(dir).is_empty()
}

pub fn lightning_target(dir: &Path, all: bool) -> Target {
    let mut target = Target::new(dir, LIGHTNING);
    let checkpoints = lightning_checkpoints(dir);
    if all {
        target.versions = checkpoints;
    } else if let Some(newest) = checkpoints.into_iter().last() {
        target.versions.push(newest);
    }
    target
}

// ---- bare PEFT ----

pub fn is_bare_peft(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG).is_file()
        && (dir.join(ADAPTER_WEIGHTS).is_file() || dir.join("adapter_model.bin").is_file())
}

pub fn peft_target(dir: &Path) -> Target {
    let mut target = Target::new(dir, PEFT);
    target.versions.push(dir.to_path_buf());
    target
}

/// The target a directory is, when it is one of the layouts (checked in
/// this order: dlm, HF Trainer, Lightning, bare PEFT); None to look deeper.
pub fn classify(dir: &Path, all: bool) -> Option<Target> {
    if is_dlm_store(dir) {
        Some(dlm_target(dir, all))
    } else if is_hf_output(dir) {
        Some(hf_target(dir, all))
    } else if is_lightning_dir(dir) {
        Some(lightning_target(dir, all))
    } else if is_bare_peft(dir) {
        Some(peft_target(dir))
    } else {
        None
    }
}

/// When a root is one version inside a known store (a dlm version dir, an
/// HF `checkpoint-N/`), that version alone, inside its store.
pub fn version_root(root: &Path) -> Option<Target> {
    if is_dlm_store(root) {
        return None;
    }
    if is_version_dir(root) {
        if let Some(store) = enclosing_dlm_store(root) {
            let mut t = Target::new(&store, DLM);
            t.versions.push(root.to_path_buf());
            t.with_logs = false;
            return Some(t);
        }
    }
    let name = root.file_name()?.to_str()?;
    let parent = root.parent()?;
    if checkpoint_step(name).is_some()
        && (is_version_dir(root) || root.join(TRAINER_STATE).is_file())
    {
        let mut t = Target::new(parent, HF_TRAINER);
        t.versions.push(root.to_path_buf());
        t.with_logs = false;
        return Some(t);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"x").unwrap();
    }

    #[test]
    fn hf_checkpoints_are_ordered_numerically() {
        let tmp = tempfile::tempdir().unwrap();
        for n in [10, 2, 100] {
            touch(&tmp.path().join(format!("checkpoint-{n}/{TRAINER_STATE}")));
        }
        fs::create_dir_all(tmp.path().join("checkpoint-x")).unwrap();
        fs::create_dir_all(tmp.path().join("checkpoint-7")).unwrap(); // empty: not one
        let t = classify(tmp.path(), false).unwrap();
        assert_eq!(t.layout, HF_TRAINER);
        assert_eq!(t.versions, vec![tmp.path().join("checkpoint-100")]);
        let every = classify(tmp.path(), true).unwrap();
        let names: Vec<_> = every
            .versions
            .iter()
            .map(|p| p.file_name().unwrap())
            .collect();
        assert_eq!(names, ["checkpoint-2", "checkpoint-10", "checkpoint-100"]);
        let one = version_root(&tmp.path().join("checkpoint-10")).unwrap();
        assert_eq!((one.store.as_path(), one.with_logs), (tmp.path(), false));
    }

    #[test]
    fn lightning_newest_is_last_then_highest_step() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = tmp.path().join("checkpoints");
        touch(&ck.join("epoch=0-step=50.ckpt"));
        touch(&ck.join("epoch=1-step=100.ckpt"));
        assert_eq!(
            classify(tmp.path(), false).unwrap().versions,
            vec![ck.join("epoch=1-step=100.ckpt")]
        );
        touch(&ck.join("last.ckpt"));
        let t = classify(tmp.path(), false).unwrap();
        assert_eq!(
            (t.layout.as_str(), t.versions[0].clone()),
            (LIGHTNING, ck.join("last.ckpt"))
        );
        assert_eq!(classify(tmp.path(), true).unwrap().versions.len(), 3);
    }

    #[test]
    fn bare_peft_and_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(classify(tmp.path(), false).is_none());
        touch(&tmp.path().join(ADAPTER_CONFIG));
        assert!(classify(tmp.path(), false).is_none());
        touch(&tmp.path().join(ADAPTER_WEIGHTS));
        let t = classify(tmp.path(), false).unwrap();
        assert_eq!((t.layout.as_str(), t.versions.len()), (PEFT, 1));
    }

    #[test]
    fn hostile_dlm_pointers_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        touch(&tmp.path().join("adapter/versions/v0001").join(STATE_FILE));
        for bad in ["../../etc", "/etc", "", "versions/v0009"] {
            fs::write(tmp.path().join("adapter/current.txt"), bad).unwrap();
            let t = dlm_target(tmp.path(), false);
            assert!(t.versions.is_empty(), "{bad}");
            assert_eq!(t.broken.len(), 1, "{bad}");
        }
    }
}
