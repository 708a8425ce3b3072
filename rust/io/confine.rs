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
            cache.paths.clear();
            cache.cwd = None;
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
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        match with_cache(|m| m.cwd.clone()).flatten() {
            Some(dir) => dir,
            None => {
                let dir = std::env::current_dir()?;
                with_cache(|m| m.cwd = Some(dir.clone()));
                dir
            }
        }
        .join(path)
    };
    resolve_cached(&absolute)
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
    real_path(path).is_ok_and(|real| !real.starts_with(root.as_path()))
}

/// Ok when `dir` may be listed: it resolves inside the root in force and
/// opens as a directory. Nothing is read from it (a caller that only asks
/// whether a folder can be looked into need not read all its entries).
pub fn can_list(dir: &Path, area: Area) -> Result<()> {
    check_path(dir, area)?;
    std::fs::read_dir(dir)
        .map(drop)
        .map_err(|e| Error::io(area, dir, &e))
}

/// The entries of directory `dir` (name, path, whether it is a directory,
/// links followed), after checking `dir` against the root in force. Names
/// that are not UTF-8 are kept (lossily converted) so nothing is hidden.
pub fn list_dir(dir: &Path, area: Area) -> Result<Vec<(String, PathBuf)>> {
    check_path(dir, area)?;
    let listing = std::fs::read_dir(dir).map_err(|e| Error::io(area, dir, &e))?;
    let mut out = vec![];
    for entry in listing {
        let entry = entry.map_err(|e| Error::io(area, dir, &e))?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            entry.path(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn links_out_of_the_root_are_refused_inside_are_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(tmp.path().join("secret"), b"s").unwrap();
        std::fs::write(root.join("sub/inside"), b"i").unwrap();
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

    #[cfg(target_os = "linux")]
    #[test]
    fn pseudo_files_are_refused_even_unconfined() {
        let p = Path::new("/proc/self/environ");
        let f = File::open(p).unwrap();
        let e = check_opened(&f, p, Area::LogFormat).unwrap_err();
        assert!(e.message.contains("pseudo-file"), "{e}");
    }
}
