//! Read one loss column of a Lightning `CSVLogger` `metrics.csv`.
//!
//! Lightning writes the file with Python's `csv.DictWriter`: a header row, a
//! `step` column, and one row per logging call holding only the metrics
//! logged at that moment (every other cell empty). The `csv` crate splits
//! it the way `csv.DictReader` does: RFC 4180 quoting (`"a,b"`, `""` for a
//! quote), `\r\n`, `\n` or a lone `\r` ending a row, blank rows skipped;
//! on top of it short rows read as padded with empty cells and a repeated
//! column name resolves to its last cell. A leading UTF-8 BOM is dropped
//! (spreadsheet exports add one). Values convert like Python's `float()`
//! (`nan`, `inf`, `1.5e-3`, `1_0`), steps like `int()` (an integral float
//! such as `10.0` is accepted too). Line numbers in messages count `\n`.
//!
//! A crashed run can leave a torn last line. A final row with no line end
//! that is malformed (an open quote, fewer cells than the header, a cell
//! that does not convert) is dropped and reported as torn; a well-formed one
//! is kept. Anywhere else a bad value is an error naming its line.
//!
//! Rows stream through the reader's buffer one at a time and each is capped
//! at `MAX_ROW_BYTES` (counted on the bytes fed to the parser, so an open
//! quote cannot swallow the file), so memory does not grow with the file.

use std::io::Read;
use std::path::{Path, PathBuf};

use csv::{ByteRecord, Position};

use crate::error::{Area, Error, Result};
use crate::formats::logs::json_line::{float_to_step, python_float, python_int};
use crate::formats::logs::series_names;
use crate::io::files::open_regular;
use crate::io::lfs;

/// Loss columns tried, in order, when the caller names none.
pub const DEFAULT_LOSS_COLUMNS: [&str; 4] = ["train_loss", "train_loss_step", "loss", "train/loss"];

/// Longest row accepted (Lightning's rows are a few hundred bytes).
pub const MAX_ROW_BYTES: usize = 1 << 20;

/// The start of the message of a read that found no loss column (see
/// [`is_missing_loss_column`]).
const NO_LOSS_COLUMN: &str = "has no loss column";

/// Whether `e` says the CSV holds no loss column (the file is fine; it
/// logs other things).
pub fn is_missing_loss_column(e: &Error) -> bool {
    e.area == Area::LogFormat && e.message.starts_with(NO_LOSS_COLUMN)
}

/// The points of one column of a `metrics.csv`.
// `skip_from_py_object`: a result is only handed to Python, never taken
// back, and pyo3 0.29 asks Clone types to choose.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, skip_from_py_object, module = "adapterprobe._core")
)]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CsvSeries {
    pub path: PathBuf,
    /// The column read (the caller's, or the first of `DEFAULT_LOSS_COLUMNS` present).
    pub column: String,
    /// `(step, value)` of the rows with a value in `column`, in file order.
    /// Not deduplicated; NaN and infinities kept as written.
    pub points: Vec<(i64, f64)>,
    /// The header's column names.
    pub columns: Vec<String>,
    /// Whether a malformed, unterminated last line was dropped.
    pub torn_last_line: bool,
    /// The column the steps were read from: `step`, `epoch` (Keras's
    /// CSVLogger, Ultralytics), or empty (the row number).
    pub step_column: String,
    /// Rows that are not data (a merge's conflict markers), passed over.
    pub skipped_rows: u64,
    /// Data rows read.
    pub rows: u64,
}

/// A column name that stands for the sum of the columns it matches: a
/// loss logged in parts (Ultralytics: `train/box_loss`, `train/cls_loss`,
/// `train/dfl_loss`, whose sum is the loss it minimises).
pub const SUMMED_COLUMNS: [&str; 2] = ["train/*_loss", "val/*_loss"];

/// The columns a [`SUMMED_COLUMNS`] pattern (`prefix*suffix`) matches.
fn matching(pattern: &str, columns: &[String]) -> Vec<usize> {
    let Some((prefix, suffix)) = pattern.split_once('*') else {
        return vec![];
    };
    columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.len() > prefix.len() + suffix.len())
        .filter(|(_, c)| c.starts_with(prefix) && c.ends_with(suffix))
        .map(|(i, _)| i)
        .collect()
}

/// The [`SUMMED_COLUMNS`] patterns that match two or more of `columns`.
pub fn summed_columns(columns: &[String]) -> Vec<String> {
    SUMMED_COLUMNS
        .iter()
        .filter(|p| matching(p, columns).len() >= 2)
        .map(|p| p.to_string())
        .collect()
}

/// Bytes of a CSV read to tell from its header whether it is a training
/// log (a header row is a few hundred bytes).
pub const HEADER_PEEK: u64 = 16 << 10;

/// Whether a CSV's first line names a training log: a `step` or `epoch`
/// column and a loss by its meaning (`loss`, `train_loss`, `val_loss`,
/// or a loss in parts such as Ultralytics' `train/*_loss`). Keras's
/// CSVLogger (`epoch,accuracy,loss,val_accuracy,val_loss`) and
/// Ultralytics' `results.csv` are; a table of data is not.
pub fn is_training_log_header(first_line: &str) -> bool {
    let columns: Vec<String> = first_line
        .trim_start_matches('\u{feff}')
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_string())
        .collect();
    // Keras's History names, even without the epoch column (a CSVLogger
    // fed by hand, or its rows appended by another writer).
    let keras = ["loss", "val_loss"]
        .iter()
        .all(|name| columns.iter().any(|c| c == name));
    let counts = keras || columns.iter().any(|c| c == "epoch" || c == "step");
    let loss = series_names::loss_among(&DEFAULT_LOSS_COLUMNS, columns.iter().map(String::as_str))
        .is_some()
        || !summed_columns(&columns).is_empty();
    counts && loss
}

/// The training-log CSV in `dir` other than Lightning's `metrics.csv` (read
/// elsewhere): the first `*.csv` by name, of at most `MAX_CSV_LOOKED_AT`,
/// whose header [`is_training_log_header`].
pub fn training_csv_in(files: impl IntoIterator<Item = PathBuf>) -> Option<PathBuf> {
    let mut csvs: Vec<PathBuf> = files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("csv")))
        .filter(|p| p.file_name().is_some_and(|n| n != "metrics.csv"))
        .collect();
    csvs.sort();
    csvs.into_iter().take(MAX_CSV_LOOKED_AT).find(|path| {
        let Ok(file) = open_regular(path, Area::LogFormat) else {
            return false;
        };
        let mut head = Vec::new();
        if file.take(HEADER_PEEK).read_to_end(&mut head).is_err() {
            return false;
        }
        let text = String::from_utf8_lossy(&head);
        text.lines().next().is_some_and(is_training_log_header)
    })
}

/// Most CSV files of one folder whose header is looked at.
pub const MAX_CSV_LOOKED_AT: usize = 8;

/// Whether a row's first cell is a merge's conflict marker.
fn is_conflict_marker(first: &[u8]) -> bool {
    [&b"<<<<<<<"[..], b"=======", b">>>>>>>", b"|||||||"]
        .iter()
        .any(|m| first.starts_with(m))
}

/// Read `column` (or the default loss column) of the CSV file at `path`.
pub fn read_csv_series(path: &Path, column: Option<&str>) -> Result<CsvSeries> {
    let file = open_regular(path, Area::LogFormat)?;
    let mut series = series_from(file, column).map_err(|msg| match msg {
        Failure::Io(e) => Error::io(Area::LogFormat, path, &e),
        Failure::Bad(msg) => Error::new(Area::LogFormat, path, msg),
        Failure::Header(msg, head) => lfs::pointer_error_at(Area::LogFormat, path, head.as_bytes())
            .unwrap_or_else(|| Error::new(Area::LogFormat, path, msg)),
    })?;
    series.path = path.to_path_buf();
    Ok(series)
}

enum Failure {
    Io(std::io::Error),
    Bad(String),
    /// The header row has no step column; the row's first cell is kept (a
    /// Git LFS pointer's first line lands there).
    Header(String, String),
}

impl From<String> for Failure {
    fn from(msg: String) -> Self {
        Failure::Bad(msg)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e)
    }
}

/// The parser's read-ahead.
const BUFFER_BYTES: usize = 64 << 10;
/// Bytes of the stream kept behind the parser: enough to hold the row being
/// read and the one read ahead of it.
const TAIL_BYTES: usize = 2 * (MAX_ROW_BYTES + BUFFER_BYTES);

/// The stream under the parser: refuses to feed a row past
/// `MAX_ROW_BYTES`, and keeps the last bytes fed so that a final row's raw
/// text can be looked at (was it ended by a line end, is a quote open?).
struct Fed<R> {
    inner: R,
    /// Where the row being read starts.
    row_start: u64,
    /// The last bytes fed; `tail[0]` is byte `tail_start` of the stream.
    tail: Vec<u8>,
    tail_start: u64,
    /// The line the row being read starts on (for the cap's message).
    row_line: u64,
}

impl<R: Read> Read for Fed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let cap = self.row_start + (MAX_ROW_BYTES + BUFFER_BYTES) as u64;
        if self.fed() > cap {
            return Err(std::io::Error::other(RowTooLong(self.row_line)));
        }
        let got = self.inner.read(buf)?;
        let fresh = buf.get(..got).unwrap_or_default();
        self.tail.extend_from_slice(fresh);
        if self.tail.len() > 2 * TAIL_BYTES {
            let drop = self.tail.len() - TAIL_BYTES;
            self.tail.drain(..drop);
            self.tail_start += drop as u64;
        }
        Ok(got)
    }
}

impl<R> Fed<R> {
    /// Bytes fed so far (the tail always ends at the last byte fed).
    fn fed(&self) -> u64 {
        self.tail_start + self.tail.len() as u64
    }

    /// The raw bytes from stream offset `from` to what was fed, if kept.
    fn since(&self, from: u64) -> Option<&[u8]> {
        let skip = usize::try_from(from.checked_sub(self.tail_start)?).ok()?;
        self.tail.get(skip..)
    }
}

/// The error `Fed` gives when one row runs past `MAX_ROW_BYTES`.
#[derive(Debug)]
struct RowTooLong(u64);

impl std::fmt::Display for RowTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {} is longer than {} KiB; not a metrics log",
            self.0,
            MAX_ROW_BYTES >> 10
        )
    }
}

impl std::error::Error for RowTooLong {}

impl From<csv::Error> for Failure {
    fn from(e: csv::Error) -> Self {
        match e.into_kind() {
            csv::ErrorKind::Io(e) => match e.get_ref().and_then(|inner| inner.downcast_ref()) {
                Some(RowTooLong(line)) => Failure::Bad(RowTooLong(*line).to_string()),
                None => Failure::Io(e),
            },
            other => Failure::Bad(format!("cannot be read as CSV: {other:?}")),
        }
    }
}

/// Where one row was, and how it ended; its cells are [`Rows::cell`].
struct Row {
    /// The line the row starts on (1-based).
    line: u64,
    /// Ended by a line end outside quotes (not by the end of the file).
    terminated: bool,
    /// The file ended inside a quoted cell.
    open_quote: bool,
}

/// The rows of a CSV stream, blank rows skipped. Two records are reused
/// for every row: the current one and the next, read ahead to learn
/// whether the current one is the file's last.
struct Rows<R: Read> {
    reader: csv::Reader<Fed<R>>,
    current: ByteRecord,
    ahead: ByteRecord,
    /// `ahead` holds a row not yet handed out; None before the first read.
    ahead_holds_row: Option<bool>,
}

impl<R: Read> Rows<R> {
    fn new(inner: R) -> Self {
        let fed = Fed {
            inner,
            row_start: 0,
            tail: Vec::new(),
            tail_start: 0,
            row_line: 1,
        };
        let reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .buffer_capacity(BUFFER_BYTES)
            .from_reader(fed);
        Rows {
            reader,
            current: ByteRecord::new(),
            ahead: ByteRecord::new(),
            ahead_holds_row: None,
        }
    }

    /// The current row's cell `index`; empty past its last cell.
    fn cell(&self, index: usize) -> &[u8] {
        self.current.get(index).unwrap_or_default()
    }

    /// The number of cells in the current row.
    fn cells(&self) -> usize {
        self.current.len()
    }

    /// Read the next row into `ahead`; false at the end of the input.
    fn read_ahead(&mut self) -> std::result::Result<bool, Failure> {
        if !self.reader.read_byte_record(&mut self.ahead)? {
            return Ok(false);
        }
        let next = self.reader.position().clone();
        let start = self.ahead.position().map_or(0, Position::byte);
        if next.byte().saturating_sub(start) > MAX_ROW_BYTES as u64 {
            let line = self.ahead.position().map_or(1, Position::line);
            return Err(Failure::Bad(RowTooLong(line).to_string()));
        }
        let fed = self.reader.get_mut();
        fed.row_start = next.byte();
        fed.row_line = next.line();
        Ok(true)
    }

    /// Move to the next row; None at the end of the input.
    fn next(&mut self) -> std::result::Result<Option<Row>, Failure> {
        let holds_row = match self.ahead_holds_row {
            Some(holds) => holds,
            None => self.read_ahead()?,
        };
        if !holds_row {
            self.ahead_holds_row = Some(false);
            return Ok(None);
        }
        std::mem::swap(&mut self.current, &mut self.ahead);
        let more = self.read_ahead()?;
        self.ahead_holds_row = Some(more);
        let start = self
            .current
            .position()
            .cloned()
            .unwrap_or_else(Position::new);
        let raw = self
            .reader
            .get_ref()
            .since(start.byte())
            .unwrap_or_default();
        // Blank lines the parser skipped before the row.
        let skipped = raw.iter().take_while(|&&b| b == b'\r' || b == b'\n');
        let line = start.line() + skipped.filter(|&&b| b == b'\n').count() as u64;
        let (terminated, open_quote) = if more {
            (true, false)
        } else {
            last_row_ends(raw)
        };
        Ok(Some(Row {
            line,
            terminated,
            open_quote,
        }))
    }
}

/// Whether the raw text of a file's last row ends with a line end outside
/// quotes, and whether it leaves a quote open.
fn last_row_ends(raw: &[u8]) -> (bool, bool) {
    // Room for every cell of `raw` plus a line end: the parser never runs
    // out of output, so one call reads the row or all of the input.
    let mut out = vec![0u8; raw.len() + 1];
    let mut ends = vec![0usize; raw.len() + 2];
    let mut ends_row = |text: &[u8]| {
        let mut parser = csv_core::Reader::new();
        let (result, _, _, _) = parser.read_record(text, &mut out, &mut ends);
        result == csv_core::ReadRecordResult::Record
    };
    let terminated = ends_row(raw);
    let open_quote = !terminated && !ends_row(&[raw, b"\n"].concat());
    (terminated, open_quote)
}

/// The reader, less a leading UTF-8 byte-order mark.
fn without_bom<R: Read>(mut reader: R) -> std::io::Result<impl Read> {
    let mut head = [0u8; 3];
    let got = crate::io::files::read_full(&mut reader, &mut head)?;
    let start = if head[..got] == [0xef, 0xbb, 0xbf] {
        3
    } else {
        0
    };
    let prefix = head.get(start..got).unwrap_or_default().to_vec();
    Ok(std::io::Cursor::new(prefix).chain(reader))
}

/// Column names for a message: the first few, each a short excerpt (a
/// header may be any file's first line).
fn listed(columns: &[String]) -> String {
    crate::io::excerpt::listed(columns.iter().map(String::as_str))
}

/// A step as Python's `int()` reads it, or an integral float such as `10.0`.
fn parse_step(text: &str) -> Option<i64> {
    python_int(text).or_else(|| {
        python_float(text)
            .filter(|x| x.fract() == 0.0)
            .and_then(float_to_step)
    })
}

/// The `(step, value)` of a row whose `column` cell is not empty.
/// A cell's number (Python's `float()` spellings: `nan`, `inf`, `1e-3`).
fn parse_value(value_cell: &[u8], column: &str, line: u64) -> std::result::Result<f64, String> {
    std::str::from_utf8(value_cell)
        .ok()
        .and_then(python_float)
        .ok_or_else(|| {
            let shown: String = String::from_utf8_lossy(value_cell)
                .chars()
                .take(40)
                .collect();
            format!(
                "line {line}: {} value {} is not a number",
                crate::io::excerpt::excerpt(column),
                crate::io::excerpt::quoted(&shown)
            )
        })
}

fn parse_point(
    step_cell: &[u8],
    value_cell: &[u8],
    column: &str,
    line: u64,
) -> std::result::Result<(i64, f64), String> {
    let show = |cell: &[u8]| {
        String::from_utf8_lossy(cell)
            .chars()
            .take(40)
            .collect::<String>()
    };
    let value = parse_value(value_cell, column, line)?;
    if step_cell.is_empty() {
        return Err(format!("line {line}: a {column} value without a step"));
    }
    let step = std::str::from_utf8(step_cell)
        .ok()
        .and_then(parse_step)
        .ok_or_else(|| {
            let step = crate::io::excerpt::quoted(&show(step_cell));
            format!("line {line}: step {step} is not an integer")
        })?;
    Ok((step, value))
}

fn series_from<R: Read>(
    reader: R,
    column: Option<&str>,
) -> std::result::Result<CsvSeries, Failure> {
    let mut rows = Rows::new(without_bom(reader)?);
    let Some(header) = rows.next()? else {
        return Err(Failure::Bad(
            "is empty; a metrics.csv starts with a header row".into(),
        ));
    };
    let columns = rows
        .current
        .iter()
        .map(|cell| {
            // Ultralytics pads its names with spaces to align them.
            std::str::from_utf8(cell)
                .map(|c| c.trim().to_owned())
                .map_err(|_| format!("the header row (line {}) is not UTF-8 text", header.line))
        })
        .collect::<std::result::Result<Vec<String>, String>>()?;
    // A repeated name means its last cell, as in csv.DictReader.
    let find = |name: &str| columns.iter().rposition(|c| c == name);
    // Without a step column (a hand-written logger) rows are read in order,
    // the row number standing for the step; a Git LFS pointer is no CSV.
    // Keras's CSVLogger and Ultralytics count epochs.
    let step_column = ["step", "epoch"].into_iter().find(|c| find(c).is_some());
    let step_index = step_column.and_then(find);
    if step_index.is_none()
        && lfs::may_begin_pointer(columns.first().map_or(&b""[..], |c| c.as_bytes()))
    {
        return Err(Failure::Header(
            format!("has no step column (columns: {})", listed(&columns)),
            columns.first().cloned().unwrap_or_default(),
        ));
    }
    let parts = |pattern: &str| Some(matching(pattern, &columns)).filter(|m| m.len() >= 2);
    let (column, value_indices) = match column {
        Some(name) => (
            name.to_string(),
            find(name)
                .map(|i| vec![i])
                .or_else(|| parts(name).filter(|_| SUMMED_COLUMNS.contains(&name)))
                .ok_or_else(|| {
                    let name = crate::io::excerpt::quoted(name);
                    format!("has no column {name}; columns: {}", listed(&columns))
                })?,
        ),
        None => series_names::loss_among(&DEFAULT_LOSS_COLUMNS, columns.iter().map(String::as_str))
            .filter(|_| parts(SUMMED_COLUMNS[0]).is_none())
            .and_then(|name| find(name).map(|i| (name.to_string(), vec![i])))
            .or_else(|| parts(SUMMED_COLUMNS[0]).map(|m| (SUMMED_COLUMNS[0].to_string(), m)))
            .ok_or_else(|| {
                format!(
                    "{NO_LOSS_COLUMN} (none named as a training or held-out loss); columns: {}; \
                     name the column to read",
                    listed(&columns)
                )
            })?,
    };
    let mut points = vec![];
    let mut torn_last_line = false;
    let (mut skipped_rows, mut data_rows) = (0u64, 0u64);
    while let Some(row) = rows.next()? {
        if is_conflict_marker(rows.cell(0)) {
            skipped_rows += 1;
            continue;
        }
        data_rows += 1;
        let point = if value_indices.iter().any(|&i| rows.cell(i).is_empty()) {
            Ok(None)
        } else {
            let mut parts = value_indices.iter().map(|&i| rows.cell(i));
            let first = parts.next().unwrap_or_default();
            let step = |at: usize| match step_index {
                Some(i) => parse_point(rows.cell(i), first, &column, row.line).map(|p| p.0),
                None => Ok(i64::try_from(at).unwrap_or(i64::MAX)),
            };
            step(points.len()).and_then(|step| {
                let mut total = 0.0;
                for cell in value_indices.iter().map(|&i| rows.cell(i)) {
                    total += parse_value(cell, &column, row.line)?;
                }
                Ok(Some((step, total)))
            })
        };
        let malformed = row.open_quote || rows.cells() < columns.len() || point.is_err();
        if !row.terminated && malformed {
            torn_last_line = true;
            break;
        }
        if let Some(p) = point? {
            points.push(p);
        }
    }
    Ok(CsvSeries {
        path: PathBuf::new(),
        column,
        points,
        columns,
        torn_last_line,
        step_column: step_column.unwrap_or_default().to_string(),
        skipped_rows,
        rows: data_rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("rust/testdata/logs")
            .join(rel)
    }

    /// A reader that returns one byte at a time exercises every boundary.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((&b, rest)), Some(slot)) => {
                    *slot = b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    fn parse(text: &[u8], column: Option<&str>) -> std::result::Result<CsvSeries, String> {
        let whole = series_from(text, column);
        let trickled = series_from(Trickle(text), column);
        let flat = |r: std::result::Result<CsvSeries, Failure>| match r {
            Ok(s) => Ok(s),
            Err(Failure::Bad(m) | Failure::Header(m, _)) => Err(m),
            Err(Failure::Io(e)) => Err(e.to_string()),
        };
        let (whole, trickled) = (flat(whole), flat(trickled));
        assert_eq!(
            format!("{whole:?}"),
            format!("{trickled:?}"),
            "buffer boundaries matter"
        );
        whole
    }

    fn points(text: &str, column: Option<&str>) -> Vec<(i64, f64)> {
        parse(text.as_bytes(), column).unwrap().points
    }

    #[test]
    fn matches_python_csv_on_a_real_lightning_log() {
        let path = fixture("lightning/version_0/metrics.csv");
        let text =
            std::fs::read_to_string(fixture("lightning/version_0/metrics.expected.json")).unwrap();
        let want: serde_json::Value = serde_json::from_str(&text).unwrap();
        let want = want.as_object().unwrap();
        for (column, expected) in want {
            let series = read_csv_series(&path, Some(column)).unwrap();
            let expected: Vec<(i64, f64)> = expected
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p[0].as_i64().unwrap(),
                        p[1].as_str().unwrap().parse().unwrap(),
                    )
                })
                .collect();
            assert_eq!(series.points.len(), expected.len(), "{column}");
            for (got, want) in series.points.iter().zip(&expected) {
                assert_eq!(got.0, want.0, "{column}");
                assert!(got.1.to_bits() == want.1.to_bits() || (got.1.is_nan() && want.1.is_nan()));
            }
            assert!(!series.torn_last_line);
        }
        let series = read_csv_series(&path, None).unwrap();
        assert_eq!(series.column, "train_loss_step");
        assert_eq!(series.path, path);
        assert_eq!(
            series.columns,
            [
                "epoch",
                "step",
                "train_loss_epoch",
                "train_loss_step",
                "val_loss"
            ]
        );
        assert!(
            series.points.iter().any(|p| p.1.is_nan()),
            "the generator logged a NaN"
        );
    }

    #[test]
    fn quoting_line_ends_and_bom() {
        let text = "\u{feff}\"step\",\"a,b\",loss\r\n1,\"x\"\"y\",0.5\r\n\r\n2,\"multi\r\nline\",\"1.5e-3\"\r3,,inf\n4,z,\n";
        assert_eq!(
            points(text, None),
            vec![(1, 0.5), (2, 0.0015), (3, f64::INFINITY)]
        );
        let series = parse(text.as_bytes(), None).unwrap();
        assert_eq!(series.columns, ["step", "a,b", "loss"]);
        // A quoted cell's content is the value; a repeated column means the last one.
        assert_eq!(points("step,loss,loss\n1,\"2\",3\n", None), vec![(1, 3.0)]);
        assert_eq!(
            points("step,loss\n\"1\",\"2\"\n", Some("loss")),
            vec![(1, 2.0)]
        );
        // Python's float() spellings, and integral float steps.
        let got = points("step,loss\n1, nan \n2,-Infinity\n3,1_0.5\n4.0,+1E2\n", None);
        assert!(got[0].1.is_nan());
        assert_eq!(&got[1..], &[(2, f64::NEG_INFINITY), (3, 10.5), (4, 100.0)]);
    }

    #[test]
    fn default_column_order_and_explicit_columns() {
        let text = "step,loss,train_loss_step,val_loss\n1,9,2,\n2,,,0.5\n";
        let series = parse(text.as_bytes(), None).unwrap();
        assert_eq!(
            (series.column.as_str(), series.points.clone()),
            ("train_loss_step", vec![(1, 2.0)])
        );
        assert_eq!(points(text, Some("val_loss")), vec![(2, 0.5)]);
        let e = parse(text.as_bytes(), Some("acc")).unwrap_err();
        assert!(
            e.contains("no column \"acc\"; columns: step, loss, train_loss_step, val_loss"),
            "{e}"
        );
        let e = parse(b"step,acc\n1,2\n", None).unwrap_err();
        assert!(e.contains("has no loss column"), "{e}");
        // Without a step column, rows in order; blank cells keep no number.
        let series = parse(b"loss,acc\n2,0\n,1\n1.5,1\n", None).unwrap();
        assert_eq!(series.points, vec![(0, 2.0), (1, 1.5)]);
        // An epoch column (Keras, Ultralytics) counts when there is no step.
        let series = parse(b"epoch,loss,acc\n1,2,0\n2,,1\n3,1.5,1\n", None).unwrap();
        assert_eq!(series.points, vec![(1, 2.0), (3, 1.5)]);
        // A loss by its meaning when no default column is there; a held-out
        // loss when it is the only loss.
        assert_eq!(
            points("step,train/nll_loss,val/rmse_loss\n1,0.5,0.1\n", None),
            vec![(1, 0.5)]
        );
        let dev = parse(b"dev_auroc,dev_loss,epoch,step\n0.5,1.48,0,9\n", None).unwrap();
        assert_eq!(
            (dev.column.as_str(), dev.points),
            ("dev_loss", vec![(9, 1.48)])
        );
        let e = parse(b"", None).unwrap_err();
        assert!(e.contains("is empty"), "{e}");
        let e = parse(b"\n\r\n", None).unwrap_err();
        assert!(e.contains("is empty"), "{e}");
        assert!(parse(b"\xff,step,loss\n", None)
            .unwrap_err()
            .contains("not UTF-8"));
        // Only a header (even unterminated): no points, no error.
        assert!(points("step,loss", None).is_empty());
    }

    #[test]
    fn bad_values_in_the_middle_name_their_line() {
        let cases: [(&[u8], &str); 5] = [
            (
                b"step,loss\n1,0.5\n2,abc\n3,1\n",
                "line 3: loss value \"abc\" is not a number",
            ),
            (
                b"step,loss\n1,0.5\n,1\n",
                "line 3: a loss value without a step",
            ),
            (
                b"step,loss\n1.5,1\n2,1\n",
                "line 2: step \"1.5\" is not an integer",
            ),
            (
                b"step,x,loss\n1,\"a\r\nb\",1\n2,,\xff\n",
                "line 4: loss value",
            ),
            (b"step,loss\n1e300,1\n", "line 2: step"),
        ];
        for (text, want) in cases {
            let e = parse(text, None).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // Short rows are padded, long rows keep their extra cells: no error.
        assert_eq!(points("step,x,loss\n1\n2,,3,4,5\n", None), vec![(2, 3.0)]);
    }

    #[test]
    fn torn_last_lines() {
        let body = "step,loss,val\n1,0.5,\n2,0.25,\n";
        for (tail, kept, torn) in [
            ("", vec![], false),
            ("3", vec![], true),               // fewer cells than the header
            ("3,0.1", vec![], true),           // still fewer
            ("3,0.1,", vec![(3, 0.1)], false), // complete, just no line end
            ("3,\"0.1", vec![], true),         // open quote
            ("3,0.1e,", vec![], true),         // a cut exponent
            ("3,,", vec![], false),            // nothing logged in the column
        ] {
            let text = format!("{body}{tail}");
            let series = parse(text.as_bytes(), None).unwrap();
            let mut want = vec![(1, 0.5), (2, 0.25)];
            want.extend(kept);
            assert_eq!(series.points, want, "{tail:?}");
            assert_eq!(series.torn_last_line, torn, "{tail:?}");
        }
        // Every cut of the real file parses: a prefix of the full points.
        let bytes = std::fs::read(fixture("lightning/version_0/metrics.csv")).unwrap();
        let full = series_from(&bytes[..], None).ok().unwrap().points;
        let header_end = bytes.iter().position(|&c| c == b'\n').unwrap() + 1;
        for cut in header_end..bytes.len() {
            let got = series_from(&bytes[..cut], None).ok().unwrap().points;
            assert!(got.len() <= full.len(), "cut {cut}");
            let exact = got
                .iter()
                .zip(&full)
                .all(|(a, b)| a.0 == b.0 && (a.1 == b.1 || a.1.is_nan()));
            // The last kept value may itself be cut short ("1.07" of "1.0753...").
            let n = got.len();
            let prefix_ok = n == 0
                || got[..n - 1]
                    .iter()
                    .zip(&full)
                    .all(|(a, b)| a.0 == b.0 && (a.1 == b.1 || a.1.is_nan()));
            assert!(exact || prefix_ok, "cut {cut}: {got:?}");
        }
    }

    #[test]
    fn overlong_rows_are_refused() {
        let mut text = b"step,loss\n1,".to_vec();
        text.extend(std::iter::repeat_n(b'1', MAX_ROW_BYTES + 10));
        text.push(b'\n');
        let e = parse(&text, None).unwrap_err();
        assert!(e.contains("line 2 is longer than 1024 KiB"), "{e}");
        // An unclosed quote cannot swallow the file either.
        let mut text = b"step,loss\n1,\"".to_vec();
        text.extend(std::iter::repeat_n(b"0.5\n".as_slice(), MAX_ROW_BYTES / 4 + 10).flatten());
        let e = parse(&text, None).unwrap_err();
        assert!(e.contains("line 2 is longer"), "{e}");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "step,loss\n1,x\n2,1\n").unwrap();
        let e = read_csv_series(&path, None).unwrap_err();
        assert_eq!((e.area, e.path.clone()), (Area::LogFormat, path));
        assert!(e.to_string().contains("metrics.csv: line 2"), "{e}");
        let e = read_csv_series(&dir.path().join("nope.csv"), None).unwrap_err();
        assert_eq!(e.area, Area::Missing);
    }

    #[test]
    fn keras_and_ultralytics_logs_are_read_by_meaning() {
        // Keras's CSVLogger: epochs, `loss` and `val_loss`.
        let keras = b"epoch,accuracy,loss,val_accuracy,val_loss\n0,0.7,1.93,0.79,1.42\n1,0.8,1.34,0.81,1.27\n";
        let s = parse(keras, None).unwrap();
        assert_eq!(
            (s.column.as_str(), s.step_column.as_str()),
            ("loss", "epoch")
        );
        assert_eq!(s.points, vec![(0, 1.93), (1, 1.34)]);
        // Ultralytics: names padded with spaces, the loss in parts (their
        // sum is the loss), and a merge's conflict markers among the rows.
        let yolo = b"  epoch,  train/box_loss,  train/cls_loss,  val/box_loss,  val/cls_loss\n\
              1,   1.0,   2.0,   0.5,   0.25\n\
<<<<<<< HEAD\n\
              2,   0.5,   1.0,   0.25,   0.125\n\
=======\n\
>>>>>>> other\n";
        let s = parse(yolo, None).unwrap();
        assert_eq!(s.column, "train/*_loss");
        assert_eq!(s.points, vec![(1, 3.0), (2, 1.5)]);
        assert_eq!((s.skipped_rows, s.rows), (3, 2));
        assert_eq!(summed_columns(&s.columns), ["train/*_loss", "val/*_loss"]);
        let val = parse(yolo, Some("val/*_loss")).unwrap();
        assert_eq!(val.points, vec![(1, 0.75), (2, 0.375)]);
        // A pattern is no column name for any other caller.
        assert!(parse(yolo, Some("train/*")).is_err());
    }

    #[test]
    fn a_training_log_is_told_from_a_data_table_by_its_header() {
        for log in [
            "epoch,accuracy,loss,val_accuracy,val_loss",
            "\u{feff}epoch,loss",
            "loss,acc,val_loss,val_acc",
            "  epoch,  train/box_loss,  train/cls_loss,  metrics/mAP50(B)",
            "step,train_loss",
        ] {
            assert!(is_training_log_header(log), "{log}");
        }
        for table in [
            "id,name,price",
            "epoch,accuracy",
            "loss,accuracy",
            "x,y,loss_weight",
            "",
        ] {
            assert!(!is_training_log_header(table), "{table}");
        }
    }
}
