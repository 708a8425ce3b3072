//! sha256 sidecars: dlm writes `<file>.sha256` beside a `training_state.pt`
//! with the file's digest, so a state modified or corrupted after it was
//! written is reported as such instead of as whatever the parser trips on.
//! Every state reader checks a sidecar when one is there.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Area, Error, Result};
use crate::io::files::{open_regular, Opened};
use crate::io::lfs;
use crate::io::read_once::{self, Content};

/// Run `parse` on `file`; when `<file>.sha256` sits beside it, its digest
/// must match the file's, else the result is an `Area::Integrity` error
/// (which wins over any parse error, since a tampered file explains both).
///
/// On a remote root the digest would fetch the whole file where the parser
/// reads a part of it, so there it is checked only when
/// `ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS=1` asks (the command line says
/// so when it scans a remote root).
pub fn verified<T: Send>(file: &Path, parse: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    if crate::io::staged::is_staged(file) && !verify_remote_checksums() {
        return parse();
    }
    let Some(expected) = read_sidecar(file)? else {
        return parse();
    };
    let digest = match read_once::content(file, Area::TrainingState)? {
        // A small file: hashed from the bytes the parser then reads too.
        Content::Whole(bytes) => hex_sha256(&bytes),
        // A large one: hashed and parsed in parallel. Either half may run
        // on another rayon thread: both keep the scan's root.
        Content::Open(opened) => {
            let root = crate::io::confine::current();
            let (root_a, root_b) = (root.clone(), root);
            let hash = || crate::io::confine::within(root_a, || sha256_stream(opened, file));
            let parse = || crate::io::confine::within(root_b, parse);
            let (digest, parsed) = rayon::join(hash, parse);
            return check_digest(file, digest?, &expected).and(parsed);
        }
    };
    check_digest(file, digest, &expected)?;
    parse()
}

/// Ok when `digest` is the one the sidecar records.
fn check_digest(file: &Path, digest: String, expected: &str) -> Result<()> {
    if digest != expected {
        // A clone without `git lfs pull` keeps the sidecar but not the file.
        if let Some(e) = lfs::pointer_error_in(Area::TrainingState, file) {
            return Err(e);
        }
        return Err(Error::new(
            Area::Integrity,
            file,
            format!(
                "sha256 is {digest} but {} records {expected}; the file was \
                 modified or corrupted after it was written",
                sidecar_path(file).display()
            ),
        )
        .with("expected", expected)
        .with("actual", digest));
    }
    Ok(())
}

/// Environment switch: check sidecars of staged remote files too.
pub const VERIFY_REMOTE_ENV: &str = "ADAPTERPROBE_REMOTE_VERIFY_CHECKSUMS";

/// Whether [`VERIFY_REMOTE_ENV`] asks for remote sidecars to be checked
/// (the one reader of that switch; the command line asks it too).
pub fn verify_remote_checksums() -> bool {
    std::env::var(VERIFY_REMOTE_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

pub fn sidecar_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// The lowercase hex digest recorded beside `file`, if there is a sidecar.
fn read_sidecar(file: &Path) -> Result<Option<String>> {
    let side = sidecar_path(file);
    let handle = match open_regular(&side, Area::Integrity) {
        Ok(f) => f,
        Err(e) if e.area == Area::Missing => return Ok(None),
        Err(e) => return Err(e),
    };
    // Room for all of it: one read and the one that finds the end, where
    // an empty vector starts with 32-byte probe reads (4 reads a sidecar).
    let mut text = Vec::with_capacity(4098);
    handle
        .take(4097)
        .read_to_end(&mut text)
        .map_err(|e| Error::io(Area::Integrity, &side, &e))?;
    let token = std::str::from_utf8(&text)
        .ok()
        .filter(|_| text.len() <= 4096)
        .and_then(|t| t.split_whitespace().next())
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()));
    match token {
        Some(t) => Ok(Some(t.to_ascii_lowercase())),
        None => Err(Error::new(
            Area::Integrity,
            &side,
            "is not a sha256 sidecar (expected 64 hex digits)",
        )),
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lowercase hex of `digest`, into one string (a `format!` a byte was 32
/// small strings a file).
fn hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * digest.len());
    for &b in digest {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

fn sha256_stream(opened: Opened, file: &Path) -> Result<String> {
    let Opened { file: mut f, len } = opened;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; len.clamp(4096, 1 << 20) as usize];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io(Area::TrainingState, file, &e))?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_spells_every_byte_as_format_does() {
        let all: Vec<u8> = (0..=255).collect();
        let want: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), want);
        assert_eq!(hex(&[]), "");
        assert_eq!(
            hex_sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
