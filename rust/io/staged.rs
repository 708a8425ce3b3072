//! Files staged from remote storage, whose bytes arrive on first read.
//!
//! A remote scan (the `remote` room) lists a bucket prefix and lays its
//! objects out as sparse files of their real sizes in a local directory;
//! every reader then runs unchanged on that tree. Before a reader touches a
//! byte range it calls [`fill`], which asks the installed filler to fetch
//! the range if it is not there yet. No filler is installed until a remote
//! root is scanned, so for local files [`fill`] is one atomic load.
//!
//! The filler is a plain function installed once (by `remote::install`):
//! this room cannot depend on the one that knows object stores.

use std::path::Path;
use std::sync::OnceLock;

use crate::error::{Area, Result};

/// Make bytes `offset..offset + len` of the staged file at `path` present
/// (`len` may run past the end: up to the end). A path that is not staged
/// is left alone. Errors name `path` in `area`.
pub type Filler = fn(path: &Path, area: Area, offset: u64, len: u64) -> Result<()>;

/// Whether `path` is a staged remote file (its bytes arrive on first read).
pub type IsStaged = fn(path: &Path) -> bool;

static FILLER: OnceLock<(Filler, IsStaged)> = OnceLock::new();

/// Ask for the whole file (capped by the filler).
pub const TO_END: u64 = u64::MAX;

/// Install the filler and its test of staged paths (the first pair
/// installed stays).
pub fn install(filler: Filler, is_staged: IsStaged) {
    let _ = FILLER.set((filler, is_staged));
}

/// Whether `path` is a staged remote file; false for every local file.
#[inline]
pub fn is_staged(path: &Path) -> bool {
    FILLER.get().is_some_and(|(_, staged)| staged(path))
}

/// Fetch bytes `offset..offset + len` of `path` if it is a staged remote
/// file whose range is not present yet; nothing for local files.
#[inline]
pub fn fill(path: &Path, area: Area, offset: u64, len: u64) -> Result<()> {
    match FILLER.get() {
        None => Ok(()),
        Some((filler, _)) => filler(path, area, offset, len),
    }
}
