//! The record log a `.wandb` file is: LevelDB's log layout with W&B's own
//! header. The file starts with 7 bytes, `:W&B`, the magic `0xBEE1` and a
//! version (0), then 32 KiB blocks (the header sits in the first). Each
//! chunk in a block has a 7-byte header: a CRC-32 (IEEE, as zlib computes
//! it, over the chunk's type byte and data), the data length (u16) and the
//! type (1 whole record, 2 first, 3 middle, 4 last piece). A block's tail
//! too short for a chunk header is zero padding.
//!
//! A chunk whose checksum or type is wrong loses the rest of its block (as
//! LevelDB's reader does) and is counted; a file that ends inside a chunk
//! is torn (a run still writing). Records longer than
//! [`MAX_RECORD_BYTES`] are passed over whole, never buffered.

use std::io::Read;

use crate::io::files::read_full;

/// The file's first bytes: ident, magic (little-endian) and version.
pub const HEADER: [u8; 7] = [b':', b'W', b'&', b'B', 0xe1, 0xbe, 0x00];
const BLOCK: usize = 32 * 1024;
const CHUNK_HEADER: usize = 7;
/// Largest record kept (a history row is a few KiB; a logged table or
/// console burst can be large and is no series we read).
pub const MAX_RECORD_BYTES: usize = 16 << 20;

const FULL: u8 = 1;
const FIRST: u8 = 2;
const MIDDLE: u8 = 3;
const LAST: u8 = 4;

/// Whether `head` starts like a `.wandb` log.
pub fn has_header(head: &[u8]) -> bool {
    head.starts_with(&HEADER[..4])
}

/// The records of a `.wandb` log, read block by block from `reader` (after
/// its 7-byte header has been checked and consumed by the caller).
pub struct Records<R> {
    reader: R,
    block: Vec<u8>,
    /// Read position in `block`, and how much of it holds file bytes.
    at: usize,
    filled: usize,
    /// The block read was shorter than a block: the file's last.
    last_block: bool,
    /// A record being assembled from pieces; None outside one.
    pending: Option<Vec<u8>>,
    /// The record being assembled outgrew the cap: drop its pieces.
    dropping: bool,
    pub torn: bool,
    /// Blocks cut short by a bad checksum, an unknown chunk type or a
    /// piece out of order.
    pub corrupt: usize,
    /// Records passed over for their size.
    pub oversized: usize,
    /// Blocks read (the damaged ones included).
    pub blocks: usize,
    /// Bytes of the log read, and of those the bytes passed over: the rest
    /// of a block after a chunk that did not check, the pieces of a record
    /// whose other pieces were lost, records too large to keep.
    pub bytes: u64,
    pub skipped_bytes: u64,
    pub io_error: Option<std::io::Error>,
}

impl<R: Read> Records<R> {
    /// Records of a log whose header has been read: the first block's
    /// remaining bytes follow.
    pub fn after_header(reader: R) -> Records<R> {
        let mut r = Records {
            reader,
            block: vec![0; BLOCK],
            at: CHUNK_HEADER,
            filled: CHUNK_HEADER,
            last_block: false,
            pending: None,
            dropping: false,
            torn: false,
            corrupt: 0,
            oversized: 0,
            blocks: 1,
            bytes: 0,
            skipped_bytes: 0,
            io_error: None,
        };
        r.fill_from(CHUNK_HEADER);
        r
    }

    /// Read into `block[from..]` as far as the file goes.
    fn fill_from(&mut self, from: usize) {
        // On an I/O error the caller refuses the whole log, so the bytes
        // read before it need not be kept.
        let filled = match read_full(&mut self.reader, &mut self.block[from..]) {
            Ok(n) => from + n,
            Err(e) => {
                self.io_error = Some(e);
                from
            }
        };
        self.filled = filled;
        self.bytes += (filled - from) as u64;
        self.last_block = filled < BLOCK;
    }

    fn next_block(&mut self) -> bool {
        if self.last_block {
            return false;
        }
        self.at = 0;
        self.fill_from(0);
        self.blocks += usize::from(self.filled > 0);
        self.filled > 0
    }

    /// Give up the rest of this block: it held a chunk that did not check.
    fn corrupt_block(&mut self) {
        self.corrupt += 1;
        self.drop_pending();
        self.skipped_bytes += (self.filled - self.at) as u64;
        self.dropping = false;
        self.at = self.filled;
    }

    /// The record being assembled is lost: its bytes so far were passed over.
    fn drop_pending(&mut self) {
        if let Some(buf) = self.pending.take() {
            self.skipped_bytes += buf.len() as u64;
        }
    }

    fn append(&mut self, data_at: usize, len: usize) {
        if self.dropping {
            self.skipped_bytes += len as u64;
            return;
        }
        let Some(buf) = self.pending.as_mut() else {
            return;
        };
        if buf.len() + len > MAX_RECORD_BYTES {
            self.oversized += 1;
            self.dropping = true;
            self.skipped_bytes += len as u64;
            self.drop_pending();
            return;
        }
        buf.extend_from_slice(&self.block[data_at..data_at + len]);
    }

    /// The next whole record, or None at the end of the log.
    pub fn next_record(&mut self) -> Option<Vec<u8>> {
        loop {
            if self.filled - self.at < CHUNK_HEADER {
                let tail = &self.block[self.at..self.filled];
                if self.last_block && tail.iter().any(|&b| b != 0) {
                    self.torn = true;
                }
                if !self.next_block() {
                    if self.pending.is_some() || self.dropping {
                        self.torn = true;
                    }
                    return None;
                }
                continue;
            }
            let h = &self.block[self.at..self.at + CHUNK_HEADER];
            let crc = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let len = usize::from(u16::from_le_bytes([h[4], h[5]]));
            let kind = h[6];
            let data_at = self.at + CHUNK_HEADER;
            if kind == 0 && len == 0 && crc == 0 {
                // Zeros: the writer's padding or preallocation.
                self.at = self.filled;
                continue;
            }
            if data_at + len > self.filled {
                if self.last_block {
                    self.torn = true;
                    self.pending = None;
                    self.at = self.filled;
                    self.last_block = true;
                    return None;
                }
                self.corrupt_block();
                continue;
            }
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&[kind]);
            hasher.update(&self.block[data_at..data_at + len]);
            if hasher.finalize() != crc {
                self.corrupt_block();
                continue;
            }
            self.at = data_at + len;
            match kind {
                FULL => {
                    let out_of_order = self.pending.is_some() || self.dropping;
                    self.drop_pending();
                    self.dropping = false;
                    if out_of_order {
                        self.corrupt += 1;
                    }
                    // A chunk is at most a block, far below the cap.
                    return Some(self.block[data_at..data_at + len].to_vec());
                }
                FIRST => {
                    if self.pending.is_some() || self.dropping {
                        self.corrupt += 1;
                    }
                    self.drop_pending();
                    self.dropping = false;
                    self.pending = Some(Vec::new());
                    self.append(data_at, len);
                }
                MIDDLE | LAST => {
                    if self.pending.is_none() && !self.dropping {
                        // A piece whose first piece was lost.
                        self.corrupt += 1;
                        self.skipped_bytes += len as u64;
                        continue;
                    }
                    self.append(data_at, len);
                    if kind == LAST {
                        self.dropping = false;
                        if let Some(record) = self.pending.take() {
                            return Some(record);
                        }
                    }
                }
                _ => self.corrupt_block(),
            }
        }
    }
}

/// Frame `records` as W&B's writer does (header, blocks, pieces, padding):
/// test data for the reader, and the fuzzer's seeds.
pub fn frame(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = HEADER.to_vec();
    for record in records {
        let mut rest: &[u8] = record;
        let mut first = true;
        loop {
            let left = BLOCK - out.len() % BLOCK;
            if left < CHUNK_HEADER {
                out.resize(out.len() + left, 0);
                continue;
            }
            let room = left - CHUNK_HEADER;
            let take = rest.len().min(room);
            let end = take == rest.len();
            let kind = match (first, end) {
                (true, true) => FULL,
                (true, false) => FIRST,
                (false, true) => LAST,
                (false, false) => MIDDLE,
            };
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&[kind]);
            hasher.update(&rest[..take]);
            out.extend(hasher.finalize().to_le_bytes());
            out.extend(u16::try_from(take).unwrap_or(u16::MAX).to_le_bytes());
            out.push(kind);
            out.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            first = false;
            if end {
                break;
            }
        }
    }
    out
}
