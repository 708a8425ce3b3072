//! A zip reader for `torch.save` archives: STORED entries only, every size
//! checked against the file before anything is read or allocated.
//!
//! `torch.save` writes an uncompressed zip. We parse the end-of-central-
//! directory record (zip64 too) and the central directory ourselves and read
//! entry data with positioned reads, so a hostile archive can neither make us
//! allocate what it claims nor read outside the file.

use std::collections::HashMap;
use std::fs::File;
#[cfg(not(unix))]
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Area, Error, Result};
use crate::io::lfs;
use crate::io::read_once::{self, Content};
use crate::io::staged;

/// Caps on what a zip header may make us allocate.
const MAX_CENTRAL_DIR_BYTES: u64 = 64 << 20;
const MAX_ENTRIES: u64 = 1 << 20;
const EOCD_LEN: usize = 22;
const MAX_COMMENT: usize = 0xffff;

#[derive(Debug, Clone)]
pub struct Entry {
    pub size: u64,
    header_offset: u64,
    method: u16,
    flags: u16,
}

/// Most bytes reserved ahead of one ranged read (larger ranges grow as read).
#[cfg(not(unix))]
const RESERVE_MAX: u64 = 64 << 20;

/// A zip archive opened for reading STORED entries.
pub struct Archive {
    pub path: PathBuf,
    /// The file, when it is read by ranges (not held whole).
    file: Option<File>,
    pub len: u64,
    pub entries: HashMap<String, Entry>,
    /// The whole file, when it is at most `read_once::WHOLE_MAX` bytes
    /// (shared with the store's other readers of it).
    whole: Option<Arc<Vec<u8>>>,
    /// Off unix, ranged reads seek a shared file position: one at a time.
    #[cfg(not(unix))]
    lock: std::sync::Mutex<()>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    if let Some(s) = b.get(at..at + 2) {
        a.copy_from_slice(s);
    }
    u16::from_le_bytes(a)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

impl Archive {
    pub fn err(&self, message: impl Into<String>) -> Error {
        Error::new(Area::TrainingState, &self.path, message)
    }

    /// Read `len` bytes at the absolute file offset `offset` into `buf`
    /// (its contents replaced); an error when the range runs past the
    /// file. Also for readers that resolved an entry's data offset once
    /// ([`Archive::data_offset`]) and read many ranges of it.
    pub fn read_exact_at(&self, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(self.err(format!(
                "truncated archive: {len} bytes at offset {offset} run past the end ({} bytes)",
                self.len
            )));
        }
        if self.whole.is_none() {
            staged::fill(&self.path, Area::TrainingState, offset, len)?;
        }
        if let Some(whole) = &self.whole {
            // In range: `offset + len <= self.len == whole.len()` was checked above.
            let range = usize::try_from(offset).unwrap_or(usize::MAX)
                ..usize::try_from(offset + len).unwrap_or(usize::MAX);
            let bytes = whole
                .get(range)
                .ok_or_else(|| self.err("file shrank while being read"))?;
            buf.clear();
            buf.extend_from_slice(bytes);
            return Ok(());
        }
        let Some(file) = self.file.as_ref() else {
            return Err(self.err("file shrank while being read"));
        };
        self.read_file_at(file, offset, len, buf)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => self.err("file shrank while being read"),
                _ => Error::io(Area::TrainingState, &self.path, &e),
            })
    }

    /// `len` bytes at `offset` of `file` into `buf` (its contents replaced), with
    /// a positioned read: readers on several threads share the file with
    /// no shared seek position. `len` is within the file (checked by the
    /// caller), so the buffer is no larger than the file.
    #[cfg(unix)]
    fn read_file_at(
        &self,
        file: &File,
        offset: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let n = usize::try_from(len).map_err(|_| std::io::ErrorKind::OutOfMemory)?;
        // Every byte is overwritten: zero only what the buffer grows by.
        if buf.len() >= n {
            buf.truncate(n);
        } else {
            buf.resize(n, 0);
        }
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }

    /// Off unix: a seek and a read under a lock (one position per file).
    #[cfg(not(unix))]
    fn read_file_at(
        &self,
        mut file: &File,
        offset: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        buf.clear();
        buf.reserve(usize::try_from(len.min(RESERVE_MAX)).unwrap_or(0));
        file.seek(SeekFrom::Start(offset))?;
        let got = file.take(len).read_to_end(buf)?;
        if got as u64 != len {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    pub fn open(path: &Path) -> Result<Archive> {
        // A small archive is served from memory: a small optimizer state
        // has dozens of entries, and a seek + read pair for each local header
        // and each entry costs more than the bytes.
        let (file, whole, len) = match read_once::content(path, Area::TrainingState)? {
            Content::Whole(bytes) => (None, Some(bytes.clone()), bytes.len() as u64),
            Content::Open(opened) => (Some(opened.file), None, opened.len),
        };
        let mut archive = Archive {
            path: path.to_path_buf(),
            file,
            len,
            entries: HashMap::new(),
            whole,
            #[cfg(not(unix))]
            lock: std::sync::Mutex::new(()),
        };
        let not_zip = || {
            // A small file was read whole: a Git LFS pointer says so.
            let whole = archive.whole.as_deref().map_or(&[][..], |w| w.as_slice());
            lfs::pointer_error(Area::TrainingState, path, whole).unwrap_or_else(|| {
                Error::new(
                    Area::TrainingState,
                    path,
                    "not a zip archive (torch.save writes zip files; the legacy \
                     pre-1.6 format is not supported)",
                )
            })
        };
        if len == 0 {
            // What a save killed before it wrote anything leaves behind.
            return Err(archive.err(
                "is empty (0 bytes): the save that wrote it did not finish (killed, or the \
                 disk filled up)",
            ));
        }
        if len < EOCD_LEN as u64 {
            return Err(not_zip());
        }
        // The end-of-central-directory record sits in the last 22 + comment bytes.
        let tail_len = len.min((EOCD_LEN + MAX_COMMENT + 20) as u64);
        let mut tail = Vec::new();
        archive.read_exact_at(len - tail_len, tail_len, &mut tail)?;
        let eocd = (0..=tail.len() - EOCD_LEN)
            .rev()
            .find(|&i| le32(&tail, i) == 0x0605_4b50)
            .ok_or_else(not_zip)?;
        let mut total = u64::from(le16(&tail, eocd + 10));
        let mut cd_size = u64::from(le32(&tail, eocd + 12));
        let mut cd_offset = u64::from(le32(&tail, eocd + 16));
        // zip64: a locator right before the EOCD points at the real record.
        if eocd >= 20 && le32(&tail, eocd - 20) == 0x0706_4b50 {
            let rec_offset = le64(&tail, eocd - 20 + 8);
            let mut rec = Vec::new();
            archive.read_exact_at(rec_offset, 56, &mut rec)?;
            if le32(&rec, 0) != 0x0606_4b50 {
                return Err(archive.err("corrupt zip64 end-of-central-directory record"));
            }
            total = le64(&rec, 32);
            cd_size = le64(&rec, 40);
            cd_offset = le64(&rec, 48);
        }
        if total > MAX_ENTRIES || cd_size > MAX_CENTRAL_DIR_BYTES {
            return Err(archive.err(format!(
                "zip central directory claims {total} entries in {cd_size} bytes, over the \
                 limit ({MAX_ENTRIES} entries, {MAX_CENTRAL_DIR_BYTES} bytes)"
            )));
        }
        let mut cd = Vec::new();
        archive.read_exact_at(cd_offset, cd_size, &mut cd)?;
        archive.entries = parse_central_dir(&cd, total).map_err(|m| archive.err(m))?;
        // An entry can never hold more bytes than the whole file: refuse the
        // claim at open, so no caller sizes anything from it.
        if let Some((name, e)) = archive.entries.iter().find(|(_, e)| e.size > archive.len) {
            return Err(archive.err(format!(
                "zip entry {name} claims {} bytes, which runs past the end of the file ({} bytes)",
                e.size, archive.len
            )));
        }
        Ok(archive)
    }

    /// Byte offset in the file of an entry's data, after its local header;
    /// an error for a compressed or encrypted entry or one that runs past
    /// the end of the file.
    pub fn data_offset(&self, name: &str, e: &Entry) -> Result<u64> {
        if e.flags & 1 != 0 {
            return Err(self.err(format!("zip entry {name} is encrypted")));
        }
        if e.method != 0 {
            return Err(self.err(format!(
                "zip entry {name} is compressed (method {}); torch.save stores entries \
                 uncompressed and only those can be read",
                e.method
            )));
        }
        let mut header = Vec::new();
        self.read_exact_at(e.header_offset, 30, &mut header)?;
        if le32(&header, 0) != 0x0403_4b50 {
            return Err(self.err(format!("zip entry {name} has a corrupt local header")));
        }
        let skip = 30 + u64::from(le16(&header, 26)) + u64::from(le16(&header, 28));
        let start = e.header_offset + skip;
        if start.checked_add(e.size).is_none_or(|end| end > self.len) {
            return Err(self.err(format!(
                "zip entry {name} ({} bytes) runs past the end of the file",
                e.size
            )));
        }
        Ok(start)
    }

    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Read `len` bytes starting `skip` bytes into entry `name`.
    pub fn read_entry_range(
        &self,
        name: &str,
        e: &Entry,
        skip: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let start = self.data_offset(name, e)?;
        if skip.checked_add(len).is_none_or(|end| end > e.size) {
            return Err(self.err(format!("read past the end of zip entry {name}")));
        }
        self.read_exact_at(start + skip, len, buf)
    }
}

fn parse_central_dir(cd: &[u8], total: u64) -> std::result::Result<HashMap<String, Entry>, String> {
    // Sized once for the entries the directory can hold (each takes at
    // least 46 bytes of it), not grown a rehash at a time; never by what
    // the count field alone claims.
    let room = usize::try_from(total).map_or(0, |n| n.min(cd.len() / 46));
    let mut entries = HashMap::with_capacity(room);
    let mut at = 0usize;
    for _ in 0..total {
        let fixed = cd
            .get(at..at + 46)
            .ok_or("truncated zip central directory")?;
        if le32(fixed, 0) != 0x0201_4b50 {
            return Err("corrupt zip central directory entry".into());
        }
        let flags = le16(fixed, 8);
        let method = le16(fixed, 10);
        let mut csize = u64::from(le32(fixed, 20));
        let mut usize_ = u64::from(le32(fixed, 24));
        let name_len = usize::from(le16(fixed, 28));
        let extra_len = usize::from(le16(fixed, 30));
        let comment_len = usize::from(le16(fixed, 32));
        let mut header_offset = u64::from(le32(fixed, 42));
        let name_start = at + 46;
        let extra_start = name_start + name_len;
        let next = extra_start + extra_len + comment_len;
        let name = cd
            .get(name_start..extra_start)
            .ok_or("truncated zip central directory")?;
        let extra = cd
            .get(extra_start..extra_start + extra_len)
            .ok_or("truncated zip central directory")?;
        // zip64 extended information replaces the fields saturated at 0xffffffff.
        let mut x = 0usize;
        while x + 4 <= extra.len() {
            let id = le16(extra, x);
            let size = usize::from(le16(extra, x + 2));
            let body = extra.get(x + 4..x + 4 + size).unwrap_or_default();
            if id == 0x0001 {
                let mut field = 0usize;
                for slot in [&mut usize_, &mut csize, &mut header_offset] {
                    if *slot == 0xffff_ffff {
                        *slot = body
                            .get(field..field + 8)
                            .map(|_| le64(body, field))
                            .ok_or("truncated zip64 extra field")?;
                        field += 8;
                    }
                }
            }
            x += 4 + size;
        }
        if method == 0 && csize != usize_ {
            return Err("stored zip entry with differing sizes".into());
        }
        let name = String::from_utf8_lossy(name).into_owned();
        entries.insert(
            name,
            Entry {
                size: csize,
                header_offset,
                method,
                flags,
            },
        );
        at = next;
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_bytes(bytes: &[u8]) -> Error {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.pt");
        std::fs::write(&path, bytes).unwrap();
        Archive::open(&path).err().unwrap()
    }

    #[test]
    fn an_empty_file_is_called_empty_not_a_foreign_format() {
        let e = open_bytes(b"");
        assert!(e.message.starts_with("is empty (0 bytes)"), "{e}");
        assert!(!e.message.contains("not a zip"), "{e}");
        assert!(open_bytes(b"ten bytes!")
            .message
            .contains("not a zip archive"));
    }
}
