//! Bounded directory walks: find files by name a few levels below a run.
//!
//! Trainers bury their logs (HF: `runs/<date>_<host>/`; Lightning:
//! `lightning_logs/version_N/`), so readers look a few levels down. The walk
//! is bounded in depth and in entries seen, never enters hidden or
//! symlinked directories (possible loops), and returns a stable order. The
//! directory searched must itself resolve inside the scanned root
//! (`io::confine`); the files found are checked again when opened.

use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};

/// Subdirectory levels searched below a directory for event files or a
/// `metrics.csv` (HF: `runs/<date>_<host>/`; Lightning: `lightning_logs/version_N/`).
pub const MAX_SEARCH_DEPTH: usize = 4;
/// Directory entries looked at in one search before it gives up.
pub const MAX_SEARCH_ENTRIES: usize = 100_000;

/// Files whose name `matches`, in `dir` and up to `MAX_SEARCH_DEPTH`
/// subdirectory levels below it, sorted by file name (then path). Hidden
/// directories and symlinked directories (possible loops) are not entered.
pub fn files_under(dir: &Path, area: Area, matches: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    crate::io::confine::check_path(dir, area)?;
    let mut found = vec![];
    let mut level = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    for depth in 0..=MAX_SEARCH_DEPTH {
        let mut next_level = vec![];
        for current in &level {
            let entries = std::fs::read_dir(current).map_err(|e| Error::io(area, current, &e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(area, current, &e))?;
                seen += 1;
                if seen > MAX_SEARCH_ENTRIES {
                    return Err(Error::new(
                        area,
                        dir,
                        format!(
                            "holds more than {MAX_SEARCH_ENTRIES} entries within \
                             {MAX_SEARCH_DEPTH} levels; point at the run's own directory"
                        ),
                    ));
                }
                let file_name = entry.file_name();
                let Some(name) = file_name.to_str() else {
                    continue;
                };
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir {
                    if depth < MAX_SEARCH_DEPTH && !name.starts_with('.') {
                        next_level.push(entry.path());
                    }
                } else if matches(name) {
                    found.push(entry.path());
                }
            }
        }
        level = next_level;
    }
    found.sort_by(|a, b| a.file_name().cmp(&b.file_name()).then_with(|| a.cmp(b)));
    Ok(found)
}

/// Files and bytes a plain walk reads: every regular file under `root`
/// (links not followed, hidden entries included) whose name is not in
/// `skip`, opened and read to its end once, directories in parallel on the
/// rayon pool in force. The floor a store scan is measured against
/// (`benches/bench_scan.py`): the same files read with nothing else done.
/// Bounded like any walk here: at most `MAX_FLOOR_DEPTH` levels.
pub fn read_tree(root: &Path, skip: &[String]) -> (u64, u64) {
    use rayon::prelude::*;
    use std::io::Read;
    fn visit(dir: &Path, skip: &[String], depth: usize) -> (u64, u64) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return (0, 0);
        };
        let entries: Vec<_> = entries.flatten().collect();
        entries
            .par_iter()
            .map(|entry| {
                let Ok(kind) = entry.file_type() else {
                    return (0, 0);
                };
                if kind.is_dir() && depth < MAX_FLOOR_DEPTH {
                    return visit(&entry.path(), skip, depth + 1);
                }
                let name = entry.file_name();
                if !kind.is_file() || skip.iter().any(|s| name.to_str() == Some(s)) {
                    return (0, 0);
                }
                let mut bytes = Vec::new();
                match std::fs::File::open(entry.path()).and_then(|mut f| f.read_to_end(&mut bytes))
                {
                    Ok(n) => (1, n as u64),
                    Err(_) => (0, 0),
                }
            })
            .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
    visit(root, skip, 0)
}

/// Deepest level [`read_tree`] descends to.
const MAX_FLOOR_DEPTH: usize = 64;
