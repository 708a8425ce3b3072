//! Stream dlm training logs into one deduplicated loss curve.
//!
//! Files are read in name order (dlm names them chronologically) through a
//! fixed-size buffer, so memory grows with the number of step records, not
//! with the file size. A later record for the same step replaces an earlier
//! one (a resumed run repeats steps). Lines split like Python's universal
//! newlines: `\n`, `\r\n` and a lone `\r` all end a line.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::files::open_regular;
use crate::json_line::{classify, LineKind};

/// Bytes read per batch; each batch is parsed in parallel pieces.
const BATCH: usize = 8 << 20;
/// Target size of one parallel piece.
const PIECE: usize = 512 << 10;
/// Longest line kept; a longer one is unreadable (and skipped).
pub const MAX_LINE: usize = 16 << 20;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossCurve {
    /// Ascending, distinct step numbers.
    pub steps: Vec<i64>,
    /// The loss at each step; non-finite losses are stored as +inf.
    pub losses: Vec<f64>,
    pub num_files: usize,
}

fn is_train_log(name: &str) -> bool {
    name.len() >= "train-.jsonl".len() && name.starts_with("train-") && name.ends_with(".jsonl")
}

/// `train-*.jsonl` entries of `dir`, sorted by name.
pub fn train_logs_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(Area::LogFormat, dir, &e))?;
    let mut files = vec![];
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(Area::LogFormat, dir, &e))?;
        let name = entry.file_name();
        if name.to_str().is_some_and(is_train_log) {
            files.push(entry.path());
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
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

/// Subdirectory levels searched below a directory for event files or a
/// `metrics.csv` (HF: `runs/<date>_<host>/`; Lightning: `lightning_logs/version_N/`).
pub const MAX_SEARCH_DEPTH: usize = 4;
/// Directory entries looked at in one search before it gives up.
pub const MAX_SEARCH_ENTRIES: usize = 100_000;

/// Files whose name `matches`, in `dir` and up to `MAX_SEARCH_DEPTH`
/// subdirectory levels below it, sorted by file name (then path). Hidden
/// directories and symlinked directories (possible loops) are not entered.
pub(crate) fn files_under(dir: &Path, matches: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut found = vec![];
    let mut level = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    for depth in 0..=MAX_SEARCH_DEPTH {
        let mut next_level = vec![];
        for current in &level {
            let entries =
                std::fs::read_dir(current).map_err(|e| Error::io(Area::LogFormat, current, &e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(Area::LogFormat, current, &e))?;
                seen += 1;
                if seen > MAX_SEARCH_ENTRIES {
                    return Err(Error::new(
                        Area::LogFormat,
                        dir,
                        format!(
                            "holds more than {MAX_SEARCH_ENTRIES} entries within \
                             {MAX_SEARCH_DEPTH} levels; point at the run's own directory"
                        ),
                    ));
                }
                let file_name = entry.file_name();
                let Some(name) = file_name.to_str() else {
                    continue;
                };
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir {
                    if depth < MAX_SEARCH_DEPTH && !name.starts_with('.') {
                        next_level.push(entry.path());
                    }
                } else if matches(name) {
                    found.push(entry.path());
                }
            }
        }
        level = next_level;
    }
    found.sort_by(|a, b| a.file_name().cmp(&b.file_name()).then_with(|| a.cmp(b)));
    Ok(found)
}

/// The ASCII characters Python's `str.strip()` removes (no terminators remain here).
fn is_py_space(c: &u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\x0b' | b'\x0c' | b'\x1c'..=b'\x1f')
}

/// The line as Python's `str.strip()` would leave it (ASCII whitespace only).
fn strip(line: &[u8]) -> &[u8] {
    let start = line
        .iter()
        .position(|c| !is_py_space(c))
        .unwrap_or(line.len());
    let end = line
        .iter()
        .rposition(|c| !is_py_space(c))
        .map_or(start, |e| e + 1);
    &line[start..end]
}

/// Classify one line; None for a blank one. Over-long lines are unreadable.
fn line_kind(line: &[u8]) -> Option<LineKind> {
    if line.len() > MAX_LINE {
        return Some(LineKind::Invalid);
    }
    match strip(line) {
        [] => None,
        stripped => Some(classify(stripped)),
    }
}

/// Step records of a run of complete lines. `\r` and `\n` both end a line;
/// the empty "line" inside `\r\n` is blank and skipped, which is exactly
/// what universal newlines give (only line 1's identity matters, below).
fn steps_in(lines: &[u8], out: &mut Vec<(i64, f64)>) {
    let mut start = 0;
    for end in memchr::memchr2_iter(b'\n', b'\r', lines).chain(std::iter::once(lines.len())) {
        if let Some(LineKind::Step(step, loss)) = line_kind(&lines[start..end]) {
            out.push((step, loss));
        }
        start = end + 1;
    }
}

/// `steps_in` over a large region, split at line ends and run in parallel.
fn steps_in_parallel(region: &[u8], out: &mut Vec<(i64, f64)>) {
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
    let parts: Vec<Vec<(i64, f64)>> = pieces
        .par_iter()
        .map(|piece| {
            let mut v = Vec::with_capacity(piece.len() / 128);
            steps_in(piece, &mut v);
            v
        })
        .collect();
    for part in parts {
        out.extend(part);
    }
}

/// Append the step records of one log to `out` in file order. Memory stays
/// bounded by one batch plus one line, whatever the file size.
pub fn read_steps_from<R: Read>(
    mut reader: R,
    size_hint: usize,
    out: &mut Vec<(i64, f64)>,
) -> std::result::Result<(), String> {
    // Small logs (the common case in a store scan) get a small buffer.
    let mut buf: Vec<u8> = Vec::with_capacity(size_hint.min(BATCH) + 1);
    let mut first_line_seen = false;
    // Inside an over-long line: drop bytes up to the next terminator.
    let mut discarding = false;
    loop {
        let got = (&mut reader)
            .take(BATCH as u64)
            .read_to_end(&mut buf)
            .map_err(|e| format!("failed to read: {e}"))?;
        let eof = got < BATCH;
        let end = if eof {
            buf.len()
        } else {
            memchr::memrchr2(b'\n', b'\r', &buf).map_or(0, |p| p + 1)
        };
        let mut region = &buf[..end];
        if discarding && !region.is_empty() {
            match memchr::memchr2(b'\n', b'\r', region) {
                Some(p) => {
                    region = &region[p + 1..];
                    discarding = false;
                }
                None => region = &[],
            }
        }
        if !first_line_seen && !region.is_empty() {
            let first_end = memchr::memchr2(b'\n', b'\r', region).unwrap_or(region.len());
            match line_kind(&region[..first_end]) {
                Some(LineKind::Invalid) => return Err("first line is not valid JSON".into()),
                Some(LineKind::Step(step, loss)) => out.push((step, loss)),
                _ => {}
            }
            first_line_seen = true;
            region = &region[first_end..];
        }
        steps_in_parallel(region, out);
        buf.drain(..end);
        if buf.len() > MAX_LINE {
            if !first_line_seen {
                return Err(format!("first line is longer than {MAX_LINE} bytes"));
            }
            buf.clear();
            discarding = true;
        }
        if eof {
            return Ok(());
        }
    }
}

/// Append the step records of the log at `path` to `out` in file order.
pub fn read_steps(path: &Path, out: &mut Vec<(i64, f64)>) -> Result<()> {
    let file = open_regular(path, Area::LogFormat)?;
    let size = file
        .metadata()
        .map_or(BATCH, |m| m.len().min(BATCH as u64) as usize);
    read_steps_from(file, size, out).map_err(|msg| {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let msg = msg.replace("first line", &format!("first line of {name}"));
        Error::new(Area::LogFormat, path, msg)
    })
}

/// Build the curve from records in reading order: sort by step, keep the
/// last record of each step, store non-finite losses as +inf.
pub fn assemble(mut records: Vec<(i64, f64)>, num_files: usize) -> LossCurve {
    // Stable sort keeps reading order within a step; runs of sorted steps
    // (the normal case) make this close to linear.
    records.sort_by_key(|&(step, _)| step);
    let mut steps = Vec::with_capacity(records.len());
    let mut losses = Vec::with_capacity(records.len());
    for (i, &(step, loss)) in records.iter().enumerate() {
        if records.get(i + 1).is_some_and(|next| next.0 == step) {
            continue;
        }
        steps.push(step);
        losses.push(if loss.is_finite() {
            loss
        } else {
            f64::INFINITY
        });
    }
    LossCurve {
        steps,
        losses,
        num_files,
    }
}

/// Read the given files (sorted by file name) into one curve.
pub fn read_loss_curve(files: &[PathBuf]) -> Result<LossCurve> {
    let mut ordered: Vec<&PathBuf> = files.iter().collect();
    ordered.sort_by(|a, b| a.file_name().cmp(&b.file_name()).then_with(|| a.cmp(b)));
    let mut records = Vec::new();
    for path in &ordered {
        read_steps(path, &mut records)?;
    }
    Ok(assemble(records, files.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that returns one byte at a time exercises every boundary.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0[0];
            self.0 = &self.0[1..];
            Ok(1)
        }
    }

    fn step(s: i64, l: f64) -> String {
        format!(r#"{{"loss": {l}, "step": {s}, "type": "step"}}"#)
    }

    #[test]
    fn universal_newlines_and_blank_lines() {
        let data = format!(
            "\r\n{}\r{}\n\n  \r\n{}",
            step(1, 1.0),
            step(2, 2.0),
            step(3, 3.0)
        );
        for trickle in [false, true] {
            let mut out = vec![];
            if trickle {
                read_steps_from(Trickle(data.as_bytes()), 0, &mut out).unwrap();
            } else {
                read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
            }
            assert_eq!(out, vec![(1, 1.0), (2, 2.0), (3, 3.0)], "trickle={trickle}");
        }
    }

    #[test]
    fn a_lone_cr_splits_the_first_line() {
        // Python reads "{...}\r garbage" as two lines: a valid first line.
        let data = format!("{}\rgarbage\n", step(1, 1.0));
        let mut out = vec![];
        read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
        assert_eq!(out, vec![(1, 1.0)]);
        let mut out = vec![];
        assert!(read_steps_from(&b"garbage\r{}"[..], 0, &mut out).is_err());
    }

    #[test]
    fn many_batches_keep_order() {
        let body: String = (0..200_000).map(|i| step(i, i as f64) + "\n").collect();
        let mut out = vec![];
        read_steps_from(body.as_bytes(), 0, &mut out).unwrap();
        assert_eq!(out.len(), 200_000);
        assert!(out.iter().enumerate().all(|(i, &(s, _))| s == i as i64));
    }

    #[test]
    fn dedupe_keeps_the_last_record() {
        let c = assemble(
            vec![(1, 5.0), (2, 4.0), (3, f64::NAN), (2, 9.0), (0, 1.0)],
            2,
        );
        assert_eq!(c.steps, vec![0, 1, 2, 3]);
        assert_eq!(c.losses, vec![1.0, 5.0, 9.0, f64::INFINITY]);
    }

    #[test]
    fn reads_files_in_name_order_with_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let banner = r#"{"type": "banner", "run_id": 1}"#;
        let step = |s: i64, l: f64| format!(r#"{{"loss": {l}, "step": {s}, "type": "step"}}"#);
        let a = format!("{banner}\n{}\n{}\n", step(1, 3.0), step(2, 2.0));
        let b = format!(
            "{banner}\r\n{}\r\n{}\r\n{{\"loss\": 1.",
            step(2, 2.5),
            step(3, 1.0)
        );
        std::fs::write(logs.join("train-000002-20250101T000001.jsonl"), b).unwrap();
        std::fs::write(logs.join("train-000001-20250101T000000.jsonl"), a).unwrap();
        std::fs::write(logs.join("other.jsonl"), "garbage").unwrap();
        let files = resolve_source(dir.path()).unwrap();
        assert_eq!(files.len(), 2);
        let c = read_loss_curve(&files).unwrap();
        assert_eq!(c.steps, vec![1, 2, 3]);
        assert_eq!(c.losses, vec![3.0, 2.5, 1.0]);
        assert_eq!(c.num_files, 2);
    }

    #[test]
    fn bad_first_line_is_an_error_but_a_blank_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("train-1.jsonl");
        std::fs::write(&p, "{oops\n").unwrap();
        let e = read_loss_curve(std::slice::from_ref(&p)).unwrap_err();
        assert_eq!(e.area, Area::LogFormat);
        assert!(e.message.contains("first line"), "{e}");
        std::fs::write(&p, "\n{oops\n{\"type\":\"step\",\"step\":1,\"loss\":1}\n").unwrap();
        assert_eq!(read_loss_curve(&[p]).unwrap().steps, vec![1]);
        let e = read_loss_curve(&[dir.path().to_path_buf()]).unwrap_err();
        assert_eq!(e.area, Area::LogFormat);
    }

    #[test]
    fn overlong_line_is_discarded() {
        let mut data = step(1, 1.0).into_bytes();
        data.push(b'\n');
        data.extend(std::iter::repeat_n(b'x', MAX_LINE + BATCH));
        data.push(b'\n');
        data.extend(step(2, 2.0).into_bytes());
        let mut out = vec![];
        read_steps_from(&data[..], 0, &mut out).unwrap();
        assert_eq!(out, vec![(1, 1.0), (2, 2.0)]);
        let mut out = vec![];
        let long_first = vec![b'x'; MAX_LINE + BATCH];
        assert!(read_steps_from(&long_first[..], 0, &mut out).is_err());
    }
}
