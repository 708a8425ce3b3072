//! Opening input files safely: only regular files are read, so a FIFO,
//! socket or device planted in a store is refused instead of blocking the
//! reader forever.
//!
//! The file is opened first (non-blocking, so opening a FIFO cannot wait
//! for a writer) and the *opened* file is checked, never the path before
//! opening it: a FIFO renamed into place between a check and an open could
//! otherwise still block the reader. Symlinks are followed (stores are often
//! assembled from links) while they stay inside the scanned root
//! (`io::confine`); a link to a FIFO is refused like the FIFO, a link to a
//! kernel pseudo-file (`/proc/self/environ`) like a link out of the root.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Area, Error, Result};
use crate::io::staged;

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK from <fcntl.h>: 0o4000 on Linux (x86, arm), 0x4 on macOS/BSD.
    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    const O_NONBLOCK: i32 = 0x0004;
    #[cfg(not(any(target_os = "macos", target_os = "ios", target_os = "freebsd")))]
    const O_NONBLOCK: i32 = 0o4000;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

/// Read from `reader` until `buf` is full or the input ends; how many
/// bytes were read (fewer than `buf` holds only at the end of the input).
pub fn read_full(reader: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Open `path` for reading if it is a regular file (symlinks followed while
/// they stay under the root in force, see `io::confine`).
/// Reads on a regular file never block, so the non-blocking flag used to
/// open it changes nothing afterwards.
pub fn open_regular(path: &Path, area: Area) -> Result<File> {
    staged::fill(path, area, 0, staged::TO_END)?;
    open_ranged(path, area)
}

/// [`open_regular`] for a reader that reads by position and calls
/// [`staged::fill`] for each range before reading it (a staged remote file
/// is then fetched by ranges, not whole).
pub fn open_ranged(path: &Path, area: Area) -> Result<File> {
    open_sized(path, area).map(|opened| opened.file)
}

/// A regular file opened for reading, with the length its one `stat` gave.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub len: u64,
}

/// [`open_ranged`] that also hands back the file's length, so a reader
/// needs no second `stat` of a file just opened.
pub fn open_sized(path: &Path, area: Area) -> Result<Opened> {
    let (opened, beneath) = match crate::io::confine::open_beneath(path) {
        Some(opened) => (opened, true),
        None => (open_nonblocking(path), false),
    };
    let file = opened.map_err(|e| Error::io(area, path, &e))?;
    let meta = file.metadata().map_err(|e| Error::io(area, path, &e))?;
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
    if !beneath {
        crate::io::confine::check_opened(&file, path, area)?;
    }
    Ok(Opened {
        file,
        len: meta.len(),
    })
}

/// Read the rest of `file` (at most `max` bytes) into `out`, `expected`
/// bytes by the `stat` of the opened file; refused when it holds more than
/// `max`, which a file growing while it is read can make it do. A file as
/// long as its `stat` said takes one read (room is left for one byte more,
/// so a file that grew since shows it and is read on); `read_to_end`
/// started at 8 KiB, doubled, and read once more to find the end.
pub fn read_rest(
    mut file: File,
    path: &Path,
    area: Area,
    max: u64,
    expected: u64,
    out: &mut Vec<u8>,
) -> Result<()> {
    let io = |e: std::io::Error| Error::io(area, path, &e);
    let start = out.len();
    let room = expected.min(max).saturating_add(1);
    let room = usize::try_from(room)
        .unwrap_or(usize::MAX)
        .min(WHOLE_ROOM_MAX);
    out.resize(start + room, 0);
    let mut got = 0;
    while got < room {
        match file.read(&mut out[start + got..]) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if got as u64 == expected {
                    break; // as long as its stat said: that is the end
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    out.truncate(start + got);
    if got == room {
        // Longer than expected (it grew): the rest, still bounded.
        file.take(max.saturating_add(1).saturating_sub(got as u64))
            .read_to_end(out)
            .map_err(io)?;
    }
    if (out.len() - start) as u64 > max {
        return Err(Error::new(
            area,
            path,
            format!("grew past the {max}-byte limit"),
        ));
    }
    Ok(())
}

/// Most bytes [`read_rest`] sets aside before reading (a larger file's
/// rest is read as it comes).
const WHOLE_ROOM_MAX: usize = 64 << 20;

/// The whole content of the regular file `path`, refused when it is larger
/// than `max` bytes (checked on the opened file, and again while reading in
/// case it grows).
pub fn read_small(path: &Path, area: Area, max: u64) -> Result<Vec<u8>> {
    staged::fill(path, area, 0, max.saturating_add(1))?;
    let Opened { file, len } = open_sized(path, area)?;
    if len > max {
        return Err(Error::new(
            area,
            path,
            format!("is {len} bytes, more than the {max}-byte limit"),
        ));
    }
    let mut out = vec![];
    read_rest(file, path, area, max, len, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Whatever length the caller expected (a file may have shrunk or
        /// grown since its `stat`), the bytes are the file's, and a file
        /// over `max` is refused.
        #[test]
        fn read_rest_gives_the_files_bytes_whatever_length_was_expected(
            content in proptest::collection::vec(proptest::num::u8::ANY, 0..20_000),
            expected in 0usize..20_000,
            max in 0u64..20_000,
            prefix in 0usize..3,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            std::fs::write(&path, &content).unwrap();
            let mut out = vec![7u8; prefix];
            let file = File::open(&path).unwrap();
            let got = read_rest(file, &path, Area::Header, max, expected as u64, &mut out);
            if content.len() as u64 > max {
                proptest::prop_assert!(got.unwrap_err().message.contains("limit"));
            } else {
                got.unwrap();
                proptest::prop_assert_eq!(&out[..prefix], &vec![7u8; prefix][..]);
                proptest::prop_assert_eq!(&out[prefix..], &content[..]);
            }
        }
    }

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
    fn refuses_devices_and_links_to_fifos() {
        let e = open_regular(Path::new("/dev/zero"), Area::Header).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.map(|s| s.success()).unwrap_or(false) {
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&fifo, &link).unwrap();
            let start = std::time::Instant::now();
            assert!(open_regular(&link, Area::Header).is_err());
            assert!(read_small(&link, Area::Header, 10).is_err());
            assert!(start.elapsed() < std::time::Duration::from_secs(5));
        }
        let small = dir.path().join("small");
        std::fs::write(&small, b"12345").unwrap();
        assert_eq!(read_small(&small, Area::Header, 5).unwrap(), b"12345");
        assert!(read_small(&small, Area::Header, 4).is_err());
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
