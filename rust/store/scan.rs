//! Find stores under roots and gather what each probe needs, in parallel.
//!
//! The walk stops at the first directory that is a store of a known layout
//! (`layout::classify`); everything below a root is searched in parallel,
//! symlink loops become problems, not errors. A directory that cannot be
//! listed becomes a target of layout `unreadable` (its record is an error:
//! nothing unreadable passes) and a link to a directory outside the root a
//! target of layout `outside-root` (a skip saying it was not followed),
//! unless links are followed anywhere (`follow_symlinks`). Each root's
//! resolved path is put in force (`io::confine`) while it is walked and
//! while its targets are gathered, so no reader leaves it either.
//! Gathering reads each store's inputs (`probe_inputs`) on a rayon pool;
//! the verdicts are computed by the Python probes, so a scan and a single
//! probe can never disagree.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rayon::prelude::*;

use crate::error::{Area, Error, Result};
use crate::io::confine::{self, Root};
use crate::io::read_once;
pub use crate::store::layout::Target;
use crate::store::layout::{self, natural_path_cmp};
use crate::store::probe_inputs::{direct_drift_input, drift_input_below};
pub use crate::store::probe_inputs::{
    full_weights_input, ghost_input, weights_input, DriftInput, FullWeightsInput, GhostInput,
    LogsStatus, TargetInputs, Wanted, WeightsInput,
};

/// Deepest directory level the walk descends to below a root.
const MAX_DEPTH: usize = 64;

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

/// The targets found under some roots, what could not be searched, and
/// the directories the walk passed over on purpose, each with the reason.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovery {
    pub targets: Vec<Target>,
    pub problems: Vec<Problem>,
    /// Directories not probed and not searched further, with why: hidden
    /// ones, folders with nothing a layout recognises, subfolders of a
    /// store that are no part of its layout.
    pub skipped: Vec<Problem>,
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

/// Folders a walk does not enter (`scan --exclude GLOB`): a pattern matches
/// a folder's name or its path relative to the root it was found under
/// (`*` stays within one folder name; `**` crosses them).
#[derive(Debug, Default)]
pub struct Exclude {
    set: Option<globset::GlobSet>,
    patterns: Vec<String>,
}

impl Exclude {
    /// The patterns compiled; an invalid one is a usage error naming it.
    pub fn new(patterns: &[String]) -> Result<Exclude> {
        if patterns.is_empty() {
            return Ok(Exclude::default());
        }
        let mut builder = globset::GlobSetBuilder::new();
        for p in patterns {
            let glob = globset::GlobBuilder::new(p.trim_end_matches('/'))
                .literal_separator(true)
                .build()
                .map_err(|e| Error::new(Area::Usage, "", format!("--exclude {p:?}: {e}")))?;
            builder.add(glob);
        }
        let set = builder
            .build()
            .map_err(|e| Error::new(Area::Usage, "", format!("--exclude: {e}")))?;
        Ok(Exclude {
            set: Some(set),
            patterns: patterns.to_vec(),
        })
    }

    /// The pattern that excludes `dir` (found under `root`), if one does.
    fn matching(&self, dir: &Path, root: &Path) -> Option<&str> {
        let set = self.set.as_ref()?;
        let name = dir.file_name().map(Path::new);
        let relative = dir.strip_prefix(root).ok();
        let hits = |p: &Path| set.matches(p);
        let first = name
            .map(hits)
            .filter(|h| !h.is_empty())
            .or_else(|| relative.map(hits).filter(|h| !h.is_empty()))?;
        first
            .first()
            .and_then(|&i| self.patterns.get(i))
            .map(String::as_str)
    }
}

struct Walk {
    all: bool,
    exclude: Exclude,
    /// Whether to keep what was passed over, and why (`Discovery::skipped`).
    explain: bool,
    seen: Mutex<HashSet<(u64, u64)>>,
    targets: Mutex<Vec<Target>>,
    problems: Mutex<Vec<Problem>>,
    skipped: Mutex<Vec<Problem>>,
}

impl Walk {
    fn skip(&self, path: &Path, why: impl FnOnce() -> String) {
        if !self.explain {
            return;
        }
        let why = why();
        if let Ok(mut s) = self.skipped.lock() {
            s.push(Problem {
                path: path.to_path_buf(),
                message: why,
            });
        }
    }

    fn problem(&self, path: &Path, message: String) {
        if let Ok(mut p) = self.problems.lock() {
            p.push(Problem {
                path: path.to_path_buf(),
                message,
            });
        }
    }

    /// A walk problem that goes in the records (`layout::UNREADABLE`,
    /// `layout::OUTSIDE_ROOT`), not only on stderr.
    fn refused(&self, path: &Path, layout: &str, why: String) {
        self.found(Target::problem(path, layout, why));
    }

    fn found(&self, target: Target) {
        if let Ok(mut t) = self.targets.lock() {
            t.push(target);
        }
    }

    /// Visit `dir`; `ancestors` are the ids on the path from the root;
    /// `known`: its metadata when the parent's listing already looked it
    /// up (one `stat` per directory).
    fn visit(
        &self,
        dir: &Path,
        known: Option<fs::Metadata>,
        ancestors: &[(u64, u64)],
        root_dir: &Path,
    ) {
        let meta = match known.map_or_else(|| fs::metadata(dir), Ok) {
            Ok(m) => m,
            Err(e) => {
                let why = format!("cannot be read ({e}); what it holds is not checked");
                return self.refused(dir, layout::UNREADABLE, why);
            }
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
        // The layout checks ask about the same few paths: one stat each.
        let (db, classified) = read_once::for_one_store(|| {
            (layout::mlflow_db_in(dir), layout::classify(dir, self.all))
        });
        if let Some(db) = &db {
            // The store's runs are stores of their own, whatever else the
            // directory is.
            for target in layout::mlflow_db_targets(db) {
                self.found(target);
            }
        }
        if let Some(target) = classified {
            if self.explain {
                for (path, why) in layout::unclaimed(&target) {
                    self.skip(&path, || why);
                }
            }
            return self.found(target);
        }
        // LoRA files of other tools: each file a store; the folder holding
        // them is their run's (its logs/ is read for them), not searched on.
        let loras = read_once::for_one_store(|| layout::lora_files(dir));
        if !loras.is_empty() {
            if self.explain {
                let folder = Target {
                    store: dir.to_path_buf(),
                    ..layout::lora_file_target(&loras[0])
                };
                for (path, why) in layout::unclaimed(&folder) {
                    self.skip(&path, || why);
                }
            }
            for file in &loras {
                self.found(layout::lora_file_target(file));
            }
            return;
        }
        if ancestors.len() >= MAX_DEPTH {
            return self.problem(dir, format!("deeper than {MAX_DEPTH} levels, not searched"));
        }
        let entries = match fs::read_dir(dir) {
            Ok(it) => it,
            Err(e) => {
                let why = format!("cannot be listed ({e}); what it holds is not checked");
                return self.refused(dir, layout::UNREADABLE, why);
            }
        };
        let mut subdirs = vec![];
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    let why =
                        format!("cannot be listed to the end ({e}); not all of it is checked");
                    self.refused(dir, layout::UNREADABLE, why);
                    break;
                }
            };
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            let path = entry.path();
            // The listing's own type (no syscall where the file system gives
            // it): a file is passed over unstated, a folder is stated from
            // the listed folder (not a link, so as if followed), and only a
            // link, or an entry of unknown type, is stated by its path.
            let file_type = entry.file_type();
            let meta = match &file_type {
                Ok(t) if t.is_file() => continue,
                Ok(t) if t.is_dir() => entry.metadata(),
                _ => fs::metadata(&path),
            };
            let meta = match meta {
                Ok(m) if m.is_dir() => m,
                _ => continue,
            };
            let is_link = file_type.is_ok_and(|t| t.is_symlink());
            if hidden {
                self.skip(&path, || "hidden directory: not searched".into());
            } else if let Some(pattern) = self.exclude.matching(&path, root_dir) {
                self.skip(&path, || {
                    format!("excluded by --exclude {pattern}: not searched")
                });
            } else if is_link && entry.file_name() == layout::WANDB_LATEST_RUN {
                self.skip(&path, || {
                    "W&B's link to its newest run: the run is scanned under its own name".into()
                });
            } else if is_link && confine::leads_outside(&path) {
                self.refused(&path, layout::OUTSIDE_ROOT, confine::OUTSIDE.to_string());
            } else {
                subdirs.push((path, meta));
            }
        }
        if subdirs.is_empty() {
            if db.is_none() {
                self.skip(dir, || layout::why_not_a_store(dir));
            }
            return;
        }
        let mut chain = ancestors.to_vec();
        chain.push(id);
        let root = confine::current();
        subdirs.par_iter().for_each(|(sub, meta)| {
            let meta = Some(meta.clone());
            confine::within(root.clone(), || self.visit(sub, meta, &chain, root_dir))
        });
    }
}

/// The loss curve of a store: its dlm logs, its HF run (`trainer_state.json`
/// and TensorBoard events), or its Lightning logs (`metrics.csv` or events).
/// A path that is no store itself is judged as a scan would find it: an
/// HF checkpoint by its own `trainer_state.json`, a folder holding one run
/// somewhere below (e.g. TensorBoard events in `runs/<name>/`) by that run.
pub fn drift_input(store: &Path) -> DriftInput {
    if let Some(input) = direct_drift_input(store) {
        return input;
    }
    let found = discover(&[store.to_path_buf()], false, false);
    let runs: Vec<&Target> = found
        .targets
        .iter()
        .filter(|t| t.with_logs && t.layout != layout::PEFT)
        .collect();
    drift_input_below(store, &runs)
}

/// Find the targets under `roots`: each root may be a store of any layout,
/// one adapter version (probed alone, inside its store), or any directory
/// with stores at any depth below it. Links are followed only inside each
/// root unless `follow_symlinks`; each target carries its root.
pub fn discover(roots: &[PathBuf], all: bool, follow_symlinks: bool) -> Discovery {
    discover_with(roots, all, follow_symlinks, false)
}

/// [`discover`], and with `explain` the directories passed over on purpose,
/// each with why, in `skipped` (one more listing per store and per leaf
/// directory, so only when asked).
pub fn discover_with(
    roots: &[PathBuf],
    all: bool,
    follow_symlinks: bool,
    explain: bool,
) -> Discovery {
    discover_within(roots, &[], all, follow_symlinks, explain)
}

/// [`discover_with`], each root confined to the directory at the same index
/// of `bounds` instead of to itself (a Hugging Face hub snapshot's files are
/// links into the cache's `blobs/`: its bound is the cache). A missing bound
/// is the root itself; a bound must hold its root.
pub fn discover_within(
    roots: &[PathBuf],
    bounds: &[PathBuf],
    all: bool,
    follow_symlinks: bool,
    explain: bool,
) -> Discovery {
    discover_excluding(
        roots,
        bounds,
        all,
        follow_symlinks,
        explain,
        Exclude::default(),
    )
}

/// [`discover_within`] that does not enter the folders `exclude` matches.
pub fn discover_excluding(
    roots: &[PathBuf],
    bounds: &[PathBuf],
    all: bool,
    follow_symlinks: bool,
    explain: bool,
    exclude: Exclude,
) -> Discovery {
    let walk = Walk {
        all,
        exclude,
        explain,
        seen: Mutex::new(HashSet::new()),
        targets: Mutex::new(vec![]),
        problems: Mutex::new(vec![]),
        skipped: Mutex::new(vec![]),
    };
    for (i, root) in roots.iter().enumerate() {
        let bound = bounds
            .get(i)
            .filter(|b| root.starts_with(b))
            .unwrap_or(root);
        if !root.exists() {
            walk.problem(root, "does not exist".into());
        } else if !root.is_dir() && crate::formats::logs::mlflow_db::is_mlflow_db(root) {
            // Confined to the file's folder, like a directory root: a folder
            // that cannot be resolved is a problem, never an unconfined read.
            let root_dir = match root.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let confined: Root = match (follow_symlinks, confine::root_of(root_dir)) {
                (true, _) => None,
                (false, Ok(real)) => Some(real),
                (false, Err(e)) => {
                    walk.problem(root, format!("its folder cannot be resolved: {e}"));
                    continue;
                }
            };
            confine::within(confined, || {
                for target in layout::mlflow_db_targets(root) {
                    walk.found(target);
                }
            });
        } else if !root.is_dir() && layout::is_lora_file(root) {
            // One LoRA file given alone: confined to its folder.
            let root_dir = match root.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            match (follow_symlinks, confine::root_of(root_dir)) {
                (true, _) => walk.found(layout::lora_file_target(root)),
                (false, Ok(real)) => {
                    confine::within(Some(real), || walk.found(layout::lora_file_target(root)))
                }
                (false, Err(e)) => {
                    walk.problem(root, format!("its folder cannot be resolved: {e}"))
                }
            }
        } else if !root.is_dir() {
            walk.problem(root, "is not a directory".into());
        } else {
            let confined: Root = match (follow_symlinks, confine::root_of(bound)) {
                (true, _) => None,
                (false, Ok(real)) => Some(real),
                (false, Err(e)) => {
                    walk.problem(root, format!("cannot be resolved: {e}"));
                    continue;
                }
            };
            confine::within(confined, || match layout::version_root(root) {
                Some(target) => walk.found(target),
                None => walk.visit(root, None, &[], root),
            });
        }
    }
    let mut targets = walk.targets.into_inner().unwrap_or_default();
    targets.sort_by(|a, b| {
        natural_path_cmp(&a.store, &b.store).then_with(|| {
            let pairs = a.versions.iter().zip(&b.versions);
            pairs
                .map(|(x, y)| natural_path_cmp(x, y))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| a.versions.len().cmp(&b.versions.len()))
        })
    });
    let mut problems = walk.problems.into_inner().unwrap_or_default();
    problems.sort_by(|a, b| a.path.cmp(&b.path));
    let mut skipped = walk.skipped.into_inner().unwrap_or_default();
    skipped.sort_by(|a, b| natural_path_cmp(&a.path, &b.path));
    Discovery {
        targets,
        problems,
        skipped,
    }
}

/// Gather the inputs of many targets in parallel, in target order.
pub fn probe_targets(targets: &[Target], wanted: Wanted) -> Vec<TargetInputs> {
    targets
        .par_iter()
        .map(|t| {
            let root = t.root.clone().map(std::sync::Arc::new);
            confine::within(root, || crate::store::probe_inputs::gather(t, wanted))
        })
        .collect()
}

/// Most reader threads a scan starts: far beyond any useful I/O parallelism,
/// and small enough that starting them is instant.
pub const MAX_WORKERS: usize = 256;

/// The scan pools made so far, by size (None: one thread per core), with
/// the process that made them: a forked child has none of their threads.
type Pools = std::collections::HashMap<Option<usize>, (u32, std::sync::Arc<rayon::ThreadPool>)>;
static POOLS: std::sync::Mutex<Option<Pools>> = std::sync::Mutex::new(None);

/// The rayon pool of `workers` threads (None: one per core) that scans run
/// on. Pools are kept for the process, so a scan's batches reuse warm
/// threads; each call starts a new generation of the threads' cache of
/// resolved paths (`confine::forget_real_paths`), so nothing resolved
/// outlives the call that resolved it.
pub fn pool(workers: Option<usize>) -> Result<std::sync::Arc<rayon::ThreadPool>> {
    if let Some(n) = workers {
        if n == 0 || n > MAX_WORKERS {
            return Err(Error::new(
                Area::Usage,
                "",
                format!("workers must be between 1 and {MAX_WORKERS}, got {n}"),
            ));
        }
    }
    crate::io::confine::forget_real_paths();
    let pid = std::process::id();
    let mut pools = POOLS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let pools = pools.get_or_insert_with(Default::default);
    if let Some((made_by, pool)) = pools.get(&workers) {
        if *made_by == pid {
            return Ok(pool.clone());
        }
    }
    let mut builder =
        rayon::ThreadPoolBuilder::new().start_handler(|_| crate::io::confine::cache_real_paths());
    if let Some(n) = workers {
        builder = builder.num_threads(n);
    }
    let made =
        std::sync::Arc::new(builder.build().map_err(|e| {
            Error::new(Area::Usage, "", format!("cannot start worker threads: {e}"))
        })?);
    pools.insert(workers, (pid, made.clone()));
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    fn mkdirs(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }

    fn version(store: &Path, adapter: &str, v: &str) -> PathBuf {
        let dir = mkdirs(store, &format!("{adapter}/versions/{v}"));
        fs::write(dir.join(crate::store::torch_state::STATE_FILE), b"x").unwrap();
        dir
    }

    #[test]
    fn excluded_folders_are_not_entered_and_say_why() {
        let tmp = tempfile::tempdir().unwrap();
        let keep = mkdirs(tmp.path(), "runs/keep");
        version(&keep, "adapter", "v0001");
        for rel in [
            "wandb/run-1",
            "outputs/old/a",
            "runs/ablation-3",
            "deep/x/wandb",
        ] {
            version(&mkdirs(tmp.path(), rel), "adapter", "v0001");
        }
        let patterns = ["wandb", "outputs/old", "runs/ablation-*"].map(String::from);
        let d = discover_excluding(
            &[tmp.path().to_path_buf()],
            &[],
            false,
            false,
            true,
            Exclude::new(&patterns).unwrap(),
        );
        let stores: Vec<&PathBuf> = d.targets.iter().map(|t| &t.store).collect();
        assert_eq!(stores, vec![&keep]);
        let why: Vec<String> = d.skipped.iter().map(|s| s.message.clone()).collect();
        assert!(why
            .iter()
            .any(|m| m == "excluded by --exclude wandb: not searched"));
        assert!(why.iter().any(|m| m.contains("--exclude outputs/old")));
        // `*` stays within a name: "runs/*" is not "runs/keep/deeper".
        assert!(Exclude::new(&["runs/*".into()])
            .unwrap()
            .matching(&tmp.path().join("runs/keep/adapter"), tmp.path())
            .is_none());
        let e = Exclude::new(&["[".into()]).unwrap_err();
        assert_eq!(e.area, Area::Usage);
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
        let d = discover(&[tmp.path().to_path_buf()], false, false);
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
        let all = discover(&[tmp.path().to_path_buf()], true, false);
        assert_eq!(all.targets[1].versions.len(), 2);
        assert_eq!(all.targets[2].versions.len(), 2);
    }

    #[test]
    fn a_version_dir_root_is_probed_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let v = version(tmp.path(), "adapter", "v0003");
        let d = discover(std::slice::from_ref(&v), false, false);
        assert_eq!(d.targets.len(), 1);
        assert_eq!(d.targets[0].store, tmp.path());
        assert_eq!(d.targets[0].versions, vec![v]);
        assert!(!d.targets[0].with_logs && d.targets[0].log_root.is_none());
    }

    #[cfg(unix)]
    #[test]
    fn symlink_loops_are_reported_not_followed_forever() {
        let tmp = tempfile::tempdir().unwrap();
        let a = mkdirs(tmp.path(), "a/b");
        std::os::unix::fs::symlink(tmp.path().join("a"), a.join("loop")).unwrap();
        mkdirs(tmp.path(), "a/store/logs");
        let d = discover(&[tmp.path().to_path_buf()], false, false);
        assert_eq!(d.targets.len(), 1);
        assert_eq!(d.problems.len(), 1);
        assert!(d.problems[0].message.contains("loop"));
    }

    #[cfg(unix)]
    #[test]
    fn links_out_of_the_root_are_records_not_walks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = mkdirs(tmp.path(), "root");
        let outside = mkdirs(tmp.path(), "elsewhere/store/logs");
        mkdirs(&root, "mine/logs");
        std::os::unix::fs::symlink("/", root.join("slash")).unwrap();
        std::os::unix::fs::symlink(outside.parent().unwrap(), root.join("theirs")).unwrap();
        std::os::unix::fs::symlink(root.join("mine"), root.join("alias")).unwrap();
        let d = discover(std::slice::from_ref(&root), false, false);
        let by_layout = |l: &str| -> Vec<PathBuf> {
            d.targets
                .iter()
                .filter(|t| t.layout == l)
                .map(|t| t.store.clone())
                .collect()
        };
        // The link inside the root reaches the same store, probed once.
        assert_eq!(by_layout(layout::DLM).len(), 1, "{:?}", d.targets);
        assert_eq!(
            by_layout(layout::OUTSIDE_ROOT),
            vec![root.join("slash"), root.join("theirs")]
        );
        let refused = d.targets.iter().find(|t| t.layout == layout::OUTSIDE_ROOT);
        assert!(refused.unwrap().broken[0]
            .1
            .contains("outside the scanned root"));
        let real_root = fs::canonicalize(&root).unwrap();
        assert!(d
            .targets
            .iter()
            .all(|t| t.root.as_ref() == Some(&real_root)));
        // Opting out follows them (the link to / is not used here: it
        // would walk the machine).
        fs::remove_file(root.join("slash")).unwrap();
        let d = discover(std::slice::from_ref(&root), false, true);
        assert_eq!(d.targets.len(), 2, "{:?}", d.targets);
        assert!(d.targets.iter().all(|t| t.root.is_none()));
    }

    #[cfg(unix)]
    #[test]
    fn gathering_stays_in_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = mkdirs(tmp.path(), "root");
        let store = mkdirs(&root, "store");
        let secret = tmp.path().join("secret.txt");
        fs::write(&secret, "versions/v0001\n").unwrap();
        version(&store, "adapter", "v0001");
        std::os::unix::fs::symlink(&secret, store.join("adapter/current.txt")).unwrap();
        let d = discover(std::slice::from_ref(&root), false, false);
        assert_eq!(d.targets.len(), 1);
        let t = &d.targets[0];
        assert!(t.versions.is_empty());
        assert!(
            t.broken[0].1.contains("outside the scanned root"),
            "{:?}",
            t.broken
        );
        // Followed when asked.
        let d = discover(std::slice::from_ref(&root), false, true);
        assert_eq!(d.targets[0].versions.len(), 1);
    }

    #[test]
    fn targets_and_skips_come_in_numeric_order() {
        let tmp = tempfile::tempdir().unwrap();
        let out = mkdirs(tmp.path(), "out");
        let roots: Vec<PathBuf> = [120, 40, 80]
            .iter()
            .map(|n| {
                let ck = mkdirs(&out, &format!("checkpoint-{n}"));
                fs::write(ck.join("optimizer.pt"), b"x").unwrap();
                ck
            })
            .collect();
        let d = discover(&roots, false, false);
        let order: Vec<&Path> = d.targets.iter().map(|t| t.versions[0].as_path()).collect();
        assert_eq!(order, [&roots[1], &roots[2], &roots[0]]);
        for n in [10, 9, 100] {
            mkdirs(tmp.path(), &format!("notes/run{n}"));
        }
        mkdirs(tmp.path(), ".cache/x");
        assert!(discover(&[tmp.path().to_path_buf()], false, false)
            .skipped
            .is_empty());
        let d = discover_with(&[tmp.path().to_path_buf()], false, false, true);
        let skipped: Vec<String> = d
            .skipped
            .iter()
            .map(|p| {
                p.path
                    .strip_prefix(tmp.path())
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(
            skipped,
            [".cache", "notes/run9", "notes/run10", "notes/run100"]
        );
        assert_eq!(d.skipped[0].message, "hidden directory: not searched");
        assert_eq!(d.skipped[1].message, "empty directory");
    }

    #[test]
    fn dlm_versions_in_numeric_order() {
        let tmp = tempfile::tempdir().unwrap();
        for v in ["v10", "v9", "v100"] {
            version(tmp.path(), "adapter", v);
        }
        let d = discover(&[tmp.path().to_path_buf()], true, false);
        let names: Vec<_> = d.targets[0]
            .versions
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, ["v9", "v10", "v100"]);
    }

    #[test]
    fn natural_order() {
        let cmp = |a: &str, b: &str| natural_path_cmp(Path::new(a), Path::new(b));
        assert_eq!(cmp("o/checkpoint-40", "o/checkpoint-120"), Ordering::Less);
        assert_eq!(
            cmp("o/checkpoint-40/x", "o/checkpoint-40"),
            Ordering::Greater
        );
        assert_eq!(cmp("a10/b", "a9/c"), Ordering::Greater);
        assert_eq!(cmp("v0010", "v10"), "v0010".cmp("v10"));
        let long = "9".repeat(40);
        assert_eq!(cmp(&format!("x{long}"), "x1"), Ordering::Greater);
        assert_eq!(cmp("x", "x"), Ordering::Equal);
    }

    #[test]
    fn missing_roots_are_problems() {
        let d = discover(&[PathBuf::from("/no/such/root")], false, false);
        assert!(d.targets.is_empty());
        assert_eq!(d.problems[0].message, "does not exist");
    }
}
