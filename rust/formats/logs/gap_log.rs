//! The GAP monitor's records in a dlm-style JSONL log: the lines
//! `{"type": "gap", "step": N, "stats": {"gap/summary/...": x, ...}}` that
//! `adapterprobe.JsonlSink` writes on sampled steps beside the step lines.
//!
//! Only what the `gap_monitor` rules read is kept: the summary keys
//! (`gap/summary/{kind}s/...`: global size and non-finite counts, per-layer
//! sizes, the top offenders) and inline per-tensor non-finite counts
//! (`gap/{kind}s/{name}/nonfinite`). Per-tensor side files are not opened.
//! A line that is not a well-formed gap record is passed over, as the loss
//! reader passes over lines that are not steps.
//!
//! Bounded whatever the log claims: lines longer than `MAX_LINE` are
//! dropped, a record keeps at most `MAX_KEYS` statistics, and when the
//! values kept pass `MAX_VALUES` every other sampled step is let go (the
//! stride doubles), keeping the first step with a non-finite value.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::dlm_log::MAX_LINE;
use crate::formats::logs::json_line::{to_loss, to_step, unescape, Scalar, Scanner};
use crate::io::read_once;

/// Statistics kept from one record (a 7B model's summary has a few thousand).
pub const MAX_KEYS: usize = 65_536;
/// Statistics kept over a whole run before sampled steps are thinned.
pub const MAX_VALUES: usize = 4_000_000;
/// Bytes read from the files per batch.
const BATCH: usize = 8 << 20;

/// One sampled step's statistics, `(key, value)` in the record's order.
#[derive(Debug, Clone, PartialEq)]
pub struct GapRecord {
    pub step: i64,
    pub stats: Vec<(String, f64)>,
}

impl GapRecord {
    /// Whether any statistic kept says NaN/inf reached some tensor.
    pub fn has_nonfinite(&self) -> bool {
        self.stats.iter().any(|(k, v)| {
            (k.ends_with("/nonfinite") && *v > 0.0)
                || ((k.ends_with("/l2_norm") || k.ends_with("/rms")) && !v.is_finite())
        })
    }
}

/// The gap records of a run's logs, in step order (the last record of a
/// step wins, as for step lines), and how they were read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GapLog {
    pub records: Vec<GapRecord>,
    pub files: Vec<PathBuf>,
    /// Every `thinned`-th sampled step is kept (1: all of them).
    pub thinned: usize,
    /// Records whose statistics were cut at `MAX_KEYS`.
    pub cut_records: usize,
}

/// Whether a statistic is one the rules read.
fn wanted(key: &str) -> bool {
    key.starts_with("gap/summary/") || (key.starts_with("gap/") && key.ends_with("/nonfinite"))
}

/// Text every gap record holds (its `"type": "gap"`): a line without it
/// is not one.
const GAP_TYPE: &[u8] = b"\"gap\"";

/// A gap record from one line; None for any other line.
pub fn parse_gap_line(line: &[u8]) -> Option<GapRecord> {
    memchr::memmem::find(line, GAP_TYPE)?;
    let text = std::str::from_utf8(line).ok()?;
    let mut s = Scanner::new(text);
    s.ws();
    s.eat(b'{').ok()?;
    let (mut is_gap, mut step, mut stats) = (false, None, None);
    s.ws();
    if s.peek() == Some(b'}') {
        return None;
    }
    loop {
        s.eat(b'"').ok()?;
        let (raw, escaped) = s.string_raw().ok()?;
        let key = if escaped {
            unescape(raw)
        } else {
            std::str::from_utf8(raw).ok()?.to_string()
        };
        s.ws();
        s.eat(b':').ok()?;
        s.ws();
        match key.as_str() {
            "type" => is_gap = matches!(s.scalar().ok()?, Scalar::Str(t) if t == "gap"),
            "step" => step = to_step(&s.scalar().ok()?),
            "stats" if s.peek() == Some(b'{') => stats = Some(stats_object(&mut s)?),
            _ => s.skip_value(1).ok()?,
        }
        if s.closes(b'}').ok()? {
            break;
        }
    }
    s.ws();
    if s.i != line.len() || !is_gap {
        return None;
    }
    Some(GapRecord {
        step: step?,
        stats: stats.unwrap_or_default(),
    })
}

/// A statistic's value: a JSON number, or the `NaN`/`Infinity` Python's
/// json writes. The monitor writes nothing else; a string or a bool there
/// is not a measurement (unlike a loss log, whose loggers quote numbers).
fn to_stat(v: &Scalar<'_>) -> Option<f64> {
    match v {
        Scalar::Number(_) | Scalar::NaN | Scalar::PosInf | Scalar::NegInf => to_loss(v),
        Scalar::Str(_) | Scalar::Bool(_) | Scalar::Unusable => None,
    }
}

/// The wanted numeric entries of the `stats` object (at most `MAX_KEYS`;
/// the rest are validated and skipped).
fn stats_object(s: &mut Scanner<'_>) -> Option<Vec<(String, f64)>> {
    s.eat(b'{').ok()?;
    s.ws();
    let mut out = Vec::new();
    if s.peek() == Some(b'}') {
        s.i += 1;
        return Some(out);
    }
    loop {
        s.eat(b'"').ok()?;
        let (raw, escaped) = s.string_raw().ok()?;
        s.ws();
        s.eat(b':').ok()?;
        s.ws();
        let key = if escaped {
            unescape(raw)
        } else {
            std::str::from_utf8(raw).ok()?.to_string()
        };
        if out.len() < MAX_KEYS && wanted(&key) {
            if let Some(v) = to_stat(&s.scalar().ok()?) {
                out.push((key, v));
            }
        } else {
            s.skip_value(2).ok()?;
        }
        if s.closes(b'}').ok()? {
            return Some(out);
        }
    }
}

/// Call `each` on every line of `reader` no longer than `MAX_LINE`; memory
/// stays within one batch plus one line.
fn for_each_line(mut reader: impl Read, mut each: impl FnMut(&[u8])) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut discarding = false;
    loop {
        let got = (&mut reader).take(BATCH as u64).read_to_end(&mut buf)?;
        let eof = got < BATCH;
        let end = if eof {
            buf.len()
        } else {
            memchr::memrchr(b'\n', &buf).map_or(0, |p| p + 1)
        };
        let mut start = 0;
        if discarding {
            // The rest of an over-long line ends at the next line end.
            match memchr::memchr(b'\n', &buf[..end]) {
                Some(p) => (start, discarding) = (p + 1, false),
                None => start = end,
            }
        }
        // `end` is just past a line end unless the file ended there.
        each_line(&buf[start..end], &mut each);
        buf.drain(..end);
        if buf.len() > MAX_LINE {
            buf.clear();
            discarding = true;
        }
        if eof {
            return Ok(());
        }
    }
}

/// The gap records of one log file, in file order.
pub fn read_gap_file(path: &Path) -> Result<Vec<GapRecord>> {
    let file = read_once::sequential(path, Area::LogFormat)?;
    let mut out = Vec::new();
    let mut keep = |line: &[u8]| {
        if let Some(record) = parse_gap_line(line) {
            out.push(record);
        }
    };
    match file.whole() {
        // A small file is the store's shared bytes (shorter than `MAX_LINE`,
        // so no line is cut): its lines are read in place, and a file that
        // names no gap record anywhere (a training log the drift probe
        // reads too) is passed over in one search.
        Some(bytes) => {
            if memchr::memmem::find(bytes, GAP_TYPE).is_some() {
                each_line(bytes, keep);
            }
        }
        None => for_each_line(file, &mut keep).map_err(|e| Error::io(Area::LogFormat, path, &e))?,
    }
    Ok(out)
}

/// Call `each` on every line of `bytes`: each `\n`-terminated one, then
/// the unterminated rest when there is one (as [`for_each_line`] does).
fn each_line(bytes: &[u8], mut each: impl FnMut(&[u8])) {
    let mut start = 0;
    for newline in memchr::memchr_iter(b'\n', bytes) {
        each(&bytes[start..newline]);
        start = newline + 1;
    }
    if start < bytes.len() {
        each(&bytes[start..]);
    }
}

/// The gap records of a run's logs (in the order given), sorted by step,
/// the last of each step kept, and thinned to `MAX_VALUES` statistics.
pub fn read_gap_log(files: &[PathBuf]) -> Result<GapLog> {
    let mut records = Vec::new();
    for path in files {
        records.extend(read_gap_file(path)?);
    }
    Ok(assemble(records, files.to_vec()))
}

/// Sort, keep the last record of each step, and thin (see the module doc).
pub fn assemble(records: Vec<GapRecord>, files: Vec<PathBuf>) -> GapLog {
    let cut_records = records.iter().filter(|r| r.stats.len() >= MAX_KEYS).count();
    let mut indexed: Vec<(usize, GapRecord)> = records.into_iter().enumerate().collect();
    indexed.sort_by_key(|(i, r)| (r.step, *i));
    let mut kept: Vec<GapRecord> = Vec::with_capacity(indexed.len());
    for (_, r) in indexed {
        match kept.last_mut() {
            Some(last) if last.step == r.step => *last = r,
            _ => kept.push(r),
        }
    }
    let mut thinned = 1;
    let total = |rs: &[GapRecord]| rs.iter().map(|r| r.stats.len()).sum::<usize>();
    while total(&kept) > MAX_VALUES && kept.len() > 2 {
        let first_bad = kept.iter().position(GapRecord::has_nonfinite);
        let last = kept.len() - 1;
        kept = kept
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 0 || *i == last || Some(*i) == first_bad)
            .map(|(_, r)| r)
            .collect();
        thinned *= 2;
    }
    GapLog {
        records: kept,
        files,
        thinned,
        cut_records,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_max_line_are_passed_over_whole() {
        // Longer than MAX_LINE once a batch ends inside it: dropped to its
        // line end, and the lines around it are read.
        let long = vec![b'x'; 3 * BATCH + 5];
        let mut text = b"a\n".to_vec();
        text.extend_from_slice(&long);
        text.extend_from_slice(b"\nb\nc");
        let mut lines: Vec<Vec<u8>> = vec![];
        for_each_line(&text[..], |l| lines.push(l.to_vec())).unwrap();
        assert_eq!(lines, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        // An over-long last line, with no line end, is dropped too.
        let mut text = b"a\n".to_vec();
        text.extend_from_slice(&long);
        lines.clear();
        for_each_line(&text[..], |l| lines.push(l.to_vec())).unwrap();
        assert_eq!(lines, [b"a".to_vec()]);
    }

    proptest::proptest! {
        /// A small file's lines read in place are the records the streaming
        /// reader finds in the same bytes.
        #[test]
        fn whole_files_read_in_place_as_streamed(
            lines in proptest::collection::vec((0u8..4, 0i64..50, "[ a-z\"{}:,]{0,12}"), 0..30),
            final_newline: bool,
        ) {
            let text: Vec<String> = lines
                .iter()
                .map(|(kind, step, noise)| match kind {
                    0 => format!(r#"{{"type": "gap", "step": {step}, "stats": {{"gap/summary/grads/l2_norm": 1.5}}}}"#),
                    1 => format!(r#"{{"step": {step}, "loss": 2.0}}{noise}"#),
                    2 => format!(r#"{{"type": "gap", {noise}"#),
                    _ => noise.clone(),
                })
                .collect();
            let mut bytes = text.join("\n").into_bytes();
            if final_newline {
                bytes.push(b'\n');
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("train.jsonl");
            std::fs::write(&path, &bytes).unwrap();
            let read = read_gap_file(&path).unwrap();
            let mut streamed = vec![];
            for_each_line(&bytes[..], |l| streamed.extend(parse_gap_line(l))).unwrap();
            let steps = |rs: &[GapRecord]| rs.iter().map(|r| (r.step, r.stats.len())).collect::<Vec<_>>();
            proptest::prop_assert_eq!(steps(&read), steps(&streamed));
        }
    }

    #[test]
    fn reads_a_sink_line_and_keeps_only_what_the_rules_read() {
        let line = br#"{"stats": {"gap/summary/grads/l2_norm": 1.5, "gap/summary/grads/layers/model.layers.0/l2_norm": NaN, "gap/params/x/mean": 3, "gap/grads/x.weight/nonfinite": 2}, "step": 10, "timestamp": "t", "type": "gap"}"#;
        let r = parse_gap_line(line).unwrap();
        assert_eq!(r.step, 10);
        let keys: Vec<&str> = r.stats.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "gap/summary/grads/l2_norm",
                "gap/summary/grads/layers/model.layers.0/l2_norm",
                "gap/grads/x.weight/nonfinite"
            ]
        );
        assert!(r.stats[1].1.is_nan());
        assert!(r.has_nonfinite());
    }

    #[test]
    fn only_numbers_are_statistics() {
        let line = br#"{"type": "gap", "step": 1, "stats": {"gap/summary/grads/l2_norm": "0", "gap/summary/grads/nonfinite": true, "gap/summary/activations/rms": NaN, "gap/summary/grads/layers/a/l2_norm": 2}}"#;
        let r = parse_gap_line(line).unwrap();
        let keys: Vec<&str> = r.stats.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "gap/summary/activations/rms",
                "gap/summary/grads/layers/a/l2_norm"
            ]
        );
    }

    #[test]
    fn other_lines_are_passed_over() {
        for line in [
            &br#"{"type": "step", "step": 1, "loss": 2.0}"#[..],
            br#"{"type": "gap", "stats": {}}"#,
            br#"{"type": "gap", "step": 1, "stats": {} "#,
            br#"{"type": "gapx", "step": 1, "stats": {}}"#,
            br#"["gap"]"#,
            b"\"gap\"",
            b"",
        ] {
            assert_eq!(
                parse_gap_line(line),
                None,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn lines_split_across_batches_and_overlong_lines() {
        let mut text = Vec::new();
        for step in 0..3 {
            text.extend(
                format!("{{\"type\": \"gap\", \"step\": {step}, \"stats\": {{}}}}\n").bytes(),
            );
        }
        let mut seen = 0;
        for_each_line(&text[..], |line| {
            seen += usize::from(parse_gap_line(line).is_some())
        })
        .unwrap();
        assert_eq!(seen, 3);
    }

    #[test]
    fn last_record_of_a_step_wins_and_thinning_keeps_the_first_bad_step() {
        let rec = |step, v: f64| GapRecord {
            step,
            stats: vec![("gap/summary/grads/l2_norm".into(), v)],
        };
        let log = assemble(vec![rec(2, 1.0), rec(1, 1.0), rec(2, 3.0)], vec![]);
        assert_eq!(log.records, vec![rec(1, 1.0), rec(2, 3.0)]);
        assert_eq!(log.thinned, 1);
    }
}
