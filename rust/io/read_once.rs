//! A store's small files read once, whoever asks for them.
//!
//! Several probes read the same files of a store: the adapter's safetensors
//! file is wanted by the weights check (its tensors) and by the ghost
//! check (its layer names), a `training_state.pt` is hashed for its sidecar
//! and then parsed. While one store is gathered ([`for_one_store`]), a file
//! of at most [`WHOLE_MAX`] bytes read through [`content`] is read whole
//! once and its bytes are handed to every later reader of the same path on
//! that thread. Outside that scope, or for a larger file, [`content`] opens
//! the file and the reader reads the ranges it needs, as before.
//!
//! The memo is per thread and lives only while the store is gathered, so a
//! scan never holds more than one store's small files per thread, and a
//! file is never served from another scan. Confinement is unchanged: the
//! first read opens the file through `files::open_sized`, which checks it.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::error::{Area, Result};
use crate::io::files::{self, Opened};
use crate::io::staged;

/// Largest file read whole and shared (the readers that use this read
/// files up to this size whole anyway).
pub const WHOLE_MAX: u64 = 1 << 20;
/// Most bytes one store's memo holds; past it, files are read but not kept.
const MEMO_MAX: usize = 16 << 20;
/// A staged remote file is read whole only when its first fetch (a block of
/// this size) brings all of it: reading more would fetch bytes no reader
/// asked for.
const STAGED_WHOLE_MAX: u64 = 64 << 10;

#[derive(Default)]
struct Memo {
    // Keyed by the path's bytes: a store's readers build the same paths
    // the same way, and a path spelled otherwise only costs a second read.
    files: FxHashMap<OsString, Arc<Vec<u8>>>,
    bytes: usize,
    /// Files found in a directory, by (what was looked for, directory).
    listings: FxHashMap<(&'static str, OsString), Vec<PathBuf>>,
    /// What each path asked about was, by its first `stat`.
    kinds: FxHashMap<OsString, Kind>,
    /// Values made from a file's bytes (its parsed header), by (what,
    /// path): see [`derived`].
    derived: FxHashMap<(&'static str, OsString), Arc<dyn Any + Send + Sync>>,
}

/// Most listings one store's memo holds.
const LISTINGS_MAX: usize = 64;
/// Most paths whose kind one store's memo holds (a store's readers ask
/// about a few dozen).
const KINDS_MAX: usize = 512;

/// What a path is, as `std::fs::metadata` (links followed) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Absent, or not looked into (any error: as `Path::exists` sees it).
    Missing,
    Dir,
    File,
    /// Something else: a fifo, a socket, a device.
    Other,
}

impl Kind {
    fn of(path: &Path) -> Kind {
        #[cfg(target_os = "linux")]
        if let Some(found) = crate::io::confine::file_type_from_root(path) {
            use rustix::fs::FileType;
            return match found {
                Err(_) => Kind::Missing,
                Ok(FileType::Directory) => Kind::Dir,
                Ok(FileType::RegularFile) => Kind::File,
                Ok(_) => Kind::Other,
            };
        }
        match std::fs::metadata(path) {
            Err(_) => Kind::Missing,
            Ok(m) if m.is_dir() => Kind::Dir,
            Ok(m) if m.is_file() => Kind::File,
            Ok(_) => Kind::Other,
        }
    }
}

/// What `path` is: one `stat` per path per store (several readers of a
/// store ask whether the same version folder and files exist), a fresh
/// one outside a store's scope.
pub fn kind(path: &Path) -> Kind {
    if let Some(known) = MEMO.with(|m| m.borrow().as_ref()?.kinds.get(path.as_os_str()).copied()) {
        return known;
    }
    let found = Kind::of(path);
    MEMO.with(|m| {
        if let Some(memo) = m.borrow_mut().as_mut() {
            if memo.kinds.len() < KINDS_MAX {
                memo.kinds.insert(path.as_os_str().to_owned(), found);
            }
        }
    });
    found
}

/// `path.is_dir()`, asked once per store (see [`kind`]).
pub fn is_dir(path: &Path) -> bool {
    kind(path) == Kind::Dir
}

/// `path.is_file()`, asked once per store (see [`kind`]).
pub fn is_file(path: &Path) -> bool {
    kind(path) == Kind::File
}

/// `path.exists()`, asked once per store (see [`kind`]).
pub fn exists(path: &Path) -> bool {
    kind(path) != Kind::Missing
}

thread_local! {
    static MEMO: RefCell<Option<Memo>> = const { RefCell::new(None) };
}

/// Puts the previous memo back when dropped (a panic or early return
/// inside [`for_one_store`] leaves nothing behind).
struct Restore(Option<Memo>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        MEMO.with(|m| *m.borrow_mut() = previous);
    }
}

/// Run `f` (the gathering of one store) with a fresh memo on this thread.
pub fn for_one_store<R>(f: impl FnOnce() -> R) -> R {
    let previous = MEMO.with(|m| m.replace(Some(Memo::default())));
    let _restore = Restore(previous);
    f()
}

/// What a reader gets: the whole file, or the file opened for ranged reads.
pub enum Content {
    Whole(Arc<Vec<u8>>),
    Open(Opened),
}

fn remembered(path: &Path) -> Option<Arc<Vec<u8>>> {
    MEMO.with(|m| m.borrow().as_ref()?.files.get(path.as_os_str()).cloned())
}

fn remember(path: &Path, bytes: &Arc<Vec<u8>>) {
    MEMO.with(|m| {
        if let Some(memo) = m.borrow_mut().as_mut() {
            if memo.bytes + bytes.len() <= MEMO_MAX {
                memo.bytes += bytes.len();
                memo.files
                    .insert(path.as_os_str().to_owned(), bytes.clone());
            }
        }
    });
}

/// `path`'s bytes when it is a regular file of at most [`WHOLE_MAX`] bytes
/// (read once per store, see the module), else the file opened.
pub fn content(path: &Path, area: Area) -> Result<Content> {
    if let Some(bytes) = remembered(path) {
        return Ok(Content::Whole(bytes));
    }
    let staged = staged::is_staged(path);
    let whole_max = if staged { STAGED_WHOLE_MAX } else { WHOLE_MAX };
    if staged {
        staged::fill(path, area, 0, whole_max)?;
    }
    let opened = files::open_sized(path, area)?;
    if opened.len > whole_max {
        return Ok(Content::Open(opened));
    }
    let mut out = vec![];
    files::read_rest(opened.file, path, area, whole_max, opened.len, &mut out)?;
    // Kept as the Vec it was read into: no copy into a fresh allocation.
    let bytes = Arc::new(out);
    remember(path, &bytes);
    Ok(Content::Whole(bytes))
}

/// What `make` builds from the file at `path` (`what` names it: a parsed
/// header), made once per store and shared with its later readers on this
/// thread, as the file's bytes are (see the module). An error is not kept:
/// the next reader makes it again.
pub fn derived<T: Send + Sync + 'static>(
    what: &'static str,
    path: &Path,
    make: impl FnOnce() -> Result<T>,
) -> Result<Arc<T>> {
    let key = (what, path.as_os_str().to_owned());
    let known = MEMO.with(|m| m.borrow().as_ref()?.derived.get(&key).cloned());
    if let Some(made) = known.and_then(|any| any.downcast::<T>().ok()) {
        return Ok(made);
    }
    let made = Arc::new(make()?);
    MEMO.with(|m| {
        if let Some(memo) = m.borrow_mut().as_mut() {
            if memo.derived.len() < DERIVED_MAX {
                memo.derived.insert(key, made.clone());
            }
        }
    });
    Ok(made)
}

/// Most values one store's memo holds (see [`derived`]).
const DERIVED_MAX: usize = 64;

/// The files `list` finds in `dir` (`what` names the kind looked for),
/// listed once per store: the training-drift and GAP readers both look for
/// a run's logs.
pub fn listing(
    what: &'static str,
    dir: &Path,
    list: impl FnOnce() -> Result<Vec<PathBuf>>,
) -> Result<Vec<PathBuf>> {
    let key = (what, dir.as_os_str().to_owned());
    if let Some(found) = MEMO.with(|m| m.borrow().as_ref()?.listings.get(&key).cloned()) {
        return Ok(found);
    }
    let found = list()?;
    MEMO.with(|m| {
        if let Some(memo) = m.borrow_mut().as_mut() {
            if memo.listings.len() < LISTINGS_MAX {
                memo.listings.insert(key, found.clone());
            }
        }
    });
    Ok(found)
}

/// A whole file read from start to end: the store's shared bytes when it
/// is small, else the file (a staged remote one fetched whole first).
pub struct Sequential {
    source: Content,
    at: usize,
    len: u64,
}

impl Sequential {
    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All of the file's bytes, when it was read whole (see [`content`]):
    /// a reader may go through them in place rather than copy them out.
    pub fn whole(&self) -> Option<&[u8]> {
        match &self.source {
            Content::Whole(bytes) => Some(bytes.as_slice()),
            Content::Open(_) => None,
        }
    }
}

impl std::io::Read for Sequential {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.source {
            Content::Whole(bytes) => {
                let rest = bytes.get(self.at..).unwrap_or_default();
                let n = rest.len().min(buf.len());
                buf[..n].copy_from_slice(&rest[..n]);
                self.at += n;
                Ok(n)
            }
            Content::Open(opened) => opened.file.read(buf),
        }
    }
}

/// `path` opened to be read whole, in order (see [`Sequential`]).
pub fn sequential(path: &Path, area: Area) -> Result<Sequential> {
    let source = content(path, area)?;
    let len = match &source {
        Content::Whole(bytes) => bytes.len() as u64,
        Content::Open(opened) => {
            staged::fill(path, area, 0, opened.len)?;
            opened.len
        }
    };
    Ok(Sequential { source, at: 0, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(c: Content) -> Arc<Vec<u8>> {
        match c {
            Content::Whole(b) => b,
            Content::Open(_) => panic!("expected the whole file"),
        }
    }

    #[test]
    fn a_small_file_is_read_once_per_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"first").unwrap();
        for_one_store(|| {
            assert_eq!(&*whole(content(&path, Area::Header).unwrap()), b"first");
            // Rewritten under the scan: the store still sees one version.
            std::fs::write(&path, b"second").unwrap();
            assert_eq!(&*whole(content(&path, Area::Header).unwrap()), b"first");
        });
        // The next store reads it afresh; so does a read outside a store.
        for_one_store(|| {
            assert_eq!(&*whole(content(&path, Area::Header).unwrap()), b"second");
            let mut read = String::new();
            let mut seq = sequential(&path, Area::Header).unwrap();
            std::io::Read::read_to_string(&mut seq, &mut read).unwrap();
            assert_eq!((read.as_str(), seq.len()), ("second", 6));
        });
        std::fs::write(&path, b"third").unwrap();
        assert_eq!(&*whole(content(&path, Area::Header).unwrap()), b"third");
    }

    #[test]
    fn a_listing_is_made_once_per_store() {
        let calls = std::cell::Cell::new(0);
        let list = || {
            calls.set(calls.get() + 1);
            Ok(vec![PathBuf::from("a")])
        };
        for_one_store(|| {
            for _ in 0..3 {
                assert_eq!(listing("logs", Path::new("d"), list).unwrap().len(), 1);
            }
        });
        assert_eq!(calls.get(), 1);
        listing("logs", Path::new("d"), list).unwrap();
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn a_value_made_from_a_file_is_made_once_per_store() {
        let calls = std::cell::Cell::new(0);
        let make = |fail: bool| {
            calls.set(calls.get() + 1);
            if fail {
                Err(crate::error::Error::new(
                    Area::Header,
                    Path::new("f"),
                    "bad",
                ))
            } else {
                Ok(7u32)
            }
        };
        for_one_store(|| {
            assert!(derived("n", Path::new("f"), || make(true)).is_err());
            for _ in 0..3 {
                assert_eq!(*derived("n", Path::new("f"), || make(false)).unwrap(), 7);
            }
            // Another kind of value of the same file is its own.
            assert_eq!(*derived("m", Path::new("f"), || make(false)).unwrap(), 7);
        });
        // The error was not kept; the value was made once, then once more.
        assert_eq!(calls.get(), 3);
        derived("n", Path::new("f"), || make(false)).unwrap();
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn a_path_is_looked_at_once_per_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v0001");
        for_one_store(|| {
            assert_eq!(kind(&path), Kind::Missing);
            std::fs::create_dir(&path).unwrap();
            // Made under the scan: this store keeps what it first saw.
            assert!(!exists(&path) && !is_dir(&path));
            assert!(is_dir(dir.path()) && !is_file(dir.path()));
        });
        // The next store, and a question outside a store, look afresh.
        for_one_store(|| assert!(is_dir(&path)));
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, b"x").unwrap();
        assert!(is_file(&path) && exists(&path));
    }

    #[test]
    fn a_large_file_is_opened_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, vec![7u8; WHOLE_MAX as usize + 1]).unwrap();
        match content(&path, Area::Header).unwrap() {
            Content::Open(o) => assert_eq!(o.len, WHOLE_MAX + 1),
            Content::Whole(_) => panic!("read whole"),
        }
    }

    #[test]
    fn errors_are_the_open_errors() {
        let dir = tempfile::tempdir().unwrap();
        let e = for_one_store(|| content(&dir.path().join("nope"), Area::Header))
            .err()
            .unwrap();
        assert_eq!(e.area, Area::Missing);
        let e = content(dir.path(), Area::Header).err().unwrap();
        assert!(e.message.contains("directory"), "{e}");
    }
}
