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
