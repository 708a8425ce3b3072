//! Git LFS pointers: the small text file a repository holds in place of a
//! large one until `git lfs pull` fetches it.
//!
//! Why: a run cloned without `git lfs pull` has a pointer where every weight,
//! optimizer state and often every log should be. Each reader fails on such
//! a file anyway; this module lets it say what the file is instead of what
//! its parser tripped on (a header length of 8 billion, "not a zip archive").
//! Readers call it only where they already fail, on the bytes they already
//! read, so a valid file costs nothing.
//!
//! A pointer is what git-lfs writes (spec v1): UTF-8 lines `key value\n`,
//! `version https://git-lfs.github.com/spec/v1` first, then (sorted) at
//! least `oid sha256:<64 hex>` and `size <bytes>`; it is under 1024 bytes.

use std::path::Path;

use crate::error::{Area, Error};
use crate::io::files::read_small;

/// How every pointer starts.
pub const SIGNATURE: &[u8] = b"version https://git-lfs.github.com/spec/";
/// git-lfs never writes a pointer this large.
pub const MAX_POINTER_BYTES: u64 = 1024;
/// Hex digits of the oid shown in messages.
const OID_SHOWN: usize = 12;
/// The fewest leading bytes that suggest a pointer (`version`).
const MIN_HEAD: usize = 7;

/// What a pointer says about the file it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// `sha256:<hex>` as written (None when the line is missing).
    pub oid: Option<String>,
    /// Bytes of the real file (None when the line is missing or not a number).
    pub size: Option<u64>,
}

/// Whether `head`, the first bytes of a file, may begin a pointer: it starts
/// with the signature, or is a prefix of it at least `version` long (a
/// reader that looked at only 8 or 12 bytes).
pub fn may_begin_pointer(head: &[u8]) -> bool {
    if head.len() >= SIGNATURE.len() {
        head.starts_with(SIGNATURE)
    } else {
        head.len() >= MIN_HEAD && SIGNATURE.starts_with(head)
    }
}

/// The pointer in `bytes` (a whole file), or None when it is not one.
pub fn parse_pointer(bytes: &[u8]) -> Option<Pointer> {
    if bytes.len() as u64 > MAX_POINTER_BYTES || !bytes.starts_with(SIGNATURE) {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let mut pointer = Pointer {
        oid: None,
        size: None,
    };
    for line in text.lines().skip(1) {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "oid" => pointer.oid = Some(value.trim().to_string()),
            "size" => pointer.size = value.trim().parse().ok(),
            _ => {}
        }
    }
    Some(pointer)
}

/// The words a reader's error uses for the pointer in `bytes`: "is a Git LFS
/// pointer (N bytes in LFS, oid sha256:abcd…), not the file: run `git lfs
/// pull`"; None when `bytes` is not a pointer.
pub fn describe_pointer(bytes: &[u8]) -> Option<String> {
    let pointer = parse_pointer(bytes)?;
    let mut facts = vec![];
    if let Some(size) = pointer.size {
        facts.push(format!("{size} bytes in LFS"));
    }
    if let Some(oid) = &pointer.oid {
        let shown: String = oid.chars().take("sha256:".len() + OID_SHOWN).collect();
        let more = if shown.len() < oid.len() { "…" } else { "" };
        facts.push(format!("oid {shown}{more}"));
    }
    let facts = if facts.is_empty() {
        String::new()
    } else {
        format!(" ({})", facts.join(", "))
    };
    Some(format!(
        "is a Git LFS pointer{facts}, not the file: run `git lfs pull`"
    ))
}

/// Whether `e` is a reader's refusal of a Git LFS pointer.
pub fn is_pointer_error(e: &Error) -> bool {
    e.details.iter().any(|(key, _)| *key == "lfs_pointer")
}

/// The error a reader in `area` gives for `path` when `bytes` (the whole
/// file, already read) is a pointer.
pub fn pointer_error(area: Area, path: &Path, bytes: &[u8]) -> Option<Error> {
    let message = describe_pointer(bytes)?;
    let pointer = parse_pointer(bytes)?;
    let mut err = Error::new(area, path, message).with("lfs_pointer", "true");
    if let Some(oid) = pointer.oid {
        err = err.with("lfs_oid", oid);
    }
    if let Some(size) = pointer.size {
        err = err.with("lfs_size", size.to_string());
    }
    Some(err)
}

/// For a reader that failed after reading only `head` (the first bytes of
/// `path`): when `head` may begin a pointer, the pointer error, reading the
/// (at most 1 KiB) file once more for its oid and size. Files whose first
/// bytes are not a pointer's are never read again.
pub fn pointer_error_at(area: Area, path: &Path, head: &[u8]) -> Option<Error> {
    if !may_begin_pointer(head) {
        return None;
    }
    let bytes = read_small(path, area, MAX_POINTER_BYTES).ok()?;
    pointer_error(area, path, &bytes)
}

/// For a reader that knows only that `path` is wrong (a digest mismatch):
/// the pointer error when the file is small enough to be a pointer and is
/// one. Reads at most 1 KiB, and only files that small.
pub fn pointer_error_in(area: Area, path: &Path) -> Option<Error> {
    let small = std::fs::metadata(path).is_ok_and(|m| m.len() <= MAX_POINTER_BYTES);
    if !small {
        return None;
    }
    let bytes = read_small(path, area, MAX_POINTER_BYTES).ok()?;
    pointer_error(area, path, &bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pointer as git-lfs writes it (`git lfs pointer --file=...`).
    pub(crate) fn pointer_text(oid_hex: &str, size: u64) -> String {
        format!("version https://git-lfs.github.com/spec/v1\noid sha256:{oid_hex}\nsize {size}\n")
    }

    /// The pointer git-lfs writes for the real file at `real`.
    pub(crate) fn pointer_for(real: &Path) -> String {
        use sha2::{Digest, Sha256};
        let bytes = std::fs::read(real).unwrap();
        let hex: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        pointer_text(&hex, bytes.len() as u64)
    }

    /// Replace a copy of the real file `real` in `dir` by its pointer, as a
    /// clone without `git lfs pull` has it; returns (pointer path, size).
    pub(crate) fn cloned_without_lfs(real: &Path, dir: &Path) -> (std::path::PathBuf, u64) {
        let name = real.file_name().unwrap();
        let path = dir.join(name);
        std::fs::write(&path, pointer_for(real)).unwrap();
        (path, std::fs::metadata(real).unwrap().len())
    }

    /// The error names the pointer, its size and the fix.
    pub(crate) fn assert_names_pointer(e: &Error, path: &Path, size: u64) {
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "{}: is a Git LFS pointer ({size} bytes in LFS, oid sha256:",
                path.display()
            )) && text.ends_with("not the file: run `git lfs pull`"),
            "{text}"
        );
    }

    pub(crate) const OID: &str = "4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393";

    #[test]
    fn describes_a_pointer() {
        let text = pointer_text(OID, 553_452);
        let said = describe_pointer(text.as_bytes()).unwrap();
        assert_eq!(
            said,
            "is a Git LFS pointer (553452 bytes in LFS, oid sha256:4d7a214614ab…), not the \
             file: run `git lfs pull`"
        );
        let p = parse_pointer(text.as_bytes()).unwrap();
        assert_eq!(p.size, Some(553_452));
        assert_eq!(p.oid.as_deref(), Some(format!("sha256:{OID}").as_str()));
    }

    #[test]
    fn other_text_is_not_a_pointer() {
        for bytes in [
            &b""[..],
            b"version 1\n",
            b"{\"version\": \"https://git-lfs.github.com/spec/v1\"}",
            b"\x08\x00\x00\x00\x00\x00\x00\x00{}",
        ] {
            assert!(describe_pointer(bytes).is_none(), "{bytes:?}");
        }
        let long = format!("{}{}", pointer_text(OID, 1), "x".repeat(2000));
        assert!(describe_pointer(long.as_bytes()).is_none());
    }

    #[test]
    fn heads_that_may_begin_one() {
        assert!(may_begin_pointer(b"version "));
        assert!(may_begin_pointer(b"version http"));
        assert!(may_begin_pointer(pointer_text(OID, 3).as_bytes()));
        assert!(!may_begin_pointer(b"versio"));
        assert!(!may_begin_pointer(b"version 2"));
        assert!(!may_begin_pointer(b"PK\x03\x04"));
    }

    #[test]
    fn reads_the_file_again_only_for_a_pointer_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, pointer_text(OID, 9)).unwrap();
        let e = pointer_error_at(Area::Header, &path, b"version ").unwrap();
        assert_eq!(e.area, Area::Header);
        assert!(e.to_string().starts_with(&format!(
            "{}: is a Git LFS pointer (9 bytes in LFS",
            path.display()
        )));
        assert!(e.details.contains(&("lfs_size", "9".to_string())));
        assert!(pointer_error_at(Area::Header, &path, b"\x10\x00\x00\x00").is_none());
    }
}
