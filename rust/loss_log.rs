//! Stream dlm training logs into one deduplicated loss curve.
//!
//! Files are read in name order (dlm names them chronologically) through a
//! fixed-size buffer, so memory grows with the number of step records, not
//! with the file size. A later record for the same step replaces an earlier
//! one (a resumed run repeats steps). Lines split like Python's universal
//! newlines: `\n`, `\r\n` and a lone `\r` all end a line.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::json_line::{classify, LineKind};

/// Read buffer size.
const CHUNK: usize = 1 << 20;
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

/// Call `on_line(line_number, bytes)` for every line of `reader` (1-based
/// numbers; the bytes exclude the terminator). A line longer than
/// `MAX_LINE` is passed as `None` and its bytes are discarded.
pub fn for_each_line<R: Read>(
    mut reader: R,
    mut on_line: impl FnMut(usize, Option<&[u8]>),
) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut line_no = 0usize;
    // A `\r` ended the previous chunk: a `\n` starting the next one belongs to it.
    let mut skip_lf = false;
    // Inside an over-long line: drop bytes up to the next terminator.
    let mut discarding = false;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = reader.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        let mut data = &chunk[..n];
        if skip_lf {
            if data[0] == b'\n' {
                data = &data[1..];
            }
            skip_lf = false;
        }
        let mut start = 0;
        while let Some(pos) = memchr::memchr2(b'\n', b'\r', &data[start..]) {
            let end = start + pos;
            line_no += 1;
            if discarding {
                discarding = false;
                on_line(line_no, None);
            } else if buf.is_empty() {
                on_line(line_no, Some(&data[start..end]));
            } else {
                buf.extend_from_slice(&data[start..end]);
                if buf.len() > MAX_LINE {
                    on_line(line_no, None);
                } else {
                    on_line(line_no, Some(&buf));
                }
                buf.clear();
            }
            start = end + 1;
            if data[end] == b'\r' {
                match data.get(start) {
                    Some(b'\n') => start += 1,
                    Some(_) => {}
                    None => skip_lf = true,
                }
            }
        }
        let rest = &data[start..];
        if !discarding {
            if buf.len() + rest.len() > MAX_LINE {
                buf.clear();
                discarding = true;
            } else {
                buf.extend_from_slice(rest);
            }
        }
    }
    if discarding {
        on_line(line_no + 1, None);
    } else if !buf.is_empty() {
        on_line(line_no + 1, Some(&buf));
    }
    Ok(())
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

/// Append the step records of one file to `out` in file order.
pub fn read_steps(path: &Path, out: &mut Vec<(i64, f64)>) -> Result<()> {
    let file = File::open(path).map_err(|e| Error::io(Area::LogFormat, path, &e))?;
    if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(Error::new(
            Area::LogFormat,
            path,
            "is a directory, expected a .jsonl file",
        ));
    }
    let mut first_line_bad = false;
    for_each_line(file, |line_no, line| {
        let kind = match line {
            Some(l) => match strip(l) {
                [] => return,
                stripped => classify(stripped),
            },
            None => LineKind::Invalid,
        };
        match kind {
            LineKind::Step(step, loss) => out.push((step, loss)),
            LineKind::Invalid if line_no == 1 => first_line_bad = true,
            _ => {}
        }
    })
    .map_err(|e| Error::new(Area::LogFormat, path, format!("failed to read: {e}")))?;
    if first_line_bad {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        return Err(Error::new(
            Area::LogFormat,
            path,
            format!("first line of {name} is not valid JSON"),
        ));
    }
    Ok(())
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

    fn lines_of(data: &[u8], chunk_reader: bool) -> Vec<(usize, Option<Vec<u8>>)> {
        let mut out = vec![];
        // A reader that returns one byte at a time exercises every boundary.
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
        let cb = |n: usize, l: Option<&[u8]>| out.push((n, l.map(<[u8]>::to_vec)));
        if chunk_reader {
            for_each_line(Trickle(data), cb).unwrap();
        } else {
            for_each_line(data, cb).unwrap();
        }
        out
    }

    #[test]
    fn universal_newlines() {
        let data = b"a\r\nb\rc\n\nd";
        for trickle in [false, true] {
            let got = lines_of(data, trickle);
            let want: Vec<(usize, Option<Vec<u8>>)> = vec![
                (1, Some(b"a".to_vec())),
                (2, Some(b"b".to_vec())),
                (3, Some(b"c".to_vec())),
                (4, Some(b"".to_vec())),
                (5, Some(b"d".to_vec())),
            ];
            assert_eq!(got, want, "trickle={trickle}");
        }
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
        let mut data = vec![b'x'; MAX_LINE + 10];
        data.extend_from_slice(b"\nok");
        let got = lines_of(&data, false);
        assert_eq!(got, vec![(1, None), (2, Some(b"ok".to_vec()))]);
    }
}
