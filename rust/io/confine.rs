//! Keeping a scan inside the roots it was given.
//!
//! A store is often someone else's: a pull request that adds a run, a
//! bucket other teams write to. Its files may be symlinks to anything the
//! scanning process can read (`/proc/self/environ`, `/etc/shadow`, `/`), so
//! by default a link is followed only when the real path it leads to stays
//! under the scanned root: resolve, then check the prefix (the rule `tar`
//! and `git` use). `--follow-symlinks` (`follow_symlinks=True`) lifts it.
//!
//! The root in force is carried per thread: a scan sets it around the work
//! for each target (`within`), and every place that hands work to another
//! rayon thread carries it along (`carried`), so every file the readers
//! open through `io::files::open_regular` and every directory listed
//! through `list_dir` is checked without each reader taking the root as an
//! argument. With no root set (a probe called on one path, or
//! `--follow-symlinks`) nothing is confined; pseudo-files under `/proc`
//! and `/sys` are refused either way (devices, FIFOs and sockets are refused
//! by `open_regular` itself).

use std::cell::RefCell;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Area, Error, Result};

/// What a scan pool thread remembers within one scan call: real paths by
/// the bytes of the absolute path they were resolved from (a path spelled
/// another way is resolved again, never wrongly), and the working
/// directory once asked (a scan of a relative root resolves every file it
/// opens from it, and a `getcwd` each time was 8 syscalls a store).
#[derive(Default)]
struct RealPaths {
    paths: rustc_hash::FxHashMap<std::ffi::OsString, PathBuf>,
    cwd: Option<PathBuf>,
    /// The root in force, opened once (see `open_beneath`).
    #[cfg(target_os = "linux")]
    /// None beside the root when it cannot be walked beneath (it holds the
    /// kernel's pseudo-files, or it does not open as a folder): asked once.
    root_dir: Option<(Arc<PathBuf>, Option<Arc<std::os::fd::OwnedFd>>)>,
}

/// The root a scan stays in: None when nothing is confined.
pub type Root = Option<Arc<PathBuf>>;

thread_local! {
    static ROOT: RefCell<Root> = const { RefCell::new(None) };
    /// Real paths already resolved on this thread (see `real_path`), with
    /// the generation they belong to; None (no caching) unless the thread is
    /// a scan pool's (`cache_real_paths`).
    static REAL: RefCell<Option<(u64, RealPaths)>> = const { RefCell::new(None) };
}

/// The current generation of the threads' caches of real paths: each scan
/// call starts a new one, and a thread's cache from an older one is dropped
/// before it is read.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Make every cache of real paths stale: called as each scan call starts,
/// so what was resolved is never trusted beyond the call that resolved it.
pub fn forget_real_paths() {
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// This thread's cache, emptied first when it is of an older generation.
fn with_cache<R>(f: impl FnOnce(&mut RealPaths) -> R) -> Option<R> {
    let now = GENERATION.load(std::sync::atomic::Ordering::SeqCst);
    REAL.with(|r| {
        let mut slot = r.borrow_mut();
        let (generation, cache) = slot.as_mut()?;
        if *generation != now {
            *cache = RealPaths::default();
            *generation = now;
        }
        Some(f(cache))
    })
}

/// Most real paths a thread keeps before starting afresh.
const REAL_CACHE_MAX: usize = 8192;

/// Let this thread remember resolved paths (for the threads of the scan
/// pools, `store::scan::pool`), each only within the scan call that
/// resolved it (see `forget_real_paths`). Each store's paths then cost one
/// `lstat` per new directory instead of a `getcwd` and a `readlink` per
/// component from `/` down.
pub fn cache_real_paths() {
    let now = GENERATION.load(std::sync::atomic::Ordering::SeqCst);
    REAL.with(|r| *r.borrow_mut() = Some((now, RealPaths::default())));
}

/// `fs::canonicalize(path)`, through this thread's cache when it has one:
/// a path whose last component is not a link resolves to its parent's real
/// path joined with its name (the parent resolved the same way); a link,
/// `..`, or a path without a parent is resolved by the kernel.
fn real_path(path: &Path) -> std::io::Result<PathBuf> {
    if REAL.with(|r| r.borrow().is_none()) {
        return std::fs::canonicalize(path);
    }
    resolve_cached(&absolute(path)?)
}

/// `path` made absolute from the working directory this thread's cache
/// holds (asked once per scan call).
fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    let cwd = match with_cache(|m| m.cwd.clone()).flatten() {
        Some(dir) => dir,
        None => {
            let dir = std::env::current_dir()?;
            with_cache(|m| m.cwd = Some(dir.clone()));
            dir
        }
    };
    Ok(cwd.join(path))
}

fn resolve_cached(path: &Path) -> std::io::Result<PathBuf> {
    use std::path::Component;
    if let Some(hit) = with_cache(|m| m.paths.get(path.as_os_str()).cloned()).flatten() {
        return Ok(hit);
    }
    let plain = path
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let real = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if plain => {
            if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
                std::fs::canonicalize(path)?
            } else {
                resolve_cached(parent)?.join(name)
            }
        }
        _ => std::fs::canonicalize(path)?,
    };
    with_cache(|cache| {
        if cache.paths.len() >= REAL_CACHE_MAX {
            cache.paths.clear();
        }
        cache
            .paths
            .insert(path.as_os_str().to_owned(), real.clone());
    });
    Ok(real)
}

/// What a refused link says, after its path.
pub const OUTSIDE: &str = "resolves through a symlink to a path outside the scanned root; not \
                           followed (--follow-symlinks follows links out of the root)";

/// The root in force on this thread.
pub fn current() -> Root {
    ROOT.with(|r| r.borrow().clone())
}

/// Restores the previous root when dropped, so a panic or an early return
/// inside `within` never leaves another target's root behind.
struct Restore(Root);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        ROOT.with(|r| *r.borrow_mut() = previous);
    }
}

/// Run `f` with `root` in force on this thread.
pub fn within<R>(root: Root, f: impl FnOnce() -> R) -> R {
    let previous = ROOT.with(|r| r.replace(root));
    let _restore = Restore(previous);
    f()
}

/// `f`, made to run with this thread's current root on whichever thread
/// calls it (for `par_iter().map(...)` and `rayon::join`).
pub fn carried<A, R>(f: impl Fn(A) -> R + Send + Sync) -> impl Fn(A) -> R + Send + Sync {
    let root = current();
    move |a| within(root.clone(), || f(a))
}

/// The canonical form of a scan root, the prefix every followed path must keep.
pub fn root_of(path: &Path) -> std::io::Result<Arc<PathBuf>> {
    std::fs::canonicalize(path).map(Arc::new)
}

/// Kernel pseudo-files: they look like regular files (size 0) but are
/// views of the machine (`/proc/self/environ` is the reader's environment).
fn is_pseudo(real: &Path) -> bool {
    ["/proc", "/sys"].iter().any(|top| real.starts_with(top))
}

/// Ok when `real` (a resolved path) may be read from this thread's root.
fn allowed(path: &Path, real: &Path, area: Area) -> Result<()> {
    if is_pseudo(real) {
        return Err(Error::new(
            area,
            path,
            "leads to a kernel pseudo-file (under /proc or /sys); refusing to read it",
        ));
    }
    match current() {
        Some(root) if !real.starts_with(root.as_path()) => Err(Error::new(area, path, OUTSIDE)),
        _ => Ok(()),
    }
}

/// The real path of an opened file: what the kernel says the descriptor is
/// (no race with a link swapped after opening), else the path resolved.
#[cfg(target_os = "linux")]
fn real_path_of(file: &File, path: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::io::AsRawFd;
    let fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    std::fs::read_link(fd).or_else(|_| std::fs::canonicalize(path))
}

#[cfg(not(target_os = "linux"))]
fn real_path_of(_file: &File, path: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

/// Whether `openat2` may be tried: cleared for good when the kernel lacks
/// it (before Linux 5.6) or a sandbox refuses it.
#[cfg(target_os = "linux")]
static OPENAT2_USABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// `path` opened for reading (non-blocking) by the kernel beneath the root
/// in force, in one call: `openat2` from the root's own descriptor with
/// `RESOLVE_BENEATH` refuses every step out of the root, links and `..`
/// included, as it resolves, so the file it opens needs no read-back of its
/// real path and no `lstat` of its folders (two to four syscalls a file).
///
/// None when the checked open (`open` then `check_opened`) must decide:
/// nothing confined, a thread that keeps no cache (only scan pool threads
/// hold the root open, per scan call), a path not spelled under the root,
/// a root under `/proc` or `/sys`, a link the kernel will not follow
/// beneath the root (an absolute link, even one pointing inside; a link out,
/// which the checked open then refuses), or a kernel without `openat2`.
/// A missing file or folder, or no permission, is the open's own error.
#[cfg(target_os = "linux")]
pub fn open_beneath(path: &Path) -> Option<std::io::Result<File>> {
    use rustix::fs::OFlags;
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    beneath(path, flags).map(|opened| opened.map(File::from))
}

/// `openat2(root, path relative to the root, flags, RESOLVE_BENEATH)`: the
/// descriptor, the open's own error, or None (see [`open_beneath`]).
#[cfg(target_os = "linux")]
fn beneath(
    path: &Path,
    flags: rustix::fs::OFlags,
) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
    use rustix::fs::{openat2, Mode, ResolveFlags};
    use rustix::io::Errno;
    use std::sync::atomic::Ordering::Relaxed;
    if !OPENAT2_USABLE.load(Relaxed) {
        return None;
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    match from_root(path, |dir, rel| {
        openat2(dir, rel, flags, Mode::empty(), resolve)
    })? {
        Ok(fd) => Some(Ok(fd)),
        Err(e) if [Errno::NOENT, Errno::NOTDIR, Errno::ACCESS].contains(&e) => Some(Err(e.into())),
        Err(e) if [Errno::NOSYS, Errno::PERM, Errno::INVAL, Errno::TOOBIG].contains(&e) => {
            OPENAT2_USABLE.store(false, Relaxed);
            None
        }
        // EXDEV (a link out of the root, or an absolute one), ELOOP, EAGAIN.
        Err(_) => None,
    }
}

/// `f(root's descriptor, path relative to the root)` on a thread that holds
/// the root open (see [`root_dir`]), for a path spelled plainly under the
/// root (see [`plainly_beneath`]); None elsewhere (see [`open_beneath`]).
#[cfg(target_os = "linux")]
fn from_root<R>(path: &Path, f: impl FnOnce(&std::os::fd::OwnedFd, &Path) -> R) -> Option<R> {
    use std::os::unix::ffi::OsStrExt;
    ROOT.with(|r| {
        let root = r.borrow();
        let root = root.as_ref()?;
        let dir = root_dir(root)?;
        let made_absolute;
        let absolute = if path.is_absolute() {
            path
        } else {
            made_absolute = absolute(path).ok()?;
            &made_absolute
        };
        let rel = plainly_beneath(absolute.as_os_str().as_bytes(), root.as_os_str().as_bytes())?;
        Some(f(&dir, Path::new(std::ffi::OsStr::from_bytes(rel))))
    })
}

/// `path` relative to `root` (both absolute, `root` as the kernel resolved
/// it, with no trailing `/`) when it is spelled plainly beneath it: `root`,
/// one `/`, then names, none of them `..` and the first not `.`. Anything
/// else (the root itself, `//`, `..`) is left to the checked open.
fn plainly_beneath<'a>(path: &'a [u8], root: &[u8]) -> Option<&'a [u8]> {
    let rel = path.strip_prefix(root)?.strip_prefix(b"/")?;
    let mut names = rel.split(|&b| b == b'/');
    let first = names.next()?;
    let plain = !matches!(first, b"" | b"." | b"..") && names.all(|name| name != b"..");
    plain.then_some(rel)
}

/// What `path` is, links followed as `std::fs::metadata` follows them,
/// asked by `statx` from the root's descriptor: the kernel walks only the
/// components below the root, where a path from `/` walks the root's own
/// each time (a store's readers ask about a dozen paths). Nothing is
/// confined by this: it only says what a later checked open will find.
/// None where [`from_root`] is None.
#[cfg(target_os = "linux")]
pub fn file_type_from_root(path: &Path) -> Option<std::io::Result<rustix::fs::FileType>> {
    use rustix::fs::{statx, AtFlags, FileType, StatxFlags};
    from_root(path, |dir, rel| {
        statx(dir, rel, AtFlags::empty(), StatxFlags::TYPE)
            .map(|st| FileType::from_raw_mode(st.stx_mode.into()))
            .map_err(std::io::Error::from)
    })
}

/// Directory `dir` opened for listing beneath the root (see
/// [`open_beneath`]): no `lstat` of its folders to check it first.
#[cfg(target_os = "linux")]
fn dir_beneath(dir: &Path) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
    use rustix::fs::OFlags;
    beneath(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC)
}

/// The names in directory `dir` read beneath the root ([`dir_beneath`]).
#[cfg(target_os = "linux")]
fn names_beneath(dir: &Path) -> Option<std::io::Result<Vec<std::ffi::OsString>>> {
    use std::os::unix::ffi::OsStrExt;
    let fd = match dir_beneath(dir)? {
        Ok(fd) => fd,
        Err(e) => return Some(Err(e)),
    };
    let listed = (|| -> rustix::io::Result<Vec<std::ffi::OsString>> {
        let mut names = vec![];
        for entry in rustix::fs::Dir::new(fd)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(std::ffi::OsStr::from_bytes(name).to_owned());
            }
        }
        Ok(names)
    })();
    Some(listed.map_err(std::io::Error::from))
}

#[cfg(not(target_os = "linux"))]
pub fn open_beneath(_path: &Path) -> Option<std::io::Result<File>> {
    None
}

/// The root in force opened as a directory descriptor, once per scan call
/// on a thread that keeps a cache (see `cache_real_paths`); None elsewhere,
/// and for a root at or above `/proc` or `/sys` (a scan of `/`), whose
/// pseudo-files need the checked open's refusal, or one that does not open
/// as a folder (a scan of one file): both known after the first ask.
#[cfg(target_os = "linux")]
fn root_dir(root: &Arc<PathBuf>) -> Option<Arc<std::os::fd::OwnedFd>> {
    use rustix::fs::{open, Mode, OFlags};
    let held = with_cache(|m| match &m.root_dir {
        Some((path, fd)) if Arc::ptr_eq(path, root) || path == root => Some(fd.clone()),
        _ => None,
    })?;
    if let Some(known) = held {
        return known;
    }
    let holds_pseudo = ["/proc", "/sys"]
        .iter()
        .any(|top| Path::new(top).starts_with(&**root));
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = if is_pseudo(root) || holds_pseudo {
        None
    } else {
        open(root.as_path(), flags, Mode::empty())
            .ok()
            .map(Arc::new)
    };
    with_cache(|m| m.root_dir = Some((root.clone(), fd.clone())));
    fd
}

/// Check an opened file against the root in force (and the pseudo-file rule).
pub fn check_opened(file: &File, path: &Path, area: Area) -> Result<()> {
    let real = real_path_of(file, path).map_err(|e| Error::io(area, path, &e))?;
    allowed(path, &real, area)
}

/// Check a path (a directory about to be listed) against the root in force.
pub fn check_path(path: &Path, area: Area) -> Result<()> {
    let real = real_path(path).map_err(|e| Error::io(area, path, &e))?;
    allowed(path, &real, area)
}

/// Whether `path` resolves outside the root in force (false when nothing is
/// confined or it cannot be resolved: the caller's own error says why).
pub fn leads_outside(path: &Path) -> bool {
    let Some(root) = current() else {
        return false;
    };
    // Opened beneath the root: inside it. Missing, or not looked into:
    // unresolvable, as `real_path` would find. A link the kernel will not
    // follow beneath the root (out, or absolute) is resolved by path.
    #[cfg(target_os = "linux")]
    if beneath(path, rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC).is_some() {
        return false;
    }
    real_path(path).is_ok_and(|real| !real.starts_with(root.as_path()))
}

/// Ok when `dir` may be listed: it resolves inside the root in force and
/// opens as a directory. Nothing is read from it (a caller that only asks
/// whether a folder can be looked into need not read all its entries).
pub fn can_list(dir: &Path, area: Area) -> Result<()> {
    #[cfg(target_os = "linux")]
    if let Some(opened) = dir_beneath(dir) {
        return opened.map(drop).map_err(|e| Error::io(area, dir, &e));
    }
    check_path(dir, area)?;
    std::fs::read_dir(dir)
        .map(drop)
        .map_err(|e| Error::io(area, dir, &e))
}

/// The names in directory `dir` (`.` and `..` left out), after checking
/// `dir` against the root in force: read beneath the root where it can be
/// (one `openat2`, see [`open_beneath`]), else checked and listed by path.
pub fn list_names(dir: &Path, area: Area) -> Result<Vec<std::ffi::OsString>> {
    #[cfg(target_os = "linux")]
    if let Some(listed) = names_beneath(dir) {
        return listed.map_err(|e| Error::io(area, dir, &e));
    }
    check_path(dir, area)?;
    let listing = std::fs::read_dir(dir).map_err(|e| Error::io(area, dir, &e))?;
    listing
        .map(|entry| {
            entry
                .map(|e| e.file_name())
                .map_err(|e| Error::io(area, dir, &e))
        })
        .collect()
}

/// The entries of directory `dir` (name, path), after checking `dir`
/// against the root in force (see [`list_names`]). Names that are not
/// UTF-8 are kept (lossily converted) so nothing is hidden.
pub fn list_dir(dir: &Path, area: Area) -> Result<Vec<(String, PathBuf)>> {
    Ok(list_names(dir, area)?
        .into_iter()
        .map(|name| (name.to_string_lossy().into_owned(), dir.join(name)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_spellings_are_walked_beneath_the_root() {
        let beneath = |p: &str| plainly_beneath(p.as_bytes(), b"/r/oot").map(|r| r.to_vec());
        for (path, rel) in [
            ("/r/oot/a", "a"),
            ("/r/oot/a/b.txt", "a/b.txt"),
            ("/r/oot/a/./b", "a/./b"),
            ("/r/oot/..a/b..", "..a/b.."),
        ] {
            assert_eq!(beneath(path), Some(rel.as_bytes().to_vec()), "{path}");
        }
        for path in [
            "/r/oot",
            "/r/oot/",
            "/r/ootx/a",
            "/r/oot//a",
            "/r/oot/./a",
            "/r/oot/.",
            "/r/oot/..",
            "/r/oot/a/../b",
            "/r/oot/a/..",
            "/r/oo",
            "r/oot/a",
        ] {
            assert_eq!(beneath(path), None, "{path}");
        }
    }

    /// `tmp/root/sub/inside` (holding `i`) and, outside the root,
    /// `tmp/secret` (holding `s`).
    fn root_beside_a_secret() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(tmp.path().join("secret"), b"s").unwrap();
        std::fs::write(root.join("sub/inside"), b"i").unwrap();
        (tmp, root)
    }

    #[cfg(unix)]
    #[test]
    fn links_out_of_the_root_are_refused_inside_are_followed() {
        let (tmp, root) = root_beside_a_secret();
        let out = root.join("out");
        std::os::unix::fs::symlink(tmp.path().join("secret"), &out).unwrap();
        let ok = root.join("ok");
        std::os::unix::fs::symlink(root.join("sub/inside"), &ok).unwrap();
        let r = Some(root_of(&root).unwrap());
        within(r.clone(), || {
            let f = File::open(&out).unwrap();
            let e = check_opened(&f, &out, Area::LogFormat).unwrap_err();
            assert!(e.message.contains("outside the scanned root"), "{e}");
            assert!(leads_outside(&out));
            let f = File::open(&ok).unwrap();
            check_opened(&f, &ok, Area::LogFormat).unwrap();
            assert!(!leads_outside(&ok));
            // Carried onto another thread.
            let on_other = carried(|p: PathBuf| leads_outside(&p));
            let out2 = out.clone();
            assert!(std::thread::scope(|s| s
                .spawn(move || on_other(out2))
                .join()
                .unwrap()));
        });
        // Not confined outside `within`, and restored after it.
        assert!(current().is_none());
        let f = File::open(&out).unwrap();
        check_opened(&f, &out, Area::LogFormat).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn cached_real_paths_are_the_kernels() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("a/b/c");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::create_dir_all(tmp.path().join("elsewhere/d")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), base.join("link")).unwrap();
        let cases = [
            base.clone(),
            base.join("link"),
            base.join("link/d"),
            base.join("../c/link/d"),
            tmp.path().join("a/b"),
        ];
        std::thread::spawn(move || {
            cache_real_paths();
            for round in 0..2 {
                for p in &cases {
                    assert_eq!(
                        real_path(p).unwrap(),
                        std::fs::canonicalize(p).unwrap(),
                        "{p:?} (round {round})"
                    );
                }
            }
            assert!(real_path(&cases[0].join("missing")).is_err());
            // A directory swapped for a link: trusted no longer once the
            // next scan call starts a new generation.
            let swapped = cases[0].join("swapped");
            std::fs::create_dir(&swapped).unwrap();
            assert_eq!(
                real_path(&swapped).unwrap(),
                std::fs::canonicalize(&swapped).unwrap()
            );
            std::fs::remove_dir(&swapped).unwrap();
            std::os::unix::fs::symlink(cases[1].join("d"), &swapped).unwrap();
            forget_real_paths();
            assert_eq!(
                real_path(&swapped).unwrap(),
                std::fs::canonicalize(&swapped).unwrap()
            );
        })
        .join()
        .unwrap();
        // Threads that did not ask keep nothing.
        assert!(REAL.with(|r| r.borrow().is_none()));
    }

    /// The kernel's walk beneath the root decides what it can, and hands
    /// the rest to the checked open: the same files read, the same refused.
    #[cfg(target_os = "linux")]
    #[test]
    fn opening_beneath_the_root_keeps_the_checked_opens_answers() {
        use crate::io::files::open_sized;
        let (tmp, root) = root_beside_a_secret();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, root.join(name)).unwrap();
            root.join(name)
        };
        let out = link(&tmp.path().join("secret"), "out");
        let relative_out = link(Path::new("../secret"), "relative_out");
        let inside = link(Path::new("sub/inside"), "inside");
        let absolute_inside = link(&root.join("sub/inside"), "absolute_inside");
        let dir_out = link(tmp.path(), "dir_out");
        let r = Some(root_of(&root).unwrap());
        std::thread::scope(|s| {
            s.spawn(|| {
                cache_real_paths();
                within(r.clone(), || {
                    let plain = root.join("sub/inside");
                    assert!(matches!(open_beneath(&plain), Some(Ok(_))));
                    assert!(matches!(open_beneath(&inside), Some(Ok(_))));
                    // Out of the root, or absolute: the checked open decides.
                    for p in [
                        &out,
                        &relative_out,
                        &absolute_inside,
                        &dir_out.join("secret"),
                    ] {
                        assert!(open_beneath(p).is_none(), "{p:?}");
                    }
                    assert!(open_beneath(&root.join("sub/../sub/inside")).is_none());
                    // Where a path leads: asked beneath the root, the same
                    // answers as resolving it from `/`.
                    for p in [&out, &relative_out, &dir_out.join("secret")] {
                        assert!(leads_outside(p), "{p:?}");
                    }
                    for p in [&plain, &inside, &absolute_inside, &root.join("sub/missing")] {
                        assert!(!leads_outside(p), "{p:?}");
                    }
                    // What a path is, links followed wherever they lead.
                    use rustix::fs::FileType;
                    for p in [&plain, &inside, &absolute_inside, &out] {
                        let found = file_type_from_root(p).unwrap().unwrap();
                        assert_eq!(found, FileType::RegularFile, "{p:?}");
                    }
                    let sub = file_type_from_root(&root.join("sub")).unwrap().unwrap();
                    assert_eq!(sub, FileType::Directory);
                    let missing = file_type_from_root(&root.join("sub/missing")).unwrap();
                    assert_eq!(missing.unwrap_err().kind(), std::io::ErrorKind::NotFound);
                    assert!(file_type_from_root(&root.join("sub/../sub")).is_none());
                    let missing = open_beneath(&root.join("sub/missing")).unwrap();
                    assert_eq!(missing.unwrap_err().kind(), std::io::ErrorKind::NotFound);
                    for p in [&plain, &inside, &absolute_inside] {
                        let mut text = String::new();
                        let opened = open_sized(p, Area::LogFormat).unwrap();
                        std::io::Read::read_to_string(&mut &opened.file, &mut text).unwrap();
                        assert_eq!((text.as_str(), opened.len), ("i", 1), "{p:?}");
                    }
                    for p in [&out, &relative_out, &dir_out.join("secret")] {
                        let e = open_sized(p, Area::LogFormat).unwrap_err();
                        assert!(e.message.contains("outside the scanned root"), "{p:?}: {e}");
                    }
                    // Folders: listed beneath the root, or refused as before.
                    assert!(matches!(names_beneath(&root.join("sub")), Some(Ok(_))));
                    assert!(names_beneath(&dir_out).is_none());
                    let sub_link = link(Path::new("sub"), "sub_link");
                    for dir in [root.join("sub"), sub_link] {
                        let names = list_names(&dir, Area::LogFormat).unwrap();
                        assert_eq!(names, ["inside"], "{dir:?}");
                    }
                    let e = list_names(&dir_out, Area::LogFormat).unwrap_err();
                    assert!(e.message.contains("outside the scanned root"), "{e}");
                    can_list(&root.join("sub"), Area::LogFormat).unwrap();
                    let e = can_list(&dir_out, Area::LogFormat).unwrap_err();
                    assert!(e.message.contains("outside the scanned root"), "{e}");
                    let e = can_list(&plain, Area::LogFormat).unwrap_err();
                    assert!(e.message.contains("Not a directory"), "{e}");
                    let e = list_names(&plain, Area::LogFormat).unwrap_err();
                    assert!(e.message.contains("Not a directory"), "{e}");
                    let mut all = list_names(&root, Area::LogFormat).unwrap();
                    all.sort();
                    assert_eq!(all.len(), 7, "{all:?}");
                });
                // Nothing confined: no walk beneath a root.
                assert!(open_beneath(&root.join("sub/inside")).is_none());
            });
        });
        // A thread that keeps no cache holds no root open.
        within(r, || {
            assert!(open_beneath(&root.join("sub/inside")).is_none())
        });
        // A root above /proc: its pseudo-files are still refused.
        std::thread::scope(|s| {
            s.spawn(|| {
                cache_real_paths();
                within(Some(root_of(Path::new("/")).unwrap()), || {
                    let environ = Path::new("/proc/self/environ");
                    assert!(open_beneath(environ).is_none());
                    let e = open_sized(environ, Area::LogFormat).unwrap_err();
                    assert!(e.message.contains("pseudo-file"), "{e}");
                });
            });
        });
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pseudo_files_are_refused_even_unconfined() {
        let p = Path::new("/proc/self/environ");
        let f = File::open(p).unwrap();
        let e = check_opened(&f, p, Area::LogFormat).unwrap_err();
        assert!(e.message.contains("pseudo-file"), "{e}");
    }
}
