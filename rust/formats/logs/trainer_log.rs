//! LLaMA-Factory's `trainer_log.jsonl`: one JSON object a line, written by
//! its log callback each time the Trainer logs. A training line carries
//! `current_steps`, `total_steps`, `loss` and the learning rate (`lr` in
//! newer releases, `learning_rate` in older ones, which also write `null`
//! for what a line lacks); an evaluation line carries `eval_loss`. RL
//! stages add `reward`. It is read into the same [`TrainerState`] a
//! `trainer_state.json` gives, so the curve, its side series and the step
//! count (`total_steps` as `max_steps`) reach the rules unchanged.
//!
//! Lines are Python's JSON dialect (`NaN`, `Infinity`). A line that is not
//! a JSON object (a torn last line of a run still writing, a stray print)
//! is passed over; a file with no line at all that reads is an error.

use std::path::Path;

use crate::error::{Area, Error, Result};
use crate::formats::logs::json_line::{to_loss, to_step, Scalar, Scanner};
use crate::formats::logs::trainer_state::{members, TrainerState};
use crate::io::files::read_small;
use crate::io::lfs;

/// The file's name in a LLaMA-Factory output directory.
pub const TRAINER_LOG: &str = "trainer_log.jsonl";

/// Largest log read (a line is ~200 bytes: a million logged steps is 200 MiB).
pub const MAX_TRAINER_LOG_BYTES: u64 = 512 << 20;

/// Longest line parsed; a longer one is no log line.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Read the `trainer_log.jsonl` at `path`.
pub fn read_trainer_log(path: &Path) -> Result<TrainerState> {
    let err = |msg: String| Error::new(Area::LogFormat, path, msg);
    let bytes = read_small(path, Area::LogFormat, MAX_TRAINER_LOG_BYTES)?;
    let (mut state, read_lines) = parse_trainer_log(&bytes);
    if read_lines == 0 && bytes.iter().any(|b| !b.is_ascii_whitespace()) {
        return Err(
            lfs::pointer_error(Area::LogFormat, path, &bytes).unwrap_or_else(|| {
                err(
                    "holds no line that reads as a LLaMA-Factory log record (a JSON object with \
                 current_steps)"
                        .to_string(),
                )
            }),
        );
    }
    state.path = path.to_path_buf();
    Ok(state)
}

/// The state the lines of `bytes` describe, and how many lines were log
/// records (`path` is left empty).
pub fn parse_trainer_log(bytes: &[u8]) -> (TrainerState, usize) {
    let mut state = TrainerState::default();
    let mut records = 0;
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    for line in bytes.split(|&b| b == b'\n') {
        if line.len() > MAX_LINE_BYTES {
            continue;
        }
        let Ok(text) = std::str::from_utf8(line) else {
            continue;
        };
        if let Some(record) = parse_line(text.trim()) {
            records += 1;
            record.add_to(&mut state);
        }
    }
    (state, records)
}

/// What one line logged.
#[derive(Debug, Default, PartialEq)]
struct Record {
    step: i64,
    total_steps: Option<i64>,
    epoch: Option<f64>,
    loss: Option<f64>,
    eval_loss: Option<f64>,
    learning_rate: Option<f64>,
    grad_norm: Option<f64>,
}

impl Record {
    fn add_to(self, state: &mut TrainerState) {
        let step = self.step;
        state.global_step = state.global_step.max(step);
        if self.total_steps.is_some() {
            state.max_steps = self.total_steps;
        }
        if self.epoch.is_some() {
            state.epoch = self.epoch;
        }
        if let Some(loss) = self.loss {
            state.train_points.push((step, loss));
            if let Some(v) = self.grad_norm {
                state.grad_norm_points.push((step, v));
            }
            if let Some(v) = self.learning_rate {
                state.learning_rate_points.push((step, v));
            }
        }
        if let Some(v) = self.eval_loss {
            state.eval_points.push((step, v));
        }
    }
}

/// One line as a record: None unless it is a whole JSON object with an
/// integer `current_steps`.
fn parse_line(text: &str) -> Option<Record> {
    if !text.starts_with('{') {
        return None;
    }
    let mut s = Scanner::new(text);
    let mut step: Option<Scalar> = None;
    let mut record = Record::default();
    let number = |v: Scalar| to_loss(&v);
    members(&mut s, |s, name| {
        match name {
            "current_steps" => step = Some(s.scalar()?),
            "total_steps" => record.total_steps = to_step(&s.scalar()?),
            "epoch" => record.epoch = number(s.scalar()?),
            "loss" => record.loss = number(s.scalar()?),
            "eval_loss" => record.eval_loss = number(s.scalar()?),
            "lr" | "learning_rate" => record.learning_rate = number(s.scalar()?),
            "grad_norm" => record.grad_norm = number(s.scalar()?),
            _ => s.skip_value(1)?,
        }
        Ok(())
    })
    .ok()?;
    s.ws();
    if s.peek().is_some() {
        return None;
    }
    record.step = step.as_ref().and_then(to_step)?;
    Some(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"current_steps": 10, "total_steps": 30, "loss": 2.5, "lr": 4.9e-05, "epoch": 0.33, "percentage": 33.33, "elapsed_time": "0:00:10", "remaining_time": "0:00:20"}
{"current_steps": 20, "total_steps": 30, "loss": 1.8, "learning_rate": 4.5e-05, "eval_loss": null, "predict_loss": null, "epoch": 0.67}
{"current_steps": 20, "total_steps": 30, "eval_loss": 1.9, "epoch": 0.67, "percentage": 66.67}
{"current_steps": 30, "total_steps": 30, "loss": NaN, "lr": 4e-05, "grad_norm": Infinity, "epoch": 1.0}
{"current_steps": 40, "total_st"#;

    #[test]
    fn lines_of_old_and_new_releases_are_read() {
        let (state, records) = parse_trainer_log(LOG.as_bytes());
        assert_eq!(records, 4);
        assert_eq!(state.global_step, 30);
        assert_eq!(state.max_steps, Some(30));
        assert_eq!(state.epoch, Some(1.0));
        assert_eq!(state.train_points[..2], [(10, 2.5), (20, 1.8)]);
        assert!(state.train_points[2].1.is_nan());
        assert_eq!(state.eval_points, vec![(20, 1.9)]);
        assert_eq!(
            state.learning_rate_points,
            vec![(10, 4.9e-5), (20, 4.5e-5), (30, 4e-5)]
        );
        assert_eq!(state.grad_norm_points, vec![(30, f64::INFINITY)]);
    }

    #[test]
    fn a_byte_order_mark_and_crlf_endings_are_read_through() {
        let text = "\u{feff}{\"current_steps\": 1, \"loss\": 2.0}\r\n{\"current_steps\": 2, \"loss\": 1.0}\r\n";
        let (state, records) = parse_trainer_log(text.as_bytes());
        assert_eq!((records, state.train_points), (2, vec![(1, 2.0), (2, 1.0)]));
    }

    #[test]
    fn lines_that_are_no_record_are_passed_over() {
        let text = "\n[1, 2]\n{\"loss\": 1.0}\nnot json\n{\"current_steps\": \"x\", \"loss\": 1}\n\
                    {\"current_steps\": 5, \"loss\": 1.5} trailing\n\u{feff}\n";
        let (state, records) = parse_trainer_log(text.as_bytes());
        assert_eq!((records, state.train_points.len()), (0, 0));
        let (_, records) = parse_trainer_log(b"\xff\xfe{\"current_steps\": 1}\n");
        assert_eq!(records, 0);
    }

    #[test]
    fn a_file_of_no_records_is_an_error_and_an_empty_one_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(TRAINER_LOG);
        std::fs::write(&path, "garbage\n").unwrap();
        let e = read_trainer_log(&path).unwrap_err();
        assert!(e.message.contains("no line that reads"), "{e}");
        std::fs::write(&path, "\n\n").unwrap();
        assert!(read_trainer_log(&path).unwrap().train_points.is_empty());
        std::fs::write(&path, LOG).unwrap();
        assert_eq!(read_trainer_log(&path).unwrap().path, path);
    }
}
