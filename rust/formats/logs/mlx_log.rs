//! The training output of `mlx_lm.lora`, saved as text (`mlx_lm.lora ... |
//! tee train.log`), read as a loss curve.
//!
//! Why: mlx-lm keeps no log file of its own; what people keep is what it
//! printed. Two layouts are in use:
//!
//! - up to mlx-lm 0.2x, one line per report:
//!   `Iter 10: Train loss 2.345, Learning Rate 1.000e-05, It/sec ...` and
//!   `Iter 1: Val loss 2.901, Val took 1.234s`;
//! - from 0.3x, a table drawn by `rich`: `  10    2.345 ▼    8,130    1.0k`
//!   (iteration, train loss, an arrow, tokens/s, tokens) and
//!   `  12    val 3.448    0.01s`, with ANSI styling even in a file.
//!
//! Both are read: styling escapes are dropped, every other line (banners,
//! progress bars, warnings) is passed over. The reader streams the file
//! line by line (a line is read up to [`MAX_LINE_BYTES`]), keeps at most
//! [`MAX_POINTS`] training points (thinned past that, `thinned`) and as
//! many held-out ones.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Area, Error, Result};
use crate::formats::logs::curve::{assemble, by_step, LossCurve, RunProgress, Thinning};
use crate::formats::logs::thinned::Thinned;
use crate::io::files::open_regular;

/// The `source` of a curve read from mlx-lm's output.
pub const MLX_SOURCE: &str = "mlx_log";
/// Longest line read (longer ones are read up to this and passed over).
const MAX_LINE_BYTES: u64 = 64 * 1024;
/// Most training points kept (and most held-out ones).
pub const MAX_POINTS: usize = 1 << 20;
/// Largest log read.
const MAX_LOG_BYTES: u64 = 1 << 30;

/// One report line of mlx-lm's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Report {
    Train {
        iter: i64,
        loss: f64,
        lr: Option<f64>,
    },
    Val {
        iter: i64,
        loss: f64,
    },
}

/// The line without ANSI styling escapes (`ESC [ ... letter`).
fn unstyled(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

fn number(text: &str) -> Option<f64> {
    let t = text.trim().trim_end_matches(',');
    match t.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "inf" | "+inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => t.parse::<f64>().ok(),
    }
}

/// The report a line of output holds, if it holds one.
pub fn parse_line(line: &str) -> Option<Report> {
    let line = unstyled(line);
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("Iter ") {
        // `Iter 10: Train loss 2.345, Learning Rate 1.000e-05, ...`
        let (iter, rest) = rest.split_once(':')?;
        let iter: i64 = iter.trim().parse().ok()?;
        let rest = rest.trim();
        if let Some(after) = rest.strip_prefix("Train loss ") {
            let loss = number(after.split(',').next()?)?;
            let lr = rest
                .split(',')
                .find_map(|part| part.trim().strip_prefix("Learning Rate "))
                .and_then(number);
            return Some(Report::Train { iter, loss, lr });
        }
        if let Some(after) = rest.strip_prefix("Val loss ") {
            let loss = number(after.split(',').next()?)?;
            return Some(Report::Val { iter, loss });
        }
        return None;
    }
    // The table: `10    2.345 ▼    8,130    1.0k`, `12    val 3.448    0.01s`.
    let mut words = line.split_whitespace();
    let iter: i64 = words.next()?.parse().ok()?;
    let second = words.next()?;
    if second == "val" {
        let loss = number(words.next()?)?;
        return Some(Report::Val { iter, loss });
    }
    let loss = number(second)?;
    let arrow = words.next()?;
    (arrow == "▼" || arrow == "▲").then_some(Report::Train {
        iter,
        loss,
        lr: None,
    })
}

/// Whether the text file at `path` holds mlx-lm training output: one of
/// its first lines is a train report.
pub fn is_mlx_log(path: &Path) -> bool {
    const LOOKED_AT: usize = 400;
    let Ok(file) = open_regular(path, Area::LogFormat) else {
        return false;
    };
    let mut reader = BufReader::new(file.take(1 << 20));
    let mut buf = Vec::new();
    for _ in 0..LOOKED_AT {
        buf.clear();
        match (&mut reader)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf);
        if matches!(parse_line(&line), Some(Report::Train { .. })) {
            return true;
        }
    }
    false
}

/// The loss curve in mlx-lm's output at `path`: the train reports, the
/// validation reports as its held-out loss, the learning rate where the
/// lines carry it, and how far the run got of `planned` iterations (the
/// config's `iters`).
pub fn read_mlx_log(path: &Path, planned: Option<i64>) -> Result<LossCurve> {
    let file = open_regular(path, Area::LogFormat)?;
    let mut reader = BufReader::new(file.take(MAX_LOG_BYTES));
    let mut train = Thinned::new(MAX_POINTS, |p: &(i64, f64)| !p.1.is_finite());
    let mut val: Vec<(i64, f64)> = Vec::new();
    let mut lr: Vec<(i64, f64)> = Vec::new();
    let mut buf = Vec::new();
    let oom = |_| Error::new(Area::LogFormat, path, "out of memory keeping the curve");
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut buf)
            .map_err(|e| Error::io(Area::LogFormat, path, &e))?;
        if n == 0 {
            break;
        }
        if buf.last() != Some(&b'\n') && n as u64 == MAX_LINE_BYTES {
            // The rest of an over-long line: passed over up to its end.
            let mut rest = Vec::new();
            let _ = (&mut reader)
                .take(MAX_LOG_BYTES)
                .read_until(b'\n', &mut rest);
            continue;
        }
        match parse_line(&String::from_utf8_lossy(&buf)) {
            Some(Report::Train { iter, loss, lr: l }) => {
                train.push((iter, loss)).map_err(oom)?;
                if let Some(l) = l.filter(|_| lr.len() < MAX_POINTS) {
                    lr.push((iter, l));
                }
            }
            Some(Report::Val { iter, loss }) if val.len() < MAX_POINTS => val.push((iter, loss)),
            _ => {}
        }
    }
    let kept = train.finish().map_err(oom)?;
    if kept.points.is_empty() {
        return Err(Error::new(
            Area::LogFormat,
            path,
            "holds no mlx-lm train report (`Iter N: Train loss ...` or the table's `N  loss ▼`)",
        ));
    }
    let thinned: Option<Thinning> = Thinning::of(&kept);
    let mut curve = LossCurve {
        source: MLX_SOURCE.to_string(),
        series: "train_loss".to_string(),
        thinned,
        ..assemble(kept.points, vec![PathBuf::from(path)])
    };
    curve.side.eval_loss = by_step(val);
    curve.side.learning_rate = by_step(lr);
    if let (Some(max_steps), Some(&last)) = (planned, curve.steps.last()) {
        curve.side.progress = Some(RunProgress {
            global_step: last,
            max_steps,
        });
    }
    Ok(curve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_of_report_are_read() {
        assert_eq!(
            parse_line("Iter 10: Train loss 2.345, Learning Rate 1.000e-05, It/sec 1.2"),
            Some(Report::Train {
                iter: 10,
                loss: 2.345,
                lr: Some(1e-5)
            })
        );
        assert_eq!(
            parse_line("Iter 1: Val loss 2.901, Val took 1.234s"),
            Some(Report::Val {
                iter: 1,
                loss: 2.901
            })
        );
        assert_eq!(
            parse_line("     2    \u{1b}[1m4.417 ▼\u{1b}[0m    \u{1b}[1m    7\u{1b}[0m      0.2k"),
            Some(Report::Train {
                iter: 2,
                loss: 4.417,
                lr: None
            })
        );
        assert_eq!(
            parse_line("    12    \u{1b}[1mval\u{1b}[0m \u{1b}[1m3.448\u{1b}[0m    0.01s"),
            Some(Report::Val {
                iter: 12,
                loss: 3.448
            })
        );
        assert!(matches!(
            parse_line("Iter 3: Train loss nan, Learning Rate 1e-3"),
            Some(Report::Train { loss, .. }) if loss.is_nan()
        ));
        for other in [
            "Trainable parameters: 38.364% (0.009M/0.023M)",
            "  iter   train_loss     tok/s     tokens",
            "12 apples 3",
            "Iter x: Train loss 1",
            "",
        ] {
            assert_eq!(parse_line(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_log_is_a_curve_with_its_held_out_loss_and_progress() {
        let dir = std::env::temp_dir().join(format!("ap-mlx-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("train.log");
        let long = "x".repeat(100_000);
        let text = format!(
            "banner\nIter 1: Val loss 3.0, Val took 1s\n{long}\nIter 2: Train loss 2.5, \
             Learning Rate 1e-3\nIter 4: Train loss 2.0, Learning Rate 1e-3\n"
        );
        std::fs::write(&log, text).unwrap();
        assert!(is_mlx_log(&log));
        let c = read_mlx_log(&log, Some(100)).unwrap();
        assert_eq!(c.steps, [2, 4]);
        assert_eq!(c.losses, [2.5, 2.0]);
        assert_eq!(c.side.eval_loss, [(1, 3.0)]);
        assert_eq!(c.side.learning_rate.len(), 2);
        assert_eq!(
            c.side.progress,
            Some(RunProgress {
                global_step: 4,
                max_steps: 100
            })
        );
        std::fs::write(&log, "no reports here\n").unwrap();
        assert!(!is_mlx_log(&log));
        assert_eq!(read_mlx_log(&log, None).unwrap_err().area, Area::LogFormat);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
