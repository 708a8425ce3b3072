//! One adapter per training run: a run's checkpoints are near-copies of
//! its final adapter, so a store searched for duplicates would list every
//! run against its own last checkpoint. A run is the directory an adapter's
//! checkpoints sit in: `run/checkpoint-N/` (HF Trainer) and
//! `store/adapter/versions/vN/` (dlm) belong to `run` and `store`; any other
//! adapter directory is a run of its own, and the final adapter
//! `trainer.save_model()` writes at the top of `run/` is that run's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::formats::logs::trainer_state::{numbered_checkpoint_step, LAST_CHECKPOINT};
use crate::store::layout::natural_path_cmp;

/// How much a run's adapter is preferred: its final one over a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Standing {
    Checkpoint,
    Final,
}

/// The run `dir` belongs to, and whether it is that run's final adapter.
fn run_of(dir: &Path) -> (PathBuf, Standing) {
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
    let parent = dir.parent();
    let own = name(dir).unwrap_or_default();
    if numbered_checkpoint_step(&own).is_some() || own == LAST_CHECKPOINT {
        if let Some(run) = parent {
            return (run.to_path_buf(), Standing::Checkpoint);
        }
    }
    let versions = parent.filter(|p| name(p).as_deref() == Some("versions"));
    let adapter = versions.and_then(Path::parent);
    if let Some(store) = adapter
        .filter(|a| name(a).as_deref() == Some("adapter"))
        .and_then(Path::parent)
    {
        return (store.to_path_buf(), Standing::Checkpoint);
    }
    (dir.to_path_buf(), Standing::Final)
}

/// `dirs` with one adapter per run kept (the final one, else the newest
/// checkpoint in natural order), in sorted order, and how many were left out.
pub fn one_per_run(dirs: Vec<PathBuf>) -> (Vec<PathBuf>, u64) {
    let total = dirs.len();
    let mut best: BTreeMap<PathBuf, (Standing, PathBuf)> = BTreeMap::new();
    for dir in dirs {
        let (run, standing) = run_of(&dir);
        let better = match best.get(&run) {
            None => true,
            Some((kept, path)) => {
                standing > *kept
                    || (standing == *kept
                        && natural_path_cmp(&dir, path) == std::cmp::Ordering::Greater)
            }
        };
        if better {
            best.insert(run, (standing, dir));
        }
    }
    let mut kept: Vec<PathBuf> = best.into_values().map(|(_, dir)| dir).collect();
    kept.sort();
    let left_out = (total - kept.len()) as u64;
    (kept, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_run_keeps_its_final_adapter_else_its_newest_checkpoint() {
        let (kept, left_out) = one_per_run(paths(&[
            "r/a",
            "r/a/checkpoint-500",
            "r/a/checkpoint-1000",
            "r/b/checkpoint-40",
            "r/b/checkpoint-120",
            "r/b/checkpoint-9",
            "r/c",
            "s/adapter/versions/v0002",
            "s/adapter/versions/v0010",
        ]));
        assert_eq!(
            kept,
            paths(&[
                "r/a",
                "r/b/checkpoint-120",
                "r/c",
                "s/adapter/versions/v0010"
            ])
        );
        assert_eq!(left_out, 5);
    }

    #[test]
    fn the_order_given_does_not_matter() {
        let mut dirs = paths(&["x/checkpoint-2", "x", "x/checkpoint-10", "y/checkpoint-3"]);
        let (first, _) = one_per_run(dirs.clone());
        dirs.reverse();
        assert_eq!(one_per_run(dirs).0, first);
        assert_eq!(first, paths(&["x", "y/checkpoint-3"]));
    }
}
