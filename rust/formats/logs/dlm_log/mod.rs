//! dlm's `train-*.jsonl` step logs, streamed into one loss curve.
//!
//! Files are read in name order (dlm names them chronologically) through a
//! fixed-size buffer, so memory grows with the number of step records, not
//! with the file size. A later record for the same step replaces an earlier
//! one (a resumed run repeats steps). Lines split like Python's universal
//! newlines: `\n`, `\r\n` and a lone `\r` all end a line.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::curve::{assemble, by_step, LossCurve, SideSeries};
use crate::formats::logs::damage::Damage;
use crate::formats::logs::json_line::{classify_step, LineKind, StepExtras};
use crate::io::lfs;
use crate::io::read_once;
/// Bytes read per batch; each batch is parsed in parallel pieces.
const BATCH: usize = 8 << 20;
/// Target size of one parallel piece.
const PIECE: usize = 512 << 10;
/// Room kept beyond a batch for the partial line carried into the next.
const CARRY_ROOM: usize = 64 << 10;
/// Longest line kept; a longer one is unreadable (and skipped).
pub const MAX_LINE: usize = 16 << 20;

fn is_train_log(name: &str) -> bool {
    name.len() >= "train-.jsonl".len() && name.starts_with("train-") && name.ends_with(".jsonl")
}

/// `train-*.jsonl` entries of `dir`, sorted by name.
pub fn train_logs_in(dir: &Path) -> Result<Vec<PathBuf>> {
    read_once::listing("train logs", dir, || {
        let mut files: Vec<PathBuf> = crate::io::confine::list_names(dir, Area::LogFormat)?
            .into_iter()
            .filter(|name| name.to_str().is_some_and(is_train_log))
            .map(|name| dir.join(name))
            .collect();
        files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        Ok(files)
    })
}

/// The log files a source names: a store dir (its `logs/`), a logs dir, or a file.
pub fn resolve_source(source: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(source).map_err(|e| Error::io(Area::LogFormat, source, &e))?;
    if !meta.is_dir() {
        return Ok(vec![source.to_path_buf()]);
    }
    let logs = source.join("logs");
    if logs.is_dir() {
        train_logs_in(&logs)
    } else {
        train_logs_in(source)
    }
}

/// Whether Python's `str.isspace()` holds for `c` (what `str.strip()`
/// removes); line terminators never reach here.
fn is_py_space_char(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\x1c'..='\x1f'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// The first UTF-8 character of `bytes` and its length, if it is complete and valid.
fn first_char(bytes: &[u8]) -> Option<(char, usize)> {
    let len = match *bytes.first()? {
        b if b < 0x80 => 1,
        b if b >> 5 == 0b110 => 2,
        b if b >> 4 == 0b1110 => 3,
        b if b >> 3 == 0b11110 => 4,
        _ => return None,
    };
    let c = std::str::from_utf8(bytes.get(..len)?)
        .ok()?
        .chars()
        .next()?;
    Some((c, len))
}

/// The line as Python's `str.strip()` would leave it: ASCII and Unicode
/// whitespace (U+00A0, U+2028, U+3000, ...) removed from both ends.
fn strip(line: &[u8]) -> &[u8] {
    let mut start = 0;
    while let Some((c, n)) = first_char(&line[start..]) {
        if !is_py_space_char(c) {
            break;
        }
        start += n;
    }
    let mut end = line.len();
    while end > start {
        // The last character starts at the last byte that is not a
        // continuation byte (0b10xxxxxx), at most 4 bytes back.
        let from = (end.saturating_sub(4)..end)
            .rev()
            .find(|&i| line[i] & 0xc0 != 0x80)
            .unwrap_or(end - 1)
            .max(start);
        match first_char(&line[from..end]) {
            Some((c, n)) if from + n == end && is_py_space_char(c) => end = from,
            _ => break,
        }
    }
    &line[start..end]
}

/// Whether `bytes` (part of one line) holds only whitespace; `carry` holds
/// the bytes of a character split at the previous part's end and is left
/// holding this part's own unfinished tail.
fn only_whitespace(bytes: &[u8], carry: &mut Vec<u8>) -> bool {
    let joined: Vec<u8>;
    let mut rest: &[u8] = if carry.is_empty() {
        bytes
    } else {
        joined = [carry.as_slice(), bytes].concat();
        &joined
    };
    carry.clear();
    while !rest.is_empty() {
        if rest[0] < 0x80 {
            if !is_py_space_char(char::from(rest[0])) {
                return false;
            }
            rest = &rest[1..];
            continue;
        }
        match first_char(rest) {
            Some((c, n)) if is_py_space_char(c) => rest = &rest[n..],
            Some(_) => return false,
            None if rest.len() < 4 => {
                carry.extend_from_slice(rest);
                return true;
            }
            None => return false,
        }
    }
    true
}

/// Where the step lines of a dlm log go: `(step, loss)` records, and for a
/// sink that keeps them, what else each step logged.
pub trait StepSink: Default + Send {
    fn push_step(&mut self, step: i64, loss: f64, extras: StepExtras);
    fn append(&mut self, other: Self);
    /// One non-blank line met; `readable`: whether it parsed (a line that
    /// does not is passed over). Only a sink that counts damage keeps it.
    #[inline]
    fn count_line(&mut self, _readable: bool) {}
    /// The log ends in a line with no line end that does not parse.
    fn torn_tail(&mut self) {}
}

/// The loss curve's records alone.
impl StepSink for Vec<(i64, f64)> {
    #[inline]
    fn push_step(&mut self, step: i64, loss: f64, _: StepExtras) {
        self.push((step, loss));
    }
    fn append(&mut self, mut other: Self) {
        Vec::append(self, &mut other);
    }
}

/// Records and the values logged beside the loss, each side series kept
/// only where a line logged it (16 bytes a value, not 48 a record: the
/// reader's memory traffic is most of its cost after parsing).
#[derive(Default)]
pub struct StepsWithExtras {
    pub records: Vec<(i64, f64)>,
    pub val_loss: Vec<(i64, f64)>,
    pub grad_norm: Vec<(i64, f64)>,
    pub lr: Vec<(i64, f64)>,
    /// Non-blank lines met, and those that did not parse (passed over).
    pub lines: u64,
    pub unreadable_lines: u64,
    /// Logs read so far that ended in a torn line.
    pub torn_logs: usize,
}

impl StepSink for StepsWithExtras {
    #[inline]
    fn push_step(&mut self, step: i64, loss: f64, extras: StepExtras) {
        self.records.push((step, loss));
        if let Some(v) = extras.val_loss {
            self.val_loss.push((step, v));
        }
        if let Some(v) = extras.grad_norm {
            self.grad_norm.push((step, v));
        }
        if let Some(v) = extras.lr {
            self.lr.push((step, v));
        }
    }
    fn append(&mut self, mut other: Self) {
        self.records.append(&mut other.records);
        self.val_loss.append(&mut other.val_loss);
        self.grad_norm.append(&mut other.grad_norm);
        self.lr.append(&mut other.lr);
        self.lines += other.lines;
        self.unreadable_lines += other.unreadable_lines;
        self.torn_logs += other.torn_logs;
    }
    #[inline]
    fn count_line(&mut self, readable: bool) {
        self.lines += 1;
        self.unreadable_lines += u64::from(!readable);
    }
    fn torn_tail(&mut self) {
        self.torn_logs += 1;
    }
}

impl StepsWithExtras {
    /// The side series of these records (reading order; later steps win).
    pub fn side_series(self) -> (Vec<(i64, f64)>, SideSeries) {
        let side = SideSeries {
            eval_loss: by_step(self.val_loss),
            grad_norm: by_step(self.grad_norm),
            learning_rate: by_step(self.lr),
            reward: vec![],
            margins: vec![],
            progress: None,
            ending: None,
        };
        (self.records, side)
    }
}

/// Classify one line; None for a blank one. Over-long lines are unreadable.
fn line_kind(line: &[u8]) -> Option<(LineKind, StepExtras)> {
    if line.len() > MAX_LINE {
        return Some((LineKind::Invalid, StepExtras::default()));
    }
    match strip(line) {
        [] => None,
        stripped => Some(classify_step(stripped)),
    }
}

/// Step records of a run of complete lines. `\r` and `\n` both end a line;
/// the empty "line" inside `\r\n` is blank and skipped, which is exactly
/// what universal newlines give (only line 1's identity matters, below).
fn steps_in<S: StepSink>(lines: &[u8], out: &mut S) {
    let mut start = 0;
    for end in memchr::memchr2_iter(b'\n', b'\r', lines).chain(std::iter::once(lines.len())) {
        take_line(line_kind(&lines[start..end]), out);
        start = end + 1;
    }
}

/// One classified line into `out`: counted (an unreadable one as passed
/// over), and pushed when it is a step record. A blank line is neither.
#[inline]
fn take_line<S: StepSink>(line: Option<(LineKind, StepExtras)>, out: &mut S) {
    match line {
        Some((LineKind::Step(step, loss), extras)) => {
            out.count_line(true);
            out.push_step(step, loss, extras);
        }
        Some((kind, _)) => out.count_line(kind != LineKind::Invalid),
        None => {}
    }
}

/// `steps_in` over a large region, split at line ends and run in parallel.
fn steps_in_parallel<S: StepSink>(region: &[u8], out: &mut S) {
    use rayon::prelude::*;
    if region.len() < 2 * PIECE {
        return steps_in(region, out);
    }
    let mut pieces = Vec::with_capacity(region.len() / PIECE + 1);
    let mut start = 0;
    while start < region.len() {
        let nominal = (start + PIECE).min(region.len());
        let end =
            memchr::memchr(b'\n', &region[nominal..]).map_or(region.len(), |p| nominal + p + 1);
        pieces.push(&region[start..end]);
        start = end;
    }
    let parts: Vec<S> = pieces
        .par_iter()
        .map(|piece| {
            let mut v = S::default();
            steps_in(piece, &mut v);
            v
        })
        .collect();
    for part in parts {
        out.append(part);
    }
}

/// Read up to one batch from `reader`, appended to `buf`; whether the file
/// ended.
fn read_batch<R: Read>(reader: &mut R, buf: &mut Vec<u8>) -> std::result::Result<bool, String> {
    let got = reader
        .take(BATCH as u64)
        .read_to_end(buf)
        .map_err(|e| format!("failed to read: {e}"))?;
    Ok(got < BATCH)
}

/// Append the step records of one log to `out` in file order. Memory stays
/// bounded by two batches plus one line, whatever the file size: the next
/// batch is read while this one is parsed (on this 2-core machine the read
/// was a seventh of the wall time, with a core idle).
pub fn read_steps_from<R: Read + Send, S: StepSink>(
    mut reader: R,
    size_hint: usize,
    out: &mut S,
) -> std::result::Result<(), String> {
    // Small logs (the common case in a store scan) get a small buffer.
    // Room for the partial line carried from one batch to the next, so the
    // buffer is not reallocated (and copied) at the second read.
    let mut buf: Vec<u8> = Vec::with_capacity(size_hint.min(BATCH) + CARRY_ROOM);
    let mut next: Vec<u8> = Vec::new();
    let mut first_line_seen = false;
    // Inside an over-long line: drop bytes up to the next terminator.
    let mut discarding = false;
    // Discarding an over-long *first* line that has been whitespace so far
    // (Python strips it to a blank line, which is fine), and the bytes of a
    // character split between two reads.
    let mut blank_first = false;
    let mut carry = Vec::new();
    let mut eof = read_batch(&mut reader, &mut buf)?;
    loop {
        let end = if eof {
            buf.len()
        } else {
            memchr::memrchr2(b'\n', b'\r', &buf).map_or(0, |p| p + 1)
        };
        let mut from = 0;
        if discarding && end > 0 {
            let line_end = memchr::memchr2(b'\n', b'\r', &buf[..end]);
            let dropped = &buf[..line_end.unwrap_or(end)];
            if blank_first && !only_whitespace(dropped, &mut carry) {
                return Err(format!("first line is longer than {MAX_LINE} bytes"));
            }
            match line_end {
                Some(p) => {
                    from = p + 1;
                    discarding = false;
                    if blank_first {
                        (blank_first, first_line_seen) = (false, true);
                    }
                }
                None => from = end,
            }
        }
        if !first_line_seen && !discarding && from < end {
            from += first_line(&buf[from..end], out)?;
            first_line_seen = true;
        }
        if eof {
            last_lines(&buf[from..end], out);
            if blank_first && !carry.is_empty() {
                return Err(format!("first line is longer than {MAX_LINE} bytes"));
            }
            return Ok(());
        }
        // The partial last line starts the next batch.
        next.clear();
        next.extend_from_slice(&buf[end..]);
        if next.len() > MAX_LINE {
            if !first_line_seen {
                if !only_whitespace(&next, &mut carry) {
                    return Err(format!("first line is longer than {MAX_LINE} bytes"));
                }
                blank_first = true;
            }
            next.clear();
            discarding = true;
        }
        let (read, ()) = rayon::join(
            || read_batch(&mut reader, &mut next),
            || steps_in_parallel(&buf[from..end], out),
        );
        eof = read?;
        std::mem::swap(&mut buf, &mut next);
    }
}

/// Take the first line of `region` (a log's bytes from its start); the
/// length of that line. A first line that is not JSON makes the file no
/// log of this kind (a Git LFS pointer says so in its own words).
fn first_line<S: StepSink>(region: &[u8], out: &mut S) -> std::result::Result<usize, String> {
    let first_end = memchr::memchr2(b'\n', b'\r', region).unwrap_or(region.len());
    match line_kind(&region[..first_end]) {
        Some((LineKind::Invalid, _)) => {
            // A Git LFS pointer is small: this batch holds all of it.
            Err(lfs::describe_pointer(region)
                .unwrap_or_else(|| "first line is not valid JSON".into()))
        }
        line => {
            take_line(line, out);
            Ok(first_end)
        }
    }
}

/// Take the lines of `region`, a log's last bytes: its whole lines, then a
/// last line with no line end. That one is the record a crashed or
/// still-running writer was writing: unreadable, it is a torn tail, not
/// damage.
fn last_lines<S: StepSink>(region: &[u8], out: &mut S) {
    let whole = memchr::memrchr2(b'\n', b'\r', region).map_or(0, |p| p + 1);
    steps_in_parallel(&region[..whole], out);
    match line_kind(&region[whole..]) {
        Some((LineKind::Invalid, _)) => out.torn_tail(),
        line => take_line(line, out),
    }
}

/// Append the step records of a log held whole in memory (shorter than a
/// batch and than `MAX_LINE`), read in place: what [`read_steps_from`]
/// finds in the same bytes, without copying them into its buffers.
pub fn read_steps_whole<S: StepSink>(bytes: &[u8], out: &mut S) -> std::result::Result<(), String> {
    debug_assert!(bytes.len() < BATCH.min(MAX_LINE));
    let from = if bytes.is_empty() {
        0
    } else {
        first_line(bytes, out)?
    };
    last_lines(&bytes[from..], out);
    Ok(())
}

/// Append the step records of the log at `path` to `out` in file order.
pub fn read_steps<S: StepSink>(path: &Path, out: &mut S) -> Result<()> {
    let file = read_once::sequential(path, Area::LogFormat)?;
    let size = file.len().min(BATCH as u64) as usize;
    // A small log is the store's shared bytes (see `read_once`).
    let read = match file.whole() {
        Some(bytes) if bytes.len() < BATCH.min(MAX_LINE) => read_steps_whole(bytes, out),
        _ => read_steps_from(file, size, out),
    };
    read.map_err(|msg| {
        if let Some(e) = lfs::pointer_error_in(Area::LogFormat, path) {
            return e; // with its oid and size as details
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let msg = msg.replace("first line", &format!("first line of {name}"));
        Error::new(Area::LogFormat, path, msg)
    })
}

/// Read the given files (sorted by file name) into one curve.
pub fn read_loss_curve(files: &[PathBuf]) -> Result<LossCurve> {
    let mut ordered: Vec<PathBuf> = files.to_vec();
    ordered.sort_by(|a, b| a.file_name().cmp(&b.file_name()).then_with(|| a.cmp(b)));
    let mut read = StepsWithExtras::default();
    let mut torn_files = vec![];
    for path in &ordered {
        let torn_before = read.torn_logs;
        read_steps(path, &mut read)?;
        if read.torn_logs > torn_before {
            torn_files.push(path.clone());
        }
    }
    let damage = Damage::of("JSON lines", read.unreadable_lines, read.lines);
    let (records, side) = read.side_series();
    Ok(LossCurve {
        side,
        damage,
        torn_files,
        ..assemble(records, ordered)
    })
}

#[cfg(test)]
pub(crate) mod tests;
