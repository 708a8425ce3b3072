//! A remote prefix laid out as a local tree of sparse files, filled by range
//! on first read.
//!
//! [`stage`] lists the prefix (one recursive `LIST`, paginated by the
//! client) and creates each object as a file of its real size holding no
//! data yet, so layout detection and size checks see exactly what they
//! would on disk.
//! The readers call `io::staged::fill` before reading a range; [`fill`]
//! fetches the missing part with range GETs (at least [`MIN_BLOCK`] bytes,
//! so one request covers a safetensors header or a zip entry's local header
//! and the start of its data) and writes it in place. A whole-file read is
//! refused over [`WHOLE_MAX`] bytes; nothing is ever fetched twice.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use futures::stream::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectMeta;

use crate::error::{Area, Error, Result};
use crate::io::staged;
use crate::remote::connect::{self, one_line, Limits, Remote};

/// The least a range fetch asks for: a speculative 64 KiB holds a
/// safetensors header (8 bytes + N) or a zip local header and its data's
/// start in one request.
pub const MIN_BLOCK: u64 = 64 << 10;
/// Largest single range request (bigger ranges are split; each request
/// then fits in the timeout and in memory).
pub const MAX_REQUEST: u64 = 16 << 20;
/// Bytes of range responses held in memory at once, over every reader
/// thread (a scan of a remote root runs 64 at once): a request waits for
/// room unless nothing else is in flight.
pub const MAX_BYTES_IN_FLIGHT: u64 = 256 << 20;

static IN_FLIGHT: (Mutex<u64>, std::sync::Condvar) = (Mutex::new(0), std::sync::Condvar::new());

/// Room for `n` more bytes in flight, held until the guard drops.
struct InFlight(u64);

impl InFlight {
    fn take(n: u64) -> Self {
        let (lock, room) = &IN_FLIGHT;
        let mut held = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *held > 0 && *held + n > MAX_BYTES_IN_FLIGHT {
            held = room
                .wait(held)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *held += n;
        Self(n)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let (lock, room) = &IN_FLIGHT;
        let mut held = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *held = held.saturating_sub(self.0);
        room.notify_all();
    }
}
/// A file read whole (logs, JSON) larger than this is refused: the largest
/// whole-file cap of the local readers (`trainer_state.json`).
pub const WHOLE_MAX: u64 = 512 << 20;
/// Levels listed below the root, as deep as the local walk goes.
pub const MAX_DEPTH: usize = 64;
/// Objects staged under one root before the listing gives up.
pub const MAX_OBJECTS: usize = 1_000_000;
/// Keys per LIST page (S3's and GCS's default; Azure's is larger).
pub const LIST_PAGE: u64 = 1000;

/// One staged object: where it lives and which byte ranges are local.
struct Staged {
    location: ObjectPath,
    size: u64,
    /// Sorted, disjoint, non-adjacent ranges present in the local file.
    have: Vec<(u64, u64)>,
    bytes: u64,
    requests: u64,
}

/// A staged root.
struct Tree {
    dir: PathBuf,
    remote: Remote,
    files: HashMap<PathBuf, Mutex<Staged>>,
}

static TREES: RwLock<Vec<Arc<Tree>>> = RwLock::new(Vec::new());

/// What staging a root gave.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub objects: usize,
    pub bytes_listed: u64,
    pub list_requests: u64,
    /// Objects that could not be laid out locally: (URL, why).
    pub problems: Vec<(String, String)>,
}

/// Bytes and requests spent on one staged file.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    pub path: PathBuf,
    pub bytes: u64,
    pub requests: u64,
}

/// The path of `key` below `prefix` as safe relative parts, or why not.
fn relative_parts<'a>(prefix: &str, key: &'a str) -> std::result::Result<Vec<&'a str>, String> {
    let rest = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or("lies outside the listed prefix")?
    };
    let parts: Vec<&str> = rest.split('/').collect();
    for part in &parts {
        if part.is_empty() || *part == "." || *part == ".." || part.contains('\0') {
            return Err(format!(
                "has a name part {part:?} that cannot be a local file name"
            ));
        }
        if part.len() > 255 {
            return Err("has a name part longer than 255 bytes".into());
        }
    }
    Ok(parts)
}

/// The listing of a root: its objects sorted by key and the LIST requests
/// made.
struct Listing {
    objects: Vec<ObjectMeta>,
    requests: u64,
}

/// Longest a whole listing may take, whatever the server answers
/// (`ADAPTERPROBE_REMOTE_LIST_TIMEOUT` seconds): a server that answers every
/// page with a fresh continuation token and no key would list for ever.
const DEFAULT_LIST_SECONDS: f64 = 900.0;

fn list_deadline() -> Result<std::time::Duration> {
    let seconds = match std::env::var("ADAPTERPROBE_REMOTE_LIST_TIMEOUT") {
        Err(_) => DEFAULT_LIST_SECONDS,
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(v) if (0.1..=86_400.0).contains(&v) => v,
            _ => {
                return Err(connect::usage(
                    "",
                    format!(
                        "ADAPTERPROBE_REMOTE_LIST_TIMEOUT must be a number of seconds between \
                         0.1 and 86400, got {text:?}"
                    ),
                ))
            }
        },
    };
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Every object under the root's prefix, sorted by key, and the LIST
/// requests made. One recursive listing, paginated (a thousand keys per
/// request on S3): listing each directory level on its own would cost a
/// request per directory (about five per dlm store: 5,000 for 1,000 stores,
/// against 8 pages here).
///
/// Bounded whatever the server answers: by `MAX_OBJECTS`, by a key listed
/// twice (a listing that starts over), and by the time a whole listing may
/// take. A key that is no valid path (`.`/`..` or empty segments; legal in
/// S3) stops the listing with an error naming it: the client drops the
/// whole page it is on, and a scan that silently missed stores would pass
/// a gate it should not.
async fn list_all(remote: &Remote) -> Result<Listing> {
    let at = (!remote.prefix.as_ref().is_empty()).then_some(&remote.prefix);
    let allowed = list_deadline()?;
    let deadline = tokio::time::Instant::now() + allowed;
    let mut listing = remote.store.list(at);
    let mut objects: Vec<ObjectMeta> = vec![];
    let mut seen: std::collections::HashSet<String> = Default::default();
    loop {
        let item = match tokio::time::timeout_at(deadline, listing.next()).await {
            Ok(Some(item)) => item,
            Ok(None) => break,
            Err(_) => {
                return Err(connect::usage(
                    &remote.url,
                    format!(
                        "cannot list: the listing took longer than {} s (the server keeps \
                         answering with more pages; ADAPTERPROBE_REMOTE_LIST_TIMEOUT sets the limit)",
                        allowed.as_secs_f64()
                    ),
                ))
            }
        };
        let meta = match item {
            Ok(meta) => meta,
            Err(object_store::Error::InvalidPath { source }) => {
                // S3 and GCS pages are filtered before the client sees them
                // (`key_filter`); Azure's are not, and there the client
                // refuses the whole page such a key is on, so going on
                // would silently drop the keys beside it: stop, saying so.
                return Err(connect::usage(
                    &remote.url,
                    format!(
                        "cannot list: the bucket holds an object whose key is no valid path \
                         ({source}); S3 allows such keys, but they cannot be listed past \
                         here: point at a prefix without it"
                    ),
                ));
            }
            Err(e) => {
                return Err(connect::usage(
                    &remote.url,
                    format!("cannot list: {}", one_line(&e)),
                ))
            }
        };
        let depth = meta.location.as_ref().matches('/').count();
        if depth > MAX_DEPTH + remote.prefix.as_ref().matches('/').count() + 1 {
            return Err(connect::usage(
                &url_of(remote, meta.location.as_ref()),
                format!("lies deeper than {MAX_DEPTH} levels below the root, not listed"),
            ));
        }
        if !seen.insert(meta.location.as_ref().to_string()) {
            return Err(connect::usage(
                &url_of(remote, meta.location.as_ref()),
                "cannot list: the server listed this key twice (a listing that starts over \
                 would never end)",
            ));
        }
        objects.push(meta);
        if objects.len() > MAX_OBJECTS {
            return Err(connect::usage(
                &remote.url,
                format!("holds more than {MAX_OBJECTS} objects; point at a smaller prefix"),
            ));
        }
    }
    let requests = (objects.len() as u64).div_ceil(LIST_PAGE).max(1);
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(Listing { objects, requests })
}

/// The URL of object `key` of `remote`'s bucket.
fn url_of(remote: &Remote, key: &str) -> String {
    let prefix = remote.prefix.as_ref();
    let rest = key
        .strip_prefix(prefix)
        .map(|r| r.trim_start_matches('/'))
        .unwrap_or(key);
    if rest.is_empty() {
        remote.url.clone()
    } else {
        format!("{}/{rest}", remote.url)
    }
}

/// List `url` and lay its objects out under the empty directory `dir`,
/// which is then read like any local root (its files are fetched on first
/// read until [`release`]). An unreachable store, bad credentials, a missing
/// bucket or an empty prefix is a usage error naming the URL.
pub fn stage(url: &str, dir: &Path) -> Result<Summary> {
    let limits = Limits::from_env()?;
    let remote = connect::connect(url, &limits)?;
    let Listing {
        objects,
        requests: list_requests,
    } = connect::block_on(list_all(&remote))??;
    let (refused, refused_count) = remote.refused.take();
    if objects.is_empty() && refused_count > 0 {
        return Err(connect::usage(
            url,
            format!(
                "every object under it ({refused_count}) has a key that is no valid object \
                 path (an empty, '.' or '..' segment, or a control character)"
            ),
        ));
    }
    if objects.is_empty() {
        return Err(connect::usage(
            url,
            "no such prefix: nothing is stored under it (or it is a single object, not a \
             directory of them)",
        ));
    }
    let mut summary = Summary {
        list_requests,
        ..Summary::default()
    };
    for key in &refused {
        summary.problems.push((
            url_of(&remote, key),
            "its key is no valid object path (an empty, '.' or '..' segment, or a control \
             character): S3 allows such keys, but it cannot be read here; left out"
                .into(),
        ));
    }
    if refused_count > refused.len() as u64 {
        summary.problems.push((
            remote.url.clone(),
            format!(
                "{} more objects with keys that are no valid object path were left out",
                refused_count - refused.len() as u64
            ),
        ));
    }
    let mut files = HashMap::new();
    let mut made_dirs: std::collections::HashSet<PathBuf> = Default::default();
    let prefix = remote.prefix.as_ref().to_string();
    for meta in objects {
        let key = meta.location.as_ref();
        if key.ends_with('/') {
            continue; // a console's "folder" marker, not a file
        }
        let parts = match relative_parts(&prefix, key) {
            Ok(p) => p,
            Err(why) => {
                summary.problems.push((url_of(&remote, key), why));
                continue;
            }
        };
        let local = parts.iter().fold(dir.to_path_buf(), |p, part| p.join(part));
        // Keys come sorted, so a store's objects share their folders: each
        // folder is made once (create_dir_all per key made 12,500 mkdir
        // calls for 8,500 keys).
        let folder = local.parent().map(Path::to_path_buf);
        let made = match folder {
            Some(f) if !made_dirs.contains(&f) => std::fs::create_dir_all(&f).map(|()| {
                made_dirs.insert(f);
            }),
            _ => Ok(()),
        }
        .and_then(|()| File::create_new(&local))
        .and_then(|f| f.set_len(meta.size));
        if let Err(e) = made {
            let why = format!("cannot be laid out beside the other objects: {e}");
            summary.problems.push((url_of(&remote, key), why));
            continue;
        }
        summary.objects += 1;
        summary.bytes_listed += meta.size;
        files.insert(
            local,
            Mutex::new(Staged {
                location: meta.location,
                size: meta.size,
                have: vec![],
                bytes: 0,
                requests: 0,
            }),
        );
    }
    staged::install(fill, is_staged);
    let tree = Arc::new(Tree {
        dir: dir.to_path_buf(),
        remote,
        files,
    });
    if let Ok(mut trees) = TREES.write() {
        trees.retain(|t| t.dir != dir);
        trees.push(tree);
    }
    Ok(summary)
}

/// Forget the staged root `dir` (its files are read as plain local files
/// afterwards; the caller removes the directory).
pub fn release(dir: &Path) {
    if let Ok(mut trees) = TREES.write() {
        trees.retain(|t| t.dir != dir);
    }
}

/// Bytes and requests fetched so far for each file of the staged root `dir`
/// that was read, sorted by path.
pub fn fetched(dir: &Path) -> Vec<Fetched> {
    let Some(tree) = tree_of(dir) else {
        return vec![];
    };
    let mut out: Vec<Fetched> = tree
        .files
        .iter()
        .filter_map(|(path, s)| {
            let s = s.lock().ok()?;
            (s.requests > 0).then(|| Fetched {
                path: path.clone(),
                bytes: s.bytes,
                requests: s.requests,
            })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn tree_of(path: &Path) -> Option<Arc<Tree>> {
    let trees = TREES.read().ok()?;
    trees.iter().find(|t| path.starts_with(&t.dir)).cloned()
}

/// The parts of `lo..hi` not covered by `have`.
fn missing(have: &[(u64, u64)], lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut out = vec![];
    let mut at = lo;
    for &(a, b) in have {
        if b <= at {
            continue;
        }
        if a >= hi {
            break;
        }
        if a > at {
            out.push((at, a.min(hi)));
        }
        at = at.max(b);
        if at >= hi {
            break;
        }
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

/// The `gaps` each widened to at least `MIN_BLOCK` bytes (a speculative read
/// ahead), never into bytes already present nor past `size`.
fn widened(have: &[(u64, u64)], gaps: Vec<(u64, u64)>, size: u64) -> Vec<(u64, u64)> {
    gaps.into_iter()
        .map(|(lo, hi)| {
            let next = have
                .iter()
                .map(|&(a, _)| a)
                .find(|&a| a >= hi)
                .unwrap_or(size);
            (lo, hi.max(lo.saturating_add(MIN_BLOCK).min(next).min(size)))
        })
        .collect()
}

/// `have` with `a..b` added, merged with its neighbours.
fn add_range(have: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    have.push((a, b));
    have.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(have.len());
    for &(x, y) in have.iter() {
        match merged.last_mut() {
            Some(last) if x <= last.1 => last.1 = last.1.max(y),
            _ => merged.push((x, y)),
        }
    }
    *have = merged;
}

/// Whether `path` is a file of a staged remote root.
fn is_staged(path: &Path) -> bool {
    tree_of(path).is_some_and(|tree| tree.files.contains_key(path))
}

/// The filler installed in `io::staged`: fetch what is missing of
/// `offset..offset + len` (at least `MIN_BLOCK`) of a staged file.
fn fill(path: &Path, area: Area, offset: u64, len: u64) -> Result<()> {
    let Some(tree) = tree_of(path) else {
        return Ok(());
    };
    let Some(entry) = tree.files.get(path) else {
        return Ok(());
    };
    let mut s = entry
        .lock()
        .map_err(|_| Error::new(area, path, "a read of this remote object failed before"))?;
    if offset >= s.size {
        return Ok(());
    }
    if len == staged::TO_END && s.size > WHOLE_MAX {
        return Err(Error::new(
            area,
            path,
            format!(
                "is {} bytes, more than the {WHOLE_MAX}-byte limit on reading a remote object \
                 whole",
                s.size
            ),
        ));
    }
    let want = offset.saturating_add(len).min(s.size);
    let gaps = widened(&s.have, missing(&s.have, offset, want), s.size);
    if gaps.is_empty() {
        return Ok(());
    }
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(area, path, &e))?;
    for (lo, hi) in gaps {
        let mut at = lo;
        while at < hi {
            let stop = hi.min(at.saturating_add(MAX_REQUEST));
            let _room = InFlight::take(stop - at);
            let got = connect::block_on(tree.remote.store.get_range(&s.location, at..stop))?
                .map_err(|e| {
                    let why = match e {
                        object_store::Error::NotFound { .. } => {
                            "the object is gone: it was listed but reading it says not found"
                                .to_string()
                        }
                        other => format!("cannot read the remote object: {}", one_line(&other)),
                    };
                    Error::new(area, path, why)
                })?;
            s.requests += 1;
            s.bytes += got.len() as u64;
            if got.len() as u64 != stop - at {
                return Err(Error::new(
                    area,
                    path,
                    format!(
                        "the remote object is shorter than listed: asked for bytes {at}..{stop} \
                         of {}, got {} (truncated or replaced while being read)",
                        s.size,
                        got.len()
                    ),
                ));
            }
            write_at(&file, &got, at).map_err(|e| Error::io(area, path, &e))?;
            add_range(&mut s.have, at, stop);
            at = stop;
        }
    }
    Ok(())
}

#[cfg(unix)]
fn write_at(file: &File, bytes: &[u8], at: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, at)
}

#[cfg(not(unix))]
fn write_at(mut file: &File, bytes: &[u8], at: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.seek(SeekFrom::Start(at))?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ranges_are_the_gaps() {
        let have = vec![(10, 20), (30, 40)];
        assert_eq!(missing(&have, 0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(missing(&have, 12, 18), vec![]);
        assert_eq!(missing(&have, 15, 35), vec![(20, 30)]);
        assert_eq!(missing(&[], 5, 6), vec![(5, 6)]);
    }

    #[test]
    fn small_reads_are_widened_without_refetching() {
        let block = MIN_BLOCK;
        // A header read after the first block: nothing more is asked for.
        let have = vec![(0, block)];
        assert_eq!(widened(&have, missing(&have, 8, 2112), 10 * block), vec![]);
        // A gap is widened up to the next present range, not into it.
        let have = vec![(0, 10), (100, 200)];
        assert_eq!(
            widened(&have, missing(&have, 20, 30), 1 << 40),
            vec![(20, 100)]
        );
        assert_eq!(widened(&[], vec![(5, 6)], 50), vec![(5, 50)]);
        let far = widened(&[], vec![(0, 1)], 1 << 40);
        assert_eq!(far, vec![(0, block)]);
    }

    #[test]
    fn ranges_merge() {
        let mut have = vec![];
        add_range(&mut have, 30, 40);
        add_range(&mut have, 10, 20);
        add_range(&mut have, 20, 30);
        assert_eq!(have, vec![(10, 40)]);
        add_range(&mut have, 50, 60);
        assert_eq!(have, vec![(10, 40), (50, 60)]);
    }

    #[test]
    fn keys_become_safe_relative_paths() {
        assert_eq!(
            relative_parts("runs", "runs/a/b.json"),
            Ok(vec!["a", "b.json"])
        );
        assert_eq!(relative_parts("", "a"), Ok(vec!["a"]));
        assert!(relative_parts("runs", "other/a").is_err());
        assert!(relative_parts("runs", "runs/../x").is_err());
        assert!(relative_parts("runs", "runs/a//b").is_err());
    }

    #[test]
    fn unstaged_paths_are_left_alone() {
        assert!(fill(Path::new("/no/such/staged/file"), Area::Header, 0, 8).is_ok());
        assert!(fetched(Path::new("/no/such/staged")).is_empty());
    }
}
