//! Opening input files safely: only regular files are opened, so a FIFO,
//! socket or device planted in a store is refused instead of blocking the
//! reader forever.

use std::fs::File;
use std::path::Path;

use crate::error::{Area, Error, Result};

/// Open `path` for reading if it is a regular file (symlinks followed).
pub fn open_regular(path: &Path, area: Area) -> Result<File> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(area, path, &e))?;
    if meta.is_dir() {
        return Err(Error::new(area, path, "is a directory, expected a file"));
    }
    if !meta.is_file() {
        return Err(Error::new(
            area,
            path,
            "is not a regular file (a FIFO, socket or device); refusing to read it",
        ));
    }
    File::open(path).map_err(|e| Error::io(area, path, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_directories_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let e = open_regular(dir.path(), Area::Header).unwrap_err();
        assert!(e.message.contains("directory"));
        let e = open_regular(&dir.path().join("nope"), Area::Header).unwrap_err();
        assert_eq!(e.area, Area::Missing);
    }

    #[cfg(unix)]
    #[test]
    fn refuses_a_fifo_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("training_state.pt");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.map(|s| s.success()).unwrap_or(false) {
            let e = open_regular(&fifo, Area::TrainingState).unwrap_err();
            assert!(e.message.contains("FIFO"), "{e}");
        }
    }
}
