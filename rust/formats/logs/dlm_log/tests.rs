//! Unit tests of the loss-log reader.

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

pub(crate) fn step(s: i64, l: f64) -> String {
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
        vec![PathBuf::from("a"), PathBuf::from("b")],
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
fn unicode_whitespace_is_stripped_like_python() {
    let line = format!("\u{a0}\u{3000}{}\u{2028}\u{205f} ", step(4, 0.5));
    let data = format!("{line}\n\u{3000}\n{}\n", step(5, 0.25));
    let mut out = vec![];
    read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
    assert_eq!(out, vec![(4, 0.5), (5, 0.25)]);
    assert_eq!(strip("\u{a0}x\u{a0}".as_bytes()), b"x");
    assert_eq!(strip("\u{a0}".as_bytes()), b"");
    // U+200B (zero width space) is not whitespace to Python.
    assert_eq!(strip("\u{200b}x".as_bytes()), "\u{200b}x".as_bytes());
    // Non-ASCII digits: Python's int("١٢") is 12, ours is not a step (documented).
    let arabic = r#"{"type": "step", "step": "١٢", "loss": 1.0}"#;
    let mut out = vec![];
    read_steps_from(
        format!("{}\n{arabic}\n", step(1, 1.0)).as_bytes(),
        0,
        &mut out,
    )
    .unwrap();
    assert_eq!(out, vec![(1, 1.0)]);
}

#[test]
fn a_huge_whitespace_only_first_line_is_blank() {
    for pad in [" ", "\u{3000}", "\u{a0}"] {
        let mut data = pad.repeat(MAX_LINE / pad.len() + BATCH);
        data.push('\n');
        data.push_str("not json, not the first line\n");
        data.push_str(&step(3, 1.5));
        let mut out = vec![];
        read_steps_from(data.as_bytes(), 0, &mut out).unwrap();
        assert_eq!(out, vec![(3, 1.5)], "{pad:?}");
    }
    let mut data = " ".repeat(MAX_LINE + BATCH);
    data.push('x');
    data.push('\n');
    let mut out = vec![];
    assert!(read_steps_from(data.as_bytes(), 0, &mut out).is_err());
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

/// Profiling aid: `ADAPTERPROBE_PROFILE_LOG=path cargo test --release
/// profile_read_loss_curve -- --ignored` reads that log ten times.
#[test]
#[ignore = "a profiling aid, not a test"]
fn profile_read_loss_curve() {
    let Ok(path) = std::env::var("ADAPTERPROBE_PROFILE_LOG") else {
        return;
    };
    for _ in 0..10 {
        let c = read_loss_curve(&[PathBuf::from(&path)]).unwrap();
        assert!(!c.steps.is_empty());
    }
}

/// A reader that hands out at most `n` bytes a call (a pipe, a network
/// file system), to move batch ends to odd places.
struct Chunked<'a>(&'a [u8], usize);

impl std::io::Read for Chunked<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.1.min(out.len()).min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn records_across_many_batches_are_all_read_in_order_while_the_next_batch_is_read() {
    // 2.5 batches of step lines of varied length, each batch read while
    // the one before is parsed: every record once, in file order.
    let mut text = String::new();
    let mut step = 0i64;
    while text.len() < 2 * BATCH + BATCH / 2 {
        let pad = "p".repeat((step % 97) as usize);
        text.push_str(&format!(
            "{{\"type\": \"step\", \"step\": {step}, \"loss\": {}.5, \"note\": \"{pad}\"}}\n",
            step % 7
        ));
        step += 1;
    }
    for chunk in [usize::MAX, 4096 + 17] {
        let mut out: Vec<(i64, f64)> = Vec::new();
        read_steps_from(Chunked(text.as_bytes(), chunk), 0, &mut out).unwrap();
        assert_eq!(out.len() as i64, step, "chunk {chunk}");
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, r)| r.0 == i as i64 && r.1 == (i % 7) as f64 + 0.5));
    }
}

/// Everything a reader hands its sink, to compare two readers by.
#[derive(Default, Debug, PartialEq)]
struct Seen {
    steps: Vec<(i64, u64)>,
    lines: Vec<bool>,
    torn: u32,
}
impl StepSink for Seen {
    fn push_step(&mut self, step: i64, loss: f64, _: StepExtras) {
        self.steps.push((step, loss.to_bits()));
    }
    fn append(&mut self, mut other: Self) {
        self.steps.append(&mut other.steps);
        self.lines.append(&mut other.lines);
        self.torn += other.torn;
    }
    fn count_line(&mut self, readable: bool) {
        self.lines.push(readable);
    }
    fn torn_tail(&mut self) {
        self.torn += 1;
    }
}

proptest::proptest! {
    /// A small log read in place gives its sink what the streaming reader
    /// gives from the same bytes, errors included.
    #[test]
    fn a_whole_log_read_in_place_reads_as_streamed(
        lines in proptest::collection::vec((0u8..5, 0i64..40), 0..25),
        ends in proptest::collection::vec(0u8..3, 25),
        cut in 0usize..40,
    ) {
        let mut text = String::new();
        for (i, (kind, s)) in lines.iter().enumerate() {
            text.push_str(&match kind {
                0 | 1 => step(*s, *s as f64 / 4.0),
                2 => "   ".to_string(),
                3 => "{\"type\": \"step\", \"step\"".to_string(),
                _ => "version https://git-lfs.github.com/spec/v1".to_string(),
            });
            text.push_str(["\n", "\r\n", "\r"][ends[i] as usize]);
        }
        // Any cut: a torn last record, or none.
        let bytes = &text.as_bytes()[..text.len().saturating_sub(cut)];
        let (mut whole, mut streamed) = (Seen::default(), Seen::default());
        let a = read_steps_whole(bytes, &mut whole);
        let b = read_steps_from(bytes, 0, &mut streamed);
        proptest::prop_assert_eq!(a, b);
        proptest::prop_assert_eq!(whole, streamed);
    }
}
